"""One guarded external call: concurrency slot, rate limiter, timeout, retries with backoff.

Every attempt of every model and scorer call goes through :func:`guarded_call`: it takes a slot
of the sampler's semaphore (released during backoff, so waiting retries do not hold capacity),
enters the rate limiter (any async context manager), and runs under the per-attempt timeout.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from beacon.result import Usage
from beacon.retry import RetryPolicy

__all__ = ["CallGuard", "guarded_call"]

T = TypeVar("T")


@dataclass(slots=True)
class CallGuard:
    """The shared limits one kind of call (model or scorer) runs under.

    ``semaphore`` is None (and ``timeout`` None) for synchronous callables run inline: they
    never yield to the loop, so neither a slot nor a timeout can apply to them.
    """

    semaphore: asyncio.Semaphore | None
    rate_limiter: AbstractAsyncContextManager[Any] | None
    timeout: float | None
    retry: RetryPolicy
    rng: random.Random


async def guarded_call(
    guard: CallGuard,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    usage: Usage,
    *,
    model: bool,
) -> T:
    """``await fn(*args)`` under ``guard``; counts calls, failures and retries into ``usage``.

    Raises the last exception when it is not retryable or the attempts are exhausted. The wait
    before a retry is the policy's jittered backoff, or the error's ``retry_after`` seconds when
    larger (capped at ``max_delay``).
    ``asyncio.CancelledError`` always propagates at once.
    """
    attempt = 0
    while True:
        attempt += 1
        if model:
            usage.model_calls += 1
        else:
            usage.score_calls += 1
        if attempt > 1:
            usage.retries += 1
        try:
            return await _attempt(guard, fn, args)
        except Exception as exc:
            usage.failed_calls += 1
            if not guard.retry.should_retry(exc, attempt):
                raise
            delay = guard.retry.delay(attempt, guard.rng)
            # Honour a server's Retry-After (seconds) up to the policy's cap.
            ra = getattr(exc, "retry_after", None)
            if isinstance(ra, int | float) and not isinstance(ra, bool) and ra > delay:
                delay = min(float(ra), guard.retry.max_delay)
        await asyncio.sleep(delay)


async def _attempt(guard: CallGuard, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    sem = guard.semaphore
    if sem is not None:
        await sem.acquire()
    try:
        if guard.rate_limiter is None:
            if guard.timeout is None:
                return await fn(*args)
            async with asyncio.timeout(guard.timeout):
                return await fn(*args)
        async with guard.rate_limiter:
            async with asyncio.timeout(guard.timeout):
                return await fn(*args)
    finally:
        if sem is not None:
            sem.release()
