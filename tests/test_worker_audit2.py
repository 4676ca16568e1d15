"""Worker tier, second audit: Redis round trips per prompt, messages of a purged job, the
missing-extra hint, and the memory ``collect --dpo`` keeps. Real Redis on 127.0.0.1:6379
(DB 11, under test_worker's unique key prefix), real Celery tasks (run eagerly in-process,
or by real worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker
from test_packaging import _run as run_python

import beacon
from beacon.jobs import FactorySpec, JobSpec, PromptRecord, read_jsonl

PREFIX = test_worker.PREFIX
# test_worker's fixture: real Redis (DB 11), BEACON_* set to a unique key prefix and queue
# before worker.app reads them
tier = test_worker.tier
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]

SPEC = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
               beacon.BeaconConfig(cost=0.1, horizon=4))


def _registered(job_id: str, n: int) -> tuple[Any, str, list[PromptRecord], list[str]]:
    """A job of ``n`` prompts registered in the worker's store (as submit_job does, without
    sending anything): ``(store, spec ref, records, keys)``."""
    import worker.tasks as tasks
    from beacon.jobs.keys import prompt_key

    store = tasks.get_store()
    ref = store.create(job_id, SPEC.to_dict(), source=job_id)
    recs = [PromptRecord(f"{job_id}-{i}", f"question {i} of {job_id}", line=i + 1)
            for i in range(n)]
    keys = [prompt_key(r, SPEC) for r in recs]
    store.add_prompts(job_id, [(k, {"record": r.to_dict(), "line": r.line, "spec": ref})
                               for k, r in zip(keys, recs, strict=True)])
    return store, ref, recs, keys


def _deliver(store: Any, job_id: str, ref: str, rec: PromptRecord, key: str) -> Any:
    """Run the prompt's task as a worker does, with the headers a submitter writes."""
    import worker.tasks as tasks

    headers = {tasks.HEADER_PREFIX: store.prefix, tasks.HEADER_STORE: store.store_id()}
    return tasks.run_prompt.apply(args=[job_id, key, rec.to_dict(), rec.line, ref],
                                  headers=headers).get(propagate=True)


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every request this process sends to Redis from now on, one entry per round trip (a
    pipeline or a script is one write of packed commands, answered together)."""
    from redis.connection import AbstractConnection

    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        parts = [command] if isinstance(command, bytes | str) else list(command)
        sent.append(b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in parts))
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    yield sent


def test_a_prompt_costs_two_redis_round_trips(round_trips: list[bytes]) -> None:
    """A prompt cost three round trips: "has it a result?", "count the run as started"
    (BEACON_MAX_LOST_RUNS), and the store of its outcome (which ends the run). The first two
    are one script now; a redelivered message of a finished prompt costs one round trip and
    runs nothing."""
    job_id = f"{PREFIX}-two-trips"
    store, ref, recs, keys = _registered(job_id, 6)
    assert _deliver(store, job_id, ref, recs[0], keys[0]) == "ok"  # spec read, scripts loaded
    round_trips.clear()
    for rec, key in zip(recs[1:], keys[1:], strict=True):
        assert _deliver(store, job_id, ref, rec, key) == "ok"
    assert len(round_trips) == 2 * 5, [r[:80] for r in round_trips]
    round_trips.clear()
    assert _deliver(store, job_id, ref, recs[1], keys[1]) == "duplicate"
    assert len(round_trips) == 1
    st = store.status(job_id)
    assert (st.done, st.failed, st.pending) == (6, 0, 0)
    assert store.r.hlen(store._k(job_id, "runs")) == 0  # every run counted as ended
    assert store.r.ttl(store._k(job_id, "meta")) > 0


def test_a_message_of_a_purged_job_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message still queued when its job was purged (collect --purge --purge-failed, a
    sweeper's duplicate) or expired (BEACON_JOB_TTL) was run, and paid for, by a worker that
    had the job's spec cached, and its result written into a job nobody can read any more
    (status and collect say "unknown job"), re-creating part of the purged state."""
    from beacon.jobs.execute import PromptExecutor

    job_id = f"{PREFIX}-purged"
    store, ref, recs, keys = _registered(job_id, 2)
    assert _deliver(store, job_id, ref, recs[0], keys[0]) == "ok"  # the worker knows the spec
    store.purge(job_id)
    runs: list[str] = []
    original = PromptExecutor.run

    def counting(self: Any, record: Any, k: str, **kw: Any) -> Any:
        runs.append(k)
        return original(self, record, k, **kw)

    monkeypatch.setattr(PromptExecutor, "run", counting)
    assert _deliver(store, job_id, ref, recs[1], keys[1]) == "unknown-job"
    assert runs == []
    assert not list(store.r.scan_iter(f"{store.prefix}:job:{job_id}:*"))


@pytest.mark.parametrize(
    ("argv", "block"),
    [
        (["submit", "{prompts}", "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"],
         ["celery", "kombu"]),
        (["submit", "{prompts}", "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"],
         ["celery", "kombu", "redis"]),
        (["status", "job-1"], ["redis"]),
        (["status", "job-1"], ["celery", "kombu", "redis"]),
        (["collect", "job-1", "-o", "{out}"], ["redis"]),
        (["worker"], ["celery", "kombu"]),
    ],
)
def test_a_missing_worker_extra_is_named_once(argv: list[str], block: list[str],
                                              tmp_path: Path) -> None:
    """``beacon submit`` / ``status`` / ``worker`` without the worker extra printed the hint
    twice in one line ("needs the 'worker' extra (pip install ...): No module named 'redis'
    (worker.state needs the 'worker' extra: pip install ...)"): the command added it to an
    error whose text already had it."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "2+2"}\n')
    argv = [a.format(prompts=prompts, out=tmp_path / "out.jsonl") for a in argv]
    code = f"import sys\nfrom beacon.cli import main\nsys.argv = ['beacon', *{argv!r}]\nmain()"
    proc = run_python(code, block=block)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert err.count("pip install") == 1 and err.count("'worker' extra") == 1, err
    assert 'pip install "beacon-sampling[worker]"' in err, err


def _line(key: str, best: str, reward: float) -> dict[str, Any]:
    return {"key": key, "id": key, "ok": True, "best": best, "reward": reward}


def test_collect_dpo_does_not_hold_the_responses_of_the_output_in_memory(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """``collect --dpo`` kept the best response of every ok line already in ``--out`` (to
    tell the job's own lines from another run's) for the whole collect: memory grew with the
    job's total response text (1e6 prompts of long responses: out of memory). What it keeps
    now is bounded per prompt; which pairs it writes is unchanged: those of prompts whose line
    holds the job's own draw (or no line yet), none for a line of another draw."""
    job_id = f"{PREFIX}-dpo-memory"
    store = tier.store
    store.create(job_id, {"spec": "dpo-memory"}, source="dpo-memory")
    n, big = 40, 200_000
    keys = [f"{job_id}-{i:03d}" for i in range(n)]
    store.add_prompts(job_id, [(k, {"record": {"id": k}, "line": i})
                               for i, k in enumerate(keys)])
    stored = {}
    for i, k in enumerate(keys):
        rec = _line(k, f"short answer {i}", 0.5 + i / 100)
        pair = {"key": k, "id": k, "prompt": f"prompt {i}", "chosen": rec["best"],
                "rejected": f"worse {i}", "margin": 0.25}
        stored[k] = (rec, pair)
        store.store_result(job_id, k, {"record": rec, "dpo": pair})
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    # In --out already: prompts 0-29 from another run (other, long responses); 30-34 this
    # job's own lines (collected earlier without --dpo); 35-39 not collected yet.
    with out.open("w") as f:
        for i, k in enumerate(keys[:30]):
            f.write(json.dumps(_line(k, f"{i}" + "x" * big, 0.5 + i / 100)) + "\n")
        for k in keys[30:35]:
            f.write(json.dumps(stored[k][0]) + "\n")
    text_in_out = out.stat().st_size
    tracemalloc.start()
    try:
        c = tier.collect(store, job_id, out, dpo=dpo, fsync=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < text_in_out / 4, (peak, text_in_out)
    assert (c.written, c.dpo_written, c.dpo_foreign) == (5, 10, 30)
    pairs = list(read_jsonl(dpo))
    assert [p["key"] for p in pairs] == [k for k, _ in store.iter_results(job_id)
                                         if k in keys[30:]]
    assert all(p == stored[p["key"]][1] for p in pairs)
    lines = {r["key"]: r for r in read_jsonl(out)}
    assert all(lines[k] == stored[k][0] for k in keys[30:])


@pytest.mark.parametrize(("broker", "extra"), [("redis://127.0.0.1:1/0", []),
                                               ("amqp://guest@127.0.0.1:1//", ["--force"])])
def test_requeue_lost_with_the_broker_down_is_one_error_line(broker: str, extra: list[str],
                                                            tier: SimpleNamespace) -> None:
    """``beacon status JOB --requeue-lost`` with the broker unreachable (the state store up)
    ended in a traceback: redis's ConnectionError from the scan of the broker's queues, or
    kombu's OperationalError from sending the prompts again (``--force``)."""
    job_id = f"{PREFIX}-requeue-down"
    tier.store.create(job_id, SPEC.to_dict(), source="requeue-down")
    tier.store.add_prompts(job_id, [(f"{job_id}-k", {"record": {"id": 1, "prompt": "p"},
                                                     "line": 1})])
    tier.store.mark_sent(job_id, f"{PREFIX}-nobody")
    env = {**os.environ, **tier.env, "BEACON_BROKER_URL": broker}
    proc = subprocess.run([sys.executable, "-m", "beacon.cli", "status", job_id,
                           "--requeue-lost", *extra], cwd=test_worker.ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert err.startswith("error: cannot reach the broker ") and "127.0.0.1:1" in err, err
    assert "guest" not in err
    assert tier.store.status(job_id).pending == 1


def test_purge_refusal_does_not_say_to_retry_bad_input_lines(tier: SimpleNamespace,
                                                             tmp_path: Path) -> None:
    """``collect --purge`` of a job whose only failures are bad input lines told the operator
    to retry them (``submit --retry-failed``), which sends nothing for a bad line: the purge
    was refused again and again. It now says no retry fixes them, and what does."""
    from beacon.jobs import iter_prompt_file
    from worker.state import purge_refusal

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "also fine"}\n'
                       "not json\n")
    job_id = f"{PREFIX}-bad-lines-purge"
    res = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=tier.store,
                      queue=f"{PREFIX}-nobody")
    assert (res.enqueued, res.bad_lines) == (2, 1)
    ka, kb = sorted(k for k, p in tier.store.iter_prompts(job_id) if "record" in p)
    tier.store.store_result(job_id, ka, {"record": {"key": ka, "ok": True}, "dpo": None})
    tier.store.store_result(job_id, kb, {"record": {"key": kb, "ok": True}, "dpo": None})
    c = tier.collect(tier.store, job_id, tmp_path / "out.jsonl", fsync=False)
    assert (c.status.failed, c.bad_lines, c.to_dict()["bad_lines"]) == (1, 1, 1)
    why = purge_refusal(c)
    assert why is not None and "--retry-failed" not in why and "--purge-failed" in why, why
    assert "no retry fixes" in why
    assert purge_refusal(c, allow_failed=True) is None
    # A prompt that failed too: retrying it is the advice, and the bad line is named apart.
    tier.store.r.hdel(tier.store._k(job_id, "results"), kb)
    tier.store.store_error(job_id, kb, {"record": {"key": kb, "ok": False,
                                                   "error": {"type": "NoSample"}}})
    c = tier.collect(tier.store, job_id, tmp_path / "out2.jsonl", fsync=False)
    why = purge_refusal(c)
    assert why is not None and "--retry-failed" in why, why
    assert "2 prompt(s) failed (1 of them bad input lines" in why, why
