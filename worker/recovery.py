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

Only a Redis broker can be inspected this way. AMQP brokers keep unacknowledged messages
themselves and redeliver them when a consumer's connection drops, so this loss cannot happen
there; :func:`requeue_lost` refuses other brokers unless ``force`` resends every pending prompt.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from worker.config import is_redis_url
from worker.state import JobStore, UnknownJobError

__all__ = ["BrokerInspectionError", "RequeueResult", "Sweeper", "broker_keys", "in_broker",
           "requeue_lost", "requeue_lost_jobs"]

log = logging.getLogger(__name__)

TASK_NAME = "beacon.run_prompt"
_PRIORITY_SEP = "\x06\x16"  # kombu's separator of a queue's priority sub-lists
_UNACKED = "unacked"  # kombu's default ``unacked_key``


class BrokerInspectionError(RuntimeError):
    """The broker cannot be inspected for lost messages (not Redis)."""


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


def broker_keys(r: Any, queues: Iterable[str]) -> dict[str, set[str]]:
    """Per job id, the prompt keys with a message waiting in ``queues`` or held unacknowledged
    (one pass over the queue lists and the ``unacked`` hash, whatever the number of jobs)."""
    found: dict[str, set[str]] = {}

    def take(raw: bytes | str) -> None:
        args = _task_args(raw)
        if args is not None:
            found.setdefault(str(args[0]), set()).add(str(args[1]))

    for q in queues:
        for name in _queue_lists(r, q):
            start = 0
            while True:  # in pages: a queue may hold hundreds of thousands of messages
                page = r.lrange(name, start, start + 999)
                for raw in page:
                    take(raw)
                if len(page) < 1000:
                    break
                start += 1000
    for _tag, raw in r.hscan_iter(_UNACKED, count=500):
        take(raw)
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
    # job -> (its latest queue, every queue it was sent to, pending prompts)
    checked: dict[str, tuple[str, set[str], dict[str, dict[str, Any]]]] = {}
    now = time.time()
    for job_id in job_ids:
        try:
            meta = store.meta(job_id)
        except UnknownJobError:
            continue
        queue = meta.get("queue", "")
        pending = dict(store.unfinished(job_id))
        age = now - float(meta.get("sent", 0.0))
        if not pending:
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
        first = broker_keys(r, queues)
        time.sleep(settle)
        second = broker_keys(r, queues)
    finally:
        r.close()
    for job_id, (queue, _, pending) in checked.items():
        seen = first.get(job_id, set()) | second.get(job_id, set())
        still = dict(store.unfinished(job_id))
        lost = sorted((k, p) for k, p in still.items() if k in pending and k not in seen)
        if lost:
            log.warning("job %s: %d prompt message(s) lost by the broker; sending them again",
                        job_id, len(lost))
            send(job_id, lost, queue)
            store.mark_sent(job_id, queue)
        out[job_id] = RequeueResult(job_id, len(still), len(lost))
    return out


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

    ``send(job_id, [(key, payload)], queue)`` sends the tasks (:func:`worker.tasks.resend`).
    ``force`` skips the broker inspection and the grace period and resends every pending
    prompt (for brokers that cannot be inspected; duplicates are harmless but cost a run).
    Raises :class:`~worker.state.UnknownJobError` for a job the store does not know.
    """
    if force:
        queue = store.meta(job_id).get("queue", "")
        pending = dict(store.unfinished(job_id))
        if not pending:
            return RequeueResult(job_id, 0, 0, "finished")
        if not queue:
            return RequeueResult(job_id, len(pending), 0, "job has no recorded queue")
        send(job_id, sorted(pending.items()), queue)
        store.mark_sent(job_id, queue)
        return RequeueResult(job_id, len(pending), len(pending))
    res = requeue_lost_jobs(store, [job_id], broker_url=broker_url, send=send, grace=grace,
                            settle=settle)
    if job_id not in res:
        raise UnknownJobError(job_id)
    return res[job_id]


class Sweeper:
    """A daemon thread that periodically requeues lost prompts of every unfinished job.

    One sweep at a time across all workers (a Redis lock that expires with the interval),
    so a fleet of workers does not scan the broker in parallel.
    """

    def __init__(self, store: JobStore, *, broker_url: str, interval: float, grace: float,
                 send: Send) -> None:
        self.store, self.broker_url = store, broker_url
        self.interval, self.grace, self.send = interval, grace, send
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name="beacon-sweeper", daemon=True)

    def start(self) -> Sweeper:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sweep_once(self) -> list[RequeueResult]:
        """Check every unfinished job once (if no other worker is sweeping right now)."""
        lock = f"{self.store.prefix}:sweep-lock"
        if not self.store.r.set(lock, "1", nx=True, ex=max(1, int(self.interval))):
            return []
        jobs = self.store.active_jobs()
        res = requeue_lost_jobs(self.store, jobs, broker_url=self.broker_url, send=self.send,
                                grace=self.grace)
        for job_id in jobs:
            if job_id not in res or res[job_id].skipped == "finished":  # expired or done
                self.store.retire(job_id)
        return list(res.values())

    def _main(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep_once()
            except Exception:  # the thread must outlive a bad sweep (Redis down, odd data)
                log.warning("sweep failed; trying again in %g s", self.interval, exc_info=True)
