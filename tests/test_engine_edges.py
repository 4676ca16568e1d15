"""BeaconSampler at its edges: what a demanding caller's models, scorers and budgets can do."""

from __future__ import annotations

import asyncio
import gc
import pathlib
import random
import subprocess
import sys
import textwrap
import weakref
from typing import Any

import pytest

import beacon
from beacon.budget import Budget
from beacon.engine import BatchScorer, BeaconSampler, Generation
from beacon.events import SampleEvent
from beacon.retry import RetryPolicy


class Peak:
    """Counts calls in flight at once (await points only: no clock)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.calls = 0

    async def hold(self, steps: int = 3) -> None:
        self.calls += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            for _ in range(steps):
                await asyncio.sleep(0)
        finally:
            self.now -= 1


async def test_a_sync_scorer_returning_an_awaitable_is_bounded_by_max_score_concurrency(
) -> None:
    # ``score=lambda p, t: judge.ascore(p, t)`` is a sync callable (so it is called inline)
    # whose awaitable was awaited with no slot: max_score_concurrency did not bound it.
    peak = Peak()
    rng = random.Random(0)

    async def ascore(prompt: Any, text: str) -> float:
        await peak.hold()
        return rng.gauss(0, 1)

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        return "x"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    sampler = BeaconSampler(gen, lambda p, t: ascore(p, t), cfg, max_concurrency=8,
                            max_score_concurrency=2)
    results = await sampler.arun_many([f"q{i}" for i in range(20)])
    assert all(r.error is None for r in results)
    assert peak.calls == sum(r.usage.score_calls for r in results) > 20
    assert peak.peak == 2


async def test_a_batched_sync_scorer_returning_an_awaitable_is_bounded_too() -> None:
    peak = Peak()
    rng = random.Random(0)

    async def ascore(prompt: Any, texts: list[str]) -> list[float]:
        await peak.hold()
        return [rng.gauss(0, 1) for _ in texts]

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        return "x"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal", batch_size=2)
    sampler = BeaconSampler(gen, BatchScorer(lambda p, ts: ascore(p, ts)), cfg,
                            max_score_concurrency=1)
    results = await sampler.arun_many([f"q{i}" for i in range(10)])
    assert all(r.error is None for r in results)
    assert peak.peak == 1


class Abort(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit: asyncio re-raises
    those two from the loop itself, but keeps any other one in the task that raised it."""


async def test_a_base_exception_from_a_concurrent_sample_propagates_as_from_a_single_one(
) -> None:
    # Before: in a batch (here the first k0 = 3 samples) it was lost in its task ("Task
    # exception was never retrieved") and the query ended with a bare "AssertionError".
    started = []

    async def gen(prompt: Any) -> str:
        started.append(prompt)
        n = len(started)
        await asyncio.sleep(0)
        if n == 2:
            raise Abort("stop everything")
        await asyncio.sleep(0)
        return "x"

    handler_calls: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: handler_calls.append(ctx))
    try:
        cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
        sampler = BeaconSampler(gen, lambda p, t: 0.5, cfg)
        outcome: Any = None
        try:
            outcome = await sampler.arun("q")
        except Abort as exc:
            outcome = exc
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert isinstance(outcome, Abort), outcome
    assert str(outcome) == "stop everything"
    assert handler_calls == []
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_cancelling_a_query_during_batched_scoring_waits_for_the_scorer_call() -> None:
    # Before: the scorer call's task was cancelled but not awaited, so it outlived arun's
    # cancellation (an orphan task still running its clean-up).
    state = {"scoring": False, "cleaned_up": False}

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        return "x"

    async def score(prompt: Any, texts: list[str]) -> list[float]:
        state["scoring"] = True
        try:
            await asyncio.Event().wait()  # never set
        finally:
            for _ in range(3):  # asynchronous clean-up (closing a connection)
                await asyncio.sleep(0)
            state["cleaned_up"] = True
        return [0.0] * len(texts)

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal", batch_size=2)
    task = asyncio.ensure_future(BeaconSampler(gen, BatchScorer(score), cfg).arun("q"))
    while not state["scoring"]:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state["cleaned_up"]
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def test_an_observer_error_while_a_cap_stops_the_batch_keeps_the_accounts_balanced(
) -> None:
    # The first of k0 = 3 samples is slow, the two others fail at once: max_failures = 1 is
    # exceeded, the slow one is cancelled, and the two failed ones are fed as candidates. The
    # observer raising on the first of them lost the other: neither a candidate nor cancelled.
    started = []

    async def gen(prompt: Any) -> str:
        started.append(prompt)
        n = len(started)
        if n == 1:
            await asyncio.Event().wait()  # cancelled when the query stops
        await asyncio.sleep(0)
        raise ValueError(f"broken {n}")

    def obs(ev: Any) -> None:
        if isinstance(ev, SampleEvent):
            raise RuntimeError("observer broke")

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal", max_failures=1)
    res = await BeaconSampler(gen, lambda p, t: 0.5, cfg, retry=RetryPolicy.none(),
                              observers=[obs]).arun("q")
    assert res.stop_reason == "error" and res.error == "RuntimeError: observer broke"
    assert len(started) == 3
    assert len(res.candidates) + res.usage.cancelled == len(started)


@pytest.mark.parametrize("cost, cap", [(0.1, 0.8), (0.1, 0.3), (0.7, 2.1), (1 / 3, 1.0)])
def test_a_money_cap_reached_exactly_stops_at_that_sample(cost: float, cap: float) -> None:
    # Eight samples at 0.1 spend 0.7999999999999999 as a float sum: the 0.8 cap was reached
    # but not seen, and a ninth sample was paid for.
    rng = random.Random(0)

    async def gen(prompt: Any) -> Generation:
        await asyncio.sleep(0)
        return Generation("x", cost=cost)

    cfg = beacon.BeaconConfig(cost=1e-9, horizon=64, family="normal")
    res = BeaconSampler(gen, lambda p, t: rng.gauss(0, 1), cfg,
                        budget=Budget(max_cost=cap)).run("q")
    assert res.stop_reason == "budget"
    assert res.n_samples == round(cap / cost)


@pytest.mark.parametrize("batched", [False, True])
async def test_an_offloaded_sync_call_raising_stop_iteration_fails_its_sample_at_once(
    batched: bool,
) -> None:
    # ``next(iter(choices))`` on an empty response. Before: the thread's StopIteration could
    # not be set on the future ("Exception in callback _settle" in the loop's log), so the
    # call hung until the per-call timeout and was reported -- and retried -- as a timeout.
    def gen(prompt: Any) -> str:
        return "x" if batched else next(iter([]))

    def score(prompt: Any, texts: list[str]) -> list[float]:
        return [next(iter([]))]

    handler_calls: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: handler_calls.append(ctx))
    try:
        cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal", batch_size=2)
        res = await BeaconSampler(
            gen, BatchScorer(score) if batched else (lambda p, t: 0.5), cfg,
            offload_sync=True, timeout=30.0, retry=RetryPolicy.none(),
        ).arun("q")
    finally:
        loop.set_exception_handler(None)
    assert handler_calls == []
    assert res.stop_reason == "error"
    assert res.candidates and all(c.failed for c in res.candidates)
    assert res.error is not None and res.error.startswith("RuntimeError: ")
    assert "raised StopIteration" in res.error
    assert res.usage.retries == 0


def test_successive_sync_runs_do_not_keep_their_event_loops_alive() -> None:
    # Each run() has its own loop; a semaphore that made a call wait binds to it, and the
    # sampler's per-loop limits (a weak-keyed map whose value then held its key) kept every
    # finished run's loop and context alive: memory grew with every run() of a sync service.
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    rng = random.Random(0)

    async def gen(prompt: Any) -> str:
        loop = asyncio.get_running_loop()
        if not loops or loops[-1]() is not loop:
            loops.append(weakref.ref(loop))
        await asyncio.sleep(0)
        return "x"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    # one slot for k0 = 3 samples started together: calls wait for it
    sampler = BeaconSampler(gen, lambda p, t: rng.gauss(0, 1), cfg, max_concurrency=1)
    for _ in range(5):
        assert sampler.run("q").error is None
    gc.collect()
    assert len(loops) == 5
    assert sum(ref() is not None for ref in loops) <= 1  # at most the last one's


async def test_an_observer_raising_cancelled_error_ends_only_its_query() -> None:
    # An async observer awaiting something that was cancelled (not the query) raised
    # CancelledError: it looked like the caller cancelling, so arun_many raised it and lost
    # every query's result.
    rng = random.Random(0)

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        return "x"

    async def obs(ev: Any) -> None:
        if ev.query_id == 1 and isinstance(ev, SampleEvent):
            raise asyncio.CancelledError

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    sampler = BeaconSampler(gen, lambda p, t: rng.gauss(0, 1), cfg)
    results = await sampler.arun_many(["a", "b", "c"], observers=[obs])
    assert [r.prompt for r in results] == ["a", "b", "c"]
    assert results[0].error is None and results[2].error is None
    assert results[1].stop_reason == "error"
    assert results[1].error is not None
    assert results[1].error.startswith("ObserverCancelledError: ")
    assert len(results[1].candidates) == 1  # the sample it was told about is kept

    single = await sampler.arun("q", observers=[obs, lambda ev: (_ for _ in ()).throw(
        asyncio.CancelledError())])
    assert single.stop_reason == "error"
    assert single.error is not None and single.error.startswith("ObserverCancelledError: ")


async def test_cancelling_a_query_while_an_async_observer_waits_still_propagates() -> None:
    waiting = asyncio.Event()

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        return "x"

    async def obs(ev: Any) -> None:
        if isinstance(ev, SampleEvent):
            waiting.set()
            await asyncio.Event().wait()  # never set

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    task = asyncio.ensure_future(BeaconSampler(gen, lambda p, t: 0.5, cfg).arun(
        "q", observers=[obs]))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def _agen_model(prompt: Any) -> Any:
    yield "chunk"


def _gen_scorer(prompt: Any, text: str) -> Any:
    yield 1.0


async def _agen_batch_scorer(prompt: Any, texts: list[str]) -> Any:
    for _ in texts:
        yield 1.0


class _StreamingModel:
    async def __call__(self, prompt: Any) -> Any:
        yield "chunk"


@pytest.mark.parametrize("field, generate, score", [
    ("generate", _agen_model, lambda p, t: 0.5),
    ("generate", _StreamingModel(), lambda p, t: 0.5),
    ("score", lambda p: "x", _gen_scorer),
    ("score", lambda p: "x", BatchScorer(_agen_batch_scorer)),
])
def test_a_generator_function_as_model_or_scorer_is_a_config_type_error(
    field: str, generate: Any, score: Any,
) -> None:
    # Before: accepted, then every sample failed ("got async_generator", "invalid reward
    # <generator object>") until max_failures ended the query.
    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    with pytest.raises(beacon.ConfigTypeError, match=f"invalid {field}=.*generator function"):
        BeaconSampler(generate, score, cfg)


async def test_a_reward_outside_the_familys_support_names_its_sample() -> None:
    # The Stopper's RewardError counts positions in rewards observed so far, so a bad reward
    # after a failed sample was reported "at position 0" on candidate 1.
    calls: list[Any] = []

    async def gen(prompt: Any) -> str:
        calls.append(prompt)
        n = len(calls)
        await asyncio.sleep(0)
        if n == 1:
            raise ValueError("no answer")
        return f"#{n}"

    cfg = beacon.BeaconConfig(cost=0.05, horizon=12, family="bernoulli")
    res = await BeaconSampler(gen, lambda p, t: 0.5, cfg, retry=RetryPolicy.none()).arun("q")
    assert res.candidates[0].error == "ValueError: no answer"
    bad = [c for c in res.candidates if c.error and c.error.startswith("RewardError")]
    assert bad
    for c in bad:
        assert f"at position {c.index}: 0.5" in (c.error or ""), c.error


async def test_a_message_with_no_content_that_calls_tools_is_scored_on_its_calls() -> None:
    # An OpenAI SDK message (``.content`` None when it only calls tools) returned by the
    # model failed every sample: "content must be str or list, got NoneType".
    class Message:
        def __init__(self) -> None:
            self.content = None
            self.tool_calls = [{"name": "lookup", "args": {"q": "x"}, "id": "call_1"}]

    async def gen(prompt: Any) -> Message:
        await asyncio.sleep(0)
        return Message()

    seen: list[str] = []

    def score(prompt: Any, text: str) -> float:
        seen.append(text)
        return 1.0

    cfg = beacon.BeaconConfig(cost=0.05, horizon=4, family="bernoulli")
    res = await BeaconSampler(gen, score, cfg).arun("q")
    assert res.error is None and res.n_failed == 0
    assert seen and all('"name": "lookup"' in t and '"q": "x"' in t for t in seen)
    assert isinstance(res.candidates[0].raw, Message)


def test_run_inside_a_running_loop_closes_its_loop_where_asyncio_run_is_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nest_asyncio.apply() (common in Jupyter) replaces asyncio.run by one that runs on the
    # thread's loop and never closes it. run() inside a running loop runs the query on a
    # worker thread through asyncio.run, so every run() left an open loop behind (selector,
    # self-pipe sockets, the sampler's per-loop state). This stands in for nest_asyncio.
    def run_without_close(main: Any, *, debug: Any = None) -> Any:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)

    monkeypatch.setattr(asyncio, "run", run_without_close)
    used: list[asyncio.AbstractEventLoop] = []
    rng = random.Random(0)

    async def gen(prompt: Any) -> str:
        used.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return "x"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    sampler = BeaconSampler(gen, lambda p, t: rng.gauss(0, 1), cfg)

    async def cell() -> Any:  # a notebook cell: sync code under a running loop
        return sampler.run("q"), sampler.run_many(["a", "b"])

    outer = asyncio.new_event_loop()
    try:
        res, many = outer.run_until_complete(cell())
        assert res.error is None and all(r.error is None for r in many)
        assert used and outer not in used
        assert all(loop.is_closed() for loop in used)
    finally:
        outer.close()
        for loop in used:
            if not loop.is_closed():
                loop.close()


def test_run_under_real_nest_asyncio_leaves_no_open_loop() -> None:
    pytest.importorskip("nest_asyncio")
    script = textwrap.dedent("""
        import asyncio, gc, random, warnings
        import nest_asyncio
        import beacon
        from beacon.engine import BeaconSampler

        async def gen(prompt):
            await asyncio.sleep(0)
            return "x"

        rng = random.Random(0)
        cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
        sampler = BeaconSampler(gen, lambda p, t: rng.gauss(0, 1), cfg)

        async def cell():
            return [sampler.run("q").stop_reason for _ in range(3)]

        loop = asyncio.new_event_loop()
        nest_asyncio.apply(loop)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            print(loop.run_until_complete(cell()))
            loop.close()
            gc.collect()
        print("unclosed", sum("unclosed event loop" in str(w.message) for w in caught))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240, cwd=pathlib.Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert "unclosed 0" in out.stdout, out.stdout + out.stderr


async def test_a_batched_scorer_returning_awaitables_is_awaited_as_one_call() -> None:
    # ``lambda p, ts: [judge(p, t) for t in ts]`` over an async judge returned coroutines:
    # every sample failed ("invalid reward <coroutine>") and each was never awaited.
    calls: list[str] = []

    async def judge(prompt: Any, text: str) -> float:
        calls.append(text)
        mine = float(len(calls))
        await asyncio.sleep(0)
        return mine

    async def gen(prompt: Any) -> str:
        return f"t{len(calls)}"

    cfg = beacon.BeaconConfig(cost=0.5, horizon=6, family="normal", batch_size=2)
    res = await BeaconSampler(
        gen, BatchScorer(lambda p, ts: [judge(p, t) for t in ts]), cfg
    ).arun("q")
    assert res.n_failed == 0 and res.n_samples >= 3
    assert sorted(c.reward for c in res.candidates if c.reward is not None) == [
        float(i) for i in range(1, res.n_samples + 1)
    ]

    # one awaitable failing fails that batch call, which is retried; none is left unawaited
    state = {"n": 0}

    async def flaky(prompt: Any, text: str) -> float:
        state["n"] += 1
        mine = state["n"]
        await asyncio.sleep(0)
        if mine == 2:
            raise beacon.TransientError("judge overloaded")
        return 0.5

    res2 = await BeaconSampler(
        gen, BatchScorer(lambda p, ts: [flaky(p, t) for t in ts]), cfg,
        retry=RetryPolicy(max_attempts=3, base_delay=0.0, jitter=0.0),
    ).arun("q")
    assert res2.n_failed == 0 and res2.usage.retries >= 1


async def test_an_exception_value_beside_awaitables_still_fails_only_its_sample() -> None:
    async def judge(prompt: Any, text: str) -> float:
        await asyncio.sleep(0)
        return 1.0

    async def gen(prompt: Any) -> str:
        return "t"

    def score(prompt: Any, texts: list[str]) -> list[Any]:
        return [ValueError("unjudgeable"), *(judge(prompt, t) for t in texts[1:])]

    cfg = beacon.BeaconConfig(cost=0.5, horizon=6, family="normal", batch_size=3)
    res = await BeaconSampler(gen, BatchScorer(score), cfg).arun("q")
    first = res.candidates[0]
    assert first.failed and "unjudgeable" in (first.error or "")
    assert [c.reward for c in res.candidates[1:3]] == [1.0, 1.0]


async def test_a_batched_scorer_may_yield_its_rewards() -> None:
    # A batched scorer may return a generator of rewards, so a generator function is one too
    # (the refusal of generator functions as scorers had taken it away).
    def rewards(prompt: Any, texts: list[str]) -> Any:
        for t in texts:
            yield float(len(t))

    async def gen(prompt: Any) -> str:
        return "ab"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    for score in (BatchScorer(rewards), rewards):
        if score is rewards:
            rewards.batched = True  # type: ignore[attr-defined]
        res = await BeaconSampler(gen, score, cfg).arun("q")
        assert res.n_failed == 0 and [c.reward for c in res.candidates][:3] == [2.0] * 3


async def test_the_timeout_bounds_the_awaitables_a_batched_sync_scorer_returns() -> None:
    # lambda p, ts: [judge(p, t) for t in ts] with a judge that never answers hung the query:
    # the per-call timeout did not apply to the awaitables of an inline sync scorer.
    async def judge(prompt: Any, text: str) -> float:
        await asyncio.Event().wait()
        return 1.0

    async def gen(prompt: Any) -> str:
        return "x"

    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal", batch_size=2)
    sampler = BeaconSampler(gen, BatchScorer(lambda p, ts: [judge(p, t) for t in ts]), cfg,
                            timeout=0.05, retry=RetryPolicy(max_attempts=1))
    res = await asyncio.wait_for(sampler.arun("q"), 60)
    assert res.stop_reason == "error" and res.best is None
    assert all("TimeoutError" in (c.error or "") for c in res.candidates)


def test_a_sync_scorer_running_a_nested_query_of_its_sampler_under_nest_asyncio_finishes(
) -> None:
    # Jupyter-style re-entrance (nest_asyncio): a sync scorer that runs a query of the same
    # sampler with asyncio.run. Once the sync scorer took a scorer slot, nested levels held
    # every slot and the innermost scorer waited forever for one.
    pytest.importorskip("nest_asyncio")
    code = textwrap.dedent(
        """
        import asyncio, faulthandler
        faulthandler.dump_traceback_later(100, exit=True)
        import nest_asyncio; nest_asyncio.apply()
        from beacon import BeaconConfig
        from beacon.engine import BeaconSampler

        async def gen(p):
            await asyncio.sleep(0.001)
            return "x" * (len(str(p)) % 5 + 1)

        def judge(p, t):
            if str(p).startswith("outer"):
                return float(asyncio.run(s.arun("inner" + t)).best.reward)
            return float(len(t))

        s = BeaconSampler(gen, judge, BeaconConfig(cost=0.05, horizon=6), max_concurrency=16)
        rs = asyncio.run(s.arun_many([f"outer{i}" for i in range(10)]))
        print("done", len(rs))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "done 10", proc.stderr[-3000:]
