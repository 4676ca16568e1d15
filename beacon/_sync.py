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

:func:`call_in_thread` is the engine's way to await a blocking callable (``offload_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["call_in_thread", "in_running_loop", "run_sync"]

T = TypeVar("T")


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
        return asyncio.run(coro)
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
    """``asyncio.run(coro)`` on a new loop, closed after, even where ``asyncio.run`` is patched.

    ``nest_asyncio.apply()`` (common in Jupyter) replaces ``asyncio.run`` by one that runs on
    the thread's event loop and never closes it: in the worker thread, each call would leave
    a new open loop behind (its selector and self-pipe sockets, and the sampler's per-loop
    state). ``asyncio.Runner`` is what the unpatched ``asyncio.run`` uses.
    """
    with asyncio.Runner() as runner:
        return runner.run(coro)


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
