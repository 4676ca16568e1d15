"""The driver of one query: feeds a :class:`~beacon.stopper.Stopper` from concurrent samples.

Loop: ask the Stopper; on ``Draw(count)`` start ``count`` samples at once (the first ``k0``
together, then 1 in sequential mode or ``min(b, n - k)`` in batch mode); feed their rewards in
draw order as the prefix of the batch completes (a failed sample is ``discard``-ed, never a
reward); ask again only when the whole batch is in, i.e. decisions happen at batch boundaries
exactly as in the paper's batch mode. With a batched scorer the batch's texts are scored in one
call once all of them are generated.

The query ends early, cancelling samples in flight (they are not charged), when failed samples
exceed ``cfg.max_failures`` (``error``) or a :class:`~beacon.budget.Budget` cap is reached
(``budget``). An unexpected exception (including one raised by an observer) also ends the query
with ``error``; the result keeps every candidate observed so far.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from beacon.budget import Budget, BudgetNotEnforcedWarning
from beacon.config import BeaconConfig
from beacon.engine.calls import CallGuard, cancel_and_wait, guarded_call
from beacon.engine.protocol import GenerateFn, Score, ScoreFn
from beacon.errors import RewardError
from beacon.events import DecisionEvent, Observer, SampleEvent, emit
from beacon.result import _UNENFORCEABLE, BeaconResult, Candidate, Usage
from beacon.stopper import Stop, Stopper

__all__ = ["EngineContext", "QueryRun"]


@dataclass(slots=True)
class EngineContext:
    """Everything a query needs from its sampler, bound to the running event loop.

    ``reward`` turns each scorer output into a reward (:func:`~beacon.engine.protocol.
    reward_rule`); what it raises fails that sample only.
    """

    cfg: BeaconConfig
    generate: GenerateFn
    score: ScoreFn
    reward: Callable[[Any, Any], float]
    batched: bool
    model_guard: CallGuard
    score_guard: CallGuard
    budget: Budget | None
    cfg_dict: dict[str, Any]
    # caps already warned about (BudgetNotEnforcedWarning): the sampler's set, shared by loops
    budget_warned: set[str]
    # the scorer slots an awaitable returned by an inline sync scorer is awaited under
    # (score_guard has none for such a scorer: its synchronous part never waits for a slot)
    late_score_slot: asyncio.Semaphore | None = None
    # loads the family's decision data off the loop before the first decision (the sampler's
    # ``_prepare``; a failure ends the query with ``error`` as the decision's would)
    prepare: Callable[[], Awaitable[None]] | None = None


def _err(exc: BaseException) -> str:
    msg = str(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class _StopQuery(Exception):
    """Internal: a cap was reached inside a batch."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueryRun:
    """One query's state; :meth:`run` drives it to a :class:`BeaconResult`."""

    def __init__(
        self,
        ctx: EngineContext,
        prompt: Any,
        observers: Sequence[Observer],
        metadata: dict[str, Any] | None,
        query_id: int | None,
    ) -> None:
        self.ctx = ctx
        self.prompt = prompt
        self.observers = tuple(observers)
        self.metadata = dict(metadata or {})
        self.query_id = query_id
        self.stopper = Stopper(ctx.cfg)
        self.usage = Usage()
        self.candidates: list[Candidate] = []
        self.failures = 0
        self.counted: set[int] = set()
        self.last_error: str | None = None
        self.next_index = 0
        self.n_emitted = 0
        self.t0 = 0.0
        self.deadline: float | None = None
        self.unenforced: dict[str, str] = {}  # cap -> why (the first response that escaped it)

    # -- top level ------------------------------------------------------------------------------
    async def run(self) -> BeaconResult:
        error: str | None = None
        self.t0 = time.perf_counter()  # usage.wall_seconds: from the start, the load included
        try:
            started = self.t0
            if self.ctx.prepare is not None:
                await self.ctx.prepare()
                # The one-off load is not the query's sampling time: a first query on a fresh
                # machine (kernels compiled) would otherwise meet a max_seconds cap before its
                # first sample, where loading at its k0-th reward had let it draw k0 samples.
                started = time.perf_counter()
            b = self.ctx.budget
            if b is not None and b.max_seconds is not None:
                self.deadline = started + b.max_seconds
            while True:
                d = self.stopper.next_decision()
                await self._emit_decisions()
                if isinstance(d, Stop):
                    break
                if self._over_budget():
                    self.stopper.stop("budget")
                    await self._emit_decisions()
                    break
                reason = await self._batch(d.count)
                if reason is not None:
                    self.stopper.stop(reason)
                    await self._emit_decisions()
                    break
        except Exception as exc:
            error = _err(exc)
            if self.stopper.stopped is None:
                self.stopper.stop("error")
        stop = self.stopper.stopped
        reason = stop.reason if stop is not None else "error"
        if reason == "error" and error is None:
            error = self.last_error
        self.usage.wall_seconds = time.perf_counter() - self.t0
        unenforced = [c for c in _UNENFORCEABLE if c in self.unenforced]
        for cap in unenforced:
            # Here, not while sampling: under ``-W error`` the warning must not fail a
            # paid sample (it then propagates from the query, as that setting asks).
            self._warn_unenforced(cap)
        return BeaconResult(
            prompt=self.prompt,
            candidates=sorted(self.candidates, key=lambda c: c.index),
            n_samples=self.stopper.k,
            stop_reason=reason,
            trace=self.stopper.trace,
            usage=self.usage,
            error=error,
            metadata=self.metadata,
            config=dict(self.ctx.cfg_dict),
            budget_unenforced=unenforced,
        )

    # -- one batch ------------------------------------------------------------------------------
    async def _batch(self, count: int) -> str | None:
        """Draw ``count`` samples; return a stop reason if a cap was reached, else None."""
        if count == 1 and self.deadline is None and not self.ctx.batched:
            return await self._single()
        cands = [Candidate(self.next_index + i, "") for i in range(count)]
        self.next_index += count
        tasks = [asyncio.ensure_future(self._sample(c)) for c in cands]
        by_task: dict[asyncio.Future[None], int] = {t: i for i, t in enumerate(tasks)}
        done_flags = [False] * count
        observed = [False] * count

        def unobserved() -> int:
            """Finished samples not yet fed to the Stopper."""
            return sum(1 for i in range(count) if done_flags[i] and not observed[i])
        nxt = 0
        pending: set[asyncio.Future[None]] = set(tasks)
        try:
            while pending:
                timeout = None
                if self.deadline is not None:
                    timeout = self.deadline - time.perf_counter()
                    if timeout <= 0:
                        raise _StopQuery("budget")
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    raise _StopQuery("budget")
                # _sample turns every Exception into a failed sample: what is left is a
                # BaseException of the callable (not KeyboardInterrupt or SystemExit, which
                # asyncio raises from the loop itself). It propagates, as it does from a
                # sample awaited directly (_single); every task's is retrieved.
                first_error: BaseException | None = None
                for t in done:
                    i = by_task[t]
                    done_flags[i] = True
                    self.usage.merge(cands[i].usage)
                    if cands[i].failed:
                        # Counted on completion, not in draw order, so that a slow earlier
                        # sample cannot delay the max_failures stop.
                        self._count_failure(cands[i])
                    if (e := t.exception()) is not None and first_error is None:
                        first_error = e
                if first_error is not None:
                    raise first_error
                if not self.ctx.batched:
                    while nxt < count and done_flags[nxt]:
                        observed[nxt] = True  # a candidate even if an observer raises
                        await self._observe(cands[nxt])
                        nxt += 1
                self._check_caps()
            if self.ctx.batched:
                await self._score_batch(cands)
                for i, c in enumerate(cands):
                    observed[i] = True
                    await self._observe(c)
                self._check_caps()
        except _StopQuery as sq:
            await self._cancel(pending, cands, done_flags)
            try:
                for i, c in enumerate(cands):
                    if done_flags[i] and not observed[i]:
                        observed[i] = True  # a candidate even if an observer raises
                        if self.ctx.batched and not c.failed:
                            self.usage.cancelled += 1  # generated, never scored: not charged
                        else:
                            await self._observe(c)
            except BaseException:
                # An observer raised: the finished samples not yet fed are not candidates
                # either, but were started (len(candidates) + usage.cancelled stays exact).
                self.usage.cancelled += unobserved()
                raise
            return sq.reason
        except BaseException:
            await self._cancel(pending, cands, done_flags)
            # An observer raised (or the caller cancelled) before these finished samples were
            # fed to the Stopper: never candidates, not charged, but their calls were spent.
            self.usage.cancelled += unobserved()
            raise
        return None

    async def _single(self) -> str | None:
        # Sequential mode without a deadline: nothing can be in flight beside this sample, so
        # it is awaited directly (no task, no wait set) -- the engine's hot path.
        cand = Candidate(self.next_index, "")
        self.next_index += 1
        await self._sample(cand)
        self.usage.merge(cand.usage)
        await self._observe(cand)
        try:
            self._check_caps()
        except _StopQuery as sq:
            return sq.reason
        return None

    async def _cancel(
        self, pending: set[asyncio.Future[None]], cands: list[Candidate], done_flags: list[bool]
    ) -> None:
        if not pending:
            return
        # Bounded: a sample whose client swallows its cancellation is abandoned (and logged),
        # not waited for past the deadline or the caller's cancellation.
        await cancel_and_wait(pending, "a sample (its model or scorer call)",
                              "its query stopped")
        for i, c in enumerate(cands):
            if not done_flags[i]:
                # The calls a cancelled sample made (and tokens it reported) were spent.
                self.usage.merge(c.usage)
                self.usage.cancelled += 1

    def _check_caps(self) -> None:
        if self.failures > self.ctx.cfg.max_failures:
            raise _StopQuery("error")
        if self._over_budget():
            raise _StopQuery("budget")

    def _over_budget(self) -> bool:
        b = self.ctx.budget
        if b is None:
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return True
        return b.exceeded(self.usage.total_tokens, self.usage.cost)

    # -- one sample -----------------------------------------------------------------------------
    async def _sample(self, cand: Candidate) -> None:
        ctx = self.ctx
        t0 = time.perf_counter()
        try:
            gen = await guarded_call(
                ctx.model_guard, ctx.generate, (self.prompt,), cand.usage, model=True
            )
            cand.text, cand.raw = gen.text, gen.raw
            cand.usage.add_tokens(gen.input_tokens, gen.output_tokens)
            if gen.cache_read_tokens is not None or gen.cache_write_tokens is not None:
                cand.usage.add_cache(gen.cache_read_tokens, gen.cache_write_tokens,
                                     gen.cache_write_1h_tokens)
            cost = gen.cost
            if ctx.budget is not None:
                priced = cost is None
                if priced:
                    cost = ctx.budget.price(gen.input_tokens, gen.output_tokens,
                                            gen.cache_read_tokens, gen.cache_write_tokens,
                                            gen.cache_write_1h_tokens)
                for cap in ctx.budget.unmeasured(gen.input_tokens, gen.output_tokens, cost,
                                                 priced=priced):
                    self._unenforced(cap, gen.input_tokens, gen.output_tokens)
            cand.usage.add_cost(cost)
            if not ctx.batched:
                rewards = await guarded_call(
                    ctx.score_guard, ctx.score, (self.prompt, [gen.text]), cand.usage, model=False
                )
                r = rewards[0]
                if type(r) is not float and isinstance(r, Score):  # a bare float: no more
                    r = self._score_spend(r, cand.usage)
                cand.reward = ctx.reward(r, cand.index)
        except Exception as exc:
            cand.failed, cand.error = True, _err(exc)
        finally:
            cand.usage.wall_seconds = time.perf_counter() - t0

    def _score_spend(self, s: Score, *usages: Usage) -> Any:
        """Count what a scorer's :class:`Score` reports in ``usages`` (its money priced by the
        budget where it reports tokens only) and return its reward value.

        A ``Score`` that reports tokens or money is a paid call: like a model response, it
        escapes a cap it reports nothing for (``budget_unenforced``). ``Score(x)`` alone
        reports nothing and is a bare reward."""
        if s.reports:
            cost = s.cost
            b = self.ctx.budget
            if b is not None:
                priced = cost is None
                if priced:
                    cost = b.price(s.input_tokens, s.output_tokens, s.cache_read_tokens,
                                   s.cache_write_tokens, s.cache_write_1h_tokens)
                for cap in b.unmeasured(s.input_tokens, s.output_tokens, cost, priced=priced):
                    self._unenforced(cap, s.input_tokens, s.output_tokens, who="a scorer's Score")
            for u in usages:
                u.add_score(s.input_tokens, s.output_tokens, cost)
        return s.reward

    def _unenforced(self, cap: str, input_tokens: int | None, output_tokens: int | None,
                    who: str = "a model response") -> None:
        """A response escaped ``cap`` (it reports nothing, or too little, that the cap counts):
        note it, with the first such response's reason (``who``: what reported it)."""
        if cap in self.unenforced:
            return
        b = self.ctx.budget
        assert b is not None
        if cap == "max_tokens":
            why = f"{who} reported no token counts"
        elif (input_tokens is not None or output_tokens is not None) and (
            side := b.unpriced_side(input_tokens, output_tokens)
        ) is not None:
            why = (f"{who} reported no cost and no {side} token count for "
                   f"price_per_{side}_token to price (its money was counted only in part)")
        elif b.price_per_input_token or b.price_per_output_token:
            why = f"{who} reported neither a cost nor token counts to price"
        else:
            why = (f"{who} reported no cost and the budget sets no "
                   "price_per_input_token / price_per_output_token")
        self.unenforced[cap] = why

    def _warn_unenforced(self, cap: str) -> None:
        """Say once per sampler that ``cap`` could not be enforced."""
        warned = self.ctx.budget_warned
        if cap in warned:
            return
        warned.add(cap)
        b = self.ctx.budget
        assert b is not None
        why = self.unenforced[cap]
        warnings.warn(
            BudgetNotEnforcedWarning(
                f"Budget {cap}={getattr(b, cap)!r} cannot be enforced: {why}, so the "
                f"query's spend is not bounded by it (results list it in budget_unenforced)"
            ),
            stacklevel=2,
        )

    async def _score_batch(self, cands: list[Candidate]) -> None:
        ok = [c for c in cands if not c.failed]
        if not ok:
            return
        ctx = self.ctx
        t0 = time.perf_counter()
        call = asyncio.ensure_future(
            guarded_call(
                ctx.score_guard, ctx.score, (self.prompt, [c.text for c in ok]), self.usage,
                model=False,
            )
        )
        try:
            timeout = None if self.deadline is None else self.deadline - time.perf_counter()
            done, _ = await asyncio.wait({call}, timeout=timeout)
            if not done:
                await cancel_and_wait((call,), "a batched scorer call",
                                      "the query's deadline passed")
                raise _StopQuery("budget")
            rewards = call.result()
            for c, r in zip(ok, rewards, strict=True):
                try:
                    if type(r) is not float and isinstance(r, Score):
                        # the sample's usage is already in the query's: count it in both
                        r = self._score_spend(r, c.usage, self.usage)
                    c.reward = ctx.reward(r, c.index)
                except Exception as exc:  # this sample's value only: the others stand
                    c.failed, c.error = True, _err(exc)
        except _StopQuery:
            raise
        except Exception as exc:
            for c in ok:
                c.failed, c.error = True, _err(exc)
        except BaseException:
            # The caller cancelled (or the call raised a BaseException): the scorer call
            # must not outlive the query, so it is cancelled and waited for (a bounded wait).
            await cancel_and_wait((call,), "a batched scorer call", "its query was cancelled")
            raise
        finally:
            dt = time.perf_counter() - t0
            for c in ok:
                c.usage.wall_seconds += dt

    # -- feeding the Stopper --------------------------------------------------------------------
    async def _observe(self, cand: Candidate) -> None:
        st = self.stopper
        if not cand.failed:
            assert cand.reward is not None
            try:
                st.observe(cand.reward)
            except RewardError as exc:
                # The Stopper counts positions in rewards observed; the candidate's error
                # names the sample (its draw index), as the engine's own reward checks do.
                if type(exc) is RewardError and exc.position != cand.index:
                    exc = RewardError(cand.index, exc.value, exc.reason)
                cand.failed, cand.error = True, _err(exc)
        if cand.failed:
            cand.reward = None
            st.discard(1)
            self._count_failure(cand)
        self.candidates.append(cand)
        if self.observers:
            await emit(
                self.observers,
                SampleEvent(st.k, cand.index, cand.reward, cand.text, cand.failed, cand.error,
                            cand.usage.wall_seconds, self.query_id),
            )

    def _count_failure(self, cand: Candidate) -> None:
        if cand.index not in self.counted:
            self.counted.add(cand.index)
            self.failures += 1
            self.last_error = cand.error

    async def _emit_decisions(self) -> None:
        if not self.observers:
            return
        trace = self.stopper.trace
        new = trace[self.n_emitted:]
        self.n_emitted = len(trace)
        if self.observers:
            for rec in new:
                await emit(self.observers, DecisionEvent.from_record(rec, self.query_id))
