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
Every resend goes through the per-prompt send claims of :meth:`JobStore.claim_sends`, with the
moment just before the broker scans as ``since``: a prompt that a submission (or another check)
sent, or is sending, after that moment is not sent a second time, though the scans missed it.

Memory. A job may have a million prompts, each registered with its full prompt text. The check
never holds more than one chunk (``CHUNK``) of prompt records: the job's prompts are read
``HSCAN`` page by page, and lost ones are resent as they are found, a chunk at a time. What it
keeps for the whole check is a 64-bit digest of each key (8 bytes a prompt, :class:`KeyDigests`):
those pending before the first broker scan and those seen in the broker, of the jobs checked,
and those read while lost ones are resent (``HSCAN`` may return a key twice; each is sent once).

Only a Redis broker can be inspected this way. AMQP brokers keep unacknowledged messages
themselves and redeliver them when a consumer's connection drops, so this loss cannot happen
there; :func:`requeue_lost` refuses other brokers unless ``force`` resends every pending prompt.
"""

from __future__ import annotations

import base64
import contextlib
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
from worker.state import SEND_GROUP, JobStore, UnknownJobError

__all__ = ["CHUNK", "BrokerInspectionError", "BrokerUnreachableError", "KeyDigests",
           "RequeueResult", "Sweeper", "broker_digests", "read_broker", "requeue_lost",
           "requeue_lost_jobs"]

log = logging.getLogger(__name__)

TASK_NAME = "beacon.run_prompt"
_PRIORITY_SEP = "\x06\x16"  # kombu's separator of a queue's priority sub-lists
_UNACKED = "unacked"  # kombu's default ``unacked_key``
CHUNK = 500  # prompt records read per Redis call, and resent per send, at most


def _key_digest(key: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


_MERGE = 1 << 14  # digests KeyDigests keeps in a Python set, at least, before sorting them in


def _sorted_unique(a: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``a``'s distinct values, sorted (a sort and a mask: numpy's ``unique`` may hash)."""
    a = np.sort(a)
    if a.size > 1:
        a = a[np.concatenate(([True], a[1:] != a[:-1]))]
    return a


class KeyDigests:
    """A set of prompt keys held as 64-bit digests (8 bytes a key, not the key's string).

    Two keys share a digest with probability about 2**-64 per pair; for this module's sets
    that would make a lost prompt look queued (not resent by this check), a prompt
    registered during the check look pending before it (at worst one duplicate run, the cost
    of any false positive here), or a pending prompt look already resent in this sweep (left
    to the next one).

    The latest additions sit in a Python set and are sorted into the array in one go when
    the set reaches the larger of ``_MERGE`` and a sixteenth of the array (at most about
    1 MB, or 4 bytes a key, more while the set fills; :meth:`compact` empties it): adds and
    lookups may alternate (a sweep's "resent already?" check) at a small cost each, where
    merging at every lookup would cost a pass over the whole array each time.
    """

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._new: set[int] = set()
        # Keys given at once go straight into the array (no set on the way).
        self._sorted = _sorted_unique(
            np.frombuffer(array("Q", map(_key_digest, keys)), dtype=np.uint64))

    @classmethod
    def of_digests(cls, digests: array[int]) -> KeyDigests:
        """The set of these :func:`_key_digest` values (sorted in one go)."""
        out = cls()
        out._sorted = _sorted_unique(np.frombuffer(digests, dtype=np.uint64))
        return out

    def add(self, key: str) -> None:
        self._add(_key_digest(key))

    def _add(self, d: int) -> None:
        new = self._new
        new.add(d)
        if len(new) >= _MERGE and len(new) >= len(self._sorted) >> 4:
            self.compact()

    def add_new(self, key: str) -> bool:
        """Add ``key``; whether it was not in the set before (one digest for both)."""
        return self._add_new(_key_digest(key))

    def _add_new(self, d: int) -> bool:
        if self._has(d):
            return False
        self._add(d)
        return True

    def compact(self) -> KeyDigests:
        """Sort the latest additions into the array (8 bytes a key from then on); returns
        ``self``. For a set filled once and then only read."""
        if self._new:
            fresh = np.fromiter(self._new, dtype=np.uint64, count=len(self._new))
            self._sorted = _sorted_unique(np.concatenate((self._sorted, fresh)))
            self._new = set()
        return self

    def _frozen(self) -> npt.NDArray[np.uint64]:
        return self.compact()._sorted

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if not self._sorted.size and not self._new:  # a first submission: nothing to look for
            return False
        return self._has(_key_digest(key))

    def _has(self, d: int) -> bool:
        if d in self._new:
            return True
        arr = self._sorted
        if not arr.size:
            return False
        du = np.uint64(d)
        i = int(np.searchsorted(arr, du))
        return i < len(arr) and arr[i] == du

    def __len__(self) -> int:
        return len(self._frozen())

    def __or__(self, other: KeyDigests) -> KeyDigests:
        out = KeyDigests()
        out._sorted = _sorted_unique(np.concatenate((self._frozen(), other._frozen())))
        return out


class BrokerInspectionError(RuntimeError):
    """The broker cannot be inspected for lost messages (not Redis)."""


class BrokerUnreachableError(RuntimeError):
    """The broker could not be read for the messages it holds (down, a network cut, a
    timeout, an error reply such as a refused password). Raised instead of redis's own errors
    so that a caller can tell it from the state store going away: with a Redis broker both
    raise those. ``broker`` is its URL without credentials, ``cause`` redis's error."""

    def __init__(self, broker_url: str, cause: BaseException) -> None:
        self.broker = url_without_credentials(broker_url)
        self.cause = cause
        super().__init__(f"cannot reach the broker {self.broker}: {str(cause).rstrip('.')}")


@contextlib.contextmanager
def read_broker(broker_url: str) -> Iterator[Any]:
    """A Redis client of the broker for the block, closed after it; any redis error inside
    the block is raised as :class:`BrokerUnreachableError` (the state store may be the same
    kind of server, and only the caller knows which one it was reading)."""
    r = redis.Redis.from_url(broker_url)
    try:
        yield r
    except redis.exceptions.RedisError as exc:
        raise BrokerUnreachableError(broker_url, exc) from None
    finally:
        r.close()


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


def broker_digests(r: Any, queues: Iterable[str], jobs: Iterable[str]) -> dict[str, KeyDigests]:
    """Per job of ``jobs``, the prompt keys with a message waiting in ``queues`` or held
    unacknowledged, as :class:`KeyDigests` (8 bytes a message; one pass over the queue lists
    and the ``unacked`` hash, whatever the number of jobs)."""
    found = {j: array("Q") for j in jobs}  # filled, then sorted once (no lookups meanwhile)
    for job_id, key in _broker_tasks(r, queues):
        digests = found.get(job_id)
        if digests is not None:
            digests.append(_key_digest(key))
    return {j: KeyDigests.of_digests(d) for j, d in found.items()}


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
            f"broker {url_without_credentials(broker_url)!r} is not Redis: lost messages can "
            "only be found on a Redis broker (AMQP brokers redeliver unacknowledged messages "
            "themselves); use force to resend every pending prompt")
    queues = sorted(set().union(*(qs for _, qs, _ in checked.values())))
    # Before the broker is read: a prompt sent after this may be missing from the scans, and
    # is left to its sender (JobStore.claim_sends); one sent before is in them unless lost.
    since = store.now_us()
    with read_broker(broker_url) as r:
        # Twice, ``settle`` apart: a message moving between a queue and ``unacked`` is in
        # neither for milliseconds, but never in neither at both scans.
        first = broker_digests(r, queues, checked)
        time.sleep(settle)
        second = broker_digests(r, queues, checked)
    for job_id, (queue, _, pending) in checked.items():
        seen = first.pop(job_id) | second.pop(job_id)
        still = [0]  # prompts still pending now, counted as the scan goes

        def lost(job_id: str = job_id, pending: KeyDigests = pending,
                 seen: KeyDigests = seen, still: list[int] = still
                 ) -> Iterator[tuple[str, dict[str, Any]]]:
            read = KeyDigests()  # each prompt once: see _distinct
            for k, p in store.unfinished(job_id):
                d = _key_digest(k)  # once for the three sets (the check runs per prompt)
                if not read._add_new(d):
                    continue
                still[0] += 1
                if pending._has(d) and not seen._has(d):
                    yield k, p

        try:
            n_lost = _send_in_chunks(store, job_id, lost(), queue, send, since=since)
        except UnknownJobError:
            # Purged (or expired) since it was read above: nothing more is sent, and the
            # job is left out as unknown. A chunk that went out just before the purge is
            # dropped by the workers (the job is gone: nothing runs).
            log.info("job %s is gone (purged or expired) while its lost prompts were being "
                     "sent again", job_id)
            continue
        if n_lost:
            log.warning("job %s: %d prompt message(s) lost by the broker; sent them again",
                        job_id, n_lost)
        out[job_id] = RequeueResult(job_id, still[0], n_lost)
    return out


def _distinct(items: Iterable[tuple[str, dict[str, Any]]]
              ) -> Iterator[tuple[str, dict[str, Any]]]:
    """``items`` with each key's first occurrence only. ``HSCAN`` may return a field twice
    (the hash was rehashed while it was scanned): a lost prompt read twice would be resent,
    and run and paid for, twice in one sweep. 8 bytes a key (:class:`KeyDigests`)."""
    seen = KeyDigests()
    for k, p in items:
        if seen.add_new(k):
            yield k, p


def _key(item: tuple[str, dict[str, Any]]) -> str:
    """The prompt key of a ``(key, payload)`` item."""
    return item[0]


def _send_in_chunks(store: JobStore, job_id: str, items: Iterable[tuple[str, dict[str, Any]]],
                    queue: str, send: Send, *, since: int) -> int:
    """Send ``items`` ``CHUNK`` at a time (each chunk's records are all that is held);
    returns how many were sent. Each chunk is first claimed (:meth:`JobStore.claim_sends`
    with ``since``, which also checks that the job still exists): only its claimed prompts are
    sent, those another sender sent or is sending are left to it. The chunk is stamped once it
    went out (a failed send is no send: the sweeper's grace period must not skip the job for
    it). The claim and the stamp raise :class:`~worker.state.UnknownJobError`, writing and
    sending nothing more, once the job is gone (purged or expired meanwhile): a send must
    not bring a job back. A purge landing during a chunk's send leaves that chunk to the
    workers, which drop it (nothing runs for a gone job)."""
    n = 0
    batch: list[tuple[str, dict[str, Any]]] = []

    def flush() -> None:
        nonlocal n, batch
        chunk, batch = batch, []  # a new list: ``send`` may keep the one it was given
        for i in range(0, len(chunk), SEND_GROUP):  # a claim is held while its group is sent
            todo, _held = store.send_claimed(
                job_id, chunk[i:i + SEND_GROUP], _key, since=since,
                send=lambda part: send(job_id, part, queue),
            )
            if todo:
                store.mark_sent(job_id, queue)
                n += len(todo)

    for item in items:
        batch.append(item)
        if len(batch) >= CHUNK:
            flush()
    if batch:
        flush()
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
    are harmless but cost a run) but those another sender sent or claimed since the call
    began (:meth:`JobStore.claim_sends`).
    Raises :class:`~worker.state.UnknownJobError` for a job the store does not know (or no
    longer knows when the lost prompts are about to be sent: purged meanwhile),
    :class:`BrokerUnreachableError` when the broker cannot be read; what ``send`` raises
    (:func:`worker.tasks.resend`: kombu's ``OperationalError`` for the broker) and the state
    store's redis ``ConnectionError`` / ``TimeoutError`` pass through.
    """
    if force:
        since = store.now_us()  # prompts sent after this are their sender's (claim_sends)
        queue = store.meta(job_id).get("queue", "")
        if not queue:
            n = sum(1 for _ in _distinct(store.unfinished(job_id)))
            return RequeueResult(job_id, n, 0, "job has no recorded queue" if n else "finished")
        read = [0]

        def counted() -> Iterator[tuple[str, dict[str, Any]]]:
            for item in _distinct(store.unfinished(job_id)):
                read[0] += 1
                yield item

        sent = _send_in_chunks(store, job_id, counted(), queue, send, since=since)
        return RequeueResult(job_id, read[0], sent, "" if read[0] else "finished")
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
