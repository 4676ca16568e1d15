"""The Celery worker tier with real parts: Redis on 127.0.0.1:6379 (DB 11), real worker
processes (prefork), real SIGKILL. Nothing is skipped: if Redis does not answer, it is started
the way ``.ci/run`` starts it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import beacon
from beacon.jobs import FactorySpec, JobSpec, iter_prompt_file, read_jsonl, run_job
from worker.local_redis import ensure_local_redis

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/11"
PREFIX = f"beacon-test-{uuid.uuid4().hex[:8]}"

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def tier() -> Iterator[SimpleNamespace]:
    ensure_local_redis()
    env = {"BEACON_BROKER_URL": REDIS_URL, "BEACON_RESULT_BACKEND": REDIS_URL,
           "BEACON_STATE_URL": REDIS_URL, "BEACON_KEY_PREFIX": PREFIX,
           "BEACON_QUEUE": f"{PREFIX}-default"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # read by worker.app at import and by the CLI commands
    import redis

    from worker.state import JobStore, collect_job
    from worker.tasks import submit_job

    store = JobStore(REDIS_URL, prefix=PREFIX)
    try:
        yield SimpleNamespace(store=store, submit=submit_job, collect=collect_job, env=env)
    finally:
        r = redis.Redis.from_url(REDIS_URL)
        keys = [*r.scan_iter(f"{PREFIX}*"), *r.scan_iter(f"_kombu.binding*{PREFIX}*")]
        if keys:
            r.delete(*keys)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Worker:
    """A real worker (its own process group, so SIGKILL takes the pool children too)."""

    def __init__(self, queue: str, log: Path, *, env: dict[str, str], via_cli: bool = False,
                 concurrency: int = 2) -> None:
        name = f"{queue}-{uuid.uuid4().hex[:4]}@%h"
        if via_cli:
            cmd = [sys.executable, "-m", "beacon.cli", "worker", "-c", str(concurrency),
                   "-Q", queue, "-n", name, "-l", "WARNING"]
        else:
            cmd = [sys.executable, "-m", "celery", "-A", "worker.app", "worker",
                   f"--concurrency={concurrency}", "--pool=prefork", "--loglevel=WARNING",
                   "-Q", queue, "-n", name, "--without-gossip", "--without-mingle"]
        self.log = log
        self._fh = log.open("ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env,
                                                         "BEACON_QUEUE": queue},
                                     stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._fh.close()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


def _limits(soft: float, hard: float, vis: float) -> dict[str, str]:
    return {"BEACON_SOFT_TIME_LIMIT": str(soft), "BEACON_TIME_LIMIT": str(hard),
            "BEACON_VISIBILITY_TIMEOUT": str(vis), "BEACON_RETRY_BACKOFF_MAX": "1"}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wait(store: Any, job_id: str, timeout: float, until: Any = None,
          worker: Worker | None = None) -> Any:
    t0 = time.monotonic()
    while True:
        st = store.status(job_id)
        if (until(st) if until else st.finished):
            return st
        if worker is not None and worker.proc.poll() is not None:
            raise AssertionError(f"worker exited: {worker.log.read_text()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            log = worker.log.read_text()[-3000:] if worker else ""
            raise AssertionError(f"job {job_id} stuck at {st.to_dict()}\n{log}")
        time.sleep(0.1)


def _fitted_config() -> beacon.BeaconConfig:
    """A prior and a gaussianize transform fitted on demo-scorer logs (what a user would ship)."""
    import numpy as np

    from beacon import demo
    from beacon.fitting import fit_reward_model

    sc = demo.scorer(seed=3)
    logged = np.array([[sc.reward(f"calibration prompt {i}", f"response {j}") for j in range(12)]
                       for i in range(40)])
    return fit_reward_model(logged, family="normal", transform="gaussianize").config(
        cost=0.05, horizon=16)


def _core(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["id"], r["ok"], r["best"], r["reward"], r["n_samples"], r["stop_reason"])


# -- settings --------------------------------------------------------------------------------------
def test_settings_and_celery_config(tier: SimpleNamespace) -> None:
    from worker.app import celery_config
    from worker.config import WorkerSettings

    s = WorkerSettings.from_env({"BEACON_BROKER_URL": "amqp://guest@rabbit//",
                                 "BEACON_RESULT_BACKEND": "redis://r:6379/2",
                                 "BEACON_ALLOWED_FACTORIES": "mycorp.llm",
                                 "BEACON_SOFT_TIME_LIMIT": "100"})
    assert s.state_url == "redis://r:6379/2" and s.time_limit == 160
    assert s.visibility_timeout > s.time_limit and s.celery_soft_time_limit > s.soft_time_limit
    assert s.allowed_factories == ("beacon.demo", "mycorp.llm")
    c = celery_config(s)
    assert c["accept_content"] == ["json"] and c["task_serializer"] == "json"
    assert c["result_serializer"] == "json"
    assert c["task_acks_late"] and c["task_reject_on_worker_lost"]
    assert c["worker_prefetch_multiplier"] == 1
    assert c["broker_transport_options"]["visibility_timeout"] == s.visibility_timeout
    with pytest.raises(beacon.ConfigError) as e:
        WorkerSettings.from_env({"BEACON_SOFT_TIME_LIMIT": "60", "BEACON_TIME_LIMIT": "100",
                                 "BEACON_VISIBILITY_TIMEOUT": "50"})
    assert e.value.field == "BEACON_VISIBILITY_TIMEOUT"
    with pytest.raises(beacon.ConfigError) as e:
        WorkerSettings.from_env({"BEACON_SOFT_TIME_LIMIT": "ten"})
    assert e.value.field == "BEACON_SOFT_TIME_LIMIT"
    from worker.tasks import run_prompt

    assert run_prompt.acks_late and run_prompt.reject_on_worker_lost
    assert run_prompt.retry_backoff and run_prompt.retry_jitter


def test_submit_checks_every_argument_before_creating_the_job(tier: SimpleNamespace) -> None:
    from beacon.jobs import JobInputError, PromptRecord
    from worker.state import UnknownJobError

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    recs = [PromptRecord("a", "hello", line=1)]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"items": None}, "items"),
        ({"items": "hello"}, "items"),
        ({"items": {"a": "hello"}}, "items"),
        ({"spec": None}, "spec"),
        ({"spec": spec.to_dict()}, "spec"),
        ({"job_id": ""}, "job_id"),
        ({"job_id": 5}, "job_id"),
        ({"chunk": 0}, "chunk"),
        ({"retry_failed": "yes"}, "retry_failed"),
        ({"queue": ""}, "queue"),
        ({"source": None}, "source"),
        ({"store": "redis://"}, "store"),
    ]
    for i, (bad, field) in enumerate(cases):
        job_id = f"{PREFIX}-badargs-{i}"
        kwargs: dict[str, Any] = {"items": recs, "spec": spec, "job_id": job_id,
                                  "store": tier.store, **bad}
        with pytest.raises(JobInputError) as e:
            tier.submit(kwargs.pop("items"), kwargs.pop("spec"), **kwargs)
        assert e.value.field == field
        with pytest.raises(UnknownJobError):
            tier.store.meta(job_id)  # nothing was registered
    with pytest.raises(JobInputError) as e:
        tier.submit([recs[0], "not a record"], spec, job_id=f"{PREFIX}-badargs-item",
                    store=tier.store, queue=f"{PREFIX}-nobody-listens")
    assert e.value.field == "items[1]"


def test_cli_output_options_are_checked_before_anything_is_sent_or_awaited(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """--out / --dpo that would be ignored or fail late are usage errors (exit 2) up front:
    no job is created, no wait starts."""
    from typer.testing import CliRunner

    from beacon.cli import app
    from worker.state import UnknownJobError

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": 1, "prompt": "a"}) + "\n")
    job_id = f"{PREFIX}-cli-options"
    submit = ["submit", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
              "--job-id", job_id]
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    for extra, option, says in (
        (["--out", str(out)], "--out", "--out needs --wait"),
        (["--out", str(out), "--dpo", str(tmp_path / "d.jsonl")], "--out", "needs --wait"),
        (["--wait", "--dpo", str(tmp_path / "d.jsonl")], "--dpo", "--dpo needs --out"),
        (["--wait", "--out", str(tmp_path)], "--out", "is a directory"),
    ):
        res = runner.invoke(app, [*submit, *extra])
        assert res.exit_code == 2 and option in res.output and says in res.output, res.output
        with pytest.raises(UnknownJobError):
            tier.store.meta(job_id)  # nothing was submitted
    assert not out.exists()
    # collect: checked before the job is looked up or awaited
    for extra, option, says in (
        (["--out", str(tmp_path)], "--out", "is a directory"),
        (["--out", str(out), "--dpo", str(out), "--wait"], "--dpo", "must be different files"),
        (["--out", str(out), "--dpo", str(tmp_path)], "--dpo", "is a directory"),
    ):
        res = runner.invoke(app, ["collect", f"{PREFIX}-no-such-job", *extra])
        assert res.exit_code == 2 and option in res.output and says in res.output, res.output


def test_submit_counts_repeated_lines_and_a_bad_line_lists_every_line(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "a"}\n{broken\n{"id": 1, "prompt": "a"}\n'
                       '{"id": 2, "prompt": "b"}\n{broken\n')
    res = tier.submit(iter_prompt_file(prompts), spec, job_id=f"{PREFIX}-repeats",
                      store=tier.store, queue=f"{PREFIX}-nobody-listens")
    errors = [p["record"] for _, p in tier.store.iter_errors(res.job_id)]
    assert len(errors) == 1 and errors[0]["line"] == 2 and errors[0].get("lines") == [2, 5]
    assert "on lines 2, 5" in errors[0]["error"]["message"]
    assert (res.total, res.enqueued, res.bad_lines, res.duplicates) == (3, 2, 1, 2)
    assert res.to_dict()["duplicates"] == 2


def test_collect_writes_pairs_of_lines_collected_earlier_and_keeps_other_jobs_lines(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    spec = JobSpec(FactorySpec("beacon.demo:generator", {"seed": 1}),
                   FactorySpec("beacon.demo:scorer", {"seed": 1}),
                   beacon.BeaconConfig(cost=0.05, horizon=16))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"collect {i}"}) + "\n"
                               for i in range(10)))
    # What the workers would have stored: the outcomes of the same job run in-process.
    local, local_dpo = tmp_path / "local.jsonl", tmp_path / "local_dpo.jsonl"
    run_job(prompts, spec, local, dpo=local_dpo)
    pairs = {p["key"]: p for p in read_jsonl(local_dpo)}
    rows = list(read_jsonl(local))
    assert pairs and len(rows) == 10
    job_id = f"{PREFIX}-collect-dpo"
    tier.store.create(job_id, spec.to_dict(), source=str(prompts))
    tier.store.add_prompts(job_id, [(r["key"], {"record": {"id": r["id"]}, "line": r["line"]})
                                    for r in rows])
    for r in rows:
        tier.store.store_result(job_id, r["key"], {"record": r, "dpo": pairs.get(r["key"])})
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    other = {"key": "f" * 32, "id": "other job", "line": 1, "ok": False,
             "error": {"type": "NoSample", "message": "scorer down"}}
    out.write_text(json.dumps(other) + "\n")
    assert tier.collect(tier.store, job_id, out).written == 10  # first collect: no --dpo
    c = tier.collect(tier.store, job_id, out, dpo=dpo)
    assert (c.written, c.dpo_written) == (0, len(pairs))
    assert {p["key"]: p for p in read_jsonl(dpo)} == pairs
    before = (out.read_bytes(), dpo.read_bytes())
    again = tier.collect(tier.store, job_id, out, dpo=dpo)
    assert (again.written, again.dpo_written) == (0, 0)
    assert (out.read_bytes(), dpo.read_bytes()) == before
    assert other in list(read_jsonl(out))  # another job's failed line is left alone
    # The same keys written by another run of the job (e.g. `beacon run` of the same prompts
    # and spec drew other responses): the tier's pair would not match the line; not written.
    out2, dpo2 = tmp_path / "out2.jsonl", tmp_path / "dpo2.jsonl"
    mine = sorted(pairs)[0]
    out2.write_text("".join(json.dumps({**r, "best": "another draw", "reward": 99.0}
                                       if r["key"] == mine else r) + "\n" for r in rows))
    c = tier.collect(tier.store, job_id, out2, dpo=dpo2)
    assert (c.written, c.dpo_written, c.dpo_foreign) == (0, len(pairs) - 1, 1)
    assert {p["key"] for p in read_jsonl(dpo2)} == set(pairs) - {mine}
    assert c.to_dict()["dpo_foreign"] == 1


def test_collect_replaces_an_error_line_when_the_retried_prompt_failed_again(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    job_id = f"{PREFIX}-collect-errors"
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    tier.store.create(job_id, spec.to_dict(), source="p.jsonl")
    keys = ["a" * 32, "b" * 32]
    tier.store.add_prompts(job_id, [(k, {"record": {"id": i}, "line": i + 1})
                                    for i, k in enumerate(keys)])

    def err(key: str, message: str) -> dict[str, Any]:
        return {"record": {"key": key, "id": key[0], "line": 1, "ok": False,
                           "error": {"type": "NoSample", "message": message}}, "dpo": None}

    for k in keys:
        tier.store.store_error(job_id, k, err(k, "rate limited"))
    out = tmp_path / "out.jsonl"
    assert tier.collect(tier.store, job_id, out).written == 2
    # submit --retry-failed: the first prompt fails again, for another reason
    tier.store.store_error(job_id, keys[0], err(keys[0], "context too long"))
    c = tier.collect(tier.store, job_id, out)
    assert (c.replaced_errors, c.written) == (1, 1)
    msgs = {r["key"]: r["error"]["message"] for r in read_jsonl(out)}
    assert msgs == {keys[0]: "context too long", keys[1]: "rate limited"}
    before = out.read_bytes()
    again = tier.collect(tier.store, job_id, out)
    assert (again.replaced_errors, again.written) == (0, 0) and out.read_bytes() == before


def test_collect_purge_keeps_the_state_of_a_job_with_failed_prompts(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """`collect --purge` used to delete the state of a job whose prompts had failed, so the
    `submit --retry-failed` that followed re-sent (and paid for) every finished prompt too.
    Now it collects, keeps the state and says why; --purge-failed gives the failures up."""
    from typer.testing import CliRunner

    from beacon.cli import app
    from worker.state import UnknownJobError

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:verifier"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.05, horizon=8))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"id": 1, "prompt": "What is 1+1?", "reference": "2"}\n'
        '{"id": 2, "prompt": "What is 2+2?", "reference": "4"}\n'
        '{"id": 3, "prompt": "What is 3+3?"}\n')  # no reference: the verifier fails it
    # What the workers would store: the outcomes of the same job run in-process.
    local = tmp_path / "local.jsonl"
    run_job(prompts, spec, local)
    rows = {r["key"]: r for r in read_jsonl(local)}
    assert sorted(r["ok"] for r in rows.values()) == [False, True, True]
    job_id = f"{PREFIX}-purge-failed"
    nobody = f"{PREFIX}-nobody-listens"
    sub = tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                      queue=nobody)
    assert sub.enqueued == 3
    for key, r in rows.items():
        if r["ok"]:
            tier.store.store_result(job_id, key, {"record": r, "dpo": None})
        else:
            tier.store.store_error(job_id, key, {"record": r, "dpo": None})
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    res = runner.invoke(app, ["collect", job_id, "--out", str(out), "--purge", "--json"])
    assert res.exit_code == 1, res.output
    payload = json.loads(res.stdout)
    assert payload["purged"] is False and "--purge-failed" in payload["purge_refused"]
    assert payload["written"] == 3 and payload["complete"] is True
    assert tier.store.meta(job_id)  # the state is kept
    res = runner.invoke(app, ["collect", job_id, "--out", str(out), "--purge"])
    assert res.exit_code == 1 and "not purged: 1 prompt(s) failed" in res.output, res.output
    # The retry sends only the failed prompt: the finished ones are not paid for again.
    retry = tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                        queue=nobody, retry_failed=True)
    assert (retry.enqueued, retry.already) == (1, 2)
    # While the retry runs the prompt is pending: not even --purge-failed purges the job
    # under it (its paid result would have nowhere to go).
    res = runner.invoke(app, ["collect", job_id, "--out", str(out), "--purge",
                              "--purge-failed", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["purged"] is False, res.output
    assert "pending" in json.loads(res.stdout)["purge_refused"]
    for key, r in rows.items():  # the retry fails again, as the worker would store it
        if not r["ok"]:
            tier.store.store_error(job_id, key, {"record": r, "dpo": None})
    # --purge-failed needs --purge (exit 2, nothing purged) and gives the failures up.
    res = runner.invoke(app, ["collect", job_id, "--out", str(out), "--purge-failed"])
    assert res.exit_code == 2 and "--purge-failed" in res.output, res.output
    assert tier.store.meta(job_id)
    res = runner.invoke(app, ["collect", job_id, "--out", str(out), "--purge",
                              "--purge-failed", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["purged"] is True, res.output
    with pytest.raises(UnknownJobError):
        tier.store.meta(job_id)
    assert sorted(r["ok"] for r in read_jsonl(out)) == [False, True, True]


def test_collect_purge_never_drops_a_result_stored_during_the_collect(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last prompt finishing while `collect --purge` scans the results: the job then
    reads as finished, but its result was not written yet. It used to be purged unwritten
    (a lost, paid result); now the collect runs again before purging."""
    from typer.testing import CliRunner

    from beacon.cli import app
    from worker.state import JobStore, UnknownJobError

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=8))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"late {i}"}) + "\n"
                               for i in range(3)))
    local = tmp_path / "local.jsonl"
    run_job(prompts, spec, local)
    rows = list(read_jsonl(local))
    job_id = f"{PREFIX}-purge-late"
    tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                queue=f"{PREFIX}-nobody-listens")
    for r in rows[:2]:
        tier.store.store_result(job_id, r["key"], {"record": r, "dpo": None})
    late = rows[2]
    original = JobStore.iter_results

    def iter_results(self: Any, jid: str) -> Any:
        yield from original(self, jid)
        if jid == job_id:  # the worker stores the last result just after the scan
            tier.store.store_result(job_id, late["key"], {"record": late, "dpo": None})

    monkeypatch.setattr(JobStore, "iter_results", iter_results)
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["collect", job_id, "--out", str(out), "--purge", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["purged"] is True
    assert sorted(r["key"] for r in read_jsonl(out)) == sorted(r["key"] for r in rows)
    with pytest.raises(UnknownJobError):
        tier.store.meta(job_id)


# -- a few hundred prompts, the fitted config travels, bad lines fail alone --
def test_worker_job_matches_in_process_run(tier: SimpleNamespace, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    queue = f"{PREFIX}-main"
    cfg = _fitted_config()
    spec = JobSpec(FactorySpec("beacon.demo:generator", {"seed": 3}),
                   FactorySpec("beacon.demo:scorer", {"seed": 3}), cfg)
    n = 300
    prompts = tmp_path / "p.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt": f"bulk prompt {i}"}) + "\n")
        f.write('{"id": "broken", "prompt": \n')
        f.write(json.dumps({"id": "evil", "prompt": "hi",
                            "scorer": {"factory": "subprocess:run", "kwargs": {}}}) + "\n")
    # In-process first: it also builds the fitted prior's h-table into the on-disk cache that
    # the workers then load (building it is minutes of CPU on a loaded 2-core machine).
    local = tmp_path / "local.jsonl"
    run_job(prompts, spec, local)
    w = Worker(queue, tmp_path / "worker.log", env=_limits(60, 90, 120))
    try:
        res = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                          source=str(prompts), queue=queue)
        assert (res.total, res.enqueued, res.bad_lines) == (n + 2, n + 1, 1)
        st = _wait(tier.store, res.job_id, 150, worker=w)
        assert (st.done, st.failed, st.pending) == (n, 2, 0)
        again = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                            source=str(prompts), queue=queue)
        assert again.job_id == res.job_id and again.enqueued == 0
    finally:
        w.stop()
    runner = CliRunner()
    assert runner.invoke(app, ["status", "no-such-job"]).exit_code == 2
    status = runner.invoke(app, ["status", res.job_id, "--json"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["done"] == n
    out, dpo = tmp_path / "tier.jsonl", tmp_path / "tier_dpo.jsonl"
    col = runner.invoke(app, ["collect", res.job_id, "--out", str(out), "--dpo", str(dpo)])
    assert col.exit_code == 1, col.output  # two prompts failed
    rows = list(read_jsonl(out))
    assert len(rows) == n + 2 and len({r["key"] for r in rows}) == n + 2
    by_line = {r["line"]: r for r in rows}
    assert by_line[n + 1]["error"]["field"] == "line"
    assert "not valid JSON" in by_line[n + 1]["error"]["message"]
    evil = by_line[n + 2]["error"]
    assert evil["type"] == "FactoryNotAllowedError" and evil["value"] == "subprocess:run"
    assert runner.invoke(app, ["collect", res.job_id, "--out", str(out)]).exit_code == 1
    assert len(list(read_jsonl(out))) == n + 2  # collecting again adds nothing

    # The same job in-process gives the same answers: the fitted prior and transform travelled.
    tier_ok = {r["key"]: _core(r) for r in rows if r["ok"]}
    local_ok = {r["key"]: _core(r) for r in read_jsonl(local) if r["ok"]}
    assert len(tier_ok) == n and tier_ok == local_ok
    # ... and the comparison can tell configs apart: Jeffreys' default decides differently.
    plain = tmp_path / "plain.jsonl"
    run_job(prompts, JobSpec(spec.generator, spec.scorer,
                             beacon.BeaconConfig(cost=0.05, horizon=16)), plain)
    plain_by_id = {r["id"]: r["n_samples"] for r in read_jsonl(plain) if r["ok"]}
    assert any(plain_by_id[r[0]] != r[4] for r in tier_ok.values())
    pairs = list(read_jsonl(dpo))
    assert pairs and all(p["margin"] > 0 for p in pairs)
    assert {p["key"] for p in pairs} <= set(tier_ok)


# -- SIGKILL mid-job: every prompt exactly once --
def _unacked_in(queue: str) -> int:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    n = 0
    for raw in r.hvals("unacked"):
        _msg, _exchange, routing_key = json.loads(raw)
        n += routing_key == queue
    return n


def test_sigkilled_worker_loses_nothing_and_duplicates_nothing(tier: SimpleNamespace,
                                                               tmp_path: Path) -> None:
    queue = f"{PREFIX}-fault"
    spec = JobSpec(FactorySpec("beacon.demo:generator", {"latency_ms": 10}),
                   FactorySpec("beacon.demo:verifier"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.02, horizon=8))
    n = 300
    prompts = tmp_path / "p.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt": f"What is {i} times 3?",
                                "reference": str(3 * i)}) + "\n")
    limits = _limits(2, 3, 5)
    a = Worker(queue, tmp_path / "a.log", env=limits)
    try:
        res = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                          source=str(prompts), queue=queue)
        at_kill = _wait(tier.store, res.job_id, 90, until=lambda s: s.done >= 40, worker=a)
    finally:
        a.kill(signal.SIGKILL)
    assert at_kill.pending > 0, "the job finished before the kill; nothing was tested"
    stranded = _unacked_in(queue)
    assert stranded >= 1  # messages the dead worker held, acked by nobody
    # The kill may also land between Redis's pop and kombu's unacked bookkeeping, which loses
    # that message in the broker; the new worker's sweeper must find and resend it.
    b = Worker(queue, tmp_path / "b.log", via_cli=True,
               env={**limits, "BEACON_SWEEP_INTERVAL": "2", "BEACON_SWEEP_GRACE": "1"})
    try:
        st = _wait(tier.store, res.job_id, 120, worker=b)
    finally:
        b.stop()
    assert (st.done, st.failed) == (n, 0)
    assert _unacked_in(queue) == 0
    out = tmp_path / "out.jsonl"
    tier.collect(tier.store, res.job_id, out)
    lines = out.read_text().splitlines()
    ids = Counter(json.loads(x)["id"] for x in lines)
    assert len(lines) == n and set(ids) == set(range(n)) and max(ids.values()) == 1


# -- a message the broker lost (popped by a worker that died before recording it) is resent --
def _queued(queue: str) -> int:
    import redis

    return int(redis.Redis.from_url(REDIS_URL).llen(queue))


def test_lost_messages_are_found_and_resent_exactly_once(tier: SimpleNamespace,
                                                         tmp_path: Path) -> None:
    import redis
    from typer.testing import CliRunner

    from beacon.cli import app as cli
    from worker.recovery import broker_digests, requeue_lost
    from worker.tasks import resend

    queue = f"{PREFIX}-lost"
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:verifier"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.02, horizon=8))
    n = 12
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"What is {i} times 3?",
                                           "reference": str(3 * i)}) + "\n" for i in range(n)))
    res = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                      source=str(prompts), queue=queue)
    r = redis.Redis.from_url(REDIS_URL)
    assert _queued(queue) == n
    # What a dying worker does to the broker: one message popped and never recorded (lost),
    # one popped and recorded as unacknowledged (held; the visibility timeout restores it).
    lost_raw = r.rpop(queue)
    held_raw = r.rpop(queue)
    r.hset("unacked", f"{PREFIX}-tag", json.dumps([json.loads(held_raw), "", queue]))
    try:
        keys = broker_digests(r, [queue], [res.job_id])[res.job_id]
        assert len(keys) == n - 1  # the held message counts as present
        sent: list[list[str]] = []

        def send(job_id: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
            sent.append([k for k, _ in items])
            resend(job_id, items, q, store=tier.store)

        # Messages sent moments ago are left alone: a submission may still be sending.
        fresh = requeue_lost(tier.store, res.job_id, broker_url=REDIS_URL, send=send,
                             grace=3600.0, settle=0.0)
        assert (fresh.lost, sent) == (0, []) and fresh.skipped
        rq = requeue_lost(tier.store, res.job_id, broker_url=REDIS_URL, send=send,
                          grace=0.0, settle=0.2)
        assert (rq.pending, rq.lost) == (n, 1) and len(sent) == 1
        (lost_key,) = sent[0]
        msg = json.loads(lost_raw)
        assert json.loads(base64.b64decode(msg["body"]))[0][1] == lost_key  # that very prompt
        assert _queued(queue) == n - 1  # the resent one is back; the held one is not doubled
        again = requeue_lost(tier.store, res.job_id, broker_url=REDIS_URL, send=send,
                             grace=0.0, settle=0.2)
        assert again.lost == 0 and len(sent) == 1
        # The CLI does the same (nothing lost now) and reports it.
        out = CliRunner().invoke(cli, ["status", res.job_id, "--requeue-lost", "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["requeue"]["lost"] == 0
    finally:
        r.hdel("unacked", f"{PREFIX}-tag")
    r.lpush(queue, held_raw)  # as the visibility-timeout restore would
    assert r.rpop(queue) is not None  # and lose one more: the worker's own sweeper must find it
    w = Worker(queue, tmp_path / "w.log",
               env={**_limits(5, 8, 20), "BEACON_SWEEP_INTERVAL": "1", "BEACON_SWEEP_GRACE": "0"})
    try:
        st = _wait(tier.store, res.job_id, 90, worker=w)
    finally:
        w.stop()
    assert (st.done, st.failed) == (n, 0)
    out_file = tmp_path / "out.jsonl"
    tier.collect(tier.store, res.job_id, out_file)
    ids = Counter(json.loads(x)["id"] for x in out_file.read_text().splitlines())
    assert set(ids) == set(range(n)) and max(ids.values()) == 1


def test_backstop_partial_result_keeps_rewards_candidates_and_its_dpo_pair(
    tier: SimpleNamespace
) -> None:
    """The line stored when Celery's backstop limit fires has the usual fields (rewards in draw
    order, candidates when kept) and the DPO pair of the samples seen: paid samples are not
    lost, and the pair's chosen side is the line's best."""
    from celery.exceptions import SoftTimeLimitExceeded

    from beacon.events import SampleEvent
    from beacon.jobs import PromptRecord
    from worker.tasks import _partial_outcome

    rec = PromptRecord("q", "a prompt", metadata={"src": "t"}, line=3)
    events = [SampleEvent(1, 0, 0.5, "mid", False), SampleEvent(1, 1, None, "", True, "boom"),
              SampleEvent(2, 2, 0.9, "top", False), SampleEvent(3, 3, 0.1, "low", False)]
    o = _partial_outcome("k" * 32, rec, events, SoftTimeLimitExceeded(), keep_candidates=True)
    r = o.record
    assert r["ok"] and (r["best"], r["reward"], r["best_index"]) == ("top", 0.9, 2)
    assert r["rewards"] == [0.5, None, 0.9, 0.1] and (r["n_samples"], r["n_failed"]) == (3, 1)
    assert [c["text"] for c in r["candidates"]] == ["mid", "", "top", "low"]
    assert r["metadata"] == {"src": "t"} and r["stop_reason"] == "budget"
    assert o.dpo is not None
    assert (o.dpo["chosen"], o.dpo["rejected"], o.dpo["key"]) == ("top", "low", "k" * 32)
    one = _partial_outcome("k" * 32, rec, events[:1], SoftTimeLimitExceeded())
    assert one.ok and one.dpo is None and "candidates" not in one.record
    none = _partial_outcome("k" * 32, rec, events[1:2], SoftTimeLimitExceeded())
    assert not none.ok and none.dpo is None


# -- time limit keeps the partial result; a disallowed job-level factory fails every prompt --
def test_time_limit_saves_partial_result_and_disallowed_job_fails_clearly(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    queue = f"{PREFIX}-limits"
    slow = JobSpec(FactorySpec("beacon.demo:generator", {"latency_ms": 250}),
                   FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(family="normal", cost=1e-9, horizon=32))
    evil = JobSpec(FactorySpec("os:system", {"command": "touch /tmp/beacon-pwned"}),
                   FactorySpec("beacon.demo:scorer"), beacon.BeaconConfig(family="normal"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"slow {i}"}) + "\n"
                               for i in range(2)))
    w = Worker(queue, tmp_path / "w.log", env=_limits(2, 4, 8))
    try:
        r1 = tier.submit(iter_prompt_file(prompts), slow, job_id=f"slow-{uuid.uuid4().hex[:6]}",
                         queue=queue)
        r2 = tier.submit(iter_prompt_file(prompts), evil, job_id=f"evil-{uuid.uuid4().hex[:6]}",
                         queue=queue)
        s1 = _wait(tier.store, r1.job_id, 60, worker=w)
        s2 = _wait(tier.store, r2.job_id, 60, worker=w)
    finally:
        w.stop()
    assert s1.done == 2
    tier.collect(tier.store, r1.job_id, tmp_path / "slow.jsonl")
    for r in read_jsonl(tmp_path / "slow.jsonl"):
        assert r["ok"] and r["stop_reason"] == "budget" and 3 <= r["n_samples"] < 32
    assert s2.failed == 2 and s2.done == 0
    tier.collect(tier.store, r2.job_id, tmp_path / "evil.jsonl")
    for r in read_jsonl(tmp_path / "evil.jsonl"):
        assert r["error"]["type"] == "FactoryNotAllowedError"
        assert "os" in r["error"]["message"] and "BEACON_ALLOWED_FACTORIES" in r["error"]["message"]
    assert not Path("/tmp/beacon-pwned").exists()


# -- submission: an unreachable broker leaves nothing behind; a resubmission sends no duplicate --
def test_submit_to_an_unreachable_broker_fails_clearly_and_registers_nothing(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """A job registered without its messages would be sent later by the workers' sweeper,
    although its submitter was told the submission failed."""
    import socket

    import redis

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    prefix = f"{PREFIX}-nobroker"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"q {i}"}) + "\n"
                               for i in range(3)))
    env = {**os.environ, **tier.env, "BEACON_BROKER_URL": f"redis://127.0.0.1:{closed}/11",
           "BEACON_RESULT_BACKEND": REDIS_URL, "BEACON_STATE_URL": REDIS_URL,
           "BEACON_KEY_PREFIX": prefix}
    p = subprocess.run([sys.executable, "-m", "beacon.cli", "submit", str(prompts), "-g",
                        "beacon.demo:generator", "-s", "beacon.demo:scorer", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert list(redis.Redis.from_url(REDIS_URL).scan_iter(f"{prefix}*")) == []
    assert f"cannot reach the broker 'redis://127.0.0.1:{closed}/11'" in p.stderr
    assert "nothing was submitted" in p.stderr and p.stdout == ""


def test_resubmitting_a_running_job_sends_only_prompts_the_broker_lost(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    import redis

    queue = f"{PREFIX}-resubmit"
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(family="normal"))
    n = 6
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"q {i}"}) + "\n"
                               for i in range(n)))

    def submit() -> Any:
        return tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                           queue=queue)

    r = redis.Redis.from_url(REDIS_URL)
    try:
        first = submit()
        assert (first.enqueued, _queued(queue)) == (n, n)
        again = submit()  # every task still waiting: each would run (and be paid for) twice
        assert (again.job_id, again.enqueued, _queued(queue)) == (first.job_id, 0, n)
        assert (first.queued, again.queued) == (0, n)
        lost = r.rpop(queue)  # popped by a worker that died before recording it
        held = r.rpop(queue)  # running: held unacknowledged
        r.hset("unacked", f"{PREFIX}-held", json.dumps([json.loads(held), "", queue]))
        third = submit()
        assert (third.enqueued, third.queued, third.already) == (1, n - 1, 0)
        sent = {_task_key(raw) for raw in r.lrange(queue, 0, -1)}
        assert _task_key(lost) in sent and _task_key(held) not in sent
        assert _queued(queue) == n - 1
    finally:
        r.hdel("unacked", f"{PREFIX}-held")
        r.delete(queue)


def _task_key(raw: bytes) -> str:
    return str(json.loads(base64.b64decode(json.loads(raw)["body"]))[0][1])


# -- a worker configured with another key prefix or state store must not eat the job's messages --
def _wait_unless_lost(store: Any, job_id: str, queue: str, timeout: float,
                      worker: Worker) -> Any:
    """Wait for the job to finish; fail at once when its messages are gone (nothing queued or
    held unacknowledged on ``queue``, twice a second apart) while prompts are still pending."""
    t0 = time.monotonic()
    gone = 0
    while True:
        st = store.status(job_id)
        if st.finished:
            return st
        if worker.proc.poll() is not None:
            raise AssertionError(f"worker exited: {worker.log.read_text()[-3000:]}")
        gone = gone + 1 if _queued(queue) + _unacked_in(queue) == 0 else 0
        if gone >= 10:
            raise AssertionError(f"job {job_id}: {st.pending} prompt(s) pending but no message "
                                 f"left on {queue}\n{worker.log.read_text()[-3000:]}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"job {job_id} stuck at {st.to_dict()}\n"
                                 f"{worker.log.read_text()[-3000:]}")
        time.sleep(0.1)


def _prompts(path: Path, n: int, tag: str) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"{tag} {i}"}) + "\n"
                            for i in range(n)))
    return path


def test_a_worker_with_another_key_prefix_completes_the_submitters_job(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """A worker started with another BEACON_KEY_PREFIX on the submitter's queue and state
    store used to look the job up under its own prefix, fail, and acknowledge the message:
    the prompt stayed pending forever. The message says where its job lives."""
    import redis

    queue, other = f"{PREFIX}-otherprefix", f"{PREFIX}-wrongprefix"
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    n = 4
    prompts = _prompts(tmp_path / "p.jsonl", n, "prefix")
    w = Worker(queue, tmp_path / "w.log",
               env={**_limits(10, 15, 30), "BEACON_KEY_PREFIX": other,
                    "BEACON_SWEEP_INTERVAL": "0"})
    try:
        res = tier.submit(iter_prompt_file(prompts), spec, job_id=f"{PREFIX}-prefix-job",
                          store=tier.store, queue=queue)
        st = _wait_unless_lost(tier.store, res.job_id, queue, 120, worker=w)
    finally:
        w.stop()
    assert (st.done, st.failed) == (n, 0)
    assert list(redis.Redis.from_url(REDIS_URL).scan_iter(f"{other}:*")) == []
    log = w.log.read_text()
    assert f"BEACON_KEY_PREFIX={other!r}" in log and f"{PREFIX!r}" in log, log[-3000:]


def test_a_worker_on_another_state_store_leaves_the_messages_to_a_right_one(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """A worker whose BEACON_STATE_URL is another Redis (the job is not there) used to fail the
    prompt and acknowledge its message: lost. Now it refuses the message without acknowledging
    it (an error naming both prefixes), so a correctly configured worker runs it; messages
    from submitters that predate the header still run on a matching worker."""
    import redis

    from beacon.jobs import PromptRecord
    from beacon.jobs.keys import prompt_key
    from worker.tasks import run_prompt

    queue, other = f"{PREFIX}-otherstore", f"{PREFIX}-m"
    other_url = "redis://127.0.0.1:6379/12"
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    n = 4
    prompts = _prompts(tmp_path / "p.jsonl", n, "store")
    r12 = redis.Redis.from_url(other_url)
    m = Worker(queue, tmp_path / "m.log",
               env={**_limits(10, 15, 30), "BEACON_STATE_URL": other_url,
                    "BEACON_RESULT_BACKEND": other_url, "BEACON_KEY_PREFIX": other,
                    "BEACON_SWEEP_INTERVAL": "0"})
    try:
        res = tier.submit(iter_prompt_file(prompts), spec, job_id=f"{PREFIX}-store-job",
                          store=tier.store, queue=queue)
        t0 = time.monotonic()
        # A third refusal means a process finished refusing one (its Reject went through) and
        # took another: the worker has 2 processes, each holds one message while it refuses.
        while m.log.read_text().count("refused prompt") < 3:
            assert _queued(queue) + _unacked_in(queue) > 0, (
                f"the misconfigured worker took every message\n{m.log.read_text()[-3000:]}")
            assert m.proc.poll() is None and time.monotonic() - t0 < 120, m.log.read_text()
            time.sleep(0.1)
    finally:
        m.stop()
    log = m.log.read_text()
    assert f"BEACON_KEY_PREFIX={other!r}" in log and f"{PREFIX!r}" in log, log[-3000:]
    assert tier.store.status(res.job_id).pending == n  # refused, not failed
    # A message as submitters sent it before the header existed (no prefix, no store id).
    rec = PromptRecord("legacy", "store legacy", line=n + 1)
    key = prompt_key(rec, spec)
    tier.store.add_prompts(res.job_id, [(key, {"record": rec.to_dict(), "line": n + 1})])
    run_prompt.s(res.job_id, key, rec.to_dict(), n + 1,
                 tier.store.spec_ref(spec.to_dict())).apply_async(queue=queue)
    c = Worker(queue, tmp_path / "c.log", env=_limits(10, 15, 30))
    try:
        st = _wait_unless_lost(tier.store, res.job_id, queue, 120, worker=c)
    finally:
        c.stop()
    try:
        assert (st.total, st.done, st.failed) == (n + 1, n + 1, 0)
        assert list(r12.scan_iter(f"{PREFIX}*")) == []  # nothing written to the wrong store
    finally:
        stale = list(r12.scan_iter(f"{PREFIX}*"))
        if stale:
            r12.delete(*stale)


def test_message_headers_are_checked_and_named_on_the_bulk_page(tier: SimpleNamespace) -> None:
    from worker.tasks import (
        HEADER_PREFIX,
        HEADER_STORE,
        ForeignStoreError,
        MessageHeaderError,
        _store_for_message,
        get_store,
    )

    job = f"{PREFIX}-headers"
    assert _store_for_message(job, {}) is get_store()  # an older submitter's message
    from worker.state import JobStore

    mine = JobStore(REDIS_URL, prefix=f"{PREFIX}-elsewhere").store_id()
    ok = _store_for_message(job, {HEADER_PREFIX: f"{PREFIX}-elsewhere", HEADER_STORE: mine})
    assert ok.prefix == f"{PREFIX}-elsewhere" and ok.r is get_store().r
    for bad, field in (({HEADER_PREFIX: ""}, HEADER_PREFIX),
                       ({HEADER_PREFIX: "a b"}, HEADER_PREFIX),
                       ({HEADER_PREFIX: 5}, HEADER_PREFIX),
                       ({HEADER_PREFIX: PREFIX, HEADER_STORE: ""}, HEADER_STORE),
                       ({HEADER_PREFIX: PREFIX, HEADER_STORE: ["x"]}, HEADER_STORE)):
        with pytest.raises(MessageHeaderError) as e:
            _store_for_message(job, bad)
        assert (e.value.field, e.value.value) == (field, bad[field])
    with pytest.raises(ForeignStoreError) as f:
        _store_for_message(job, {HEADER_PREFIX: PREFIX, HEADER_STORE: "0" * 32})
    assert f.value.field == "BEACON_STATE_URL" and "0" * 32 in str(f.value)
    text = (ROOT / "docs" / "bulk.md").read_text()
    for name in (HEADER_PREFIX, HEADER_STORE, "MessageHeaderError", "store-id"):
        assert f"`{name}" in text or f":{name}`" in text, name


def test_resending_a_job_submitted_with_two_specs_sends_each_prompt_with_its_own_spec(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """A job id reused with another spec (``--job-id``) holds prompts of both specs. The
    sweeper and ``status --requeue-lost`` used to resend every pending prompt with the
    latest spec, so a worker failed the first spec's prompts ("key does not match the prompt
    and job spec")."""
    import redis

    from beacon.jobs import PromptRecord
    from beacon.jobs.keys import prompt_key
    from worker.recovery import requeue_lost
    from worker.tasks import resend

    queue = f"{PREFIX}-twospecs"
    prompts = _prompts(tmp_path / "p.jsonl", 2, "two specs")
    job_id = f"{PREFIX}-two-specs"
    specs = [JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                     beacon.BeaconConfig(cost=c, horizon=4)) for c in (0.1, 0.2)]
    r = redis.Redis.from_url(REDIS_URL)
    try:
        for spec in specs:
            tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                        queue=queue)
        r.delete(queue)  # the broker lost every message
        rq = requeue_lost(tier.store, job_id, broker_url=REDIS_URL, force=True,
                          send=lambda j, items, q: resend(j, items, q, store=tier.store))
        assert rq.lost == 4 and _queued(queue) == 4
        for raw in r.lrange(queue, 0, -1):
            job, key, record, line, ref = json.loads(
                base64.b64decode(json.loads(raw)["body"]))[0]
            spec = JobSpec.from_dict(tier.store.spec(job, ref))
            # What the worker checks before it runs the prompt.
            assert prompt_key(PromptRecord.from_dict(record, line=line), spec) == key
    finally:
        r.delete(queue)


def test_a_job_moved_to_another_queue_does_not_resend_what_waits_in_the_first(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """Submitting a job again to another queue (BEACON_QUEUE, e.g. to move it to a faster
    pool) rightly sends nothing that still waits in the first queue, but the job then
    recorded only the new queue: the sweeper and ``status --requeue-lost`` scanned that one,
    took every prompt waiting in the first for lost and sent it again (run and paid twice)."""
    import redis

    from worker.recovery import requeue_lost
    from worker.tasks import resend

    q1, q2, q3 = (f"{PREFIX}-move{i}" for i in (1, 2, 3))
    n = 3
    prompts = _prompts(tmp_path / "p.jsonl", n, "moved")
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    r = redis.Redis.from_url(REDIS_URL)
    sent: list[str] = []

    def send(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
        sent.extend(k for k, _ in items)
        resend(j, items, q, store=tier.store)

    try:
        first = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                            store=tier.store, queue=q1)
        moved = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                            store=tier.store, queue=q2)
        assert (first.enqueued, moved.enqueued, moved.queued) == (n, 0, n)
        rq = requeue_lost(tier.store, first.job_id, broker_url=REDIS_URL, send=send,
                          grace=0.0, settle=0.0)
        assert (rq.pending, rq.lost, sent) == (n, 0, [])
        again = tier.submit(iter_prompt_file(prompts), spec, input_digest=_digest(prompts),
                            store=tier.store, queue=q3)  # and once more: q1 still counts
        assert (again.enqueued, again.queued) == (0, n)
        lost = r.rpop(q1)  # one message the broker loses: that one alone is sent, to q3
        rq = requeue_lost(tier.store, first.job_id, broker_url=REDIS_URL, send=send,
                          grace=0.0, settle=0.0)
        assert (rq.lost, sent, _queued(q3)) == (1, [_task_key(lost)], 1)
        assert (_queued(q1), _queued(q2)) == (n - 1, 0)
    finally:
        r.delete(q1, q2, q3)


def test_a_prompt_that_kills_its_worker_process_is_failed_not_run_forever(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """A prompt whose run kills the pool process (out of memory, a crash in native code, a
    SIGKILL) had its message requeued by ``task_reject_on_worker_lost`` and run again, at
    once, forever: every run paid for, the job never finished. After BEACON_MAX_LOST_RUNS
    lost runs it is failed with an error that says so; the other prompts are not affected."""
    queue = f"{PREFIX}-poison"
    runs = tmp_path / "runs.txt"
    mod = tmp_path / "poison_factories.py"
    mod.write_text(
        "import os, signal\n"
        "async def generate(prompt):\n"
        "    if 'poison' in str(prompt):\n"
        f"        with open({str(runs)!r}, 'a') as f:\n"
        "            f.write('run\\n')\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return 'fine'\n"
        "def generator():\n"
        "    return generate\n")
    spec = JobSpec(FactorySpec("poison_factories:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "ok", "prompt": "fine"}\n{"id": "bad", "prompt": "poison"}\n')
    limit = 2
    # soft 20 s: the "ok" prompt's first run in a fresh pool process loads beacon and its
    # tables, which took over 10 s once on 2 cores shared with other test runs
    w = Worker(queue, tmp_path / "w.log", concurrency=1,
               env={**_limits(20, 25, 30), "BEACON_MAX_LOST_RUNS": str(limit),
                    "BEACON_ALLOWED_FACTORIES": "poison_factories",
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    try:
        res = tier.submit(iter_prompt_file(prompts), spec, job_id=f"{PREFIX}-poison-job",
                          store=tier.store, queue=queue)
        t0 = time.monotonic()
        while not tier.store.status(res.job_id).finished:
            n = len(runs.read_text().splitlines()) if runs.exists() else 0
            assert n <= limit, f"the poison prompt ran {n} times\n{w.log.read_text()[-2000:]}"
            assert time.monotonic() - t0 < 180, w.log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        w.stop()
    st = tier.store.status(res.job_id)
    assert (st.done, st.failed) == (1, 1)
    assert len(runs.read_text().splitlines()) == limit
    (err,) = [p["record"] for _, p in tier.store.iter_errors(res.job_id)]
    assert err["id"] == "bad" and err["error"]["type"] == "LostRunsError"
    assert err["error"]["field"] == "BEACON_MAX_LOST_RUNS" and err["error"]["value"] == limit


def test_a_redis_blip_while_storing_does_not_run_the_prompt_again(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis unreachable for a moment when the outcome is stored: the task used to be retried
    as a whole (autoretry), so the prompt ran, and was paid for, a second time. The store is
    retried; the prompt runs once."""
    import redis

    from beacon.jobs import PromptRecord
    from beacon.jobs.execute import PromptExecutor
    from beacon.jobs.keys import prompt_key
    from worker.state import JobStore
    from worker.tasks import get_store, run_prompt

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    job_id = f"{PREFIX}-blip"
    rec = PromptRecord("blip", "a prompt stored during a blip", line=1)
    key = prompt_key(rec, spec)
    store = get_store()
    ref = store.create(job_id, spec.to_dict(), source="blip")
    store.add_prompts(job_id, [(key, {"record": rec.to_dict(), "line": 1, "spec": ref})])
    runs: list[str] = []
    original_run, original_store = PromptExecutor.run, JobStore.store_result

    def counting_run(self: Any, record: Any, k: str, **kw: Any) -> Any:
        runs.append(k)
        return original_run(self, record, k, **kw)

    blips = [redis.exceptions.ConnectionError("Connection refused (a blip)")]

    def flaky_store(self: Any, *a: Any, **kw: Any) -> Any:
        if blips:
            raise blips.pop()
        return original_store(self, *a, **kw)

    monkeypatch.setattr(PromptExecutor, "run", counting_run)
    monkeypatch.setattr(JobStore, "store_result", flaky_store)
    out = run_prompt.apply(args=[job_id, key, rec.to_dict(), 1, ref])
    assert out.get(propagate=True) == "ok"
    assert not blips and runs == [key]  # stored after the blip, run once
    assert store.status(job_id).done == 1


def test_redis_outages_while_storing_are_not_counted_as_dead_worker_processes(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis down past the store's patience, three times, while a finished outcome was stored
    (and the run's end could not be counted either): the task's own retries then failed the
    prompt as "the worker process ... died 3 time(s)" (LostRunsError) with no result stored,
    although no process died. The retries are not counted as lost runs."""
    import redis

    import worker.tasks as tasks
    from beacon.jobs import PromptRecord
    from beacon.jobs.keys import prompt_key
    from worker.state import JobStore

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    job_id = f"{PREFIX}-outages"
    rec = PromptRecord("outage", "a prompt stored during outages", line=1)
    key = prompt_key(rec, spec)
    store = tasks.get_store()
    ref = store.create(job_id, spec.to_dict(), source="outages")
    store.add_prompts(job_id, [(key, {"record": rec.to_dict(), "line": 1, "spec": ref})])
    assert tasks.settings.max_lost_runs > 0
    outages = [tasks.settings.max_lost_runs]  # as many outages as the lost-run limit
    original_store, original_end = JobStore.store_result, JobStore.end_run

    def down_store(self: Any, *a: Any, **kw: Any) -> Any:
        if outages[0] > 0:
            raise redis.exceptions.ConnectionError("Redis down (an outage)")
        return original_store(self, *a, **kw)

    def down_end(self: Any, *a: Any, **kw: Any) -> Any:
        if outages[0] > 0:
            outages[0] -= 1  # the outage ends after the run's end could not be counted
            raise redis.exceptions.ConnectionError("Redis down (an outage)")
        return original_end(self, *a, **kw)

    monkeypatch.setattr(tasks, "SAVE_PATIENCE", 0.0)  # each outage outlasts the patience
    monkeypatch.setattr(JobStore, "store_result", down_store)
    monkeypatch.setattr(JobStore, "end_run", down_end)
    out = tasks.run_prompt.apply(args=[job_id, key, rec.to_dict(), 1, ref])
    assert out.get(propagate=True) == "ok"
    assert outages == [0] and store.has_result(job_id, key)
    assert store.status(job_id).failed == 0


def test_a_message_from_this_store_costs_no_store_id_read(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store id a message names was read afresh from Redis for every message (the tuple
    of cached and fresh ids was built eagerly): one more round trip per prompt."""
    import worker.tasks as tasks
    from worker.state import JobStore

    store = tasks.get_store()
    headers = {tasks.HEADER_PREFIX: store.prefix, tasks.HEADER_STORE: store.store_id()}
    fresh_reads: list[bool] = []
    original = JobStore.store_id

    def counting(self: Any, *, create: bool = True, fresh: bool = False) -> str | None:
        fresh_reads.append(fresh)
        return original(self, create=create, fresh=fresh)

    monkeypatch.setattr(JobStore, "store_id", counting)
    for _ in range(3):
        assert tasks._store_for_message("any-job", headers) is store
    assert True not in fresh_reads
    with pytest.raises(tasks.ForeignStoreError):  # another store's id is read again, refused
        tasks._store_for_message("any-job", {**headers, tasks.HEADER_STORE: "not-this-one"})
    assert fresh_reads.count(True) == 1


def test_a_retried_failed_prompt_is_pending_until_its_retry_ends(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """``submit --retry-failed`` resent a failed prompt but left its old error in place, so
    the job still read as finished (pending 0) while the retry ran: ``submit --retry-failed
    --wait --out`` and ``collect --wait`` returned at once with the old error lines, the
    sweeper could never resend a lost retry, and ``collect --purge --purge-failed`` purged
    the job under the running retry, whose paid result then had nowhere to go."""
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    prompts = _prompts(tmp_path / "p.jsonl", 3, "retried")
    job_id = f"{PREFIX}-retry-pending"
    nobody = f"{PREFIX}-nobody-listens"
    first = tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                        queue=nobody)
    keys = sorted(k for k, _ in tier.store.iter_prompts(job_id))
    tier.store.store_result(job_id, keys[0], {"record": {"key": keys[0], "ok": True},
                                              "dpo": None})
    for k in keys[1:]:  # what a worker stores when the model is down
        tier.store.store_error(job_id, k, {"record": {"key": k, "ok": False,
                                                      "error": {"type": "NoSample",
                                                                "message": "model down"}}})
    assert first.enqueued == 3 and tier.store.status(job_id).finished
    plain = tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                        queue=nobody)
    assert (plain.enqueued, plain.already) == (0, 3)
    assert tier.store.status(job_id).failed == 2  # not retried: still failed
    retry = tier.submit(iter_prompt_file(prompts), spec, job_id=job_id, store=tier.store,
                        queue=nobody, retry_failed=True)
    assert (retry.enqueued, retry.already) == (2, 1)
    st = tier.store.status(job_id)
    assert (st.done, st.failed, st.pending) == (1, 0, 2)
    assert dict(tier.store.unfinished(job_id)).keys() == set(keys[1:])  # the sweeper's view


def test_storing_an_outcome_keeps_the_whole_job_alive_for_the_ttl(tier: SimpleNamespace) -> None:
    """Job state is kept BEACON_JOB_TTL seconds after the last write, but a stored outcome
    refreshed only the results and errors hashes: a job running longer than the TTL lost its
    meta and prompts while its workers kept storing (paid) results, and status / collect then
    said "unknown job"."""
    from worker.state import JobStore

    ttl = 1000
    st = JobStore(REDIS_URL, prefix=PREFIX, ttl=ttl)
    job_id = f"{PREFIX}-ttl"
    st.create(job_id, {"spec": "x"}, source="ttl")
    st.add_prompts(job_id, [("a" * 32, {"record": {"id": 1}, "line": 1}),
                            ("b" * 32, {"record": {"id": 2}, "line": 2})])
    parts = ("meta", "prompts")
    for part in parts:  # the job was submitted long ago: little of its TTL is left
        st.r.expire(st._k(job_id, part), 10)
    st.store_result(job_id, "a" * 32, {"record": {"ok": True}, "dpo": None})
    assert all(st.r.ttl(st._k(job_id, p)) > 10 for p in parts)
    for part in parts:
        st.r.expire(st._k(job_id, part), 10)
    st.store_error(job_id, "b" * 32, {"record": {"ok": False}})
    assert all(st.r.ttl(st._k(job_id, p)) > 10 for p in parts)


def test_the_worker_banner_names_prefix_and_queue_and_never_a_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The startup banner printed the broker and state URLs with their passwords (into every
    log that keeps a worker's stderr) and did not say which key prefix and queue it serves,
    the first things to check when a job does not progress."""
    import dataclasses

    from typer.testing import CliRunner

    import worker.app
    from beacon.cli import app as cli

    secret = "s3cret-pw"
    settings = dataclasses.replace(
        worker.app.settings, broker_url=f"redis://:{secret}@127.0.0.1:6379/0",
        state_url=f"redis://user:{secret}@127.0.0.1:6379/1", key_prefix="bannerprefix",
        queue="bannerqueue")
    started: list[list[str]] = []
    monkeypatch.setattr(worker.app, "settings", settings)
    monkeypatch.setattr(worker.app.app, "worker_main", lambda argv: started.append(argv))
    res = CliRunner().invoke(cli, ["worker", "--pool", "solo"])
    assert res.exit_code == 0, res.output
    banner = res.stderr
    assert secret not in banner and "redis://127.0.0.1:6379/0" in banner
    assert "'bannerprefix'" in banner and "bannerqueue" in banner
    assert started and "--queues=bannerqueue" in started[0]


def test_a_prompt_costs_two_redis_round_trips_on_the_worker(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run counting and the store-id check had taken a prompt from 2 Redis round trips to 5:
    has the result and start the run's count (one script), store the outcome (ending the
    count) is 2."""
    import collections

    import redis
    from redis.client import Pipeline

    import worker.tasks as tasks
    from beacon.jobs import PromptRecord
    from beacon.jobs.keys import prompt_key

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.1, horizon=4))
    job_id = f"{PREFIX}-round-trips"
    store = tasks.get_store()
    ref = store.create(job_id, spec.to_dict(), source="round-trips")
    recs = [PromptRecord(f"rt{i}", f"question {i}", line=i + 1) for i in range(6)]
    keys = [prompt_key(r, spec) for r in recs]
    store.add_prompts(job_id, [(k, {"record": r.to_dict(), "line": r.line, "spec": ref})
                               for k, r in zip(keys, recs, strict=True)])
    headers = {tasks.HEADER_PREFIX: store.prefix, tasks.HEADER_STORE: store.store_id()}

    def one(i: int) -> Any:
        return tasks.run_prompt.apply(args=[job_id, keys[i], recs[i].to_dict(), recs[i].line,
                                            ref], headers=headers).get(propagate=True)

    assert one(0) == "ok"  # the spec is fetched and cached once per process
    counts: collections.Counter[str] = collections.Counter()
    command, pipeline = redis.Redis.execute_command, Pipeline.execute

    def counted(self: Any, *a: Any, **kw: Any) -> Any:
        counts[str(a[0])] += 1
        return command(self, *a, **kw)

    def counted_pipeline(self: Any, *a: Any, **kw: Any) -> Any:
        counts["PIPELINE"] += 1
        return pipeline(self, *a, **kw)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    monkeypatch.setattr(Pipeline, "execute", counted_pipeline)
    for i in range(1, 6):
        assert one(i) == "ok"
    assert sum(counts.values()) == 2 * 5, counts
    assert store.r.hlen(store._k(job_id, "runs")) == 0  # every run counted as ended
