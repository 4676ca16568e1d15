"""Worker tier, fifth audit: which service a resubmission blames when the broker's queues cannot
be read, one credential stripper for every URL the tier shows, a lost-message sweep that reads a
prompt twice (``HSCAN`` during a rehash), and ``status --requeue-lost`` racing a purge. Real
Redis on 127.0.0.1:6379 (DB 11, under test_worker's unique key prefix), real Celery messages."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_worker

PREFIX = test_worker.PREFIX
REDIS_URL = test_worker.REDIS_URL
tier = test_worker.tier
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("tier")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pending_job(store: Any, job_id: str, queue: str, n: int) -> list[str]:
    """A job of ``n`` registered prompts whose messages went to ``queue`` and are all gone."""
    store.create(job_id, {"spec": job_id}, source=job_id)
    keys = [f"{job_id}-{i:03d}" for i in range(n)]
    store.add_prompts(job_id, [(k, {"record": {"id": i, "prompt": f"q {i}"}, "line": i + 1,
                                    "spec": "ref"})
                               for i, k in enumerate(keys)])
    store.mark_sent(job_id, queue)
    return keys


# -- 1. a resubmission that cannot read the broker's queues names the broker --------------------
def test_a_resubmission_that_cannot_read_the_broker_names_the_broker(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitting a running job again reads the broker's queues (not to send a queued prompt
    twice). The broker going away just then raised redis's ConnectionError, which ``submit``
    reported as "cannot reach the job state store at <state URL>": the wrong service, and
    the state store was fine. It names the broker now (no password), says the job is
    registered, exit 1, one line; the state store is untouched."""
    import redis
    from typer.testing import CliRunner

    import worker.tasks as tasks
    from beacon.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"resubmit {i}"}) + "\n"
                               for i in range(5)))
    queue = tasks.settings.queue  # no worker of this module listens to it
    argv = ["submit", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"]
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(queue)
    try:
        res = CliRunner().invoke(app, [*argv, "--json"])
        assert res.exit_code == 0, (res.exception, res.stderr)
        first = json.loads(res.stdout)
        assert first["enqueued"] == 5 and r.llen(queue) == 5
        closed = _closed_port()
        with monkeypatch.context() as m:
            # The broker answered the submission's first check, then went away.
            m.setattr(tasks, "_check_broker", lambda: None)
            m.setitem(tasks.app.conf, "broker_url",
                      f"redis://user:brokerpw@127.0.0.1:{closed}/3")
            res = CliRunner().invoke(app, argv)
        err = res.stderr.strip()
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(
            f"error: cannot reach the broker 'redis://127.0.0.1:{closed}/3'"), err
        assert "state store" not in err and "brokerpw" not in err and "user" not in err, err
        assert f"job {first['job_id']} is registered" in err, err
        assert "\n" not in err and "Traceback" not in err, err
        assert tier.store.status(first["job_id"]).total == 5 and r.llen(queue) == 5
    finally:
        r.delete(queue)


def test_reading_the_queues_of_an_unreachable_broker_raises_the_broker_error(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read itself (``_queued_keys``, and the sweep's :func:`read_broker`) raises
    :class:`BrokerUnreachableError` naming the broker without credentials, not redis's own
    ConnectionError (which callers take for the state store's)."""
    import worker.tasks as tasks
    from worker.recovery import BrokerUnreachableError

    closed = _closed_port()
    monkeypatch.setitem(tasks.app.conf, "broker_url",
                        f"redis://user:pa55w0rd@127.0.0.1:{closed}/2")
    with pytest.raises(BrokerUnreachableError) as ei:
        tasks._queued_keys(tier.store, f"{PREFIX}-nojob", {f"{PREFIX}-q"})
    assert ei.value.broker == f"redis://127.0.0.1:{closed}/2"
    assert "w0rd" not in str(ei.value) and "user" not in str(ei.value)


# -- 2. one credential stripper for every URL shown ---------------------------------------------
@pytest.mark.parametrize(("url", "shown"), [
    ("redis://user:pw@cache.internal:6380/4", "redis://cache.internal:6380/4"),
    ("redis://:pw@cache.internal", "redis://cache.internal"),
    ("rediss://user:pw@cache.internal:6380/1", "rediss://cache.internal:6380/1"),
    ("rediss://:pw@cache.internal:6380/1?ssl_cert_reqs=none",
     "rediss://cache.internal:6380/1?ssl_cert_reqs=none"),
    ("unix://:pw@/var/run/redis.sock?db=3", "unix:///var/run/redis.sock?db=3"),
    ("unix:///var/run/redis.sock?db=3&password=pw", "unix:///var/run/redis.sock?db=3"),
    ("redis://cache.internal:6379/0?password=pw&username=user", "redis://cache.internal:6379/0"),
    ("redis://user:p@ss@cache.internal:6379/2", "redis://cache.internal:6379/2"),
    ("redis://:p/w#d?x@cache.internal:6379/2",
     "redis://(host hidden: an '@' outside the host part may belong to a password)"),
    ("amqp://guest:gu@st@rabbit:5672//", "amqp://rabbit:5672//"),
    ("redis://cache.internal:6379/5", "redis://cache.internal:6379/5"),
    ("unix:///var/run/redis.sock", "unix:///var/run/redis.sock"),
])
def test_every_url_shown_keeps_where_it_points_and_drops_credentials(
    url: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three strippers disagreed: ``config.url_without_credentials`` showed a URL whole when
    an unescaped ``/``, ``?`` or ``#`` in its password moved the parser's host past the ``@``,
    and a ``?password=`` parameter; ``tasks._url_label`` and the recovery's inline split
    dropped the scheme (``cache.internal:6379/2``, so a ``rediss://`` broker read like a plain
    one). One function now serves the banner, the error lines of submit and requeue, and the
    refusal of a foreign store."""
    import worker.tasks as tasks
    from worker.config import url_without_credentials
    from worker.recovery import BrokerInspectionError, requeue_lost_jobs

    assert url_without_credentials(url) == shown
    monkeypatch.setitem(tasks.app.conf, "broker_url", url)
    assert tasks._broker_label() == repr(shown)
    if not url.startswith(("redis", "unix")):
        # Not inspectable: the refusal names the broker.
        class OneJob:
            def meta(self, job_id: str) -> dict[str, str]:
                return {"queue": "q", "sent": "0"}

            def unfinished(self, job_id: str) -> list[tuple[str, dict[str, Any]]]:
                return [("k", {})]

            @staticmethod
            def sent_queues(meta: dict[str, str]) -> set[str]:
                return {"q"}

        with pytest.raises(BrokerInspectionError) as ei:
            requeue_lost_jobs(OneJob(), ["j"], broker_url=url,  # type: ignore[arg-type]
                              send=lambda *a: None, grace=0.0, settle=0.0)
        assert repr(shown) in str(ei.value) and "gu@st" not in str(ei.value)


# -- 3. a sweep reading a prompt twice sends it once ---------------------------------------------
class _RehashingRedis:
    """The store's Redis client, whose ``HSCAN`` of a job's prompts returns every field twice
    (what a rehash during the scan may do for some of them; every one here, to be seen)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def hscan_iter(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        items = list(self._real.hscan_iter(name, *args, **kwargs))
        twice = str(name).endswith(":prompts")
        for item in items:
            yield item
            if twice:
                yield item


@pytest.mark.parametrize("force", [False, True])
def test_a_sweep_sends_a_lost_prompt_once_when_the_scan_returns_it_twice(
    tier: SimpleNamespace, force: bool
) -> None:
    """``HSCAN`` may return a field more than once (the hash was rehashed during the scan):
    the lost-message check resent each prompt read twice twice in one sweep -- two paid runs
    (``--force`` too). Each prompt is sent at most once per sweep now, and counted once."""
    import redis

    from worker.recovery import requeue_lost
    from worker.state import JobStore

    real = redis.Redis.from_url(REDIS_URL)
    store = JobStore(REDIS_URL, prefix=PREFIX, client=_RehashingRedis(real))
    job_id = f"{PREFIX}-rehash-{force}"
    queue = f"{PREFIX}-rehash-q-{force}"
    n = 7
    keys = _pending_job(store, job_id, queue, n)
    assert len(list(store.iter_prompts(job_id))) == 2 * n  # the scan does repeat them
    sent: list[str] = []

    def send(j: str, items: list[tuple[str, dict[str, Any]]], q: str) -> None:
        sent.extend(k for k, _ in items)

    rq = requeue_lost(store, job_id, broker_url=REDIS_URL, send=send, grace=0.0, settle=0.0,
                      force=force)
    assert sorted(sent) == keys
    assert (rq.pending, rq.lost) == (n, n)


# -- 4. status --requeue-lost racing a purge ----------------------------------------------------
def test_requeue_lost_of_a_job_purged_before_the_requeue_is_one_line(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job purged between ``status``'s read and the requeue (``collect --purge`` in
    another shell): UnknownJobError came out as a Python traceback. Now one line, exit 1."""
    from typer.testing import CliRunner

    import worker.recovery as recovery
    from beacon.cli import app

    store = tier.store
    job_id = f"{PREFIX}-purged-before"
    original = recovery.requeue_lost

    def purged_first(st: Any, job: str, **kwargs: Any) -> Any:
        st.purge(job)
        return original(st, job, **kwargs)

    for force in (False, True):
        _pending_job(store, job_id, f"{PREFIX}-purged-before-q", 3)
        with monkeypatch.context() as m:
            m.setattr(recovery, "requeue_lost", purged_first)
            res = CliRunner().invoke(app, ["status", job_id, "--requeue-lost",
                                           *(["--force"] if force else [])])
        err = res.stderr.strip()
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(f"error: unknown job {job_id!r}"), err
        assert "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("force", [False, True])
def test_requeue_lost_of_a_job_purged_during_the_requeue_does_not_bring_it_back(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    """The job purged after its pending prompts were read and before they were sent: the
    send stamped the job's meta (``queue``, ``sent``) and put it back on the sweeper's list,
    so a job of 0 prompts, without a spec, lived on for another BEACON_JOB_TTL (``status``
    showed it; the sweeper visited it), and its messages were sent. Now nothing is sent,
    nothing of the job is written back, and the command says the job is gone (exit 1)."""
    import redis
    from typer.testing import CliRunner

    from beacon.cli import app
    from worker.state import JobStore

    store = tier.store
    job_id = f"{PREFIX}-purged-during-{force}"
    queue = f"{PREFIX}-purged-during-q-{force}"
    _pending_job(store, job_id, queue, 4)
    original = JobStore.unfinished
    reads = [0]

    def purging(self: Any, job: str, **kwargs: Any) -> Any:
        items = list(original(self, job, **kwargs))
        reads[0] += 1
        if job == job_id and reads[0] == (1 if force else 2):  # the read that is sent
            self.purge(job)
        yield from items

    r = redis.Redis.from_url(REDIS_URL)
    try:
        with monkeypatch.context() as m:
            m.setattr(JobStore, "unfinished", purging)
            res = CliRunner().invoke(app, ["status", job_id, "--requeue-lost",
                                           *(["--force"] if force else [])])
        err = res.stderr.strip()
        assert not any(r.exists(k) for k in store._job_keys(job_id)), r.hgetall(
            store._k(job_id, "meta"))
        assert job_id not in store.active_jobs()
        assert r.llen(queue) == 0
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(f"error: unknown job {job_id!r}"), err
        assert "\n" not in err and "Traceback" not in err, err
    finally:
        r.delete(queue)


def test_the_sweeper_leaves_a_job_purged_during_its_sweep_gone(
    tier: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race in a worker's sweep: the job is retired, not written back."""
    import redis

    from worker.recovery import Sweeper
    from worker.state import JobStore

    store = JobStore(REDIS_URL, prefix=f"{PREFIX}-sweep-purge")
    job_id = f"{PREFIX}-sweep-purge-job"
    queue = f"{PREFIX}-sweep-purge-q"
    _pending_job(store, job_id, queue, 3)
    original = JobStore.unfinished
    reads = [0]

    def purging(self: Any, job: str, **kwargs: Any) -> Any:
        items = list(original(self, job, **kwargs))
        reads[0] += 1
        if reads[0] == 2:
            self.purge(job)
        yield from items

    sent: list[str] = []
    monkeypatch.setattr(JobStore, "unfinished", purging)
    sweeper = Sweeper(store, broker_url=REDIS_URL, interval=0.0, grace=0.0,
                      send=lambda j, items, q: sent.extend(k for k, _ in items))
    assert sweeper.sweep_once() == []
    r = redis.Redis.from_url(REDIS_URL)
    assert sent == [] and not any(r.exists(k) for k in store._job_keys(job_id))
    assert store.active_jobs() == []


def test_a_job_purged_while_it_is_being_submitted_is_not_half_brought_back(
    tier: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resubmission racing ``collect --purge`` of its job: after the purge the next chunk's
    send stamp wrote the meta hash back (``queue`` and ``sent``, no spec), so the job came back
    as a spec-less shell whose sent messages every worker dropped, and submit said all was
    well. The stamp refuses a job that is gone: one ``error:`` line, exit 1, and the next
    chunk is neither registered nor sent."""
    import redis
    from typer.testing import CliRunner

    import worker.tasks as tasks
    from beacon.cli import app
    from worker.state import JobStore

    n = 700  # two chunks of 500
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"purged while sent {i}"}) + "\n"
                               for i in range(n)))
    queue = tasks.settings.queue
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(queue)
    original = JobStore.outcome_flags
    calls = [0]

    def purge_after_first_chunk(self: Any, job_id: str, keys: list[str]) -> Any:
        out = original(self, job_id, keys)
        calls[0] += 1
        if calls[0] == 1:
            self.purge(job_id)  # collect --purge in another shell, right after chunk 1
        return out

    try:
        monkeypatch.setattr(JobStore, "outcome_flags", purge_after_first_chunk)
        res = CliRunner().invoke(app, ["submit", str(prompts), "-g", "beacon.demo:generator",
                                       "-s", "beacon.demo:scorer", "--job-id",
                                       f"{PREFIX}-purged-submit"])
        err = res.stderr.strip()
        store = tier.store
        assert not any(r.exists(k) for k in store._job_keys(f"{PREFIX}-purged-submit")), \
            r.hgetall(store._k(f"{PREFIX}-purged-submit", "meta"))
        assert r.llen(queue) <= 500  # the first chunk went out before the purge, no more
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.exception, err)
        assert err.startswith(f"error: unknown job '{PREFIX}-purged-submit'"), err
        assert "\n" not in err and "Traceback" not in err, err
    finally:
        r.delete(queue)
