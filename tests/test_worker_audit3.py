"""Worker tier, third audit: the lost-message sweeper's memory, a state store lost in the middle
of ``beacon collect``, and the expiry of a job whose prompts run long. Real Redis on
127.0.0.1:6379 (DB 11, under test_worker's unique key prefix), real Celery tasks run eagerly,
and a second ``redis-server`` started and stopped here for the outage."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker
from test_worker_audit2 import _deliver

import beacon
from beacon.jobs import FactorySpec, JobSpec, PromptRecord, read_jsonl

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]


# -- 1. the sweeper holds a chunk of prompt records, not the job's ------------------------------
def test_the_lost_message_check_holds_a_chunk_of_prompts_not_the_whole_job(
    tier: SimpleNamespace,
) -> None:
    """The sweeper (and ``status --requeue-lost``) read every pending prompt's record, prompt
    text included, into memory at once -- twice, before and after its broker scans: a job of
    1e6 long prompts did not fit. It now reads them a page at a time and resends lost ones a
    chunk at a time; which prompts it resends is unchanged: those pending, and neither queued
    nor held unacknowledged in the broker."""
    import redis

    from worker import recovery
    from worker.recovery import requeue_lost
    from worker.tasks import resend

    chunk_max = getattr(recovery, "CHUNK", 500)  # the records held, and resent, at a time

    store = tier.store
    job_id, queue = f"{PREFIX}-sweep-memory", f"{PREFIX}-sweep-memory-q"
    n, text = 12000, 2000
    store.create(job_id, {"spec": "sweep-memory"}, source="sweep-memory")
    keys = [f"{job_id}-{i:05d}" for i in range(n)]
    payloads = {k: {"record": {"id": i, "prompt": f"{i} " + "p" * text}, "line": i + 1}
                for i, k in enumerate(keys)}
    store.add_prompts(job_id, payloads.items())
    for k in keys[:500]:
        store.store_result(job_id, k, {"record": {"key": k, "ok": True}, "dpo": None})
    for k in keys[500:600]:
        store.store_error(job_id, k, {"record": {"key": k, "ok": False}})
    r = redis.Redis.from_url(REDIS_URL)
    tag = f"{PREFIX}-sweep-held"
    try:
        # Real task messages: queued for 200 pending prompts (and for 50 finished ones), one
        # of them held unacknowledged by a worker; every other pending prompt's was lost.
        resend(job_id, [(k, payloads[k]) for k in keys[:50] + keys[600:800]], queue,
               store=store)
        held = r.rpop(queue)
        r.hset("unacked", tag, json.dumps([json.loads(held), "", queue]))
        sent: list[list[str]] = []

        def send(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
            assert (j, q) == (job_id, queue)
            sent.append([k for k, p in items if p == payloads[k]])

        tracemalloc.start()
        try:
            rq = requeue_lost(store, job_id, broker_url=REDIS_URL, send=send, grace=0.0,
                              settle=0.0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (rq.pending, rq.lost, rq.skipped) == (n - 600, n - 800, "")
        resent = [k for chunk in sent for k in chunk]
        assert sorted(resent) == keys[800:]  # each once, with its own record
        assert max(len(chunk) for chunk in sent) <= chunk_max
        # What was held at once is bounded by a chunk (redis-py's reply buffers included),
        # far below the pending prompts' text, which the check used to hold (twice).
        assert peak < min(10 * chunk_max * text, (n - 600) * text / 2), (peak, (n - 600) * text)
        forced = requeue_lost(store, job_id, broker_url=REDIS_URL, send=send, force=True)
        assert (forced.pending, forced.lost) == (n - 600, n - 600)
        assert sorted(k for chunk in sent for k in chunk) == sorted(keys[800:] + keys[600:])
        assert max(len(chunk) for chunk in sent) <= chunk_max
    finally:
        r.hdel("unacked", tag)
        r.delete(queue)


# -- 3. a job's state does not expire under its running prompts ---------------------------------
JOB_PARTS = ("meta", "prompts", "results", "errors", "runs")  # every key of a job


def _ttls(store: Any, job_id: str) -> dict[str, float]:
    return {p: store.r.pttl(store._k(job_id, p)) / 1000 for p in JOB_PARTS}


def _nearly_expired(store: Any, job_id: str) -> None:
    """What the job's keys look like BEACON_JOB_TTL after its last write but for 0.3 s."""
    for p in JOB_PARTS:
        store.r.pexpire(store._k(job_id, p), 300)


def test_any_activity_on_a_job_keeps_all_of_its_state(tier: SimpleNamespace) -> None:
    """Starting a prompt refreshed only the expiry of the ``runs`` key, and storing an error
    left the results' expiry alone (a registration or a send, the results' and errors'): a
    job whose prompts ran longer than BEACON_JOB_TTL after its last stored outcome lost its
    meta (and its remaining messages were dropped as "unknown-job"), and one whose last
    outcomes were errors lost its results. Each activity now refreshes all five keys."""
    from worker.config import WorkerSettings
    from worker.state import JobStore

    settings = WorkerSettings.from_env({"BEACON_STATE_URL": REDIS_URL,
                                        "BEACON_KEY_PREFIX": PREFIX, "BEACON_JOB_TTL": "60"})
    store = JobStore.from_settings(settings)
    job_id = f"{PREFIX}-ttl-activity"
    store.create(job_id, {"spec": "ttl"}, source="ttl")
    keys = [f"{job_id}-{i}" for i in range(8)]
    store.add_prompts(job_id, [(k, {"record": {"id": k}, "line": 1}) for k in keys[:7]])
    store.store_result(job_id, keys[0], {"record": {"key": keys[0], "ok": True}})
    store.store_error(job_id, keys[1], {"record": {"key": keys[1], "ok": False}})
    assert store.begin_run(job_id, keys[2]) == 1
    activities = {
        "begin_run": lambda: store.begin_run(job_id, keys[3]),
        "begin_run (another prompt)": lambda: store.begin_run(job_id, keys[4]),
        "store_error": lambda: store.store_error(job_id, keys[5], {"record": {"key": keys[5]}}),
        "store_result": lambda: store.store_result(job_id, keys[6], {"record": {"key": keys[6]}},
                                                   end_run=True),
        "add_prompts": lambda: store.add_prompts(job_id, [(keys[7], {"record": {}})]),
        "mark_sent": lambda: store.mark_sent(job_id, f"{PREFIX}-ttl-q"),
        "create": lambda: store.create(job_id, {"spec": "ttl"}, source="ttl"),
    }
    for name, activity in activities.items():
        _nearly_expired(store, job_id)
        activity()
        ttls = _ttls(store, job_id)
        assert all(50 < t <= 60 for t in ttls.values()), (name, ttls)
    st = store.status(job_id)
    assert (st.total, st.done, st.failed) == (8, 2, 2)


def test_a_prompt_running_past_the_jobs_expiry_does_not_lose_the_job(
    tier: SimpleNamespace,
) -> None:
    """A real task whose prompt runs for longer than the time left to its job (1 s of model
    latency, 0.3 s left): the job's meta expired while it ran, so its result went into a job
    that ``status`` called unknown and the job's next message was dropped as "unknown-job"."""
    import worker.tasks as tasks
    from beacon.jobs.keys import prompt_key

    job_id = f"{PREFIX}-ttl-long-run"
    slow = JobSpec(FactorySpec("beacon.demo:generator", {"latency_ms": 1000.0}),
                   FactorySpec("beacon.demo:scorer"), beacon.BeaconConfig(cost=0.1, horizon=4))
    store = tasks.get_store()
    ref = store.create(job_id, slow.to_dict(), source=job_id)
    recs = [PromptRecord(f"{job_id}-{i}", f"question {i}", line=i + 1) for i in range(2)]
    keys = [prompt_key(r, slow) for r in recs]
    store.add_prompts(job_id, [(k, {"record": r.to_dict(), "line": r.line, "spec": ref})
                               for k, r in zip(keys, recs, strict=True)])
    _nearly_expired(store, job_id)
    t0 = time.monotonic()
    assert _deliver(store, job_id, ref, recs[0], keys[0]) == "ok"
    assert time.monotonic() - t0 > 0.3  # the run did outlast the time the job had left
    assert _deliver(store, job_id, ref, recs[1], keys[1]) == "ok"
    st = store.status(job_id)
    assert (st.done, st.failed) == (2, 0)


# -- 2. the state store lost in the middle of `beacon collect` ----------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A ``redis-server`` of this test's own (password, data dir), to stop and start again."""

    def __init__(self, workdir: Path, password: str) -> None:
        self.port, self.dir, self.password = _free_port(), workdir, password
        self.url = f"redis://:{password}@127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        exe = shutil.which("redis-server")
        assert exe, "redis-server is needed (it runs the tier's tests)"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--requirepass", self.password, "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Save the data (to start again with it) and stop: an outage."""
        import redis

        if self.proc is None or self.proc.poll() is not None:
            return
        redis.Redis.from_url(self.url).shutdown(save=True)
        self.proc.wait(timeout=20)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path, "s3cret-pw-audit3")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_state_store_lost_during_collect_is_one_error_line_and_a_rerun_completes(
    own_redis: OwnRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state store going away in the middle of ``beacon collect`` (after its first status
    call) ended in a Python traceback; and the store unreachable before it printed its URL,
    password included. Now: one ``error:`` line without the password, exit 1; the lines
    already written are whole, and the same collect run again once the store is back writes
    the rest, none twice."""
    from typer.testing import CliRunner

    from beacon.cli import app
    from worker.state import JobStore

    store = JobStore(own_redis.url, prefix=PREFIX)
    job_id = f"{PREFIX}-collect-outage"
    n = 1200  # several HSCAN pages of results
    store.create(job_id, {"spec": "outage"}, source="outage")
    keys = [f"{job_id}-{i:04d}" for i in range(n)]
    store.add_prompts(job_id, [(k, {"record": {"id": i}, "line": i + 1})
                               for i, k in enumerate(keys)])
    stored = {k: {"key": k, "id": i, "ok": True, "best": f"answer {i}", "reward": i / n}
              for i, k in enumerate(keys)}
    for k, rec in stored.items():
        store.store_result(job_id, k, {"record": rec, "dpo": None})
    monkeypatch.setenv("BEACON_STATE_URL", own_redis.url)
    out = tmp_path / "out.jsonl"
    runner = CliRunner()
    with monkeypatch.context() as m:
        # The outage, at a known point: the server stops once the first result is read.
        original = JobStore.iter_results

        def stopping(self: JobStore, job: str) -> Iterator[tuple[str, dict[str, Any]]]:
            for i, item in enumerate(original(self, job)):
                if i == 1:
                    own_redis.stop()
                yield item

        m.setattr(JobStore, "iter_results", stopping)
        res = runner.invoke(app, ["collect", job_id, "--out", str(out)])
    err = res.stderr.strip()
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
    assert err.startswith("error: lost the job state store at redis://127.0.0.1:"), err
    assert "\n" not in err and "Traceback" not in err and own_redis.password not in err, err
    assert "run the same command again" in err, err
    partial = list(read_jsonl(out))
    assert 1 <= len(partial) < n and all(stored[r["key"]] == r for r in partial)

    # Unreachable from the start: the same kind of line, the password not in it either.
    res = runner.invoke(app, ["collect", job_id, "--out", str(out)])
    err = res.stderr.strip()
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
    assert err.startswith("error: cannot reach the job state store at redis://127.0.0.1:"), err
    assert "\n" not in err and own_redis.password not in err, err

    own_redis.start()  # back, with its data
    res = runner.invoke(app, ["collect", job_id, "--out", str(out)])
    assert res.exit_code == 0, (res.exception, res.stderr)
    lines = list(read_jsonl(out))
    assert len(lines) == n and {r["key"]: r for r in lines} == stored
    assert lines[:len(partial)] == partial  # the first run's lines kept as they were
