"""Run a coroutine to completion from synchronous code, even inside a running event loop.

``asyncio.run`` refuses to start when the calling thread already runs a loop (Jupyter, an async
test, an async web handler calling sync code). :func:`run_sync` then runs the coroutine on a
private event loop in a worker thread and blocks until it finishes; otherwise it is plain
``asyncio.run``. The caller's ``contextvars`` are copied into the worker thread (LangChain and
LlamaIndex keep callback managers in context variables).

Caveat: in the worker-thread case the calling loop is blocked while the coroutine runs, as any
synchronous call from a coroutine would block it; prefer the async API from async code.
A KeyboardInterrupt (Ctrl-C in Jupyter) in the blocked caller cancels the coroutine and waits
for it to wind down before it propagates, so an interrupted query stops calling the model.

In both cases the private loop is shut down as ``asyncio.run`` would (:func:`_drop_abandoned`),
except that a sample the engine abandoned (its client swallows ``asyncio.CancelledError``) is
waited for at most :data:`beacon.engine.calls.CANCEL_GRACE` s more, then dropped, and the loop
is closed anyway: ``asyncio.run`` would wait for it as long as its client runs, possibly
forever.

:func:`call_in_thread` is the engine's way to await a blocking callable (``offload_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["call_in_thread", "in_running_loop", "run_sync"]

T = TypeVar("T")
log = logging.getLogger(__name__)



def in_running_loop() -> bool:
    """True when the current thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` and return its result (or raise its exception)."""
    if not in_running_loop():
        return _run_private(coro)
    ctx = contextvars.copy_context()
    box: dict[str, Any] = {}
    stop, done = threading.Event(), threading.Event()

    async def main() -> T:
        box["task"], box["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        if stop.is_set():  # interrupted before the coroutine started
            coro.close()
            raise asyncio.CancelledError
        return await coro

    def target() -> None:
        try:
            box["value"] = ctx.run(_run_private, main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    # Waits on an Event, not Thread.join: a join interrupted by Ctrl-C marks the thread as
    # finished on Python < 3.12 (it releases the running thread's lock), so a second join
    # would return at once.
    threading.Thread(target=target, name="beacon-run-sync", daemon=True).start()
    try:
        done.wait()
    except BaseException:
        # Ctrl-C (a KeyboardInterrupt in the blocked caller, as in Jupyter): cancel the
        # coroutine -- a query stops calling the model -- and wait for it to wind down.
        stop.set()
        task, loop = box.get("task"), box.get("loop")
        if task is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                loop.call_soon_threadsafe(task.cancel)
        done.wait()
        raise
    if "error" in box:
        raise box["error"]
    result: T = box["value"]
    return result


def _run_private(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a new event loop, closed after (:func:`_drop_abandoned`).

    Not ``asyncio.run``: its shutdown waits for every task left on the loop however long it
    runs, and ``nest_asyncio.apply()`` (common in Jupyter) replaces it by one that runs on the
    thread's event loop and never closes it: in the worker thread, each call would leave a new
    open loop behind (its selector and self-pipe sockets, and the sampler's per-loop state).
    ``asyncio.Runner`` runs the coroutine as the unpatched ``asyncio.run`` does (Ctrl-C in the
    main thread cancels it); only its ``close()`` is replaced.
    """
    runner = asyncio.Runner()
    loop = runner.get_loop()
    try:
        return runner.run(coro)
    finally:
        try:
            dropped = _drop_abandoned(loop)
        except BaseException:
            runner.close()
            raise
        if dropped:
            asyncio.set_event_loop(None)  # as Runner.close() does: no closed loop left current
            loop.close()
        else:
            runner.close()  # asyncio.run's own shutdown


def _drop_abandoned(loop: asyncio.AbstractEventLoop) -> bool:
    """Wind down the samples the engine abandoned on ``loop``; ``True`` when some were dropped
    and the rest of the shutdown is done here too, ``False`` when ``Runner.close()`` (what
    ``asyncio.run`` does) is left to do it: no well-behaved task's cleanup is cut short.

    A task in ``beacon.engine.calls._abandoned`` (its client swallowed a cancellation, see
    :func:`beacon.engine.calls.cancel_and_wait`) is cancelled once more and waited for at most
    ``CANCEL_GRACE`` s, then dropped (:func:`_drop`) with a warning logged. After such a drop
    the other leftover tasks get the same bounded wait (the dropped sample's call may run in a
    task of its own), unfinished async generators are closed within ``CANCEL_GRACE`` s and
    the default executor is not joined (a thread blocked in an abandoned
    ``asyncio.to_thread`` call finishes on its own).
    """
    from beacon.engine.calls import CANCEL_GRACE, _abandoned  # beacon.engine imports this

    suspect = {t for t in asyncio.all_tasks(loop) if t in _abandoned}
    if not suspect:
        return False
    for t in suspect:
        t.cancel()
    loop.run_until_complete(asyncio.wait(suspect, timeout=CANCEL_GRACE))
    stuck = {t for t in suspect if not t.done()}
    if not stuck:
        return False
    log.warning(
        "%d sample task(s) the engine abandoned (a client swallowing asyncio.CancelledError) "
        "were still running %g s after the synchronous call ended; dropped with their event "
        "loop, their outcome is lost",
        len(stuck), CANCEL_GRACE,
    )
    loop.run_until_complete(_drop(stuck))
    rest = [t for t in asyncio.all_tasks(loop) if t not in stuck]
    for t in rest:
        t.cancel()
    if rest:
        # A dropped sample's call may run in a task of its own (a framework's wrapper, e.g.
        # LangChain's RunnableLambda), which swallows the cancellation as the sample did.
        loop.run_until_complete(asyncio.wait(rest, timeout=CANCEL_GRACE))
        late = {t for t in rest if not t.done()}
        if late:
            loop.run_until_complete(_drop(late))
        for t in rest:
            if t.done() and not t.cancelled() and t.exception() is not None:
                loop.call_exception_handler({
                    "message": "unhandled exception during run_sync() shutdown",
                    "exception": t.exception(),
                    "task": t,
                })
    gens = loop.create_task(loop.shutdown_asyncgens())
    loop.run_until_complete(asyncio.wait({gens}, timeout=CANCEL_GRACE))
    if not gens.done():
        loop.run_until_complete(_drop({gens}))
    return True


async def _drop(tasks: set[asyncio.Task[Any]]) -> None:
    """Close the coroutines of ``tasks`` (pending, about to lose their loop) without noise.

    Done inside the running loop: a coroutine that catches the ``GeneratorExit`` and awaits
    again suspends (and ``close()`` fails) rather than failing for want of a running loop,
    which such a client might retry forever. No "Task was destroyed but it is pending" at
    garbage collection: the task is known to be dropped. A coroutine that stays suspended
    (it ignored the ``GeneratorExit`` too) is leaked on purpose (:func:`_keep_forever`).
    """
    from beacon.engine.calls import _abandoned, _retrieve

    for t in tasks:
        _abandoned.discard(t)  # the engine's reference to a task it abandoned: it never ends now
        t._log_destroy_pending = False  # type: ignore[attr-defined]
        # a step already scheduled would resume the closed coroutine and fail: seen, no log
        t.add_done_callback(_retrieve)
        coro = t.get_coro()
        chain = _await_chain(coro)
        try:
            coro.close()
        except (Exception, asyncio.CancelledError) as exc:  # its own cleanup failed
            log.debug("closing dropped task %r failed: %r", t, exc)
        # close() closes the innermost awaited coroutine first; one that ignored the
        # GeneratorExit stays suspended even where the outer ones then ended
        for c in chain:
            if _suspended(c):
                _keep_forever(c)


def _keep_forever(coro: Any) -> None:
    """Leak ``coro``: never finalized, so never resumed.

    A coroutine that ignores ``GeneratorExit`` (a bare ``except:`` in a retry loop) would be
    closed again when it is garbage collected, at the latest at interpreter exit, outside any
    event loop: its ``asyncio.sleep`` then fails at once, its ``except:`` catches that, and a
    ``while True`` retry loop spins forever (the process never exits). A reference held in a
    module variable does not prevent that (module variables are cleared at exit); one extra
    reference count, never released, does. The price: its suspended frame stays in memory.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(coro))
    _kept.append(weakref.ref(coro))


# What _keep_forever leaked (weak references: for inspection; they never die).
_kept: list[weakref.ref[Any]] = []


def _await_chain(coro: Any) -> list[Any]:
    """``coro`` and the coroutines (or generators) it is awaiting, outermost first."""
    chain: list[Any] = []
    while coro is not None and len(chain) < 1000:
        chain.append(coro)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return chain


def _suspended(coro: Any) -> bool:
    return (getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)) is not None


def callable_name(fn: Any) -> str:
    """A callable's qualified name, or its type's name, for messages."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _settle(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():  # abandoned: the awaiting call timed out or was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


async def call_in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Await the blocking ``fn(*args)``, run in a new daemon thread (context variables copied).

    Not ``asyncio.to_thread``: the default executor's threads are joined when ``asyncio.run``
    returns and again at interpreter exit, so a blocking call that never returns (an HTTP
    client without its own timeout), abandoned by the engine's timeout, would hold up
    ``run()`` and even the end of the process. Here the abandoned thread is left to finish on
    its own and its result is dropped. One thread per call: noise next to a model call.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = ctx.run(fn, *args)
        except StopIteration as exc:
            # A future refuses StopIteration (it would never be settled and the call would
            # hang): a RuntimeError, as a coroutine raising it gets.
            error = RuntimeError(f"{callable_name(fn)} raised StopIteration")
            error.__cause__ = exc
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
        # RuntimeError: the loop has closed since, nobody is waiting any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, fut, value, error)

    threading.Thread(target=target, name="beacon-offload", daemon=True).start()
    return await fut
