"""Find prompt tasks the broker lost and send them again.

Why this exists. With the Redis broker, kombu takes a message off the queue list (``BRPOP``)
and only afterwards records it as unacknowledged (``ZADD``/``HSET`` on ``unacked``). A worker
killed between the two, or killed while a popped reply still sits unread in its socket, loses
that message: it is in neither the queue nor the unacked hash, so neither ``acks_late`` nor the
visibility timeout can bring it back (the same window exists while a restore moves a message
from ``unacked`` back to its queue). The job state, however, knows every prompt of every job:
a prompt that has no outcome and whose message is nowhere in the broker was lost.

The check is conservative. A message moving between the queue and the unacked hash is in
neither for a few milliseconds, so the broker is scanned twice, ``settle`` seconds apart, and
only prompts missing from both scans and still pending after the second are resent; jobs that
sent messages in the last ``grace`` seconds are skipped (a submission may be between
registering its prompts and sending them). A false positive costs one duplicate run, never a
duplicate result: tasks are idempotent and the first stored result wins (:mod:`worker.state`).

Memory. A job may have a million prompts, each registered with its full prompt text. The check
never holds more than one chunk (``CHUNK``) of prompt records: the job's prompts are read
``HSCAN`` page by page, and lost ones are resent as they are found, a chunk at a time. What it
keeps for the whole check is a 64-bit digest of each key (8 bytes a prompt, :class:`KeyDigests`):
those pending before the first broker scan and those seen in the broker, of the jobs checked.

Only a Redis broker can be inspected this way. AMQP brokers keep unacknowledged messages
themselves and redeliver them when a consumer's connection drops, so this loss cannot happen
there; :func:`requeue_lost` refuses other brokers unless ``force`` resends every pending prompt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from worker.config import is_redis_url, url_without_credentials
from worker.state import JobStore, UnknownJobError

__all__ = ["CHUNK", "BrokerInspectionError", "BrokerUnreachableError", "KeyDigests",
           "RequeueResult", "Sweeper", "broker_digests", "broker_keys", "in_broker",
           "requeue_lost", "requeue_lost_jobs"]

log = logging.getLogger(__name__)

TASK_NAME = "beacon.run_prompt"
_PRIORITY_SEP = "\x06\x16"  # kombu's separator of a queue's priority sub-lists
_UNACKED = "unacked"  # kombu's default ``unacked_key``
CHUNK = 500  # prompt records read per Redis call, and resent per send, at most


def _key_digest(key: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class KeyDigests:
    """A set of prompt keys held as 64-bit digests (8 bytes a key, not the key's string).

    Two keys share a digest with probability about 2**-64 per pair; for this module's sets
    that would make a lost prompt look queued (not resent by this check) or a prompt
    registered during the check look pending before it (at worst one duplicate run, the cost
    of any false positive here).
    """

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._new = array("Q")
        self._sorted: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        for k in keys:
            self.add(k)

    def add(self, key: str) -> None:
        self._new.append(_key_digest(key))

    def _frozen(self) -> npt.NDArray[np.uint64]:
        if len(self._new):
            fresh = np.frombuffer(self._new, dtype=np.uint64)
            self._sorted = np.union1d(self._sorted, fresh).astype(np.uint64)
            self._new = array("Q")
        return self._sorted

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        arr = self._frozen()
        if not arr.size:  # a first submission: no queued key to look for, nothing to hash
            return False
        d = np.uint64(_key_digest(key))
        i = int(np.searchsorted(arr, d))
        return i < len(arr) and arr[i] == d

    def __len__(self) -> int:
        return len(self._frozen())

    def __or__(self, other: KeyDigests) -> KeyDigests:
        out = KeyDigests()
        out._sorted = np.union1d(self._frozen(), other._frozen()).astype(np.uint64)
        return out


class BrokerInspectionError(RuntimeError):
    """The broker cannot be inspected for lost messages (not Redis)."""


class BrokerUnreachableError(RuntimeError):
    """The broker could not be read for the messages it holds (down, a network cut, a
    timeout). Raised instead of redis's own ``ConnectionError`` / ``TimeoutError`` so that a
    caller can tell it from the state store going away: with a Redis broker both raise those.
    ``broker`` is its URL without credentials."""

    def __init__(self, broker_url: str, cause: BaseException) -> None:
        self.broker = url_without_credentials(broker_url)
        super().__init__(f"cannot reach the broker {self.broker}: {str(cause).rstrip('.')}")


@dataclass(frozen=True)
class RequeueResult:
    """``pending``: prompts without an outcome; ``lost``: of those, found nowhere in the broker
    (and resent); ``skipped``: why nothing was checked (``""`` when the check ran)."""

    job_id: str
    pending: int
    lost: int
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "pending": self.pending, "lost": self.lost,
                "skipped": self.skipped}


def _task_args(raw: bytes | str) -> list[Any] | None:
    """The positional arguments of a ``beacon.run_prompt`` message, or None for others."""
    try:
        msg = json.loads(raw)
        if isinstance(msg, list):  # unacked entries are [message, exchange, routing_key]
            msg = msg[0]
        if msg.get("headers", {}).get("task") != TASK_NAME:
            return None
        body = msg["body"]
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None  # not a message this tier wrote (JSON-only; anything else is not ours)
    return args if isinstance(args, list) and len(args) >= 2 else None


def _queue_lists(r: Any, queue: str) -> Iterator[str]:
    yield queue
    for k in r.scan_iter(match=f"{queue}{_PRIORITY_SEP}*", count=500):
        yield k.decode() if isinstance(k, bytes) else str(k)


def _broker_tasks(r: Any, queues: Iterable[str]) -> Iterator[tuple[str, str]]:
    """``(job id, prompt key)`` of every prompt message waiting in ``queues`` or held
    unacknowledged (one pass over the queue lists and the ``unacked`` hash, in pages)."""
    for q in queues:
        for name in _queue_lists(r, q):
            start = 0
            while True:  # in pages: a queue may hold hundreds of thousands of messages
                page = r.lrange(name, start, start + CHUNK - 1)
                for raw in page:
                    args = _task_args(raw)
                    if args is not None:
                        yield str(args[0]), str(args[1])
                if len(page) < CHUNK:
                    break
                start += CHUNK
    for _tag, raw in r.hscan_iter(_UNACKED, count=CHUNK):
        args = _task_args(raw)
        if args is not None:
            yield str(args[0]), str(args[1])


def broker_keys(r: Any, queues: Iterable[str]) -> dict[str, set[str]]:
    """Per job id, the prompt keys with a message waiting in ``queues`` or held unacknowledged
    (one pass over the queue lists and the ``unacked`` hash, whatever the number of jobs)."""
    found: dict[str, set[str]] = {}
    for job_id, key in _broker_tasks(r, queues):
        found.setdefault(job_id, set()).add(key)
    return found


def broker_digests(r: Any, queues: Iterable[str], jobs: Iterable[str]) -> dict[str, KeyDigests]:
    """:func:`broker_keys` of ``jobs`` only, as :class:`KeyDigests` (8 bytes a message)."""
    found = {j: KeyDigests() for j in jobs}
    for job_id, key in _broker_tasks(r, queues):
        if job_id in found:
            found[job_id].add(key)
    return found


def in_broker(r: Any, job_id: str, queues: Iterable[str]) -> set[str]:
    """Prompt keys of ``job_id`` with a message waiting in ``queues`` or held unacknowledged."""
    return broker_keys(r, queues).get(job_id, set())


Send = Callable[[str, list[tuple[str, dict[str, Any]]], str], None]


def requeue_lost_jobs(
    store: JobStore,
    job_ids: Iterable[str],
    *,
    broker_url: str,
    send: Send,
    grace: float = 60.0,
    settle: float = 2.0,
) -> dict[str, RequeueResult]:
    """:func:`requeue_lost` for several jobs with one pair of broker scans for all of them.

    Jobs that are unknown (expired, purged) are left out of the result.
    """
    out: dict[str, RequeueResult] = {}
    # job -> (its latest queue, every queue it was sent to, digests of its pending prompts)
    checked: dict[str, tuple[str, set[str], KeyDigests]] = {}
    now = time.time()
    for job_id in job_ids:
        try:
            meta = store.meta(job_id)
        except UnknownJobError:
            continue
        queue = meta.get("queue", "")
        # a page of records at a time (store.unfinished scans): the digests are what is kept
        pending = KeyDigests(k for k, _ in store.unfinished(job_id))
        age = now - float(meta.get("sent", 0.0))
        if not len(pending):
            out[job_id] = RequeueResult(job_id, 0, 0, "finished")
        elif not queue:
            out[job_id] = RequeueResult(job_id, len(pending), 0, "job has no recorded queue")
        elif age < grace:
            out[job_id] = RequeueResult(job_id, len(pending), 0, f"messages sent {age:.0f} s ago")
        else:
            # A job submitted again to another queue may still have messages in the first.
            checked[job_id] = (queue, store.sent_queues(meta), pending)
    if not checked:
        return out
    if not is_redis_url(broker_url):
        raise BrokerInspectionError(
            f"broker {broker_url.split('@')[-1]!r} is not Redis: lost messages can only be "
            "found on a Redis broker (AMQP brokers redeliver unacknowledged messages "
            "themselves); use force to resend every pending prompt")
    queues = sorted(set().union(*(qs for _, qs, _ in checked.values())))
    r = redis.Redis.from_url(broker_url)
    try:
        # Twice, ``settle`` apart: a message moving between a queue and ``unacked`` is in
        # neither for milliseconds, but never in neither at both scans.
        first = broker_digests(r, queues, checked)
        time.sleep(settle)
        second = broker_digests(r, queues, checked)
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise BrokerUnreachableError(broker_url, exc) from None
    finally:
        r.close()
    for job_id, (queue, _, pending) in checked.items():
        seen = first.pop(job_id) | second.pop(job_id)
        still = [0]  # prompts still pending now, counted as the scan goes

        def lost(job_id: str = job_id, pending: KeyDigests = pending,
                 seen: KeyDigests = seen, still: list[int] = still
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
            for k, p in store.unfinished(job_id):
                still[0] += 1
                if k in pending and k not in seen:
                    yield k, p

        n_lost = _send_in_chunks(store, job_id, lost(), queue, send)
        if n_lost:
            log.warning("job %s: %d prompt message(s) lost by the broker; sent them again",
                        job_id, n_lost)
        out[job_id] = RequeueResult(job_id, still[0], n_lost)
    return out


def _send_in_chunks(store: JobStore, job_id: str, items: Iterable[tuple[str, dict[str, Any]]],
                    queue: str, send: Send) -> int:
    """Send ``items`` ``CHUNK`` at a time (each chunk's records are all that is held);
    returns how many were sent."""
    n = 0
    batch: list[tuple[str, dict[str, Any]]] = []
    for item in items:
        batch.append(item)
        if len(batch) >= CHUNK:
            send(job_id, batch, queue)
            store.mark_sent(job_id, queue)
            n, batch = n + len(batch), []
    if batch:
        send(job_id, batch, queue)
        store.mark_sent(job_id, queue)
        n += len(batch)
    return n


def requeue_lost(
    store: JobStore,
    job_id: str,
    *,
    broker_url: str,
    send: Send,
    grace: float = 60.0,
    settle: float = 2.0,
    force: bool = False,
) -> RequeueResult:
    """Resend the prompts of ``job_id`` that have no outcome and no message in the broker.

    ``send(job_id, [(key, payload)], queue)`` sends the tasks (:func:`worker.tasks.resend`),
    ``CHUNK`` prompts at most per call. ``force`` skips the broker inspection and the grace
    period and resends every pending prompt (for brokers that cannot be inspected; duplicates
    are harmless but cost a run).
    Raises :class:`~worker.state.UnknownJobError` for a job the store does not know,
    :class:`BrokerUnreachableError` when the broker cannot be read; what ``send`` raises
    (:func:`worker.tasks.resend`: kombu's ``OperationalError`` for the broker) and the state
    store's redis ``ConnectionError`` / ``TimeoutError`` pass through.
    """
    if force:
        queue = store.meta(job_id).get("queue", "")
        if not queue:
            n = sum(1 for _ in store.unfinished(job_id))
            return RequeueResult(job_id, n, 0, "job has no recorded queue" if n else "finished")
        n = _send_in_chunks(store, job_id, store.unfinished(job_id), queue, send)
        return RequeueResult(job_id, n, n, "" if n else "finished")
    res = requeue_lost_jobs(store, [job_id], broker_url=broker_url, send=send, grace=grace,
                            settle=settle)
    if job_id not in res:
        raise UnknownJobError(job_id)
    return res[job_id]


# KEYS[1]: the sweep lock; ARGV: the owner's token, milliseconds. Only while the lock still
# holds the token (it may have expired and been taken by another worker): set its expiry to
# ARGV[2] ms, or delete it when ARGV[2] is 0. One round trip, so nothing can take the lock
# between the check and the change.
_LOCK_IF_OWNED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('DEL', KEYS[1])
"""


class Sweeper:
    """A daemon thread that periodically requeues lost prompts of every unfinished job.

    One sweep at a time across all workers, so a fleet of workers does not scan the broker in
    parallel: a Redis lock (``P:sweep-lock``) holding a random token of its owner. It expires
    ``max(1, interval)`` seconds after it was taken or last renewed, so a worker that dies
    mid-sweep blocks the others for that long at most; a thread renews it every third of that
    while the sweep runs (a sweep of a large job, or of a long broker queue, may take longer
    than the interval). When the sweep ends the lock is kept until ``interval`` seconds after
    it was taken, or deleted if that time is past: the fleet sweeps once an interval, not once
    per worker. Renewing and releasing change the lock only while it still holds the owner's
    token.
    """

    def __init__(self, store: JobStore, *, broker_url: str, interval: float, grace: float,
                 send: Send) -> None:
        self.store, self.broker_url = store, broker_url
        self.interval, self.grace, self.send = interval, grace, send
        self._stop = threading.Event()
        self._lock_if_owned = store.r.register_script(_LOCK_IF_OWNED)
        self.thread = threading.Thread(target=self._main, name="beacon-sweeper", daemon=True)

    @property
    def lock_key(self) -> str:
        return f"{self.store.prefix}:sweep-lock"

    def start(self) -> Sweeper:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sweep_once(self) -> list[RequeueResult]:
        """Check every unfinished job once (if no other worker is sweeping right now)."""
        token = uuid.uuid4().hex
        ttl_ms = max(1000, int(self.interval * 1000))
        taken = time.monotonic()
        if not self.store.r.set(self.lock_key, token, nx=True, px=ttl_ms):
            return []
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(token, ttl_ms, done),
                                   name="beacon-sweep-lock", daemon=True)
        renewer.start()
        try:
            jobs = self.store.active_jobs()
            res = requeue_lost_jobs(self.store, jobs, broker_url=self.broker_url,
                                    send=self.send, grace=self.grace)
            for job_id in jobs:
                if job_id not in res or res[job_id].skipped == "finished":  # expired or done
                    self.store.retire(job_id)
            return list(res.values())
        finally:
            done.set()
            renewer.join()
            left_ms = int((self.interval - (time.monotonic() - taken)) * 1000)
            try:
                self._lock_if_owned(keys=[self.lock_key], args=[token, max(0, left_ms)])
            except redis.exceptions.RedisError:
                # Redis is away (the sweep itself probably failed on it): the lock expires
                # by itself within max(1, interval) seconds of its last renewal.
                log.debug("could not release the sweep lock", exc_info=True)

    def _renew(self, token: str, ttl_ms: int, done: threading.Event) -> None:
        """Push the lock's expiry ``ttl_ms`` ahead every third of it until ``done``."""
        while not done.wait(ttl_ms / 3000):
            try:
                if not self._lock_if_owned(keys=[self.lock_key], args=[token, ttl_ms]):
                    log.warning("the sweep lock expired during a sweep (Redis was slow or "
                                "unreachable for %g s); another worker may sweep at the "
                                "same time", ttl_ms / 1000)
                    return
            except redis.exceptions.RedisError:
                log.warning("could not renew the sweep lock; trying again", exc_info=True)

    def _main(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep_once()
            except Exception:  # the thread must outlive a bad sweep (Redis down, odd data)
                log.warning("sweep failed; trying again in %g s", self.interval, exc_info=True)
