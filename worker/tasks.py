"""Celery tasks of the BEACON worker tier: one task per prompt, idempotent, fan-in via Redis.

Event loop. Each worker process owns ONE asyncio event loop, started at ``worker_process_init``
(prefork children; lazily for the ``solo``/``threads`` pools) in a daemon thread and reused by
every task of the process: the task body submits its coroutine with
``asyncio.run_coroutine_threadsafe`` and waits. Generators and scorers are built once per
process and spec (:class:`beacon.jobs.execute.FactoryCache`), so their HTTP sessions and
connection pools are shared by all prompts and all threads of the process, and with
``--pool threads`` many prompts of one process run concurrently on the one loop. Celery's
signal-based soft time limit then lands in the waiting thread, never inside the loop.

Idempotency. A task first looks its key up in the job's results and returns at once if a result
is there (a redelivery after a worker died between storing and acknowledging), or if the job is
no longer in the state store (purged or expired: nothing would read the outcome); the same round
trip counts the run as started (``BEACON_MAX_LOST_RUNS``, :meth:`JobStore.begin_run`); results are
stored with ``HSETNX`` (:mod:`worker.state`), so a duplicate delivery racing the first one
cannot write twice. With ``acks_late`` and ``task_reject_on_worker_lost`` a killed worker's
messages are redelivered (prefork child lost: at once; whole worker lost: after the Redis
visibility timeout), so every prompt ends with exactly one result.

Time limits. The engine gets a deadline of ``BEACON_SOFT_TIME_LIMIT`` seconds
(``Budget.max_seconds``): at it sampling stops with ``stop_reason="budget"`` and the partial
result (best so far) is stored like any other. Celery's own soft limit fires a grace period later
as a backstop; the task then cancels the query and stores the best sample seen by its observer.

Where the job lives. Each message carries, in its headers, the key prefix of the submitter's state
store (``beacon_prefix``) and that store's id (``beacon_store``, :meth:`JobStore.store_id`). A
worker reads and writes the job under the message's prefix, whatever its own
``BEACON_KEY_PREFIX`` (it logs a warning naming both once per process): the submitter reads the
outcome there. A worker whose state store is not the submitter's (its ``P:store-id`` differs)
cannot store the outcome where the submitter looks: it logs an error naming both prefixes and
stores, waits a few seconds and rejects the message *with* requeue, so a correctly configured
worker runs it; nothing is run, stored or acknowledged. Messages without these headers (older
submitters) use the worker's own settings, as before.

Retries. Storing a computed outcome is retried in the task itself for up to
``SAVE_PATIENCE`` seconds (a retry of the task would run the prompt, and pay for it, again).
Other transient infrastructure errors (Redis or network down), and a store that still fails,
retry the task with exponential backoff and jitter (``retry_backoff``, ``retry_jitter``); model
and scorer errors are retried per call inside the engine and never fail the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import math
import os
import threading
import time
import unicodedata
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import redis
from celery import group, signals
from celery.exceptions import Reject, SoftTimeLimitExceeded

from beacon._checks import boolean, positive_int
from beacon.errors import ConfigError
from beacon.events import BeaconEvent, SampleEvent
from beacon.jobs.dpo import dpo_record
from beacon.jobs.execute import (
    FactoryCache,
    Outcome,
    PromptExecutor,
    error_record,
    line_error_record,
    prepare_config,
    result_record,
)
from beacon.jobs.keys import InputKeys, job_fingerprint, prompt_key
from beacon.jobs.spec import (
    FactorySpec,
    JobInputError,
    JobSpec,
    LineError,
    PromptRecord,
    canonical_json,
)
from beacon.result import BeaconResult, Candidate
from worker.app import app, settings
from worker.config import is_redis_url, url_without_credentials
from worker.state import SEND_GROUP, JobStore, UnknownJobError

if TYPE_CHECKING:
    from worker.recovery import KeyDigests

__all__ = ["BrokerUnavailableError", "ForeignStoreError", "LostRunsError", "MessageHeaderError",
           "SubmitResult", "get_loop", "resend", "run_prompt", "submit_job"]

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
    TimeoutError,
)


# -- the per-process event loop -----------------------------------------------------------------
class _ProcessLoop:
    """An event loop running forever in a daemon thread of this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="beacon-loop", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


_lock = threading.Lock()
_proc_loop: _ProcessLoop | None = None
_store: JobStore | None = None
_cache: FactoryCache | None = None
_executors: OrderedDict[str, PromptExecutor] = OrderedDict()


def get_loop() -> _ProcessLoop:
    """This process's loop (created on first use, and anew in a forked child)."""
    global _proc_loop
    with _lock:
        if _proc_loop is None or _proc_loop.pid != os.getpid():
            _proc_loop = _ProcessLoop()
        return _proc_loop


def get_store() -> JobStore:
    global _store
    with _lock:
        if _store is None:
            _store = JobStore.from_settings(settings)
        return _store


# -- where a message's job lives ------------------------------------------------------------------
HEADER_PREFIX = "beacon_prefix"  # the submitter's BEACON_KEY_PREFIX
HEADER_STORE = "beacon_store"  # the submitter's state store id (JobStore.store_id)


class MessageHeaderError(ConfigError):
    """A task message header that is not what a BEACON submitter writes (``field`` names the
    header, ``value`` is its value). The message is failed and acknowledged."""


class LostRunsError(ConfigError):
    """A prompt whose runs died with their worker process ``value`` times (``field`` is
    ``BEACON_MAX_LOST_RUNS``): it is failed instead of being run, and paid for, again."""


class ForeignStoreError(ConfigError):
    """This worker's state store is not the one the message's job lives in (``field`` is
    ``BEACON_STATE_URL``, ``value`` the worker's URL without credentials). The message is
    refused without being acknowledged, for a correctly configured worker to take."""


_prefixed: dict[str, JobStore] = {}
_warned_prefixes: set[str] = set()


def _headers(request: Any) -> dict[str, Any]:
    """The BEACON headers of the message being run (empty for older submitters)."""
    custom = getattr(request, "headers", None)
    h = dict(custom) if isinstance(custom, Mapping) else {}
    for name in (HEADER_PREFIX, HEADER_STORE):
        if name not in h and getattr(request, name, None) is not None:
            h[name] = getattr(request, name)
    return h


def _store_for_message(job_id: str, headers: Mapping[str, Any]) -> JobStore:
    """The store holding the message's job: the worker's state store under the message's key
    prefix. Raises :class:`ForeignStoreError` when the message names another state store,
    :class:`MessageHeaderError` for a malformed header."""
    base = get_store()
    prefix = headers.get(HEADER_PREFIX)
    if prefix is None:  # an older submitter: the worker's own settings, as before
        return base
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        raise MessageHeaderError(HEADER_PREFIX, prefix,
                                 "must be a non-empty key prefix without spaces")
    want = headers.get(HEADER_STORE)
    if want is not None and not (isinstance(want, str) and want):
        raise MessageHeaderError(HEADER_STORE, want, "must be a non-empty store id")
    if prefix == base.prefix:
        st = base
    else:
        with _lock:
            if prefix not in _prefixed:
                _prefixed[prefix] = JobStore(base.url, prefix=prefix, ttl=base.ttl,
                                             client=base.r)
            st = _prefixed[prefix]
    # The id read first is cached; only a mismatch is read again (the store may have a new
    # one): one GET per process, not per message.
    if want is not None and want != st.store_id(create=False) \
            and want != st.store_id(create=False, fresh=True):
        raise ForeignStoreError(
            "BEACON_STATE_URL", url_without_credentials(base.url),
            f"job {job_id!r} lives in the submitter's state store (BEACON_KEY_PREFIX="
            f"{prefix!r}, store id {want}), not in this worker's (BEACON_KEY_PREFIX="
            f"{base.prefix!r}, store id {st.store_id(create=False) or 'none'}): start this worker "
            "with the submitter's BEACON_STATE_URL (or, if this store was wiped since the job "
            "was submitted, purge the queue: the job is gone)")
    if prefix != base.prefix and prefix not in _warned_prefixes:
        _warned_prefixes.add(prefix)
        log.warning("job %s was submitted with BEACON_KEY_PREFIX=%r but this worker has "
                    "BEACON_KEY_PREFIX=%r: it works on the job under the submitter's prefix "
                    "(same state store), but its lost-message sweeper only watches jobs of "
                    "%r; give it the submitters' prefix", job_id, prefix, base.prefix,
                    base.prefix)
    return st


def _refusal_delay() -> float:
    """Seconds a refused message is held before it goes back to the queue: long enough that
    a lone misconfigured worker does not spin on it, short enough for the time limits."""
    return min(10.0, max(1.0, settings.retry_backoff_max), settings.soft_time_limit / 2)


def _refuse(job_id: str, key: str, exc: ForeignStoreError) -> NoReturn:
    delay = _refusal_delay()
    log.error("refused prompt %s of job %s: %s. The message goes back to the queue "
              "unacknowledged (after %g s) for a correctly configured worker; nothing was "
              "run or stored", key, job_id, exc, delay)
    time.sleep(delay)
    raise Reject(str(exc), requeue=True)


_prep_lock = threading.Lock()
_prepared: set[str] = set()


def _prepare(cfg_key: str, spec: JobSpec) -> None:
    # Serialized with the warm-up: both may load tables and JIT kernels, once per process.
    with _prep_lock:
        if cfg_key not in _prepared:
            prepare_config(spec.config)
            _prepared.add(cfg_key)


async def _prepare_off_loop(cfg_key: str, spec: JobSpec) -> None:
    await asyncio.to_thread(_prepare, cfg_key, spec)


def _executor(spec: JobSpec) -> PromptExecutor:
    """The process's executor for ``spec``, its tables loaded (outside the engine deadline).

    Table loading runs in a helper thread while the task thread only waits, so Celery's
    signal-based soft time limit can never interrupt it half-way (an exception raised inside
    an LLVM/numba initialization can leave the process unusable).
    """
    global _cache
    k = canonical_json(spec.to_dict())
    cfg_key = canonical_json(spec.config.to_dict())
    if cfg_key not in _prepared:
        get_loop().submit(_prepare_off_loop(cfg_key, spec)).result()
    with _lock:
        if _cache is None:
            _cache = FactoryCache(settings.allowed_factories)
        ex = _executors.get(k)
        if ex is None:
            ex = PromptExecutor(spec, allowed=settings.allowed_factories,
                                call_concurrency=settings.engine_concurrency, cache=_cache)
            _executors[k] = ex
            while len(_executors) > 16:
                _executors.popitem(last=False)
        else:
            _executors.move_to_end(k)
        return ex


def _warm_up() -> None:
    # The first normal-family decision loads the h-table and JIT-compiled kernels (seconds);
    # doing it off the task path keeps it out of the first prompt's time limit.
    import beacon

    try:
        _prepare(canonical_json(beacon.BeaconConfig().to_dict()),
                 JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                         beacon.BeaconConfig()))
    except Exception:  # a warm-up failure only costs time later
        log.debug("warm-up failed", exc_info=True)


@signals.worker_process_init.connect  # type: ignore[untyped-decorator]
def _init_process(**_: Any) -> None:
    # A forked child must not reuse the parent's loop, sockets or sessions.
    global _store, _cache
    _store, _cache = None, None
    _executors.clear()
    _prefixed.clear()
    get_loop()
    if os.environ.get("BEACON_WARMUP", "1") != "0":
        # In a thread: the pool waits only a few seconds for a new child to report "up".
        threading.Thread(target=_warm_up, name="beacon-warmup", daemon=True).start()


@signals.worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _shutdown_process(**_: Any) -> None:
    global _proc_loop
    pl, cache = _proc_loop, _cache
    if pl is None or pl.pid != os.getpid():
        return
    if cache is not None:
        try:
            pl.submit(cache.aclose()).result(timeout=10)
        except Exception:  # best effort: the process is exiting
            log.warning("closing generators/scorers failed", exc_info=True)
    pl.stop()
    _proc_loop = None


# -- the task -------------------------------------------------------------------------------------
_specs: OrderedDict[str, JobSpec] = OrderedDict()


def _job_spec(job_id: str, spec: str | dict[str, Any], store: JobStore) -> JobSpec:
    """The job spec a message names: a reference (fetched from the store once per process and
    checked against its hash) or, from older submitters, the spec itself."""
    k = spec if isinstance(spec, str) else canonical_json(spec)
    with _lock:
        job = _specs.get(k)
        if job is not None:
            _specs.move_to_end(k)
            return job
    data = store.spec(job_id, spec) if isinstance(spec, str) else spec
    job = JobSpec.from_dict(data)
    with _lock:
        _specs[k] = job
        while len(_specs) > 64:
            _specs.popitem(last=False)
    return job


def _partial_outcome(key: str, record: PromptRecord, events: list[BeaconEvent],
                     exc: BaseException, *, keep_candidates: bool = False) -> Outcome:
    """The best sample an observer saw before the backstop time limit hit, as a line of the
    usual format (``rewards`` in draw order, ``candidates`` when the job keeps them) and the
    DPO pair of the samples seen, so no paid sample's pair is lost."""
    seen: dict[int, Candidate] = {}
    for e in events:
        if isinstance(e, SampleEvent) and e.index not in seen:
            ok = not e.failed and e.reward is not None and math.isfinite(e.reward)
            seen[e.index] = Candidate(e.index, e.text, e.reward if ok else None,
                                      failed=not ok, error=e.error)
    cands = [seen[i] for i in sorted(seen)]
    res = BeaconResult(record.prompt, cands, stop_reason="budget")
    res.n_samples = len(res.scored)
    if res.best is None:
        why = TimeoutError(f"task time limit ({settings.celery_soft_time_limit:g} s) hit before "
                           f"any sample was scored ({type(exc).__name__})")
        return Outcome(key, error_record(key, record, why), None)
    out = result_record(key, record, res, keep_candidates=keep_candidates)
    # the engine's usage died with the query; say why the line is partial
    out.update(usage=None, error={
        "type": type(exc).__name__,
        "message": "task time limit hit; partial result (best sample so far)"})
    return Outcome(key, out, dpo_record(key, record.id, record.prompt, res.preference_pair()))


@app.task(  # type: ignore[untyped-decorator]
    bind=True,
    name="beacon.run_prompt",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=True,
    retry_backoff_max=int(settings.retry_backoff_max),
    retry_jitter=True,
    max_retries=settings.task_max_retries,
)
def run_prompt(self: Any, job_id: str, key: str, record: dict[str, Any], line: int | None,
               spec: str | dict[str, Any]) -> str:
    """Run BEACON on one prompt of job ``job_id`` and store the outcome under ``key``.

    Returns ``"ok"``, ``"failed"`` (an error record was stored), ``"duplicate"`` (a result
    already existed; nothing was run) or ``"unknown-job"`` (the job is no longer in the state
    store, purged or expired: nothing was run or stored). A message whose job lives in another
    state store is rejected with requeue (:class:`ForeignStoreError`, see the module docstring).
    Redis round trips per prompt: two (:meth:`JobStore.begin_run`, then the outcome's store,
    which also ends the run), plus one per process for each spec it has not seen yet.
    """
    try:
        store = _store_for_message(job_id, _headers(self.request))
    except ForeignStoreError as exc:
        _refuse(job_id, key, exc)
    # A run cut off by the death of its process (SIGKILL, out of memory, a crash, the hard
    # time limit) never ends its count (below): it stays. Celery redelivers such a message at
    # once (task_reject_on_worker_lost) and the sweeper resends one acknowledged by the hard
    # limit, so without a bound a prompt that kills its worker runs forever.
    try:
        runs = store.begin_run(job_id, key)
    except UnknownJobError:
        _gone(store, job_id, key)
        return "unknown-job"
    if runs is None:
        return "duplicate"
    try:
        rec: PromptRecord | None = None
        try:
            job = _job_spec(job_id, spec, store)
            rec = PromptRecord.from_dict(record, line=line)
            if prompt_key(rec, job) != key:
                raise JobInputError("key", key, "does not match the prompt and job spec (the "
                                                "message was altered or built by another "
                                                "version)")
        except UnknownJobError:  # purged between the check and the spec's read
            store.end_run(job_id, key)
            _gone(store, job_id, key)
            return "unknown-job"
        except (JobInputError, ValueError, TypeError) as exc:
            store.store_error(job_id, key, {"record": error_record(key, rec, exc, line=line)},
                              end_run=True)
            return "failed"
        # An earlier attempt of this message that raised for a retry (autoretry: Redis down
        # while it stored its outcome) did not die, but its decrement may have been lost with
        # Redis: each such attempt is taken off the count, so an outage is never called a dead
        # process.
        retried = getattr(self.request, "retries", 0)
        retried = retried if isinstance(retried, int) and retried > 0 else 0
        lost = max(0, runs - 1 - retried)
        if settings.max_lost_runs and lost >= settings.max_lost_runs:
            why = LostRunsError(
                "BEACON_MAX_LOST_RUNS", settings.max_lost_runs,
                f"the worker process running this prompt died {lost} time(s) before it "
                f"finished (killed, out of memory, a crash, or over BEACON_TIME_LIMIT="
                f"{settings.time_limit:g} s); not run again: fix the cause, then submit with "
                "--retry-failed")
            log.error("prompt %r of job %s: %s", rec.id, job_id, why)
            store.store_error(job_id, key, {"record": error_record(key, rec, why)})
            store.end_run(job_id, key, forget=True)  # a --retry-failed starts a fresh count
            return "failed"
        # returns only once the outcome is stored, which also counted the run as ended
        return _run(store, job_id, key, rec, job)
    except UnknownJobError:  # purged while the prompt ran: its outcome has nowhere to go
        _gone(store, job_id, key)
        return "unknown-job"
    except BaseException:
        with contextlib.suppress(*TRANSIENT_ERRORS):  # a lost decrement costs one count
            store.end_run(job_id, key)
        raise


_gone_jobs: OrderedDict[tuple[str, str], None] = OrderedDict()


def _gone(store: JobStore, job_id: str, key: str) -> None:
    # Once per job and process: a purged job may leave a whole queue of messages behind.
    with _lock:
        first = (store.prefix, job_id) not in _gone_jobs
        _gone_jobs[(store.prefix, job_id)] = None
        while len(_gone_jobs) > 256:
            _gone_jobs.popitem(last=False)
    (log.warning if first else log.debug)(
        "prompt %s of job %s not run: the job is not in the state store under "
        "BEACON_KEY_PREFIX=%r (purged, or expired BEACON_JOB_TTL after its last write); its "
        "messages are dropped", key, job_id, store.prefix)


def _run(store: JobStore, job_id: str, key: str, rec: PromptRecord, job: JobSpec) -> str:
    events: list[BeaconEvent] = []
    fut: concurrent.futures.Future[Outcome] | None = None
    try:
        executor = _executor(job)
        fut = get_loop().submit(
            executor.run(rec, key, max_seconds=settings.soft_time_limit,
                         observers=[events.append])
        )
        outcome = fut.result()
    except SoftTimeLimitExceeded as exc:
        # The backstop fired (the engine's own deadline did not end the query in time, or
        # loading tables took that long): keep the best sample seen, or record the failure.
        if fut is not None:
            fut.cancel()
            with contextlib.suppress(BaseException):  # we only wait for the cancellation
                fut.result(timeout=5)
        outcome = _partial_outcome(key, rec, events, exc, keep_candidates=job.keep_candidates)
    except TRANSIENT_ERRORS:
        raise  # autoretry with backoff and jitter
    except Exception as exc:
        # A bug or an unexpected failure: with acks_late the message is acknowledged anyway,
        # so record it, or the prompt would stay "pending" forever.
        log.exception("prompt %r of job %s failed", rec.id, job_id)
        outcome = Outcome(key, error_record(key, rec, exc), None)
    return _save(store, job_id, key, outcome)


SAVE_PATIENCE = 30.0  # seconds storing a computed outcome is retried in the task itself


def _save(store: JobStore, job_id: str, key: str, outcome: Outcome) -> str:
    """Store a computed outcome, and count its run as ended in the same round trip, retrying
    transient errors here for up to ``SAVE_PATIENCE`` seconds: a retry of the task would run
    the prompt, and pay for it, again."""
    deadline = time.monotonic() + SAVE_PATIENCE
    delay = 0.5
    while True:
        try:
            store_outcome = store.store_result if outcome.ok else store.store_error
            store_outcome(job_id, key, outcome.to_payload(), end_run=True)
            return "ok" if outcome.ok else "failed"
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise  # the task is retried (autoretry): the prompt runs again
            log.warning("storing prompt %s of job %s failed (%s); trying again in %g s", key,
                        job_id, exc, delay)
            time.sleep(delay)
            delay = min(2 * delay, 8.0)


def _send_tasks(st: JobStore, job_id: str, spec_ref: str, queue: str,
                tasks: list[tuple[str, dict[str, Any], int | None]]) -> None:
    """Send one ``run_prompt`` task per ``(key, record, line)`` to ``queue`` (groups of 500)
    and stamp the job's send time (what the lost-message sweeper's grace period reads)."""
    # Read each time (two round trips per chunk): a store wiped since gets a new id.
    headers = {HEADER_PREFIX: st.prefix, HEADER_STORE: st.store_id(fresh=True)}
    for i in range(0, len(tasks), 500):
        group(run_prompt.s(job_id, k, r, ln, spec_ref).set(queue=queue, headers=headers)
              for k, r, ln in tasks[i:i + 500]).apply_async()
    st.mark_sent(job_id, queue)


def resend(job_id: str, items: list[tuple[str, dict[str, Any]]], queue: str,
           *, store: JobStore | None = None) -> None:
    """Send the tasks of registered prompts (``(key, {"record", "line", "spec"})``) again,
    each with the spec it was registered with (a job id submitted again with another spec
    holds prompts of both); prompts registered without one get the job's latest spec."""
    st = store or get_store()
    by_ref: dict[str, list[tuple[str, dict[str, Any], int | None]]] = {}
    latest: str | None = None  # the job's latest spec, read once if a prompt lacks its own
    for k, p in items:
        ref = p.get("spec")
        if not isinstance(ref, str):
            if latest is None:
                latest = st.spec_ref(st.spec(job_id))
            ref = latest
        by_ref.setdefault(ref, []).append((k, p["record"], p.get("line")))
    for ref, tasks in by_ref.items():
        _send_tasks(st, job_id, ref, queue, tasks)


_sweeper: Any = None


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _start_sweeper(**_: Any) -> None:
    # In the worker's main process: periodically resend prompts whose message the broker lost
    # (a worker killed between Redis's pop and kombu's unacked bookkeeping; worker.recovery).
    global _sweeper
    if settings.sweep_interval <= 0 or not is_redis_url(settings.broker_url):
        return
    from worker.recovery import Sweeper

    _sweeper = Sweeper(JobStore.from_settings(settings), broker_url=settings.broker_url,
                       interval=settings.sweep_interval, grace=settings.sweep_grace,
                       send=resend).start()


# -- submission ------------------------------------------------------------------------------------
class BrokerUnavailableError(RuntimeError):
    """The broker could not be reached while submitting.

    ``job_id`` is None when it failed before anything was registered (the broker is checked
    first, so a wrong or closed broker leaves no trace in the state store). Otherwise the job
    exists and ``sent`` of its prompts' tasks went out; submitting the same input again sends
    the rest (and, on a Redis broker, not those already queued)."""

    def __init__(self, broker: str, cause: BaseException, *, job_id: str | None = None,
                 sent: int = 0) -> None:
        where = f"cannot reach the broker {broker}: {str(cause).rstrip('.')}"
        if job_id is None:
            msg = f"{where}; nothing was submitted"
        else:
            msg = (f"{where}; job {job_id} is registered but only {sent} task(s) were sent: "
                   "submit the same input again to send the rest")
        super().__init__(msg)
        self.broker, self.job_id, self.sent = broker, job_id, sent


def _broker_label() -> str:
    return repr(url_without_credentials(str(app.conf.broker_url or "")))


def _check_broker() -> None:
    """Connect to the broker once (fast failure, before the job is registered)."""
    from kombu.exceptions import OperationalError

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.5,
                                   interval_max=0.5)
    except (OperationalError, OSError) as exc:
        raise BrokerUnavailableError(_broker_label(), exc) from None


def _queued_keys(st: JobStore, job_id: str, queues: set[str]) -> KeyDigests:
    """Prompt keys of ``job_id`` whose task is already waiting in ``queues`` or held
    unacknowledged by a worker (Redis broker only; empty for others, which cannot be read).

    As 64-bit digests (:class:`~worker.recovery.KeyDigests`, 8 bytes a queued message): a
    resubmission holds them for as long as it sends, and a backlog may be millions deep. A
    digest collision (about 2**-64 a pair) would leave one unqueued prompt unsent, to the
    sweeper (:mod:`worker.recovery`) once the colliding message is gone.
    Raises :class:`~worker.recovery.BrokerUnreachableError` when the broker cannot be read
    (not redis's own error, which the caller would take for the state store's)."""
    from worker.recovery import KeyDigests, broker_digests, read_broker

    url = str(app.conf.broker_url or "")
    if not is_redis_url(url) or not queues:
        return KeyDigests()
    with read_broker(url) as r:
        return broker_digests(r, sorted(queues), [job_id])[job_id]


@dataclass(frozen=True)
class SubmitResult:
    """``enqueued``: tasks sent now; ``already``: prompts with a stored outcome (not resent);
    ``bad_lines``: distinct bad input lines, recorded as errors at submission (each lists every
    line number it occurs on); ``duplicates``: input lines repeating a prompt or a bad line seen
    earlier in the input (not sent again); ``queued``: prompts of a resubmitted job whose task
    is still waiting in the broker or running, or that a concurrent submission of the job (or
    a sweep) sent meanwhile (not sent again); ``sending``: prompts another sender has claimed
    and not yet sent (not sent again: being sent now, or, if that sender died, sent by the
    next sweep on a Redis broker or by a submission ``SEND_LEASE`` seconds later); ``total``:
    the job's prompts."""

    job_id: str
    total: int
    enqueued: int
    already: int
    bad_lines: int
    duplicates: int = 0
    queued: int = 0
    sending: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "total": self.total, "enqueued": self.enqueued,
                "already": self.already, "bad_lines": self.bad_lines,
                "duplicates": self.duplicates, "queued": self.queued, "sending": self.sending}


def _check_submit_args(
    items: Any, spec: Any, job_id: Any, input_digest: Any, source: Any, retry_failed: Any,
    chunk: Any, store: Any, queue: Any,
) -> None:
    """Every argument of :func:`submit_job`, checked before the job record is created."""
    if not isinstance(spec, JobSpec):
        raise JobInputError("spec", spec, "must be a beacon.jobs.JobSpec")
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise JobInputError(
            "items", items, "must be an iterable of PromptRecord / LineError (e.g. read_prompts)"
        )
    for name, v in (("job_id", job_id), ("input_digest", input_digest), ("queue", queue)):
        if v is not None and not (isinstance(v, str) and v):
            raise JobInputError(name, v, "must be a non-empty string or None")
    if job_id is not None and any(c.isspace() or unicodedata.category(c) == "Cc" for c in job_id):
        # The id is printed on a line of its own for `JOB=$(beacon submit ...)` and given
        # back unquoted (`beacon status $JOB`): a space or newline splits it there. Format
        # characters (a Persian word's zero-width non-joiner, an emoji's joiner) do not.
        raise JobInputError("job_id", job_id, "must hold no spaces or control characters")
    if not isinstance(source, str):
        raise JobInputError("source", source, "must be a string")
    boolean("retry_failed", retry_failed, JobInputError)
    positive_int("chunk", chunk, JobInputError)
    if store is not None and not isinstance(store, JobStore):
        raise JobInputError("store", store, "must be a worker.state.JobStore or None")


def submit_job(
    items: Iterable[PromptRecord | LineError],
    spec: JobSpec,
    *,
    job_id: str | None = None,
    input_digest: str | None = None,
    source: str = "",
    retry_failed: bool = False,
    chunk: int = 500,
    store: JobStore | None = None,
    queue: str | None = None,
) -> SubmitResult:
    """Register the prompts of a job and send one task per prompt (groups of ``chunk``).

    Submitting the same job again (same ``job_id``, or the same spec and ``input_digest``)
    sends only prompts without an outcome yet (and failed ones when ``retry_failed``; they are
    pending again until their retry ends): use it to resume after a broker was lost. On a
    Redis broker, prompts whose task is still queued or running, in any queue the job was sent
    to, are not sent again (``queued``). Each prompt's send is claimed first
    (:meth:`JobStore.claim_sends`): two submissions of one job at once, or a submission and the
    lost-message sweeper, send each prompt once (and retry a failed one once), not once each.
    Bad input lines are stored as errors right away.
    Raises :class:`BrokerUnavailableError` when the broker cannot be reached (checked before
    the job is registered; later, when it goes away while tasks are sent or, on a
    resubmission, while its queues are read), :class:`~worker.state.UnknownJobError` when the
    job is purged while it is being submitted (at the next send's claim or stamp, which refuse it).
    """
    _check_submit_args(items, spec, job_id, input_digest, source, retry_failed, chunk, store,
                       queue)
    if job_id is None:
        if input_digest is None:
            raise JobInputError("job_id", None, "give a job id or the input's digest")
        job_id = job_fingerprint(spec, input_digest)
    st = store or get_store()
    target = queue or settings.queue
    # Before anything is registered: a submission to an unreachable broker leaves no job behind
    # (the workers' sweeper would otherwise send a job its submitter was told had failed).
    _check_broker()
    # Read before the job and its queues are: a prompt that a concurrent submission of the job
    # (or a sweep) sends after this moment may be missing from what is read below, and is
    # left to that sender (JobStore.claim_sends).
    since = st.now_us()
    try:
        prior_queues = st.sent_queues(st.meta(job_id))
        resubmitted = True
    except UnknownJobError:
        prior_queues, resubmitted = set(), False
    from worker.recovery import BrokerUnreachableError

    # A job submitted again while it runs: its prompts still queued or running are not sent a
    # second time (each would be paid for twice); only lost or unsent ones are. The broker's
    # queue is read (every message in it) only once a prompt is about to be sent.
    @functools.cache
    def in_broker() -> KeyDigests:
        from worker.recovery import KeyDigests

        if not resubmitted:
            return KeyDigests()
        return _queued_keys(st, job_id, {target, *prior_queues} - {""})
    spec_ref = st.create(job_id, spec.to_dict(), source=source)
    enqueued = already = queued = sending = 0
    batch: list[tuple[str, dict[str, Any], int | None]] = []

    def send_claimed(part: list[tuple[tuple[str, dict[str, Any], int | None], bool]]) -> None:
        """Claim, then send, the tasks of ``part`` (``(item, has_error)``, ``SEND_GROUP`` at
        most: the time a claim is held is that of one group's send)."""
        nonlocal enqueued, queued, sending
        from kombu.exceptions import OperationalError

        def send(todo: list[tuple[tuple[str, dict[str, Any], int | None], bool]]) -> None:
            # Failed prompts sent again are pending until their retry stores an outcome (or
            # the job would read as finished while they run: --wait, the sweeper and
            # collect --purge would not wait for them). Before sending: a fast retry's own
            # error must not be the one removed. Only the claimed ones: another sender's
            # retry may have stored its error already.
            st.reopen(job_id, [item[0] for item, has_err in todo if has_err])
            try:
                _send_tasks(st, job_id, spec_ref, target, [item for item, _ in todo])
            except OperationalError as exc:
                raise BrokerUnavailableError(_broker_label(), exc, job_id=job_id,
                                             sent=enqueued) from None

        todo, held = st.send_claimed(job_id, part, lambda p: p[0][0], since=since, send=send)
        sending += held  # another sender's claim: being sent, or sent once the claim lapses
        queued += len(part) - len(todo) - held  # another sender sent them since ``since``
        enqueued += len(todo)

    def flush() -> None:
        nonlocal already, queued
        if not batch:
            return
        # Stamped before registering too: the lost-message sweeper leaves alone a job whose
        # prompts are registered but whose messages are still being sent (worker.recovery).
        st.mark_sent(job_id, target)
        st.add_prompts(job_id, [(k, {"record": r, "line": ln, "spec": spec_ref})
                                for k, r, ln in batch])
        flags = st.outcome_flags(job_id, [k for k, _, _ in batch])
        todo = [(item, has_err) for item, (has_res, has_err) in zip(batch, flags, strict=True)
                if not (has_res or (has_err and not retry_failed))]
        already += len(batch) - len(todo)
        try:
            # A failed prompt is sent again on retry_failed even if a stale message is around.
            fresh = [(item, has_err) for item, has_err in todo
                     if has_err or item[0] not in in_broker()]
        except BrokerUnreachableError as exc:  # its queues could not be read: chunk not sent
            raise BrokerUnavailableError(_broker_label(), exc.cause, job_id=job_id,
                                         sent=enqueued) from None
        queued += len(todo) - len(fresh)
        for i in range(0, len(fresh), SEND_GROUP):
            send_claimed(fresh[i:i + SEND_GROUP])
        batch.clear()

    # Bad lines are stored once the input is read: one error per distinct line, every number.
    keys = InputKeys(spec)
    for i, item in enumerate(items):
        if not isinstance(item, PromptRecord | LineError):
            raise JobInputError(f"items[{i}]", item, "must be a PromptRecord or a LineError")
        k = keys.first(item)
        if k is None:
            continue
        if isinstance(item, LineError):
            keys.add_bad(k, item)
            continue
        batch.append((k, item.to_dict(), item.line))
        if len(batch) >= chunk:
            flush()
    flush()
    # The error first: a registered bad line is never pending (nothing for the sweeper).
    for k, (first, lines) in keys.bad.items():
        st.store_error(job_id, k, {"record": line_error_record(k, first, lines)})
    if keys.bad:
        st.add_prompts(job_id, [(k, {"bad_line": e.raw, "line": e.line})
                                for k, (e, _) in keys.bad.items()])
    total = st.status(job_id).total
    return SubmitResult(job_id, total, enqueued, already, len(keys.bad), keys.duplicates, queued,
                        sending)
