"""Worker tier, sixth audit: concurrent senders of one job. Two ``submit`` of the same job at
once, a submission racing the lost-message sweeper (or ``status --requeue-lost``): each used to
read what was registered and queued, decide a prompt was unsent, and send it -- both of them,
so the prompt ran, and was paid for, twice (results stayed exactly-once). Each prompt's send is
claimed now (:meth:`worker.state.JobStore.claim_sends`). Real Redis on 127.0.0.1:6379 (DB 11,
under test_worker's unique key prefix), real Celery messages counted in the broker's queue."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker

import beacon
from beacon.jobs import FactorySpec, JobSpec, iter_prompt_file

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]

SPEC = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
               beacon.BeaconConfig(cost=0.1, horizon=4))


def _queued_keys(queue: str) -> Counter[str]:
    """How many task messages wait in ``queue`` for each prompt key."""
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    return Counter(test_worker._task_key(raw) for raw in r.lrange(queue, 0, -1))


def _race(n_threads: int, target: Any, timeout: float = 60.0) -> list[Any]:
    """Run ``target()`` in ``n_threads`` threads at once; their results (or exceptions)."""
    out: list[Any] = [None] * n_threads

    def run(i: int) -> None:
        try:
            out[i] = target()
        except BaseException as exc:  # reported by the test, not lost in the thread
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a submission hung"
    return out


def _hold_sends_until_both_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every sender wait at its send until the other one got there too (or 3 s passed:
    a sender that decided to send nothing never gets there): both decide what to send before
    either one's messages reach the broker -- the window two concurrent submits have."""
    import worker.tasks as tasks

    barrier = threading.Barrier(2, timeout=3.0)
    original = tasks._send_tasks

    def held(*args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        original(*args, **kwargs)

    monkeypatch.setattr(tasks, "_send_tasks", held)


# -- 1. two submits of one job at once send each prompt once -------------------------------------
@pytest.mark.parametrize("mode", ["first", "resubmit", "retry-failed"])
def test_two_concurrent_submits_of_one_job_send_each_prompt_once(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """``first``: the job is new to both; ``resubmit``: every message of a registered job was
    lost and both submissions resume it; ``retry-failed``: every prompt failed and both retry
    it. Each prompt's task is in the queue once, and the two results add up to it."""
    import redis

    n = 40
    queue = f"{PREFIX}-race-{mode}"
    job_id = f"{PREFIX}-race-job-{mode}"
    prompts = test_worker._prompts(tmp_path / "p.jsonl", n, f"race {mode}")
    r = redis.Redis.from_url(REDIS_URL)
    store = tier.store
    r.delete(queue)
    try:
        if mode != "first":
            first = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=store,
                                queue=queue)
            assert first.enqueued == n
            keys = list(_queued_keys(queue))
            r.delete(queue)  # the broker lost every message
            if mode == "retry-failed":
                for k in keys:
                    store.store_error(job_id, k, {"record": {"key": k, "ok": False}})
                assert store.status(job_id).failed == n
        _hold_sends_until_both_decided(monkeypatch)
        results = _race(2, lambda: tier.submit(
            iter_prompt_file(prompts), SPEC, job_id=job_id, store=store, queue=queue,
            retry_failed=mode == "retry-failed"))
        for res in results:
            assert not isinstance(res, BaseException), res
        counts = _queued_keys(queue)
        assert len(counts) == n and set(counts.values()) == {1}, counts.most_common(3)
        assert sum(res.enqueued for res in results) == n, results
        # What one did not send it counts as queued (sent by the other) or as being sent (the
        # other's claim), never as lost.
        assert all(res.enqueued + res.queued + res.sending == n for res in results), results
        assert store.status(job_id).pending == n  # retried failures are pending again
    finally:
        r.delete(queue)


# -- 2. a submission and a sweep at once --------------------------------------------------------
def _lost_job(tier: SimpleNamespace, tmp_path: Path, tag: str, n: int
              ) -> tuple[str, str, Path]:
    """A job of ``n`` prompts submitted long ago to a queue that then lost every message."""
    import redis

    queue, job_id = f"{PREFIX}-{tag}-q", f"{PREFIX}-{tag}"
    prompts = test_worker._prompts(tmp_path / f"{tag}.jsonl", n, tag)
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(queue)
    res = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=tier.store,
                      queue=queue)
    assert res.enqueued == n
    r.delete(queue)
    r.hset(tier.store._k(job_id, "meta"), "sent", "0")  # past any sweeper grace
    return job_id, queue, prompts


def test_a_sweep_does_not_resend_what_a_submission_sent_after_its_broker_scans(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep scanned the broker (nothing there: every message lost), then a resubmission
    sent every prompt, then the sweep sent every prompt again: each ran twice."""
    import redis

    from worker import recovery
    from worker.recovery import requeue_lost
    from worker.tasks import resend

    n = 30
    job_id, queue, prompts = _lost_job(tier, tmp_path, "sweep-after", n)
    original = recovery.broker_digests
    scans = [0]
    submitted: list[Any] = []

    def scan_then_submit(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        scans[0] += 1
        if scans[0] == 2:  # the user resubmits just after the sweep's second scan
            submitted.append(tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id,
                                         store=tier.store, queue=queue))
        return out

    monkeypatch.setattr(recovery, "broker_digests", scan_then_submit)
    try:
        rq = requeue_lost(tier.store, job_id, broker_url=REDIS_URL, grace=0.0, settle=0.0,
                          send=lambda j, items, q: resend(j, items, q, store=tier.store))
        assert submitted and submitted[0].enqueued == n
        counts = _queued_keys(queue)
        assert len(counts) == n and set(counts.values()) == {1}, counts.most_common(3)
        assert (rq.pending, rq.lost) == (n, 0), rq
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)


@pytest.mark.parametrize("force", [False, True])
def test_a_submission_does_not_resend_what_a_sweep_sent_after_it_read_the_broker(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    """The other way round: a resubmission read the broker's queues (nothing there), then
    ``status --requeue-lost`` (``--force`` too) resent every prompt, then the resubmission
    sent them all again."""
    import redis

    import worker.tasks as tasks
    from worker.recovery import requeue_lost
    from worker.tasks import resend

    n = 30
    job_id, queue, prompts = _lost_job(tier, tmp_path, f"submit-after-{force}", n)
    original = tasks._queued_keys
    swept: list[Any] = []

    def read_then_sweep(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        swept.append(requeue_lost(tier.store, job_id, broker_url=REDIS_URL, grace=0.0,
                                  settle=0.0, force=force,
                                  send=lambda j, items, q: resend(j, items, q,
                                                                  store=tier.store)))
        return out

    monkeypatch.setattr(tasks, "_queued_keys", read_then_sweep)
    try:
        res = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=tier.store,
                          queue=queue)
        assert swept and swept[0].lost == n, swept
        counts = _queued_keys(queue)
        assert len(counts) == n and set(counts.values()) == {1}, counts.most_common(3)
        assert (res.enqueued, res.queued) == (0, n), res
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)


# -- 3. a sender that dies between its claim and its send -------------------------------------
def test_a_claim_whose_sender_died_lapses_and_the_prompts_are_resent(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submitter killed after it claimed a group and before it sent it: while the claim is
    young its prompts are another sender's (not sent again: the sender may be alive and slow);
    once ``SEND_LEASE`` has passed a resubmission or a sweep sends them: a claim never keeps a
    lost prompt unsent for ever."""
    import redis

    import worker.state as state
    from worker.recovery import requeue_lost
    from worker.tasks import resend

    monkeypatch.setattr(state, "SEND_LEASE", 1.0)
    n = 6
    job_id, queue, prompts = _lost_job(tier, tmp_path, "dead-claimer", n)
    store = tier.store
    keys = [k for k, _ in store.iter_prompts(job_id)]
    token, claimed, held = store.claim_sends(job_id, keys, since=store.now_us())
    assert sorted(claimed) == sorted(keys) and held == 0  # sent before `since`; then it died
    send = lambda j, items, q: resend(j, items, q, store=store)  # noqa: E731
    try:
        young = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=store,
                            queue=queue)
        # held by the dead sender's claim: reported as being sent, not as in the broker
        assert (young.enqueued, young.queued, young.sending) == (0, 0, n), young
        assert requeue_lost(store, job_id, broker_url=REDIS_URL, grace=0.0, settle=0.0,
                            send=send).lost == 0
        time.sleep(1.2)  # the lease runs out
        rq = requeue_lost(store, job_id, broker_url=REDIS_URL, grace=0.0, settle=0.0,
                          send=send)
        assert rq.lost == n, rq
        assert store.finish_sends(job_id, token, keys) == 0  # taken over: the dead one's is void
        again = tier.submit(iter_prompt_file(prompts), SPEC, job_id=job_id, store=store,
                            queue=queue)
        # queued now: not sent twice
        assert (again.enqueued, again.queued, again.sending) == (0, n, 0), again
        counts = _queued_keys(queue)
        assert len(counts) == n and set(counts.values()) == {1}, counts.most_common(3)
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)


def test_claims_expire_and_are_purged_with_the_job_and_refused_once_it_is_gone(
    tier: SimpleNamespace, tmp_path: Path
) -> None:
    """The claims live in the job's ``sends`` hash: it expires with the job's other keys, a
    purge deletes it, and a claim on a purged job raises UnknownJobError writing nothing (a
    send must not bring a job back)."""
    from worker.state import UnknownJobError

    store = tier.store
    job_id, _queue, _ = _lost_job(tier, tmp_path, "claims-ttl", 3)
    sends = store._k(job_id, "sends")
    assert store.r.hlen(sends) == 3 and 0 < store.r.ttl(sends) <= store.ttl
    assert store.r.ttl(sends) == pytest.approx(store.r.ttl(store._k(job_id, "meta")), abs=2)
    store.purge(job_id)
    with pytest.raises(UnknownJobError):
        store.claim_sends(job_id, ["a", "b"], since=store.now_us())
    assert store.finish_sends(job_id, "token", ["a"]) == -1
    assert not any(store.r.exists(k) for k in store._job_keys(job_id))


# -- 4. an infinite setting is a settings error, not a crash at the worker's start -------------
@pytest.mark.parametrize("name", ["BEACON_SOFT_TIME_LIMIT", "BEACON_TIME_LIMIT",
                                  "BEACON_VISIBILITY_TIMEOUT", "BEACON_RETRY_BACKOFF_MAX",
                                  "BEACON_SWEEP_INTERVAL", "BEACON_SWEEP_GRACE"])
@pytest.mark.parametrize("raw", ["inf", "-inf", "Infinity"])
def test_an_infinite_setting_is_a_config_error_naming_it(name: str, raw: str) -> None:
    """``float()`` takes "inf": ``BEACON_RETRY_BACKOFF_MAX=inf`` passed the settings and the
    worker's import then died on ``int(inf)`` inside Celery's task options (an OverflowError
    or "cannot convert float NaN to integer", naming no variable); an infinite sweep interval
    killed the sweeper thread at its first wait. Now: ConfigError naming the variable."""
    from beacon.errors import ConfigError
    from worker.config import WorkerSettings

    with pytest.raises(ConfigError) as ei:
        WorkerSettings.from_env({name: raw})
    assert (ei.value.field, ei.value.value) == (name, raw), ei.value
    assert "must be <= 1e+09" in str(ei.value) or raw.startswith("-"), ei.value


@pytest.mark.parametrize(("name", "raw"), [
    ("BEACON_SWEEP_INTERVAL", "1e300"),  # finite, but the sweeper's first wait overflowed
    ("BEACON_SOFT_TIME_LIMIT", "1e300"),
    ("BEACON_TASK_MAX_RETRIES", "1" + "0" * 400),  # an int: isfinite() raised OverflowError
    ("BEACON_JOB_TTL", "1" + "0" * 400),
    ("BEACON_JOB_TTL", "1000000001"),
])
def test_a_setting_too_large_to_use_is_a_config_error_naming_it(name: str, raw: str) -> None:
    """A value no time limit, TTL or count needs (above 1e9) is refused naming the variable:
    a huge float killed the sweeper thread at its first wait (OverflowError: timestamp out of
    range), a huge integer raised a bare OverflowError from the finiteness check."""
    from beacon.errors import ConfigError
    from worker.config import WorkerSettings

    with pytest.raises(ConfigError) as ei:
        WorkerSettings.from_env({name: raw})
    assert (ei.value.field, ei.value.value) == (name, raw), ei.value
    assert "must be <= 1e+09" in str(ei.value), ei.value
    # the bound itself is a setting (31 years): accepted, and usable by a thread's wait()
    s = WorkerSettings.from_env({"BEACON_SWEEP_INTERVAL": "1e9"})
    assert s.sweep_interval == 1e9
    lock = threading.Lock()  # unlocked: acquired at once, after the timeout's range check
    assert lock.acquire(timeout=s.sweep_interval)
    lock.release()
    with pytest.raises(OverflowError):  # what a value above the bound did in the sweeper
        threading.Lock().acquire(timeout=1e300)


# -- 4. a claim is held only while its group of SEND_GROUP prompts is sent ---------------------
def test_claims_are_taken_and_sent_in_groups_short_enough_for_their_lease(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send publishes one message per broker round trip, and its claims lapse after
    SEND_LEASE: a submission or a resend claims and sends SEND_GROUP prompts at a time (it
    claimed 500, 30 s of sending on a broker 60 ms away, after which another sender could take
    the claims over mid-send)."""
    import redis

    import worker.tasks as tasks
    from worker.recovery import requeue_lost
    from worker.state import SEND_GROUP, SEND_LEASE
    from worker.tasks import resend

    assert SEND_GROUP * 0.06 < SEND_LEASE / 4
    n = 2 * SEND_GROUP + 7
    sizes: list[int] = []
    original = tasks._send_tasks

    def recorded(st: Any, job_id: str, spec_ref: str, target: Any, items: list[Any]) -> None:
        sizes.append(len(items))
        original(st, job_id, spec_ref, target, items)

    monkeypatch.setattr(tasks, "_send_tasks", recorded)
    job_id, queue, _ = _lost_job(tier, tmp_path, "groups", n)
    try:
        assert sizes == [SEND_GROUP, SEND_GROUP, 7], sizes
        resent: list[int] = []

        def send(j: str, items: list[Any], q: str) -> None:
            resent.append(len(items))
            resend(j, items, q, store=tier.store)

        rq = requeue_lost(tier.store, job_id, broker_url=REDIS_URL, force=True, send=send)
        assert (rq.pending, rq.lost) == (n, n) and resent == [SEND_GROUP, SEND_GROUP, 7], resent
    finally:
        redis.Redis.from_url(REDIS_URL).delete(queue)
