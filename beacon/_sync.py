"""Run a coroutine to completion from synchronous code, even inside a running event loop.

``asyncio.run`` refuses to start when the calling thread already runs a loop (Jupyter, an async
test, an async web handler calling sync code). :func:`run_sync` then runs the coroutine on a
private event loop in a worker thread and blocks until it finishes; otherwise it is plain
``asyncio.run``. The caller's ``contextvars`` are copied into the worker thread (LangChain and
LlamaIndex keep callback managers in context variables).

Caveat: in the worker-thread case the calling loop is blocked while the coroutine runs, as any
synchronous call from a coroutine would block it; prefer the async API from async code.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["in_running_loop", "run_sync"]

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

    def target() -> None:
        try:
            box["value"] = ctx.run(asyncio.run, coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name="beacon-run-sync", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    result: T = box["value"]
    return result
