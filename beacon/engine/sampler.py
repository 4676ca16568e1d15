"""BeaconSampler: BEACON best-of-N sampling for one query or many, async first.

Concurrency model. One sampler owns two semaphores per event loop: ``max_concurrency`` slots for
model calls and ``max_score_concurrency`` for scorer calls, shared by every query the sampler
runs on that loop (the global limit). The optional ``rate_limiter`` (asyncio-throttle's
``Throttler``, aiolimiter's ``AsyncLimiter``, or any async context manager) is entered around
every attempt of every model and scorer call, once it has its slot, so the call starts as soon
as the limiter lets it through. ``before_model_call`` is a model-only hook awaited before each
model attempt takes its slot (e.g. a LangChain rate limiter's token: waiting for it holds no
slot). ``timeout`` bounds each attempt (seconds), not counting either wait.

One sampler (and one ``AsyncLimiter``) may serve any number of successive ``run()`` calls, each
on its own event loop, and ``arun`` calls on any loop; see
:func:`~beacon.engine.calls.adopt_running_loop`.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence, Sized
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any

from beacon._checks import boolean, is_integer, is_real, positive_int, real_as_float
from beacon._sync import run_sync
from beacon.budget import Budget
from beacon.config import BeaconConfig
from beacon.engine.calls import CallGuard, adopt_running_loop
from beacon.engine.protocol import (
    GenerateLike,
    ScoreLike,
    is_inline_sync,
    make_generate,
    make_score,
    reward_rule,
)
from beacon.engine.query import EngineContext, QueryRun
from beacon.errors import ConfigError, ConfigTypeError
from beacon.events import Observer
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy

__all__ = ["BeaconSampler"]

_DEFAULT_RETRY = RetryPolicy()


def _timeout(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if not is_real(v) or not v > 0:
        raise ConfigError(name, v, "must be a positive number of seconds or None")
    return real_as_float(v)  # an int of hundreds of digits: no limit, as float("inf")


def _observers(name: str, v: Any) -> tuple[Observer, ...]:
    """``v`` as a tuple of callables (``None``: none); a ConfigError naming ``name`` otherwise."""
    if v is None:
        return ()
    if callable(v) or isinstance(v, str | bytes | Mapping) or not isinstance(v, Iterable):
        raise ConfigTypeError(
            name, v, "must be a list of callables (wrap a single one in a list)"
        )
    out = tuple(v)
    for obs in out:
        if not callable(obs):
            raise ConfigTypeError(name, obs, "every observer must be callable")
    return out


def _metadata(name: str, v: Any) -> Mapping[str, Any] | None:
    if v is not None and not isinstance(v, Mapping):
        raise ConfigTypeError(name, v, "must be a mapping (a dict) or None")
    return v


def _prompts(v: Any) -> Iterable[Any]:
    # A string is one prompt, not an iterable of one-character prompts; a dict would give its
    # keys. Both are the likely mistakes of passing one prompt or an {id: prompt} mapping.
    if isinstance(v, str | bytes | Mapping) or not isinstance(v, Iterable):
        raise ConfigTypeError(
            "prompts", v, "must be an iterable of prompts (a list); for one prompt use run()"
        )
    return v


def _metadata_list(v: Any, n_prompts: int | None) -> list[Mapping[str, Any] | None]:
    """Per-prompt metadata, checked before any query starts (where the count is known)."""
    if isinstance(v, str | bytes) or not isinstance(v, Iterable):
        raise ConfigTypeError("metadata", v, "must be a mapping or a list of them")
    out = list(v)
    for i, m in enumerate(out):
        _metadata(f"metadata[{i}]", m)
    if n_prompts is not None and len(out) != n_prompts:
        raise ConfigError(
            "metadata", f"<{len(out)} entries>", f"needs one entry per prompt ({n_prompts})"
        )
    return out


class BeaconSampler:
    """Adaptive best-of-N sampling driven by a :class:`~beacon.stopper.Stopper`.

    Args:
        generate: the model -- ``generate(prompt) -> str | Generation`` (sync or async), or an
            object with async ``ainvoke`` / ``acomplete`` (see :mod:`beacon.engine.protocol`).
        score: ``score(prompt, text) -> float`` (sync or async), or a batched scorer
            (:class:`~beacon.engine.protocol.BatchScorer` or ``batched = True``).
        cfg: the stopping problem (cost ``c``, horizon ``n``, family, batch size, ...).
        max_concurrency: model calls in flight at once across all queries of this sampler.
        max_score_concurrency: scorer calls in flight at once; ``None``: same as
            ``max_concurrency`` (a separate pool, so scoring never waits behind generation).
        rate_limiter: async context manager entered around every model and scorer call.
        before_model_call: callable (no arguments; its result awaited when awaitable; a sync
            one runs on the event loop, so it must not block) called before every model call
            attempt takes its concurrency slot, retries included, never before scorer calls:
            a model-only rate limiter's ``acquire`` (LangChain's ``BaseRateLimiter.aacquire``,
            aiolimiter's ``AsyncLimiter.acquire``). The wait holds no slot, does not count
            toward ``timeout``, and the call is counted (``usage.model_calls``) only after it.
            Where ``max_concurrency`` is the tighter limit, an attempt may wait for its slot
            after the hook let it through.
        retry: retry policy of each call (default: 3 attempts, 0.5 s base, x2, full jitter).
        timeout: seconds allowed per call attempt (model and scorer); ``None``: no limit.
        budget: per-query caps on tokens, money and wall seconds (stop reason ``budget``).
        observers: callables receiving :class:`~beacon.events.SampleEvent` and
            :class:`~beacon.events.DecisionEvent` for every query.
        offload_sync: run *synchronous* generate/score callables in worker threads (one
            daemon thread per call, :func:`beacon._sync.call_in_thread`) so that blocking
            clients do not stall the event loop and ``timeout`` applies to them: a call still
            blocked when it times out is abandoned (its thread finishes on its own, its result
            is dropped) and never holds up ``run()`` or the end of the process. By default
            sync callables are assumed cheap and called inline.
        seed: seed of the backoff jitter (reproducible retry timing in tests).

    The prompt is opaque: it is passed unchanged to ``generate`` and ``score``.

    An argument of the wrong type (``cfg`` not a ``BeaconConfig``, a ``retry`` that is not a
    ``RetryPolicy``, a non-callable ``generate``...) is a
    :class:`beacon.ConfigTypeError` naming it: a ``ConfigError`` and a ``TypeError`` at once
    (as ``Stopper(cfg)`` and ``replay(rewards, cfg)`` raise for a wrong ``cfg``); a wrong value
    is a ``ConfigError``.
    """

    def __init__(
        self,
        generate: GenerateLike,
        score: ScoreLike,
        cfg: BeaconConfig,
        *,
        max_concurrency: int = 64,
        max_score_concurrency: int | None = None,
        rate_limiter: AbstractAsyncContextManager[Any] | None = None,
        before_model_call: Callable[[], Any] | None = None,
        retry: RetryPolicy = _DEFAULT_RETRY,
        timeout: float | None = 60.0,
        budget: Budget | None = None,
        observers: Iterable[Observer] = (),
        offload_sync: bool = False,
        seed: int | None = None,
    ) -> None:
        if not isinstance(cfg, BeaconConfig):
            raise ConfigTypeError(
                "cfg", cfg, f"must be a beacon.BeaconConfig, got {type(cfg).__name__}"
            )
        if not isinstance(retry, RetryPolicy):
            raise ConfigTypeError("retry", retry, "must be a beacon.RetryPolicy")
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigTypeError("budget", budget, "must be a beacon.Budget or None")
        if rate_limiter is not None and not (
            hasattr(rate_limiter, "__aenter__") and hasattr(rate_limiter, "__aexit__")
        ):
            raise ConfigTypeError(
                "rate_limiter", rate_limiter, "must be an async context manager"
            )
        if before_model_call is not None and not callable(before_model_call):
            raise ConfigTypeError(
                "before_model_call", before_model_call,
                "must be a callable taking no arguments (sync or async), or None",
            )
        # A truthy string ("no", "false") would silently run every call in a thread.
        offload_sync = boolean("offload_sync", offload_sync, ConfigTypeError)
        if seed is not None and not is_integer(seed):
            raise ConfigTypeError("seed", seed, "must be an integer or None")
        self._cfg = cfg
        self._generate_obj = generate
        self._score_obj = score
        self._generate = make_generate(generate, offload_sync=offload_sync)
        self._score_inline = is_inline_sync(score, offload_sync=offload_sync)
        self._score, self._batched = make_score(
            score, offload_sync=offload_sync, late_timeout=_timeout("timeout", timeout),
            # only an inline sync scorer's awaitable needs a slot of its own (an async one's
            # call already holds one): no per-call lookup for the others
            late_slot=self._late_score_slot if self._score_inline else None,
        )
        self._reward = reward_rule(score)
        self.max_concurrency = positive_int("max_concurrency", max_concurrency)
        self.max_score_concurrency = (
            self.max_concurrency
            if max_score_concurrency is None
            else positive_int("max_score_concurrency", max_score_concurrency)
        )
        self.rate_limiter = rate_limiter
        self.before_model_call = before_model_call
        # loop-bound limiters to hand over to each query's loop (adopt_running_loop)
        self._limiters = tuple(
            x for x in (rate_limiter, getattr(before_model_call, "__self__", None))
            if x is not None
        )
        self.retry = retry
        self.timeout = _timeout("timeout", timeout)
        self.budget = budget
        self.observers: tuple[Observer, ...] = _observers("observers", observers)
        self._rng = random.Random(None if seed is None else int(seed))
        self._prepared = False  # the family's decision data loaded (:meth:`_prepare`)
        self._budget_warned: set[str] = set()  # caps warned about (BudgetNotEnforcedWarning)
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EngineContext] = (
            weakref.WeakKeyDictionary()
        )

    # -- properties -----------------------------------------------------------------------------
    @property
    def cfg(self) -> BeaconConfig:
        return self._cfg

    @property
    def batched_scorer(self) -> bool:
        """Whether the scorer was declared batched."""
        return self._batched

    def __repr__(self) -> str:
        return (
            f"BeaconSampler(cfg={self._cfg!r}, max_concurrency={self.max_concurrency}, "
            f"batched_scorer={self._batched}, timeout={self.timeout})"
        )

    # -- single query ---------------------------------------------------------------------------
    async def arun(
        self,
        prompt: Any,
        *,
        observers: Iterable[Observer] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> BeaconResult:
        """Sample for ``prompt`` until the Stopper (or a cap) says stop.

        Never raises for model/scorer failures or observer errors: those end the query with
        ``stop_reason="error"`` and ``result.error`` set, keeping every candidate so far.
        ``observers`` are added to the sampler's own for this query.
        """
        return await self._arun(prompt, observers, metadata, None)

    def run(
        self,
        prompt: Any,
        *,
        observers: Iterable[Observer] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> BeaconResult:
        """Synchronous :meth:`arun`; works inside a running event loop (see ``beacon._sync``)."""
        return run_sync(self.arun(prompt, observers=observers, metadata=metadata))

    # -- many queries ---------------------------------------------------------------------------
    async def arun_many(
        self,
        prompts: Iterable[Any],
        *,
        observers: Iterable[Observer] | None = None,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        max_active: int | None = None,
    ) -> list[BeaconResult]:
        """Results for every prompt, in input order; one query's failure never loses another's.

        ``prompts`` is read in full before any query starts, so an iterable that raises
        does so before any call. ``metadata``: one mapping for all prompts, or one per
        prompt. ``max_active``: queries
        in progress at once (default ``4 * max_concurrency``); the concurrency limit on calls
        applies across all of them either way.
        """
        items = list(_prompts(prompts))  # a list: astream_many checks metadata against its length
        out: list[BeaconResult | None] = [None] * len(items)
        stream = self.astream_many(
            items, observers=observers, metadata=metadata, max_active=max_active
        )
        async with aclosing(stream):  # cancelling arun_many cancels the running queries
            async for i, res in stream:
                out[i] = res
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def run_many(
        self,
        prompts: Iterable[Any],
        *,
        observers: Iterable[Observer] | None = None,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        max_active: int | None = None,
    ) -> list[BeaconResult]:
        """Synchronous :meth:`arun_many`; works inside a running event loop."""
        return run_sync(
            self.arun_many(prompts, observers=observers, metadata=metadata, max_active=max_active)
        )

    async def astream_many(
        self,
        prompts: Iterable[Any],
        *,
        observers: Iterable[Observer] | None = None,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        max_active: int | None = None,
    ) -> AsyncGenerator[tuple[int, BeaconResult], None]:
        """Yield ``(position, result)`` as queries finish (completion order).

        Prompts are consumed lazily (at most ``max_active`` queries exist as tasks at once),
        unless ``metadata`` has one entry per prompt: then an iterator of prompts is read first,
        so that the two counts are checked before any call. Backpressure: at most
        ``max_active`` finished results wait for the consumer; while they wait, each query that
        finishes holds its worker, so no more than ``2 * max_active`` prompts are ever started
        and not yet yielded, however slowly the results are consumed.
        If iterating ``prompts`` raises, no further prompt is taken; the queries already
        started run to the end and their results are yielded (their samples were paid for),
        then that error is raised (with a note saying so).
        Event ``query_id`` is the prompt's position. Closing the generator early cancels the
        queries still running; to close it deterministically when breaking out of the loop,
        wrap it in ``contextlib.aclosing(...)`` (otherwise it is closed when collected).
        """
        active = self.max_concurrency * 4 if max_active is None else positive_int(
            "max_active", max_active
        )
        _prompts(prompts)
        shared_meta: Mapping[str, Any] | None = None
        meta_list: list[Mapping[str, Any] | None] = []
        seq_meta = metadata is not None and not isinstance(metadata, Mapping)
        if isinstance(metadata, Mapping):
            shared_meta = metadata
        elif metadata is not None:
            if not isinstance(prompts, Sized):
                # per-prompt metadata pairs with a finite list of prompts: read it now, so the
                # counts are checked before any call (a lazy stream found out half-way)
                prompts = list(prompts)
            meta_list = _metadata_list(metadata, len(prompts))
        obs = _observers("observers", observers) if observers is not None else None
        it = iter(enumerate(prompts))
        # The first error raised by the prompts iterable: no prompt is taken after it, the
        # queries already started run to the end and are yielded (their samples were paid for),
        # then it is raised.
        prompt_error: list[Exception] = []

        def take() -> tuple[int, Any] | None:
            if prompt_error:
                return None
            try:
                return next(it)
            except StopIteration:
                return None
            except Exception as exc:
                prompt_error.append(exc)
                return None
        # Bounded: a worker whose result finds the queue full waits there before it takes its
        # next prompt, so a slow consumer holds back new queries (at most ``active`` results
        # queued plus one per worker, i.e. ``2 * active`` finished or running queries not yet
        # consumed) instead of letting finished results pile up without limit.
        queue: asyncio.Queue[tuple[int, BeaconResult] | None] = asyncio.Queue(maxsize=active)

        # Workers are started one at a time, each when the previous one takes a prompt, up to
        # ``active``: never more tasks than prompts in progress (a huge max_concurrency, whose
        # default max_active is 4x that, must not create millions of idle tasks up front).
        workers: list[asyncio.Future[None]] = []

        async def worker() -> None:
            while (item := take()) is not None:
                i, prompt = item
                if len(workers) < active:
                    workers.append(asyncio.ensure_future(worker()))  # for the next prompt
                meta = meta_list[i] if seq_meta else shared_meta
                try:
                    res = await self._arun(prompt, obs, meta, i)
                except Exception as exc:  # defensive: _arun only raises on misuse
                    res = BeaconResult(
                        prompt=prompt, stop_reason="error",
                        error=f"{type(exc).__name__}: {exc}", metadata=dict(meta or {}),
                        config=self._cfg.to_dict(),
                    )
                await queue.put((i, res))

        workers.append(asyncio.ensure_future(worker()))

        async def closer() -> None:
            try:
                n = 0
                while n != len(workers):  # workers are only added by running workers
                    n = len(workers)
                    await asyncio.gather(*workers)
            finally:
                # Not when the closer is being cancelled: that is the consumer leaving, and a
                # put into a full queue that nobody reads any more would never return.
                task = asyncio.current_task()
                if task is None or not task.cancelling():
                    await queue.put(None)

        close_task = asyncio.ensure_future(closer())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            await close_task  # re-raise a worker's misuse error (e.g. short metadata)
            if prompt_error:
                exc = prompt_error[0]
                exc.add_note(
                    "raised by the prompts iterable; the queries started before it were "
                    "completed and their results yielded"
                )
                raise exc
        finally:
            for w in workers:
                w.cancel()
            close_task.cancel()
            await asyncio.gather(*workers, close_task, return_exceptions=True)

    # -- internals ------------------------------------------------------------------------------
    def _late_score_slot(self) -> asyncio.Semaphore | None:
        return self._context().late_score_slot

    def _context(self) -> EngineContext:
        # Semaphores bind to the loop they are first used on, and run() may start a new loop
        # per call, so the shared limits are kept per event loop.
        loop = asyncio.get_running_loop()
        ctx = self._per_loop.get(loop)
        if ctx is None:
            # A semaphore that had to wait holds its loop, so a weak key alone would keep
            # every finished run()'s loop (and context) alive: closed loops' entries go here.
            try:
                closed = [lp for lp in self._per_loop if lp.is_closed()]
            except RuntimeError:  # another thread's run() added its loop meanwhile: next time
                closed = []
            for old in closed:
                self._per_loop.pop(old, None)
            ctx = EngineContext(
                cfg=self._cfg,
                generate=self._generate,
                score=self._score,
                reward=self._reward,
                batched=self._batched,
                model_guard=CallGuard(
                    asyncio.Semaphore(self.max_concurrency), self.rate_limiter, self.timeout,
                    self.retry, self._rng, self.before_model_call,
                ),
                score_guard=CallGuard(
                    None if self._score_inline else asyncio.Semaphore(self.max_score_concurrency),
                    self.rate_limiter, None if self._score_inline else self.timeout, self.retry,
                    self._rng,
                ),
                budget=self.budget,
                cfg_dict=self._cfg.to_dict(),
                budget_warned=self._budget_warned,
                prepare=self._prepare,
                # an inline sync scorer's returned awaitable (``lambda p, t: judge(p, t)``)
                # is awaited under these slots, so max_score_concurrency bounds it too
                late_score_slot=(
                    asyncio.Semaphore(self.max_score_concurrency) if self._score_inline else None
                ),
            )
            self._per_loop[loop] = ctx
        return ctx

    async def _prepare(self) -> None:
        """Load what the config's queries need (the family's ``prepare``: for ``normal`` the
        h-table, built on first use, its lookup kernel and, for the robust update, scipy's
        Student-t quantiles) in a worker thread, once per sampler and only while the family
        says something is left to load (``needs_prepare``).

        Else the first query did it on the event loop, at its k0-th and later rewards: ~1 s
        importing scipy.stats and loading the kernels, seconds more building another horizon's
        table, tens of seconds compiling the kernels on a fresh machine, with every query in
        flight stalled and their timeouts running. Queries that start meanwhile each wait in a
        thread of their own for the same build (``prepare`` is idempotent and thread-safe)."""
        if not self._prepared:
            from beacon.families import get_family

            family = get_family(self._cfg.family)
            # asked first: a sampler per prompt (the job runner's) must not hop every time
            if family.needs_prepare(self._cfg):
                await asyncio.to_thread(family.prepare, self._cfg)
            self._prepared = True

    async def _arun(
        self,
        prompt: Any,
        observers: Iterable[Observer] | None,
        metadata: Mapping[str, Any] | None,
        query_id: int | None,
    ) -> BeaconResult:
        obs = self.observers + _observers("observers", observers)
        meta = dict(_metadata("metadata", metadata) or {})
        for lim in self._limiters:
            adopt_running_loop(lim)
        run = QueryRun(self._context(), prompt, obs, meta, query_id)
        return await run.run()
