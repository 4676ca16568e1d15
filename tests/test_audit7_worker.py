"""Worker tier, seventh audit: what a user of ``beacon submit`` / ``status`` / ``collect`` hit.
Real Redis on 127.0.0.1:6379 (DB 11, under test_worker's unique key prefix); the CLI runs
in-process, and no worker listens to the queues used here (outcomes are stored by the test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker

import beacon
from beacon.jobs import FactorySpec, JobSpec, iter_prompt_file
from beacon.jobs.spec import JobInputError

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]

SPEC = JobSpec(
    FactorySpec("beacon.demo:generator"),
    FactorySpec("beacon.demo:scorer"),
    beacon.BeaconConfig(cost=0.1, horizon=4),
)


def _ok(key: str) -> dict[str, Any]:
    """A stored result of prompt ``key`` (what a worker writes, cut to what collect reads)."""
    return {
        "record": {"key": key, "id": key[:6], "ok": True, "best": "b", "reward": 0.5},
        "dpo": None,
    }


def _registered_job(
    tier: SimpleNamespace, tmp_path: Path, tag: str, n: int
) -> tuple[str, list[str], str]:
    """A job of ``n`` prompts sent to a queue no worker reads: its id, prompt keys and queue."""
    import redis

    queue, job_id = f"{PREFIX}-a7-{tag}-q", f"{PREFIX}-a7-{tag}"
    prompts = test_worker._prompts(tmp_path / f"{tag}.jsonl", n, tag)
    res = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=tier.store, queue=queue)
    assert res.enqueued == n
    redis.Redis.from_url(REDIS_URL).delete(queue)  # nothing will run them
    keys = [k for k, _ in tier.store.iter_prompts(job_id)]
    return job_id, keys, queue


# -- 1. a collect during which the job finishes writes every outcome before it says "done" ------
def test_collect_racing_the_last_outcome_writes_it_or_exits_1(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``beacon collect`` while a job runs (documented as safe, exit 1 while prompts are
    pending). When the last prompt finished after the results scan passed it, the counts
    read at the end said "N done, 0 pending" and the command exited 0 -- with that prompt's
    line missing from ``--out`` (seen on a 3000-prompt job: 2783 lines written, "3000 done",
    exit 0). A user scripting ``collect || sleep`` took the file as complete. Now the collect
    runs again when the job finished during it, so exit 0 means every outcome is written."""
    from typer.testing import CliRunner

    from beacon.cli import app
    from beacon.jobs import read_jsonl
    from worker.state import JobStore

    job_id, keys, _ = _registered_job(tier, tmp_path, "race", 3)
    for k in keys[:2]:
        tier.store.store_result(job_id, k, _ok(k))
    original = JobStore.iter_results
    landed: list[str] = []

    def scan_then_last_lands(self: JobStore, job: str) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from original(self, job)
        if not landed:  # the last prompt's worker stores it just after the scan passed
            landed.append(keys[2])
            self.store_result(job, keys[2], _ok(keys[2]))

    monkeypatch.setattr(JobStore, "iter_results", scan_then_last_lands)
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["collect", job_id, "--out", str(out), "--json"])
    assert landed, "the race was not staged"
    summary = json.loads(res.stdout)
    assert summary["pending"] == 0 and summary["done"] == 3, summary
    written = sorted(str(r["key"]) for r in read_jsonl(out))
    assert written == sorted(keys), (written, summary)  # nothing the counts call done is missing
    assert summary["complete"] is True and summary["written"] == 3, summary
    assert res.exit_code == 0, (res.exception, res.stderr)


# -- 2. --wait-timeout that would be ignored, or never end the wait, is a usage error ------------
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--wait", "--wait-timeout", "nan"], "nan: must be a finite number of seconds >= 0"),
        (["--wait", "--wait-timeout", "-5"], "-5.0: must be a finite number of seconds >= 0"),
        (["--wait-timeout", "5"], "--wait-timeout needs --wait"),
    ],
)
def test_collect_refuses_a_wait_timeout_it_cannot_keep(
    tier: SimpleNamespace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    says: str,
) -> None:
    """``collect --wait --wait-timeout nan`` waited forever on a job with pending prompts
    (NaN compares false with every elapsed time), ``-5`` gave up at once, and a
    ``--wait-timeout`` without ``--wait`` was silently ignored. Each is exit 2 naming the
    option now, before the job is read; the wait is cut short here if it starts at all."""
    from typer.testing import CliRunner

    import beacon.cli.jobs as jobs
    from beacon.cli import app

    # a job of its own per case: a resubmission of one job id would find its prompts queued
    tag = f"wait-{len(argv)}-{argv[-1].replace('.', '')}"
    job_id, _, _ = _registered_job(tier, tmp_path, tag, 2)  # pending: nothing runs them
    reads: list[str] = []
    original = jobs._status_or_exit

    def status_or_exit(store: Any, job: str) -> Any:
        reads.append(job)
        if len(reads) > 3:
            raise AssertionError("collect went on waiting for a job that cannot finish")
        return original(store, job)

    monkeypatch.setattr(jobs, "_status_or_exit", status_or_exit)
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["collect", job_id, "--out", str(out), *argv])
    assert res.exit_code == 2, (res.exit_code, res.exception, res.stderr)
    err = " ".join(res.stderr.split())
    assert "--wait-timeout" in err and says in err, err
    assert reads == [] and not out.exists()  # refused before the job was read or a file made


# -- 3. a job id a shell would split is refused before anything is registered -----------------
@pytest.mark.parametrize("bad", ["night run", "a\nb", "tab\there", "bell\x07"])
def test_submit_refuses_a_job_id_with_spaces_or_control_characters(
    tier: SimpleNamespace, tmp_path: Path, bad: str
) -> None:
    """``beacon submit --job-id 'night run'`` was accepted: the id printed for
    ``JOB=$(beacon submit ...)`` then split in ``beacon status $JOB`` (as docs/bulk.md writes
    it), and a newline made two lines of it. ``submit_job`` refuses it now with a
    ``JobInputError`` on ``job_id``, and the CLI with exit 2 naming ``--job-id``; nothing is
    registered or sent."""
    import redis
    from typer.testing import CliRunner

    from beacon.cli import app
    from beacon.jobs import JobInputError
    from worker.state import UnknownJobError

    prompts = test_worker._prompts(tmp_path / "p.jsonl", 2, "job id")
    queue = f"{PREFIX}-a7-jobid-q"
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(queue)
    default_queue = tier.env["BEACON_QUEUE"]  # where the CLI would send
    before = r.llen(default_queue)
    try:
        with pytest.raises(JobInputError) as e:
            tier.submit(iter_prompt_file(prompts), SPEC, job_id=bad, store=tier.store, queue=queue)
        assert e.value.field == "job_id" and e.value.value == bad
        res = CliRunner().invoke(
            app,
            [
                "submit",
                str(prompts),
                "-g",
                "beacon.demo:generator",
                "-s",
                "beacon.demo:scorer",
                "--job-id",
                bad,
            ],
        )
        assert res.exit_code == 2, (res.exit_code, res.exception, res.stdout, res.stderr)
        assert "--job-id" in res.stderr and "no spaces or control characters" in res.stderr
        with pytest.raises(UnknownJobError):
            tier.store.meta(bad)
        assert r.llen(queue) == 0 and r.llen(default_queue) == before
    finally:
        r.delete(queue)


# -- review: format characters are no control characters (tests/test_review7_engine_worker.py)
@pytest.mark.parametrize("job_id", [
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian, with a ZWNJ
    "run-\U0001f468\u200d\U0001f469\u200d\U0001f467",  # an emoji family (ZWJ)
    "night\xadrun",  # a soft hyphen
])
def test_job_ids_with_format_characters_are_accepted(job_id: str) -> None:
    from worker.tasks import _check_submit_args  # not at collection: it reads BEACON_* once

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    _check_submit_args([], spec, job_id, None, "", False, 500, None, None)  # raises if refused


@pytest.mark.parametrize("job_id", ["a b", "a\tb", "a\nb", "a\x07b"])
def test_job_ids_with_spaces_or_control_characters_are_still_refused(job_id: str) -> None:
    from worker.tasks import _check_submit_args

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    with pytest.raises(JobInputError, match="job_id"):
        _check_submit_args([], spec, job_id, None, "", False, 500, None, None)
