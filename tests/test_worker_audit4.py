"""Worker tier, fourth audit: which service ``status --requeue-lost`` blames when one goes away,
the memory a resubmission holds for a job's queued messages, and the sweep lock of a sweep
that outlasts its interval. Real Redis on 127.0.0.1:6379 (DB 11, under test_worker's unique key
prefix), real Celery messages, and a second ``redis-server`` started and stopped here for the
outage (test_worker_audit3's)."""

from __future__ import annotations

import base64
import json
import socket
import time
import tracemalloc
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker
import test_worker_audit3
from test_worker_audit3 import OwnRedis

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier
own_redis = test_worker_audit3.own_redis
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]


def _pending_job(store: Any, job_id: str, queue: str, n: int) -> list[str]:
    """A job of ``n`` registered prompts whose messages went to ``queue`` and are all gone."""
    store.create(job_id, {"spec": job_id}, source=job_id)
    keys = [f"{job_id}-{i:03d}" for i in range(n)]
    store.add_prompts(job_id, [(k, {"record": {"id": i, "prompt": f"q {i}"}, "line": i + 1})
                               for i, k in enumerate(keys)])
    store.mark_sent(job_id, queue)
    return keys


# -- 1. status --requeue-lost names the service that went away ----------------------------------
def test_requeue_lost_names_the_state_store_when_it_is_the_one_that_went_away(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state store stopping in the middle of ``status --requeue-lost`` (after the broker
    was read) was reported as "cannot reach the broker", naming the broker, which was fine:
    both raise redis's ConnectionError. Now the line names the state store (no password), and
    a broker that is down still names the broker; exit 1 both times, and once both are back
    the same command resends every lost prompt."""
    import redis
    from typer.testing import CliRunner

    import worker.app
    import worker.recovery as recovery
    from beacon.cli import app
    from worker.state import JobStore

    store = JobStore(own_redis.url, prefix=PREFIX)
    job_id, queue = f"{PREFIX}-requeue-outage", f"{PREFIX}-requeue-outage-q"
    n = 7
    _pending_job(store, job_id, queue, n)
    monkeypatch.setenv("BEACON_STATE_URL", own_redis.url)
    runner = CliRunner()
    r = redis.Redis.from_url(REDIS_URL)
    try:
        with monkeypatch.context() as m:
            # The outage, at a known point: the state store stops once the broker was read.
            original = recovery.broker_digests

            def stopping(*args: Any, **kwargs: Any) -> Any:
                found = original(*args, **kwargs)
                own_redis.stop()
                return found

            m.setattr(recovery, "broker_digests", stopping)
            res = runner.invoke(app, ["status", job_id, "--requeue-lost"])
        err = res.stderr.strip()
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(
            f"error: lost the job state store at redis://127.0.0.1:{own_redis.port}/0 while "
            f"requeueing lost prompts of job {job_id}"), err
        assert "broker" not in err.split(";")[0], err
        assert "--requeue-lost again" in err, err
        assert "\n" not in err and "Traceback" not in err and own_redis.password not in err
        own_redis.start()

        # The broker down instead: named, without its password.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        with monkeypatch.context() as m:
            m.setattr(worker.app, "settings", replace(
                worker.app.settings, broker_url=f"redis://:brokerpw@127.0.0.1:{closed}/0"))
            res = runner.invoke(app, ["status", job_id, "--requeue-lost"])
        err = res.stderr.strip()
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(f"error: cannot reach the broker redis://127.0.0.1:{closed}/0"), err
        assert "--requeue-lost again" in err and "brokerpw" not in err and "\n" not in err, err

        res = runner.invoke(app, ["status", job_id, "--requeue-lost", "--json"])
        assert res.exit_code == 0, (res.exception, res.stderr)
        assert json.loads(res.stdout)["requeue"] == {"job_id": job_id, "pending": n, "lost": n,
                                                     "skipped": ""}
        assert r.llen(queue) == n
    finally:
        r.delete(queue)


# -- 2. a resubmission holds 8 bytes a queued message, not its key ------------------------------
def test_a_resubmission_holds_digests_of_the_queued_keys_not_the_keys(
    tier: SimpleNamespace,
) -> None:
    """``submit_job`` on a job still running reads the broker's queues for the prompts whose
    task is still queued (not to send them twice) and holds what it found for the whole
    submission: it held every queued key as a Python string (about 150 bytes each with the
    set's table), unbounded for a deep backlog. It holds 64-bit digests now; which prompts
    count as queued is unchanged."""
    import redis

    from worker.tasks import _queued_keys, resend

    store = tier.store
    job_id, queue = f"{PREFIX}-queued-memory", f"{PREFIX}-queued-memory-q"
    other = f"{PREFIX}-queued-memory-other"
    n = 20000
    keys = [f"{job_id}-key-{i:06d}-" + "k" * 24 for i in range(n)]
    ref = store.create(job_id, {"spec": "queued-memory"}, source="queued-memory")
    r = redis.Redis.from_url(REDIS_URL)
    try:
        # One real task message, then the backlog: copies of it for other prompts (and some
        # of another job), as a big submission leaves them queued.
        resend(job_id, [(keys[0], {"record": {"id": 0, "prompt": "q"}, "line": 1,
                                   "spec": ref})], queue, store=store)
        template = json.loads(r.rpop(queue))
        args, kwargs, embed = json.loads(base64.b64decode(template["body"]))

        def message(job: str, key: str) -> str:
            body = json.dumps([[job, key, *args[2:]], kwargs, embed]).encode()
            return json.dumps({**template, "body": base64.b64encode(body).decode()})

        queued = keys[: n - 100]  # the last 100 prompts have no message
        pipe = r.pipeline(transaction=False)
        for i, k in enumerate(queued):
            pipe.rpush(queue, message(job_id, k))
            if i % 50 == 0:
                pipe.rpush(queue, message(other, k + "-other"))
            if len(pipe) >= 1000:
                pipe.execute()
        pipe.execute()
        backlog = sum(len(x) for x in r.lrange(queue, 0, 999)) * r.llen(queue) / 1000

        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            held = _queued_keys(store, job_id, {queue})
            after, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        retained = after - before
        # Less than the queued keys' own text, let alone Python strings of it in a set; the
        # read itself goes page by page (a fraction of the backlog at a time).
        assert retained < sum(len(k) for k in queued) / 4, retained
        assert retained < 24 * n, retained
        assert peak - before < backlog / 4, (peak - before, backlog)
        assert len(held) == len(queued)
        assert all(k in held for k in queued)
        assert not any(k in held for k in keys[n - 100:])
        assert not any(k + "-other" in held for k in queued[::50])  # another job's
    finally:
        r.delete(queue)


# -- 3. the sweep lock of a sweep that outlasts its interval ------------------------------------
def _sweeper(store: Any, interval: float, send: Any) -> Any:
    from worker.recovery import Sweeper

    return Sweeper(store, broker_url=REDIS_URL, interval=interval, grace=0.0, send=send)


def test_a_sweep_longer_than_its_interval_keeps_the_lock_and_releases_only_its_own(
    tier: SimpleNamespace,
) -> None:
    """The sweep lock expired ``max(1, interval)`` seconds after it was taken, however long the
    sweep ran: a sweep of a large job (or a deep broker queue) outlasting it let another
    worker sweep the same jobs at the same time, each resending the lost prompts. The lock is
    now renewed while the sweep runs; when the sweep ends it is kept until ``interval`` after
    it was taken (the fleet still sweeps once an interval), or deleted if that time is past,
    and only while it is still the sweeper's own."""
    from worker.state import JobStore

    store = JobStore(REDIS_URL, prefix=f"{PREFIX}-sweeplock")
    queue = f"{PREFIX}-sweeplock-q"
    job_id = f"{PREFIX}-sweeplock-job"
    _pending_job(store, job_id, queue, 3)
    lock = f"{store.prefix}:sweep-lock"
    other_sent: list[str] = []
    second: list[Any] = []
    held_during: list[Any] = []

    def other_send(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
        other_sent.extend(k for k, _ in items)

    other = _sweeper(store, 0.2, other_send)

    def slow_send(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
        # A sweep with a lot to do: well past the lock's first expiry (max(1, interval) s).
        time.sleep(2.5)
        held_during.append(store.r.get(lock))
        second.append(other.sweep_once())  # another worker's sweeper wakes up meanwhile

    first = _sweeper(store, 0.2, slow_send)
    res = first.sweep_once()
    assert [(x.job_id, x.lost) for x in res] == [(job_id, 3)]
    assert held_during[0] is not None, "the lock expired during the sweep"
    assert second == [[]] and other_sent == [], "a second sweep ran during the first"
    # The sweep took longer than its interval: the lock is released, the next sweep may run.
    assert not store.r.exists(lock)
    assert [x.lost for x in other.sweep_once()] == [3] and len(other_sent) == 3

    # Ended within its interval: kept until the interval after it was taken, not longer.
    patient = _sweeper(store, 60.0, other_send)
    t0 = time.monotonic()
    assert patient.sweep_once()
    left = store.r.pttl(lock) / 1000
    assert 0 < left <= 60.0 - (time.monotonic() - t0) + 0.5, left
    store.r.delete(lock)

    # A lock that expired and was taken by another worker is not renewed nor released.
    def taken_over(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
        store.r.set(lock, "another-worker", px=30000)
        time.sleep(1.0)  # past a renewal (every third of max(1, interval) s)

    assert _sweeper(store, 0.2, taken_over).sweep_once()
    assert store.r.get(lock) == b"another-worker" and 20000 < store.r.pttl(lock) <= 30000
    store.r.delete(lock)


def test_a_prompt_whose_job_is_purged_while_it_runs_does_not_recreate_the_job(
    tier: SimpleNamespace,
) -> None:
    """The job is purged while a real task's prompt runs (0.6 s of model latency): its outcome
    was stored anyway, recreating the job's results alone (no meta) for another
    BEACON_JOB_TTL, which a resubmission of the job id would then count as done."""
    import threading

    from test_worker_audit2 import _deliver

    import beacon
    import worker.tasks as tasks
    from beacon.jobs import FactorySpec, JobSpec, PromptRecord
    from beacon.jobs.keys import prompt_key

    job_id = f"{PREFIX}-purged-mid-run"
    slow = JobSpec(FactorySpec("beacon.demo:generator", {"latency_ms": 600.0}),
                   FactorySpec("beacon.demo:scorer"), beacon.BeaconConfig(cost=0.1, horizon=4))
    store = tasks.get_store()
    ref = store.create(job_id, slow.to_dict(), source=job_id)
    rec = PromptRecord(f"{job_id}-0", "question", line=1)
    key = prompt_key(rec, slow)
    store.add_prompts(job_id, [(key, {"record": rec.to_dict(), "line": 1, "spec": ref})])
    purge = threading.Timer(0.2, store.purge, args=(job_id,))
    purge.start()
    try:
        assert _deliver(store, job_id, ref, rec, key) == "unknown-job"
    finally:
        purge.join()
    left = sorted(k.decode() for k in store.r.scan_iter(f"{store.prefix}:job:{job_id}:*"))
    assert left == []
