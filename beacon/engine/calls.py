"""One guarded external call: concurrency slot, rate limiter, timeout, retries with backoff.

Every attempt of every model and scorer call goes through :func:`guarded_call`: it awaits the
guard's ``acquire`` hook if any (model calls only; no slot held while it waits), takes a slot
of the sampler's semaphore (released during backoff, so waiting retries do not hold capacity),
enters the rate limiter (any async context manager), and runs under the per-attempt timeout.

:func:`adopt_running_loop` hands a loop-bound rate limiter (aiolimiter's ``AsyncLimiter``) over
to the running loop, so that one limiter serves successive ``run()`` calls (one loop each).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from beacon.result import Usage
from beacon.retry import RetryPolicy, retry_after_of

__all__ = [
    "CANCEL_GRACE",
    "CallCancelledError",
    "CallGuard",
    "adopt_running_loop",
    "attach_spend",
    "cancel_and_wait",
    "guarded_call",
    "within",
]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)
log = logging.getLogger(__name__)


@dataclass(slots=True)
class CallGuard:
    """The shared limits one kind of call (model or scorer) runs under.

    ``semaphore`` None means no concurrency limit. ``timeout`` is None for a synchronous
    scorer run inline: it never yields to the loop, so no timeout can apply to it (nor does
    it take a slot: ``semaphore`` is None; an awaitable it returns is awaited within the
    timeout under the sampler's late score slot, see ``make_score``). ``acquire``, when set,
    is awaited before every attempt takes its slot (a rate
    limiter's token: the wait for it holds no slot and does not count toward the timeout).
    """

    semaphore: asyncio.Semaphore | None
    rate_limiter: AbstractAsyncContextManager[Any] | None
    timeout: float | None
    retry: RetryPolicy
    rng: random.Random
    acquire: Callable[[], Any] | None = None  # sync, or returning an awaitable


class CallCancelledError(RuntimeError):
    """The called model or scorer raised ``asyncio.CancelledError`` without being cancelled.

    A library's internal task being cancelled must not look like the caller cancelling the
    query (that would end the query, or a whole ``run_many``, instead of failing one sample).
    """


#: Attribute of an exception raised by a model or scorer call that had already paid for work
#: (an adapter's chain whose LLM answered and whose parser then failed): an object with the
#: token counts and cost of :class:`beacon.Generation` (the adapters set a spend-only
#: :class:`beacon.Score`), counted by :func:`guarded_call`'s ``on_spend`` for every failed
#: attempt, retried or not.
SPEND_ATTR = "beacon_spend"


def attach_spend(exc: BaseException, spend: Any, *, replace: bool = False) -> None:
    """Put ``spend`` (an object with :class:`beacon.Generation`'s token counts and cost) on
    ``exc`` under :data:`SPEND_ATTR`, for :func:`guarded_call` to count. A spend already there
    is kept unless ``replace`` (it may be the caller's own, more precise figure)."""
    if not replace and getattr(exc, SPEND_ATTR, None) is not None:
        return
    with contextlib.suppress(AttributeError, TypeError):  # an exception without a __dict__
        setattr(exc, SPEND_ATTR, spend)


def _count_spend(exc: BaseException, on_spend: Callable[[Any], None] | None) -> None:
    """``on_spend`` of the spend a failed attempt's exception carries, if any."""
    if on_spend is not None:
        spent = getattr(exc, SPEND_ATTR, None)
        if spent is not None:
            on_spend(spent)


async def guarded_call(
    guard: CallGuard,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    usage: Usage,
    *,
    model: bool,
    on_spend: Callable[[Any], None] | None = None,
) -> T:
    """``await fn(*args)`` under ``guard``; counts calls, failures and retries into ``usage``.

    A call is counted when its attempt starts (``acquire`` done, slot taken, rate limiter
    passed), so a sample cancelled while it waits for capacity costs no call. Raises the last
    exception when it is not retryable or the attempts are exhausted; a per-attempt timeout is
    a ``TimeoutError`` saying which call and how long, a ``CancelledError`` raised by ``fn``
    itself a :class:`CallCancelledError`. The wait before a retry is the policy's jittered
    backoff, or the server's wait when larger (in full, up to the policy's
    ``max_retry_after``; a longer one ends the call with
    :class:`beacon.retry.RetryAfterTooLongError`): the error's ``retry_after`` seconds, else its
    response's ``retry-after-ms`` / ``retry-after`` header, else a Google ``RetryInfo`` delay in
    its ``details`` (:func:`beacon.retry.retry_after_of`).
    Cancellation of the calling task always propagates: at once, or, for a callee that
    swallows it (the call is awaited inline), when that callee returns; the cancellation then
    stands (see :func:`_own_cancel_is_error`). What a failed attempt reports it spent
    (:data:`SPEND_ATTR` on its exception) goes to ``on_spend``.
    """
    attempt = 0
    failed_before = False  # an earlier attempt of this call reached the model/scorer and failed
    while True:
        attempt += 1
        started = [False]
        try:
            return await _attempt(guard, fn, args, usage, model, failed_before, started)
        except asyncio.CancelledError as exc:
            # cut by the query (its deadline, a stop, the caller): what the call's LLM calls
            # had reported was spent (the adapters put it on the cancellation); the sample's
            # usage, where it goes, is merged into the query's by whoever cancelled it
            if started[0]:
                _count_spend(exc, on_spend)
            raise
        except Exception as exc:
            # Only a call that started is a failed call (and makes the next one a retry): an
            # error of the acquire hook or the rate limiter, before the call, is retried the
            # same way but was no call.
            if started[0]:
                usage.failed_calls += 1
                failed_before = True
                _count_spend(exc, on_spend)
            if not guard.retry.should_retry(exc, attempt):
                raise
            delay = guard.retry.delay(attempt, guard.rng)
            # A server's Retry-After is honoured in full (should_retry refused one beyond the
            # policy's max_retry_after): an earlier retry would only be refused again.
            ra = retry_after_of(exc)
            if ra is not None and ra > delay:
                delay = ra
        await asyncio.sleep(delay)


def _count(usage: Usage, model: bool, retry: bool, started: list[bool]) -> None:
    started[0] = True
    if model:
        usage.model_calls += 1
    else:
        usage.score_calls += 1
    if retry:
        usage.retries += 1


async def _attempt(
    guard: CallGuard,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    usage: Usage,
    model: bool,
    retry: bool,
    started: list[bool],
) -> T:
    if guard.acquire is not None:
        gate = guard.acquire()
        if inspect.isawaitable(gate):  # a sync hook has done its work by now
            await gate
    sem = guard.semaphore
    if sem is not None:
        await sem.acquire()
    try:
        if guard.rate_limiter is None:
            _count(usage, model, retry, started)
            return await _timed(guard.timeout, fn, args, model)
        async with guard.rate_limiter:
            _count(usage, model, retry, started)
            return await _timed(guard.timeout, fn, args, model)
    finally:
        if sem is not None:
            sem.release()


async def _timed(
    timeout: float | None, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], model: bool
) -> T:
    call = _own_cancel_is_error(fn, args, model)
    if timeout is None:  # the common case: no extra coroutine frame per call
        return await call
    return await within(timeout, call, "model" if model else "scorer")


async def within(timeout: float | None, aw: Awaitable[T], what: str) -> T:
    """``await aw`` within ``timeout`` seconds (``None``: no limit).

    An expired limit is a ``TimeoutError`` saying which call (``what``) and how long; a
    ``TimeoutError`` raised by the call itself is kept as it is. (The adapters use it to bound
    a call the same way where the engine cannot, e.g. after a framework's rate limiter.)

    A callee that swallows its cancellation (a bare ``except:`` around its own retries) is
    timed out only when it returns (its late result is refused: see
    :func:`_own_cancel_is_error`): the call is awaited inline, not as its own task, because a
    task per call costs two more event-loop hops per call (about 7-10% more wall time at 64
    calls in flight, ``python -m bench.bench_engine``) for every well-behaved client.
    Where the sample runs as its own task (a query with a deadline, or a batch of more than
    one), the query's deadline and its caller's cancellation do not wait for it that long:
    they cancel that task and abandon it after twice :data:`CANCEL_GRACE` (see
    :func:`cancel_and_wait`). A sequential query without a deadline awaits its sample inline,
    so there the caller's cancellation takes effect when the client returns.
    """
    if timeout is None:
        return await aw
    cm = asyncio.timeout(timeout)
    try:
        async with cm:
            return await aw
    except TimeoutError as exc:
        if not cm.expired():  # the callee's own TimeoutError: keep it as it is
            raise
        raise _carry_spend(
            TimeoutError(f"{what} call timed out after {timeout:g} s"), exc
        ) from exc


#: Seconds a cancelled call (or sample) is given to stop before it is abandoned still running.
CANCEL_GRACE = 0.25

# Abandoned tasks, referenced until they end (the loop keeps only a weak reference to a task).
_abandoned: set[asyncio.Future[Any]] = set()


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], what: str, why: str) -> int:
    """Cancel ``tasks`` (samples, a batched scorer call) and wait for them, up to twice
    :data:`CANCEL_GRACE` s; those still running then (a client inside swallows its
    cancellation) are abandoned (:func:`_abandon`). Returns how many were abandoned."""
    tasks = list(tasks)
    pending = [t for t in tasks if not t.done()]
    for t in tasks:
        if t.done():
            _retrieve(t)
    if not pending:
        return 0
    for t in pending:
        t.cancel()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await asyncio.wait(pending, timeout=2 * CANCEL_GRACE)
    finally:
        left = [t for t in pending if not t.done()]
        if left:
            _abandon(left, what, why, loop.time() - t0)
    for t in pending:
        if t.done():
            _retrieve(t)
    return len(left)


def _abandon(tasks: list[asyncio.Future[Any]], what: str, why: str, waited: float) -> None:
    """Leave ``tasks`` running, referenced until they end, with one warning in the log: a
    client that ignores cancellation may still be spending (tokens, money) on calls nobody
    waits for."""
    log.warning(
        "%d cancelled task(s) (%s; %s) did not stop within %.2g s: their client ignores "
        "asyncio.CancelledError; abandoned while still running, their outcome will be dropped",
        len(tasks), what, why, waited,
    )
    for task in tasks:
        _abandoned.add(task)
        task.add_done_callback(_forget)


def _forget(task: asyncio.Future[Any]) -> None:
    _abandoned.discard(task)
    _retrieve(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    # Marks a dropped outcome as seen: no "exception was never retrieved" noise at exit.
    if not task.cancelled():
        task.exception()


async def _own_cancel_is_error(
    fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], model: bool
) -> T:
    """``await fn(*args)``: a ``CancelledError`` it raises uncancelled is a
    :class:`CallCancelledError`; a cancellation of this task that it swallows (returning, or
    raising another error) is raised once it is done."""
    task = asyncio.current_task()
    before = 0 if task is None else task.cancelling()
    try:
        out = await fn(*args)
    except asyncio.CancelledError as exc:
        if task is not None and task.cancelling() > 0:
            raise  # our task is being cancelled (by the caller, or by the timeout)
        what = "model" if model else "scorer"
        raise _carry_spend(
            CallCancelledError(f"the {what} call raised CancelledError without being cancelled"),
            exc,
        ) from exc
    except Exception as exc:
        if task is not None and task.cancelling() > before:
            # The callee caught our cancellation and failed otherwise: the cancellation
            # stands (a failed sample instead would let a cancelled query go on).
            raise _carry_spend(asyncio.CancelledError(), exc) from exc
        raise
    if task is not None and task.cancelling() > before:
        # The callee swallowed our cancellation and returned: honour it now, or the caller's
        # cancelled query would go on drawing samples. What its answer reports was spent.
        raise _with_spend_of(asyncio.CancelledError(), out, model)
    return out


def _with_spend_of(exc: E, out: Any, model: bool) -> E:
    """``exc`` carrying (:data:`SPEND_ATTR`) the spend that a call's late answer ``out``
    reports: a model's answer as the engine reads it (tokens, cost), a scorer's
    :class:`beacon.Score`; nothing for an answer that reports none or cannot be read."""
    from beacon.engine.protocol import Score, coerce_generation  # protocol imports this module

    spent: Any = None
    if model:
        with contextlib.suppress(Exception):  # an unreadable answer: nothing to count
            spent = coerce_generation(out)
    elif isinstance(out, Score):
        spent = out
    if spent is not None and any(
        getattr(spent, name, None) is not None
        for name in ("input_tokens", "output_tokens", "cost")
    ):
        attach_spend(exc, spent)
    return exc


def _carry_spend(new: E, old: BaseException) -> E:
    """``new``, raised in place of ``old`` (a timeout for the cancellation that cut the call),
    with the spend found on ``old`` or the exceptions it was raised from (:data:`SPEND_ATTR`:
    an adapter puts what the call's LLM calls had reported on the cancellation itself), so
    that :func:`guarded_call` counts it."""
    seen: set[int] = set()
    cur: BaseException | None = old
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        spent = getattr(cur, SPEND_ATTR, None)
        if spent is not None:
            attach_spend(new, spent)
            break
        cur = cur.__cause__ or cur.__context__
    return new


def adopt_running_loop(limiter: Any) -> None:
    """Let ``limiter`` be used on the running loop when it is bound to another, finished one.

    aiolimiter's ``AsyncLimiter`` (>= 1.2) binds to the first loop it runs on. On a later loop
    -- each synchronous ``run()`` starts one -- it warns and drops its waiters once the old loop
    is closed, and while the old loop is still open (``run()`` called from a coroutine, whose
    loop waits for it) a wait for capacity fails with "attached to a different loop". When no
    task of the old loop waits for it, the limiter is handed over here, keeping its level (its
    clock is the monotonic one of every loop), so the rate holds across calls. A limiter in use
    by two loops at once (two threads) is left alone: aiolimiter does not support that.

    asyncio's own ``Semaphore`` (a cap on model and scorer calls together) and ``Lock`` bind to
    the loop they first wait on in the same way, and on a later ``run()`` failed every call
    that had to wait ("bound to a different event loop"): they are handed over by the same
    rule (:func:`_adopt_asyncio_lock`). Other limiters (asyncio-throttle's ``Throttler``,
    LangChain's) are not bound to a loop.
    """
    if isinstance(limiter, asyncio.Semaphore | asyncio.Lock):
        _adopt_asyncio_lock(limiter)
        return
    if not any(c.__module__.partition(".")[0] == "aiolimiter" for c in type(limiter).__mro__):
        return
    try:
        bound = limiter._event_loop
        waiters = limiter._waiters
    except AttributeError:  # never used yet, or an aiolimiter that binds no loop
        return
    loop = asyncio.get_running_loop()
    if bound is loop or not isinstance(bound, asyncio.AbstractEventLoop):
        return
    live = [w for w in waiters if not w[-1].done()]
    if live and not bound.is_closed():
        return  # another loop's tasks wait for it right now
    handle = limiter._waker_handle
    limiter._waker_handle = None
    if handle is not None:
        handle.cancel()  # the old loop's timer: nothing to wake there any more
    limiter._waiters = []
    limiter._event_loop = loop


def _adopt_asyncio_lock(lock: asyncio.Semaphore | asyncio.Lock) -> None:
    """Unbind an asyncio ``Semaphore`` / ``Lock`` from a loop other than the running one when
    it is free (a permit left, or unlocked) and no task of that loop waits for it: it binds
    again to the loop of its next wait, its count kept. A held one is left bound: if its
    holder's loop was closed without releasing it, its permits are gone, and waiting on it
    here would hang for ever where the old loop's error ("bound to a different event loop")
    fails the call."""
    bound = getattr(lock, "_loop", None)
    if bound is None or bound is asyncio.get_running_loop() or lock.locked():
        return
    if any(not w.done() for w in getattr(lock, "_waiters", None) or ()):
        return  # another loop's tasks wait for it right now
    lock._loop = None  # type: ignore[union-attr]
