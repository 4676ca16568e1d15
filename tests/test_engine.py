"""BeaconSampler end to end with fake models: modes, concurrency, limits, failures, budgets."""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import json
import random
from typing import Any

import pytest

import beacon
from beacon._sync import run_sync
from beacon.budget import Budget, BudgetNotEnforcedWarning, cost_from_price
from beacon.engine import BatchScorer, BeaconSampler, Generation
from beacon.events import DecisionEvent, SampleEvent
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy, TransientError

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.002)


def bern(**kw: Any) -> beacon.BeaconConfig:
    kw.setdefault("cost", 0.05)
    kw.setdefault("horizon", 12)
    return beacon.BeaconConfig(family="bernoulli", **kw)


class FakeModel:
    """Async model: text 'r=<0|1> #<n>', optional latency, in-flight tracking, scripted faults."""

    def __init__(self, p: float = 0.2, latency: float = 0.0, seed: int = 0,
                 fail: Any = None) -> None:
        self.p, self.latency, self.rng = p, latency, random.Random(seed)
        self.fail = fail  # callable(call_no, prompt) -> exception or None
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0
        self.entry_in_flight: list[int] = []

    async def __call__(self, prompt: Any) -> str:
        self.calls += 1
        n = self.calls
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.entry_in_flight.append(self.in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            else:
                await asyncio.sleep(0)
            if self.fail is not None:
                exc = self.fail(n, prompt)
                if exc is not None:
                    raise exc
            return f"r={int(self.rng.random() < self.p)} #{n}"
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


def bin_score(prompt: Any, text: str) -> float:
    return float(text.split()[0][2:])


# -- basic behaviour --------------------------------------------------------------------------
async def test_arun_bernoulli_result_consistent_with_candidates() -> None:
    model = FakeModel(p=0.3, seed=1)
    s = BeaconSampler(model, bin_score, bern(), retry=FAST_RETRY)
    res = await s.arun("q")
    assert res.stop_reason in ("absorbed", "index", "horizon")
    assert res.n_samples == len(res.scored) == len(res.candidates) == model.calls
    assert [c.index for c in res.candidates] == list(range(res.n_samples))
    rewards = [c.reward for c in res.candidates]
    assert res.best is not None and res.best.reward == max(rewards)  # type: ignore[type-var]
    assert res.best.index == rewards.index(max(rewards))  # type: ignore[type-var]
    if res.stop_reason == "absorbed":
        assert rewards[-1] == 1.0 and rewards.count(1.0) == 1
    assert res.usage.model_calls == res.usage.score_calls == res.n_samples
    assert res.trace[-1].decision == "stop" and res.trace[-1].reason == res.stop_reason
    assert res.usage.wall_seconds > 0


async def test_sequential_mode_draws_one_at_a_time() -> None:
    model = FakeModel(p=0.0, latency=0.002)
    s = BeaconSampler(model, bin_score, bern(cost=0.01, horizon=8))
    res = await s.arun("q")
    assert res.stop_reason in ("horizon", "index")
    assert model.max_in_flight == 1
    draws = [t for t in res.trace if t.decision == "draw"]
    assert all(t.count == 1 for t in draws)
    assert len(draws) == res.n_samples


async def test_batch_mode_draws_min_b_and_remaining_concurrently() -> None:
    model = FakeModel(p=0.0, latency=0.005)
    cfg = bern(cost=0.001, horizon=10, batch_size=4)
    res = await BeaconSampler(model, bin_score, cfg).arun("q")
    assert res.stop_reason == "horizon" and res.n_samples == 10
    counts = [t.count for t in res.trace if t.decision == "draw"]
    # first the k0 = 1 sample, then batches of min(b, n - k): 4, 4, 1
    assert counts == [1, 4, 4, 1]
    assert model.max_in_flight == 4
    # decisions happen only at batch boundaries: k at each decision
    assert [t.k for t in res.trace] == [0, 1, 5, 9, 10]


async def test_first_k0_samples_are_drawn_concurrently() -> None:
    # The normal family under Jeffreys' prior has k0 = 3; the first Draw(3) needs no h-table.
    model = FakeModel(p=0.5, latency=0.01)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=8, family="normal")
    res = await BeaconSampler(model, lambda p, t: float(t.split("#")[1]), cfg).arun("q")
    assert cfg.k0 == 3
    assert res.trace[0].decision == "draw" and res.trace[0].count == 3
    assert model.entry_in_flight[:3] == [1, 2, 3]


async def test_prompt_is_passed_unchanged_to_generate_and_score() -> None:
    prompt = [{"role": "user", "content": "hi"}]
    seen: list[Any] = []

    def gen(p: Any) -> str:
        seen.append(p)
        return "r=1 x"

    def score(p: Any, t: str) -> float:
        seen.append(p)
        return 1.0

    res = await BeaconSampler(gen, score, bern()).arun(prompt)
    assert seen and all(p is prompt for p in seen)
    assert res.prompt is prompt and res.to_dict()["prompt"] == prompt


# -- concurrency and rate limiting ------------------------------------------------------------
async def test_global_concurrency_bound_across_queries() -> None:
    model = FakeModel(p=0.1, latency=0.003, seed=3)
    s = BeaconSampler(model, bin_score, bern(batch_size=3), max_concurrency=5)
    results = await s.arun_many([f"q{i}" for i in range(40)])
    assert len(results) == 40
    assert model.max_in_flight == 5  # reached, never exceeded


class CountingLimiter:
    def __init__(self) -> None:
        self.entered = 0
        self.inside = 0

    async def __aenter__(self) -> None:
        self.entered += 1
        self.inside += 1

    async def __aexit__(self, *exc: object) -> None:
        self.inside -= 1


async def test_rate_limiter_wraps_every_model_and_scorer_call_including_retries() -> None:
    lim = CountingLimiter()
    inside: list[int] = []

    def fail(n: int, prompt: Any) -> Exception | None:
        inside.append(lim.inside)
        return ConnectionError("reset") if n % 3 == 0 else None

    async def score(p: Any, t: str) -> float:
        inside.append(lim.inside)
        return bin_score(p, t)

    model = FakeModel(p=0.2, fail=fail, seed=5)
    s = BeaconSampler(model, score, bern(), rate_limiter=lim, retry=FAST_RETRY)
    results = await s.arun_many([f"q{i}" for i in range(10)])
    total_calls = sum(r.usage.calls for r in results)
    assert sum(r.usage.retries for r in results) > 0
    assert lim.entered == total_calls == model.calls + sum(r.usage.score_calls for r in results)
    assert all(x >= 1 for x in inside)  # every call ran inside the limiter


async def test_real_throttlers_accepted() -> None:
    from aiolimiter import AsyncLimiter
    from asyncio_throttle import Throttler

    for lim in (Throttler(rate_limit=10_000, period=1.0), AsyncLimiter(10_000, 1.0)):
        s = BeaconSampler(FakeModel(p=0.5), bin_score, bern(), rate_limiter=lim)
        res = await s.arun("q")
        assert res.n_samples >= 1 and res.error is None


@pytest.mark.parametrize("max_concurrency", [1, 3])
async def test_before_model_call_holds_no_slot_and_calls_count_when_they_start(
    max_concurrency: int,
) -> None:
    # The three samples of the first draw wait in the hook together, even with one slot; the
    # first passes once all three are there and its call fails (max_failures=0), which stops
    # the query and cancels the two still in the hook: they made no call and are not counted.
    waiting = 0
    all_in = asyncio.Event()

    async def gate() -> None:
        nonlocal waiting
        waiting += 1
        me = waiting
        if me == 3:
            all_in.set()
        await all_in.wait()
        if me > 1:
            await asyncio.Event().wait()

    model = FakeModel(fail=lambda n, p: ValueError("down"))
    s = BeaconSampler(model, bin_score, beacon.BeaconConfig(cost=0.01, horizon=6, max_failures=0),
                      max_concurrency=max_concurrency, before_model_call=gate,
                      retry=RetryPolicy.none())
    res = await asyncio.wait_for(s.arun("q"), 10)
    assert waiting == 3 and model.calls == 1
    assert res.stop_reason == "error" and res.usage.model_calls == 1
    assert res.usage.cancelled == 2 and res.usage.failed_calls == 1


async def test_before_model_call_precedes_every_model_attempt_and_no_scorer_call() -> None:
    hooks = 0

    async def hook() -> None:
        nonlocal hooks
        hooks += 1
        await asyncio.sleep(0)

    model = FakeModel(p=0.3, seed=4, fail=lambda n, p: ConnectionError("reset") if n % 4 == 0
                      else None)

    async def score(p: Any, t: str) -> float:
        return bin_score(p, t)

    s = BeaconSampler(model, score, bern(batch_size=3), max_concurrency=2,
                      before_model_call=hook, retry=FAST_RETRY, timeout=5.0)
    results = await s.arun_many([f"q{i}" for i in range(6)])
    assert sum(r.usage.retries for r in results) > 0
    assert hooks == model.calls == sum(r.usage.model_calls for r in results)
    assert sum(r.usage.score_calls for r in results) > 0
    with pytest.raises(beacon.ConfigError, match="before_model_call") as ei:
        BeaconSampler(model, score, bern(), before_model_call=3)  # type: ignore[arg-type]
    assert isinstance(ei.value, TypeError)


def test_a_sync_before_model_call_hook_runs_before_every_model_call() -> None:
    """A plain function as the hook (a counter, a non-blocking token check) is called, not
    awaited: every model call is preceded by one hook call and no sample fails."""
    hooks: list[int] = []
    model = FakeModel(p=0.3, seed=5)

    def hook() -> None:
        hooks.append(model.calls)

    s = BeaconSampler(model, bin_score, bern(horizon=6), before_model_call=hook)
    res = s.run("q")
    assert res.error is None and res.usage.failed_calls == 0
    assert len(hooks) == model.calls == res.usage.model_calls > 0
    assert hooks == list(range(model.calls))  # each hook call came before its model call


class FlakyLimiter:
    """Rate limiter whose entries numbered in ``fail`` fail (a backend hiccup), before the call."""

    def __init__(self, fail: set[int]) -> None:
        self.entered = 0
        self.fail = fail

    async def __aenter__(self) -> None:
        self.entered += 1
        if self.entered in self.fail:
            raise TransientError("limiter backend unavailable")

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_a_hook_or_limiter_error_before_the_call_is_no_failed_call_and_no_retry() -> None:
    # Errors of before_model_call / the rate limiter were counted as failed calls, and the
    # attempt after them as a retry: usage said 3 of 3 model calls failed and were retried
    # when the model never failed at all.
    hooks = 0

    async def hook() -> None:
        nonlocal hooks
        hooks += 1
        if hooks % 2:
            raise TransientError("token bucket unavailable")

    model = FakeModel(p=0.0)
    s = BeaconSampler(model, bin_score, bern(horizon=3), before_model_call=hook,
                      retry=FAST_RETRY)
    res = await s.arun("q")
    assert res.stop_reason == "horizon" and res.n_samples == 3 and hooks == 6
    assert res.usage.model_calls == model.calls == 3
    assert res.usage.failed_calls == 0 and res.usage.retries == 0

    # entries: 1 limiter fails, 2 model call fails, 3 its retry, 4 scorer, 5 limiter fails...
    lim = FlakyLimiter({1, 5})
    model = FakeModel(p=0.0, fail=lambda n, p: ConnectionError("reset") if n == 1 else None)
    s = BeaconSampler(model, bin_score, bern(horizon=3), rate_limiter=lim, retry=FAST_RETRY)
    res = await s.arun("q")
    assert res.stop_reason == "horizon" and res.n_samples == 3
    assert res.usage.model_calls == model.calls == 4
    # the one model call that failed is the one failed call, and its next attempt the retry
    assert res.usage.failed_calls == 1 and res.usage.retries == 1
    assert [c.usage.failed_calls for c in res.candidates] == [1, 0, 0]
    assert lim.entered == res.usage.calls + 2


def test_one_aiolimiter_serves_successive_sync_runs_without_warning() -> None:
    import warnings

    from aiolimiter import AsyncLimiter

    lim = AsyncLimiter(10_000, 1.0)
    s = BeaconSampler(FakeModel(p=0.5), bin_score, bern(), rate_limiter=lim)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        results = [s.run("q"), s.run("q"), s.run_many(["a", "b"])]
    assert [str(w.message) for w in seen] == []
    assert all(r.error is None and r.n_samples >= 1 for r in [*results[:2], *results[2]])


async def test_aiolimiter_bound_to_a_running_loop_serves_run_called_from_it() -> None:
    # The limiter first runs on this test's loop; run() from inside that loop (a private loop
    # in a worker thread) must wait for capacity there instead of failing its calls with
    # "attached to a different loop", and the loop's own arun keeps working afterwards.
    import warnings

    from aiolimiter import AsyncLimiter

    lim = AsyncLimiter(1, 0.002)  # one call at a time: every other call waits for capacity
    model = FakeModel(p=0.3, seed=2)
    s = BeaconSampler(model, bin_score, bern(horizon=6), rate_limiter=lim)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = await s.arun("q")
        inner = s.run("q")
        last = await s.arun("q")
    assert [str(w.message) for w in seen] == []
    for res in (first, inner, last):
        assert res.error is None and res.n_failed == 0 and res.n_samples >= 1


# -- cancellation -----------------------------------------------------------------------------
async def test_time_budget_cancels_in_flight_samples_and_does_not_charge_them() -> None:
    def slow_after_first(n: int, prompt: Any) -> None:
        return None

    class Model(FakeModel):
        async def __call__(self, prompt: Any) -> str:
            if self.calls >= 1:  # every sample after the first hangs
                self.latency = 30.0
            return await super().__call__(prompt)

    model = Model(p=0.0)
    cfg = bern(cost=0.001, horizon=10, batch_size=4)
    s = BeaconSampler(model, bin_score, cfg, budget=Budget(max_seconds=0.2), timeout=None)
    res = await s.arun("q")
    assert res.stop_reason == "budget"
    assert res.n_samples == 1 and len(res.candidates) == 1
    assert res.usage.cancelled == 4 and model.cancelled == 4
    assert model.in_flight == 0
    assert res.trace[-1].reason == "budget"


async def test_too_many_failures_cancels_the_rest_of_the_batch() -> None:
    class Model(FakeModel):
        async def __call__(self, prompt: Any) -> str:
            if self.calls == 1:
                self.latency = 30.0  # the first sample of the first batch hangs
            else:
                self.latency = 0.0
            return await super().__call__(prompt)

    def fail(n: int, prompt: Any) -> Exception | None:
        return ValueError("bad output") if n > 1 else None

    model = Model(p=0.0, fail=fail)
    cfg = bern(cost=0.001, horizon=10, batch_size=4, max_failures=2)
    res = await BeaconSampler(model, bin_score, cfg, timeout=None).arun("q")
    assert res.stop_reason == "error"
    assert res.error is not None and "ValueError: bad output" in res.error
    assert res.n_failed == 3 and res.n_samples == 1
    assert res.usage.cancelled == 1 and model.cancelled == 1 and model.in_flight == 0


async def test_caller_cancellation_propagates_and_cancels_samples() -> None:
    model = FakeModel(p=0.0, latency=30.0)
    s = BeaconSampler(model, bin_score, bern(batch_size=3))
    task = asyncio.ensure_future(s.arun("q"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert model.cancelled == model.calls >= 1 and model.in_flight == 0


# -- retries, timeouts, failures --------------------------------------------------------------
class StatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (ConnectionError("reset"), True),
        (TimeoutError(), True),
        (OSError("io"), True),
        (TransientError("try again"), True),
        (StatusError(429), True),
        (StatusError(503), True),
        (StatusError(400), False),
        (StatusError(404), False),
        (ValueError("bad"), False),
        (TypeError("bug"), False),
    ],
)
async def test_retry_only_on_retryable_errors(exc: Exception, retried: bool) -> None:
    model = FakeModel(p=1.0, fail=lambda n, p: exc if n == 1 else None)
    res = await BeaconSampler(model, bin_score, bern(), retry=FAST_RETRY).arun("q")
    c0 = res.candidates[0]
    if retried:
        assert not c0.failed and c0.usage.model_calls == 2 and c0.usage.retries == 1
    else:
        assert c0.failed and c0.usage.model_calls == 1 and c0.usage.retries == 0
        assert c0.error is not None and c0.error.startswith(type(exc).__name__)
        assert res.candidates[1].reward is not None  # sampling continued
    assert c0.usage.failed_calls == 1


def test_is_retryable_duck_types_aiohttp_errors() -> None:
    import aiohttp

    from beacon.retry import is_retryable

    assert is_retryable(aiohttp.ClientConnectionError("x"))
    assert is_retryable(aiohttp.ServerDisconnectedError())
    info = aiohttp.RequestInfo(url=__import__("yarl").URL("http://h/"), method="POST",
                               headers={}, real_url=__import__("yarl").URL("http://h/"))  # type: ignore[arg-type]
    assert is_retryable(aiohttp.ClientResponseError(info, (), status=502))
    assert not is_retryable(aiohttp.ClientResponseError(info, (), status=401))

    class NotRetryable(ConnectionError):
        retryable = False

    assert not is_retryable(NotRetryable())


def test_backoff_delays_are_exponential_capped_and_jittered() -> None:
    p = RetryPolicy(max_attempts=6, base_delay=0.1, multiplier=2.0, max_delay=0.5, jitter=0.0)
    assert [p.delay(i) for i in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    pj = RetryPolicy(base_delay=1.0, multiplier=3.0, max_delay=100, jitter=0.5)
    rng = random.Random(0)
    ds = [pj.delay(3, rng) for _ in range(200)]
    assert all(4.5 <= d <= 9.0 for d in ds) and max(ds) - min(ds) > 1.0
    with pytest.raises(beacon.ConfigError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(beacon.ConfigError, match="jitter"):
        RetryPolicy(jitter=2)


async def test_engine_waits_the_policy_backoff_between_attempts() -> None:
    waits: list[int] = []

    class Recording(RetryPolicy):
        def delay(self, retry: int, rng: random.Random | None = None) -> float:
            waits.append(retry)
            return 0.0

    model = FakeModel(p=1.0, fail=lambda n, p: ConnectionError() if n <= 3 else None)
    res = await BeaconSampler(model, bin_score, bern(),
                              retry=Recording(max_attempts=4)).arun("q")
    assert waits == [1, 2, 3]
    assert res.candidates[0].usage.model_calls == 4 and not res.candidates[0].failed


async def test_retry_after_is_honoured() -> None:
    class Busy(Exception):
        status = 429
        retry_after = 0.15

    loop = asyncio.get_running_loop()
    times: list[float] = []

    def fail(n: int, p: Any) -> Exception | None:
        times.append(loop.time())
        return Busy() if n == 1 else None

    model = FakeModel(p=1.0, fail=fail)
    await BeaconSampler(model, bin_score, bern(),
                        retry=RetryPolicy(base_delay=0.0, max_delay=1.0)).arun("q")
    assert times[1] - times[0] >= 0.14


class _Response:
    def __init__(self, headers: Any) -> None:
        self.headers = headers
        self.status_code = 429


class _SdkRateLimit(Exception):
    """What the OpenAI / Anthropic SDKs and httpx raise: the response, headers and all."""

    def __init__(self, headers: Any) -> None:
        super().__init__("rate limited")
        self.response = _Response(headers)


def test_retry_after_of_reads_the_sdk_response_headers() -> None:
    from email.utils import format_datetime

    from beacon.retry import retry_after_of

    assert retry_after_of(_SdkRateLimit({"retry-after-ms": "1500"})) == 1.5
    assert retry_after_of(_SdkRateLimit({"retry-after": "2"})) == 2.0
    assert retry_after_of(_SdkRateLimit({"Retry-After": "3"})) == 3.0  # a plain dict
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=60)
    ra = retry_after_of(_SdkRateLimit({"retry-after": format_datetime(soon, usegmt=True)}))
    assert ra is not None and 50 < ra <= 60
    past = datetime.datetime(2015, 10, 21, 7, 28, tzinfo=datetime.UTC)
    assert retry_after_of(_SdkRateLimit({"retry-after": format_datetime(past, usegmt=True)})) == 0
    for junk in ({"retry-after": "soon"}, {"retry-after-ms": "-5"}, {}, None, 42):
        assert retry_after_of(_SdkRateLimit(junk)) is None
    assert retry_after_of(ConnectionError()) is None


async def test_a_retry_after_header_on_the_errors_response_is_honoured() -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []

    def fail(n: int, p: Any) -> Exception | None:
        times.append(loop.time())
        return _SdkRateLimit({"retry-after-ms": "150"}) if n == 1 else None

    model = FakeModel(p=1.0, fail=fail)
    res = await BeaconSampler(model, bin_score, bern(),
                              retry=RetryPolicy(base_delay=0.0, max_delay=1.0)).arun("q")
    assert res.usage.retries == 1
    assert times[1] - times[0] >= 0.14


async def test_per_call_timeout_fails_then_retries() -> None:
    class Model(FakeModel):
        async def __call__(self, prompt: Any) -> str:
            self.latency = 5.0 if self.calls < 2 else 0.0  # calls 1 and 2 are slow
            return await super().__call__(prompt)

    model = Model(p=1.0)
    s = BeaconSampler(model, bin_score, bern(), timeout=0.05,
                      retry=RetryPolicy(max_attempts=2, base_delay=0.0))
    res = await s.arun("q")
    first = res.candidates[0]
    assert first.failed and first.error is not None and first.error.startswith("TimeoutError")
    assert first.usage.model_calls == 2 and model.cancelled == 2
    assert res.candidates[1].reward == 1.0 and res.stop_reason == "absorbed"


async def test_scorer_failures_are_failed_samples_not_rewards() -> None:
    calls = 0

    def score(p: Any, t: str) -> Any:
        nonlocal calls
        calls += 1
        return {1: "abc", 2: float("nan"), 3: 0.5, 4: True}.get(calls, 0.0)

    cfg = bern(cost=0.01, horizon=8, max_failures=5)
    res = await BeaconSampler(FakeModel(p=0.0), score, cfg).arun("q")
    errs = [c.error for c in res.candidates[:3]]
    assert all(c.failed and c.reward is None for c in res.candidates[:3])
    assert errs[0] is not None and "RewardError" in errs[0] and "'abc'" in errs[0]
    assert errs[1] is not None and "nan" in errs[1]
    assert errs[2] is not None and "0.5" in errs[2]  # outside the bernoulli support
    assert res.candidates[3].reward == 1.0 and res.stop_reason == "absorbed"
    assert res.n_samples == 1


async def test_max_failures_stops_with_error_and_keeps_results() -> None:
    model = FakeModel(p=1.0, fail=lambda n, p: ValueError(f"boom {n}") if n > 1 else None)
    cfg = bern(cost=0.001, horizon=10, max_failures=2)
    # p=1 would absorb at once; use reward 0 for the first sample
    res = await BeaconSampler(model, lambda p, t: 0.0, cfg).arun("q")
    assert res.stop_reason == "error"
    assert res.n_failed == 3 and res.n_samples == 1
    assert res.error == "ValueError: boom 4"
    assert res.best is not None and res.best.index == 0


async def test_thirty_percent_failures_every_query_gets_a_result() -> None:
    rng = random.Random(7)
    model = FakeModel(p=0.15, seed=8,
                      fail=lambda n, p: ConnectionError("flaky") if rng.random() < 0.3 else None)
    cfg = bern(cost=0.02, horizon=12, max_failures=3)
    s = BeaconSampler(model, bin_score, cfg, retry=RetryPolicy.none())
    prompts = [f"q{i}" for i in range(200)]
    results = await s.arun_many(prompts, max_active=32)
    assert [r.prompt for r in results] == prompts
    failed_calls = sum(r.usage.failed_calls for r in results)
    assert failed_calls == sum(r.n_failed for r in results) > 0
    assert sum(r.usage.model_calls for r in results) == model.calls
    assert 0.2 < failed_calls / model.calls < 0.4
    for r in results:
        assert r.n_samples == len(r.scored)
        if r.stop_reason == "error":
            assert r.n_failed == cfg.max_failures + 1 and r.error is not None
        else:
            assert r.n_failed <= cfg.max_failures and r.best is not None
    assert any(r.stop_reason == "error" for r in results)


async def test_timeout_error_says_which_call_and_how_long() -> None:
    async def slow_score(p: Any, text: str) -> float:
        await asyncio.sleep(5.0)
        return 1.0

    res = await BeaconSampler(
        FakeModel(p=1.0), slow_score, bern(max_failures=0), timeout=0.05,
        retry=RetryPolicy.none(),
    ).arun("q")
    assert "scorer call timed out after 0.05 s" in (res.error or "")

    async def own_timeout(p: Any) -> str:  # the client's own TimeoutError is kept as it is
        raise TimeoutError("upstream read timeout")

    res = await BeaconSampler(
        own_timeout, bin_score, bern(max_failures=0), timeout=10.0, retry=RetryPolicy.none()
    ).arun("q")
    assert "upstream read timeout" in (res.error or "") and "timed out after" not in (
        res.error or ""
    )


async def test_a_model_raising_cancelled_error_fails_its_sample_not_the_batch() -> None:
    async def gen(p: Any) -> str:
        await asyncio.sleep(0)
        if p == 2:  # e.g. a client library whose internal task was cancelled
            raise asyncio.CancelledError()
        return "r=1"

    s = BeaconSampler(gen, bin_score, bern(max_failures=0), retry=RetryPolicy.none())
    results = await s.arun_many(range(5))
    assert [r.stop_reason for r in results] == ["absorbed"] * 2 + ["error"] + ["absorbed"] * 2
    assert "CallCancelledError" in (results[2].error or "")
    assert results[2].usage.failed_calls == 1

    # on a later, sequential draw too (the first k0 = 3 draws of the normal family succeed)
    calls = 0

    async def late(p: Any) -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if p == 1 and calls >= 4:
            raise asyncio.CancelledError()
        return "r=0.5"

    def score(p: Any, text: str) -> float:
        return random.random()

    cfg = beacon.BeaconConfig(cost=1e-6, horizon=8, max_failures=0)
    results = await BeaconSampler(late, score, cfg, retry=RetryPolicy.none()).arun_many(
        [0, 1], max_active=1
    )
    assert results[0].n_samples == 8 and results[1].stop_reason == "error"


async def test_cancelled_error_of_the_caller_still_propagates() -> None:
    started = asyncio.Event()

    async def gen(p: Any) -> str:
        started.set()
        await asyncio.sleep(10)
        return "r=1"

    task = asyncio.create_task(BeaconSampler(gen, bin_score, bern()).arun("q"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_calls_waiting_for_a_slot_when_cancelled_are_not_counted() -> None:
    made = 0

    async def gen(p: Any) -> Generation:
        nonlocal made
        made += 1
        await asyncio.sleep(0.001)
        return Generation("r=0", input_tokens=0, output_tokens=100)

    cfg = bern(cost=0.001, horizon=8, batch_size=8)
    s = BeaconSampler(gen, bin_score, cfg, max_concurrency=1, budget=Budget(max_tokens=350))
    res = await s.arun("q")
    assert res.stop_reason == "budget"
    assert res.usage.model_calls == made  # calls queued behind the one slot were never made


# -- budgets ----------------------------------------------------------------------------------
async def test_token_budget_stops_with_budget() -> None:
    def gen(p: Any) -> Generation:
        return Generation("r=0", input_tokens=20, output_tokens=80)

    s = BeaconSampler(gen, bin_score, bern(cost=0.001, horizon=20),
                      budget=Budget(max_tokens=250))
    res = await s.arun("q")
    assert res.stop_reason == "budget" and res.n_samples == 3
    assert res.usage.input_tokens == 60 and res.usage.output_tokens == 240


async def test_money_budget_uses_reported_cost_or_token_prices() -> None:
    def priced(p: Any) -> Generation:
        return Generation("r=0", cost=0.3)

    res = await BeaconSampler(priced, bin_score, bern(cost=0.001, horizon=20),
                              budget=Budget(max_cost=1.0)).arun("q")
    assert res.stop_reason == "budget" and res.n_samples == 4
    assert res.usage.cost == pytest.approx(1.2)

    def tokens(p: Any) -> Generation:
        return Generation("r=0", input_tokens=100, output_tokens=100)

    b = Budget(max_cost=0.05, price_per_input_token=1e-4, price_per_output_token=2e-4)
    res2 = await BeaconSampler(tokens, bin_score, bern(cost=0.001, horizon=20),
                               budget=b).arun("q")
    assert res2.stop_reason == "budget" and res2.n_samples == 2  # 0.03 per sample
    assert res2.candidates[0].usage.cost == pytest.approx(0.03)


def test_a_cap_the_model_reports_nothing_for_is_reported_not_silently_inert() -> None:
    # Budget(max_cost) with a model reporting no cost (and no prices), or max_tokens with a
    # model reporting no tokens, never triggered and nothing said so.
    def plain(p: Any) -> str:
        return "r=0"

    cfg = bern(cost=0.001, horizon=6)
    s = BeaconSampler(plain, bin_score, cfg, budget=Budget(max_cost=0.01, max_tokens=10))
    with pytest.warns(BudgetNotEnforcedWarning) as rec:
        res = s.run("q")
        res2 = s.run("q2")  # the same sampler warns once per cap, not per query
    assert sorted(str(w.message).split()[1] for w in rec) == ["max_cost=0.01", "max_tokens=10"]
    assert "price_per_input_token" in str(rec[0].message) + str(rec[1].message)
    assert res.stop_reason == "horizon" and res.n_samples == 6  # the caps could not stop it
    assert res.budget_unenforced == res2.budget_unenforced == ["max_tokens", "max_cost"]
    back = BeaconResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.budget_unenforced == ["max_tokens", "max_cost"]

    # tokens but no price: max_tokens holds, max_cost still cannot
    def tokens(p: Any) -> Generation:
        return Generation("r=0", input_tokens=1, output_tokens=1)

    with pytest.warns(BudgetNotEnforcedWarning, match="max_cost"):
        res3 = BeaconSampler(tokens, bin_score, cfg,
                             budget=Budget(max_cost=0.01, max_tokens=1000)).run("q")
    assert res3.budget_unenforced == ["max_cost"]


def test_a_priced_side_the_model_reports_no_tokens_for_leaves_max_cost_unenforced() -> None:
    # A budget pricing input tokens over a model reporting only output tokens priced every
    # call at 0 money: max_cost never fired and nothing said the cap was inert.
    def output_only(p: Any) -> Generation:
        return Generation("r=0", output_tokens=100)

    cfg = bern(cost=0.001, horizon=6)
    b = Budget(max_cost=0.05, price_per_input_token=1e-3)
    with pytest.warns(BudgetNotEnforcedWarning, match="no input token count") as rec:
        res = BeaconSampler(output_only, bin_score, cfg, budget=b).run("q")
    assert len(rec) == 1 and "price_per_input_token" in str(rec[0].message)
    assert res.budget_unenforced == ["max_cost"] and res.n_samples == 6

    # Both sides priced, output missing: the input part still counts (a lower bound on the
    # money, so the cap can still fire on it), and the cap is reported as not bounding spend.
    def input_only(p: Any) -> Generation:
        return Generation("r=0", input_tokens=100)

    b2 = Budget(max_cost=0.25, price_per_input_token=1e-3, price_per_output_token=1e-2)
    with pytest.warns(BudgetNotEnforcedWarning, match="no output token count"):
        res2 = BeaconSampler(input_only, bin_score, cfg, budget=b2).run("q")
    assert res2.stop_reason == "budget" and res2.n_samples == 3  # 0.1 per call counted
    assert res2.usage.cost == pytest.approx(3 * 100 * 1e-3)
    assert res2.budget_unenforced == ["max_cost"]

    # A side the budget does not price may go unreported: nothing is missing from the money.
    import warnings

    b3 = Budget(max_cost=0.25, price_per_output_token=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res3 = BeaconSampler(output_only, bin_score, cfg, budget=b3).run("q")
    assert res3.budget_unenforced == [] and res3.stop_reason == "budget"


def test_tool_calls_with_keys_of_mixed_types_are_still_scored() -> None:
    from beacon.engine.protocol import coerce_generation

    class Msg:
        def __init__(self) -> None:
            self.content = ""
            self.tool_calls = [{"name": "f", "args": {1: "a", "b": 2}}]

    text = coerce_generation(Msg()).text
    assert json.loads(text) == [{"name": "f", "args": {"1": "a", "b": 2}}]


def test_the_budget_warning_as_an_error_fails_no_paid_sample() -> None:
    """Under warnings-as-errors (pytest's filterwarnings = error) the warning is raised from the
    query once it is over, never inside a sample: every paid sample is still scored."""
    import warnings

    def plain(p: Any) -> str:
        return "r=0"

    seen: list[SampleEvent] = []
    s = BeaconSampler(plain, bin_score, bern(cost=0.001, horizon=4),
                      budget=Budget(max_tokens=10), observers=[seen.append])
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotEnforcedWarning)
        with pytest.raises(BudgetNotEnforcedWarning, match="max_tokens"):
            s.run("q")
    samples = [e for e in seen if isinstance(e, SampleEvent)]
    assert len(samples) == 4 and not any(e.failed for e in samples)


def test_caps_the_model_reports_for_raise_no_warning() -> None:
    import warnings

    def tokens(p: Any) -> Generation:
        return Generation("r=0", input_tokens=1, output_tokens=1)

    def costed(p: Any) -> Generation:
        return Generation("r=0", cost=0.001)

    cfg = bern(cost=0.001, horizon=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = BeaconSampler(tokens, bin_score, cfg, budget=Budget(
            max_tokens=1000, max_cost=1.0, price_per_output_token=0.01)).run("q")
        b = BeaconSampler(costed, bin_score, cfg, budget=Budget(max_cost=1.0)).run("q")
        c = BeaconSampler(lambda p: "r=0", bin_score, cfg,
                          budget=Budget(max_seconds=60)).run("q")
    assert a.budget_unenforced == b.budget_unenforced == c.budget_unenforced == []


def test_budget_validation_names_field() -> None:
    with pytest.raises(beacon.ConfigError, match="max_tokens"):
        Budget(max_tokens=0)
    with pytest.raises(beacon.ConfigError, match="max_seconds"):
        Budget(max_seconds=-1.0)


def test_budget_from_dict_round_trips_and_names_a_bad_field() -> None:
    b = Budget(max_tokens=100, max_cost=2.5, price_per_output_token=0.01)
    assert Budget.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    # an unknown key (a typo) or a non-mapping was a bare TypeError from the dataclass
    with pytest.raises(beacon.ConfigError, match="max_token") as ei:
        Budget.from_dict({"max_token": 100})
    assert ei.value.field == "budget.max_token" and ei.value.value == 100
    with pytest.raises(beacon.ConfigError, match="budget") as ei2:
        Budget.from_dict([("max_tokens", 1)])  # type: ignore[arg-type]
    assert isinstance(ei2.value, TypeError)


def test_cost_from_price_formula_and_units() -> None:
    # paper example: $0.01 per sample, one reward unit worth $0.10 -> c = 0.1
    assert cost_from_price(1e-5, 1000, 0.10) == pytest.approx(0.1)
    assert cost_from_price(price_per_1k_tokens=0.01, tokens_per_sample=1000,
                           value_per_reward_unit=0.1) == pytest.approx(0.1)
    assert cost_from_price(price_per_1m_tokens=10.0, tokens_per_sample=500,
                           value_per_reward_unit=0.05,
                           extra_cost_per_sample=0.005) == pytest.approx((0.005 + 0.005) / 0.05)
    with pytest.raises(beacon.ConfigError, match="price_per_token"):
        cost_from_price(1e-5, 1000, 0.1, price_per_1k_tokens=0.01)
    with pytest.raises(beacon.ConfigError, match="value_per_reward_unit"):
        cost_from_price(1e-5, 1000, 0.0)
    cfg = bern(cost=cost_from_price(2e-6, 800, 0.05))
    assert cfg.cost == pytest.approx(2e-6 * 800 / 0.05)
    with pytest.raises(beacon.ConfigError, match="overflow") as exc:
        cost_from_price(1e300, 1e300, 1e-300)  # each finite, the product is not
    assert exc.value.field == "value_per_reward_unit"


# -- protocol ---------------------------------------------------------------------------------
async def test_batched_scorer_gets_whole_batches() -> None:
    batches: list[list[str]] = []

    async def score(prompt: Any, texts: list[str]) -> list[float]:
        batches.append(list(texts))
        return [0.0] * len(texts)

    cfg = bern(cost=0.001, horizon=9, batch_size=4)
    res = await BeaconSampler(FakeModel(), BatchScorer(score), cfg).arun("q")
    assert [len(b) for b in batches] == [1, 4, 4]
    assert res.usage.score_calls == 3 and res.n_samples == 9

    class Obj:
        batched = True

        def __call__(self, prompt: Any, texts: list[str]) -> list[float]:
            return [1.0 if t.startswith("r=1") else 0.0 for t in texts]

    res2 = await BeaconSampler(FakeModel(p=0.5, seed=2), Obj(), cfg).arun("q")
    assert res2.n_samples >= 1 and all(c.reward is not None for c in res2.candidates)


async def test_batched_scorer_wrong_length_fails_the_batch() -> None:
    cfg = bern(cost=0.001, horizon=5, batch_size=2, max_failures=10)
    res = await BeaconSampler(FakeModel(), BatchScorer(lambda p, ts: [0.0]), cfg).arun("q")
    assert res.candidates[0].reward == 0.0  # a batch of one is fine
    assert all(c.failed and "ValueError" in (c.error or "") for c in res.candidates[1:])


async def test_duck_typed_langchain_and_llamaindex_models() -> None:
    class AIMessage:
        def __init__(self, content: Any) -> None:
            self.content = content
            self.usage_metadata = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}

    class ChatModel:
        async def ainvoke(self, prompt: Any) -> AIMessage:
            return AIMessage([{"type": "text", "text": "r=1"}, " tail"])

    res = await BeaconSampler(ChatModel(), bin_score, bern()).arun("q")
    c = res.candidates[0]
    assert c.text == "r=1 tail" and isinstance(c.raw, AIMessage)
    assert res.usage.input_tokens == 7 and res.usage.output_tokens == 3
    d = json.loads(json.dumps(res.to_dict()))
    assert "raw" not in d["candidates"][0] and d["candidates"][0]["text"] == "r=1 tail"

    class CompletionResponse:
        text = "r=1 done"

    class LLM:
        async def acomplete(self, prompt: str) -> CompletionResponse:
            return CompletionResponse()

    res2 = await BeaconSampler(LLM(), bin_score, bern()).arun("q")
    assert res2.best is not None and res2.best.text == "r=1 done"

    with pytest.raises(TypeError, match="generate"):
        BeaconSampler(object(), bin_score, bern())


async def test_unknown_model_return_type_fails_sample_with_type_error() -> None:
    res = await BeaconSampler(lambda p: 42, bin_score, bern(max_failures=0)).arun("q")
    assert res.stop_reason == "error" and "TypeError" in (res.error or "")


async def test_offload_sync_runs_blocking_callables_in_threads() -> None:
    import threading

    threads: set[str] = set()

    def gen(p: Any) -> str:
        threads.add(threading.current_thread().name)
        return "r=1"

    res = await BeaconSampler(gen, bin_score, bern(), offload_sync=True).arun("q")
    assert res.n_samples == 1 and threading.current_thread().name not in threads


def test_offload_sync_call_that_never_returns_does_not_hold_up_run() -> None:
    import threading

    release = threading.Event()

    def gen(p: Any) -> str:  # a blocking client without a timeout of its own
        release.wait(60)
        return "r=1"

    s = BeaconSampler(
        gen, bin_score, bern(max_failures=0), offload_sync=True, timeout=0.05,
        retry=RetryPolicy.none(),
    )
    box: dict[str, BeaconResult] = {}
    t = threading.Thread(target=lambda: box.setdefault("res", s.run("q")), daemon=True)
    t.start()
    t.join(30)  # asyncio.to_thread made run() wait for the abandoned call (60 s here)
    finished = not t.is_alive()
    release.set()
    assert finished
    assert box["res"].stop_reason == "error" and "TimeoutError" in (box["res"].error or "")


async def test_offload_sync_keeps_context_and_reports_errors() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("v", default="unset")
    var.set("caller")
    seen: list[str] = []

    def gen(p: Any) -> str:
        seen.append(var.get())
        return "r=1"

    def score(p: Any, text: str) -> float:
        raise ValueError("scorer down")

    res = await BeaconSampler(gen, bin_score, bern(), offload_sync=True).arun("q")
    assert res.n_samples == 1 and seen == ["caller"]
    res = await BeaconSampler(
        gen, score, bern(max_failures=0), offload_sync=True, retry=RetryPolicy.none()
    ).arun("q")
    assert res.stop_reason == "error" and "scorer down" in (res.error or "")


async def test_a_scorers_own_as_reward_makes_each_value_a_reward_one_sample_at_a_time() -> None:
    # A scorer may say how its outputs become rewards (the adapters do: numeric strings,
    # {"score": x}); the engine applies it per value and checks the result, so an invalid
    # value -- in a batch too -- fails only its own sample, named by its position.
    class Judge:
        batched = True

        def __call__(self, prompt: Any, texts: list[str]) -> list[Any]:
            return [{"score": t.split()[0][2:]} if int(t.split()[1][1:]) % 3 else "?"
                    for t in texts]

        @staticmethod
        def as_reward(value: Any, position: Any) -> Any:
            if not isinstance(value, dict):
                raise beacon.RewardError(position, value, "not a judgement")
            return float(value["score"]) if value["score"] != "1" else float("nan")

    res = await BeaconSampler(FakeModel(p=0.3, seed=9), Judge(),
                              bern(batch_size=4, max_failures=20)).arun("q")
    assert res.error is None and res.scored and res.n_failed > 0
    for c in res.candidates:
        n = int(c.text.split()[1][1:])
        ok = n % 3 != 0 and c.text.startswith("r=0")
        assert c.failed is not ok, c
        if not ok:
            assert c.error is not None and f"at position {c.index}:" in c.error
    with pytest.raises(beacon.engine.ConfigTypeError, match=r"score\.as_reward"):
        BeaconSampler(FakeModel(), type("S", (), {"__call__": bin_score, "as_reward": 1})(),
                      bern())


async def test_an_exception_in_a_batch_fails_that_sample_with_it() -> None:
    class NoVerdict(Exception):
        pass

    async def score(prompt: Any, texts: list[str]) -> list[Any]:
        return [NoVerdict(f"no verdict for {t}") if t.endswith("#2") else bin_score(prompt, t)
                for t in texts]

    res = await BeaconSampler(FakeModel(p=0.0), BatchScorer(score), bern(batch_size=3)).arun("q")
    failed = [c for c in res.candidates if c.failed]
    assert [c.text for c in failed] == ["r=0 #2"]
    assert failed[0].error == "NoVerdict: no verdict for r=0 #2"
    assert len(res.scored) == res.n_samples > 0


# -- observers --------------------------------------------------------------------------------
async def test_observers_receive_sample_and_decision_events_in_order() -> None:
    sync_events: list[Any] = []
    async_events: list[Any] = []

    async def aobs(ev: Any) -> None:
        await asyncio.sleep(0)
        async_events.append(ev)

    s = BeaconSampler(FakeModel(p=0.3, seed=4), bin_score, bern(), observers=[sync_events.append])
    res = await s.arun("q", observers=[aobs])
    assert sync_events == async_events
    decisions = [e for e in sync_events if isinstance(e, DecisionEvent)]
    samples = [e for e in sync_events if isinstance(e, SampleEvent)]
    # TraceRecords hold NaNs (NaN != NaN), so compare their JSON forms
    assert [d.to_record().to_dict() for d in decisions] == [t.to_dict() for t in res.trace]
    assert [e.index for e in samples] == [c.index for c in res.candidates]
    assert [e.k for e in samples] == list(range(1, res.n_samples + 1))
    assert isinstance(sync_events[0], DecisionEvent) and isinstance(sync_events[-1], DecisionEvent)
    json.dumps([e.to_dict() for e in sync_events])


async def test_observer_error_ends_only_that_query() -> None:
    def obs(ev: Any) -> None:
        if ev.query_id == 3 and isinstance(ev, SampleEvent):
            raise RuntimeError("observer broke")

    s = BeaconSampler(FakeModel(p=0.5), bin_score, bern(), observers=[obs])
    results = await s.arun_many([f"q{i}" for i in range(6)])
    assert results[3].stop_reason == "error" and results[3].error == "RuntimeError: observer broke"
    assert len(results[3].candidates) == 1  # kept what it had
    assert all(r.stop_reason != "error" for i, r in enumerate(results) if i != 3)


async def test_an_observer_error_mid_batch_leaves_the_accounts_balanced() -> None:
    # Three samples finish together; the observer raises on the first one's event. The two
    # others were generated and scored (their calls are in usage) but never fed to the
    # Stopper: they were neither candidates nor counted as cancelled.
    model = FakeModel(p=0.0)

    def obs(ev: Any) -> None:
        if isinstance(ev, SampleEvent):
            raise RuntimeError("observer broke")

    cfg = beacon.BeaconConfig(cost=0.001, horizon=10, family="normal", batch_size=4)
    res = await BeaconSampler(model, bin_score, cfg, observers=[obs]).arun("q")
    assert res.stop_reason == "error" and res.error == "RuntimeError: observer broke"
    assert model.calls == res.usage.model_calls == res.usage.score_calls == 3
    assert len(res.candidates) == res.n_samples == 1
    assert len(res.candidates) + res.usage.cancelled == model.calls


# -- many queries, sync entry points ----------------------------------------------------------
async def test_arun_many_isolation_order_and_metadata() -> None:
    def gen(p: str) -> str:
        if p == "bad":
            raise ValueError("always broken")
        return "r=1"

    s = BeaconSampler(gen, bin_score, bern(max_failures=1))
    prompts = ["a", "bad", "c"]
    metas = [{"id": i} for i in range(3)]
    results = await s.arun_many(prompts, metadata=metas)
    assert [r.metadata for r in results] == metas
    assert [r.stop_reason for r in results] == ["absorbed", "error", "absorbed"]
    assert results[1].error == "ValueError: always broken" and results[1].best is None
    assert results[1].preference_pair() is None

    seen = [i async for i, _ in s.astream_many(prompts, max_active=1)]
    assert sorted(seen) == [0, 1, 2]
    with pytest.raises(beacon.ConfigError, match="metadata"):
        await s.arun_many(prompts, metadata=[{}])


async def test_run_inside_running_loop() -> None:
    s = BeaconSampler(FakeModel(p=0.5), bin_score, bern())
    res = s.run("q")  # this test body runs inside an event loop
    assert isinstance(res, BeaconResult) and res.n_samples >= 1
    many = s.run_many(["a", "b"])
    assert len(many) == 2
    res2 = await s.arun("q")  # the sampler still works on this loop afterwards
    assert res2.n_samples >= 1


async def test_ctrl_c_in_run_inside_a_running_loop_stops_the_query() -> None:
    # Jupyter: run() blocks the notebook's loop while a worker thread runs the query; Ctrl-C
    # is a KeyboardInterrupt in the blocked caller. The query went on calling the model in
    # the background until its horizon (200 calls) after the interrupt was raised.
    import signal
    import threading

    model = FakeModel(p=0.0, latency=0.002)

    def obs(ev: Any) -> None:
        if isinstance(ev, SampleEvent) and ev.index == 2:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    s = BeaconSampler(model, bin_score, bern(cost=1e-9, horizon=200), observers=[obs])
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as under ipykernel
    try:
        with pytest.raises(KeyboardInterrupt):
            s.run("q")
    finally:
        signal.signal(signal.SIGINT, old)
    calls = model.calls
    assert calls < 10 and model.in_flight == 0  # cancelled, and nothing runs on after
    await asyncio.sleep(0.02)
    assert model.calls == calls


def test_run_without_loop_and_reuse_across_loops() -> None:
    s = BeaconSampler(FakeModel(p=0.5, latency=0.001), bin_score, bern(), max_concurrency=2)
    assert s.run("q").n_samples >= 1
    assert s.run("q").n_samples >= 1  # a fresh asyncio.run loop: new semaphores
    assert len(s.run_many(["a", "b", "c"])) == 3


async def test_run_sync_propagates_errors_and_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")

    async def read() -> str:
        return var.get()

    async def boom() -> None:
        raise KeyError("x")

    assert run_sync(read()) == "caller"
    with pytest.raises(KeyError):
        run_sync(boom())


def test_sampler_argument_validation() -> None:
    with pytest.raises(beacon.ConfigError, match="max_concurrency"):
        BeaconSampler(FakeModel(), bin_score, bern(), max_concurrency=0)
    with pytest.raises(beacon.ConfigError, match="timeout"):
        BeaconSampler(FakeModel(), bin_score, bern(), timeout=-1)
    with pytest.raises(beacon.ConfigError, match="rate_limiter"):
        BeaconSampler(FakeModel(), bin_score, bern(), rate_limiter=object())  # type: ignore[arg-type]
    with pytest.raises(beacon.ConfigError, match="cfg"):
        BeaconSampler(FakeModel(), bin_score, {"cost": 0.1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="score"):
        BeaconSampler(FakeModel(), 3, bern())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"cfg": {"cost": 0.1}}, "cfg"),
    ({"cfg": None}, "cfg"),
    ({"generate": 3}, "generate"),
    ({"score": "score"}, "score"),
    ({"retry": 3}, "retry"),
    ({"budget": {"max_tokens": 10}}, "budget"),
    ({"rate_limiter": object()}, "rate_limiter"),
    ({"before_model_call": 1.5}, "before_model_call"),
    ({"observers": print}, "observers"),
    # a truthy string silently ran every sync call in a thread
    ({"offload_sync": "no"}, "offload_sync"),
    ({"offload_sync": None}, "offload_sync"),
    # a bare TypeError from the random module, not naming the argument
    ({"seed": [1]}, "seed"),
])
def test_a_wrong_type_is_a_type_error_as_in_the_stopper_and_a_config_error(
    kwargs: dict[str, Any], field: str
) -> None:
    # Stopper(cfg) raises TypeError for a cfg that is not a BeaconConfig; BeaconSampler raises
    # ConfigTypeError, which both ``except TypeError`` and ``except ConfigError`` catch.
    args: dict[str, Any] = {"generate": FakeModel(), "score": bin_score, "cfg": bern()}
    args.update(kwargs)
    with pytest.raises(TypeError) as ei:
        BeaconSampler(**args)
    e = ei.value
    assert isinstance(e, beacon.engine.ConfigTypeError) and isinstance(e, beacon.ConfigError)
    assert e.field == field and e.value is args.get(field, kwargs.get(field))
    assert str(e).startswith(f"invalid {field}=")
    if field == "cfg":
        with pytest.raises(TypeError):
            beacon.Stopper(kwargs["cfg"])


async def test_wrong_types_at_call_time_are_config_type_errors() -> None:
    s = BeaconSampler(FakeModel(), bin_score, bern())
    for call, field in ((lambda: s.arun("q", metadata=[1]), "metadata"),  # type: ignore[arg-type]
                        (lambda: s.arun("q", observers=[3]), "observers"),
                        (lambda: s.arun_many("abc"), "prompts")):
        with pytest.raises(beacon.engine.ConfigTypeError) as ei:
            await call()
        assert ei.value.field == field and isinstance(ei.value, TypeError)


# -- agreement with the Stopper and the offline replay (normal family) -------------------------
def _logged(n_prompts: int, horizon: int, seed: int = 11) -> list[list[float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n_prompts):
        mu, sd = rng.gauss(0, 1), rng.uniform(0.1, 2.0)
        rows.append([rng.gauss(mu, sd) for _ in range(horizon)])
    return rows


def _log_model(rows: list[list[float]]) -> Any:
    """prompt = row number; the i-th call for a prompt returns its i-th logged reward."""
    counters: dict[int, int] = {}

    async def gen(p: int) -> str:
        i = counters.get(p, 0)
        counters[p] = i + 1
        await asyncio.sleep(0)
        return repr(rows[p][i])

    return gen


@pytest.mark.parametrize("batch_size", [1, 4])
async def test_engine_decisions_equal_a_hand_driven_stopper(batch_size: int) -> None:
    cfg = beacon.BeaconConfig(cost=0.05, horizon=16, family="normal", batch_size=batch_size)
    rows = _logged(40, 16)
    s = BeaconSampler(_log_model(rows), lambda p, t: float(t), cfg, max_concurrency=8)
    results = await s.arun_many(range(len(rows)))
    for row, res in zip(rows, results, strict=True):
        st = beacon.Stopper(cfg)
        used = 0
        while isinstance(d := st.next_decision(), beacon.Draw):
            st.observe(row[used : used + d.count])
            used += d.count
        assert res.n_samples == used == st.k
        assert res.stop_reason == st.stopped.reason  # type: ignore[union-attr]
        assert [c.reward for c in res.candidates] == row[:used]
        assert res.best is not None and res.best.index == st.best_index
        assert [t.to_dict() for t in res.trace] == [t.to_dict() for t in st.trace]


async def test_engine_agrees_with_offline_replay() -> None:
    import numpy as np

    cfg = beacon.BeaconConfig(cost=0.1, horizon=16, family="normal")
    rows = _logged(60, 16, seed=5)
    results = await BeaconSampler(_log_model(rows), lambda p, t: float(t), cfg).arun_many(
        range(len(rows))
    )
    rep = beacon.replay(np.array(rows), cfg)
    assert [r.n_samples for r in results] == rep.n_samples.tolist()
    assert [r.best.index for r in results if r.best] == rep.chosen.tolist()
    assert [r.stop_reason for r in results] == list(rep.stop_reason)


async def test_time_budget_during_batched_scoring_cancels_the_scoring_call() -> None:
    scored = asyncio.Event()
    cancelled: list[bool] = []

    async def slow_batch(p: Any, texts: list[str]) -> list[float]:
        if scored.is_set():  # the second batch's scoring hangs
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        scored.set()
        return [0.0] * len(texts)

    cfg = bern(cost=0.001, horizon=10, batch_size=3)
    s = BeaconSampler(FakeModel(), BatchScorer(slow_batch), cfg,
                      budget=Budget(max_seconds=0.3), timeout=None)
    res = await s.arun("q")
    assert res.stop_reason == "budget" and cancelled == [True]
    assert res.n_samples == 1 and len(res.candidates) == 1
    assert res.usage.cancelled == 3  # generated, never scored: not charged


async def test_breaking_out_of_astream_many_cancels_the_rest() -> None:
    model = FakeModel(p=0.0, latency=0.01)
    s = BeaconSampler(model, bin_score, bern(cost=0.001, horizon=30), max_concurrency=4)
    got = []
    async for i, res in s.astream_many([f"q{i}" for i in range(6)], max_active=2):
        got.append((i, res))
        break
    await asyncio.sleep(0.05)
    assert len(got) == 1 and model.in_flight == 0


def _prompts_then_error(n: int) -> Any:
    for i in range(n):
        yield f"q{i}"
    raise ValueError("prompt source broke")


async def test_a_prompt_iterator_error_delivers_the_queries_already_started() -> None:
    # The queries running when the prompts iterator raised were cancelled: samples paid for,
    # results lost. Now they finish and are yielded, then the error is raised.
    release = asyncio.Event()  # q2 is in flight until a result is consumed
    calls: list[str] = []
    cancelled: list[str] = []

    async def gen(prompt: str) -> str:
        calls.append(prompt)
        try:
            if prompt == "q2":
                await release.wait()
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            cancelled.append(prompt)
            raise
        return "r=0"

    s = BeaconSampler(gen, bin_score, bern(cost=0.001, horizon=4), max_concurrency=8)
    got: dict[int, BeaconResult] = {}
    with pytest.raises(ValueError, match="prompt source broke") as ei:
        async for i, res in s.astream_many(_prompts_then_error(3), max_active=5):
            got[i] = res
            release.set()
    assert sorted(got) == [0, 1, 2] and cancelled == []
    assert all(r.stop_reason == "horizon" and r.n_samples == 4 for r in got.values())
    assert len(calls) == 12
    assert any("completed" in note for note in ei.value.__notes__)


async def test_a_prompt_iterator_error_starts_no_query_in_arun_many() -> None:
    model = FakeModel(p=0.0)
    s = BeaconSampler(model, bin_score, bern(cost=0.001, horizon=4))
    with pytest.raises(ValueError, match="prompt source broke"):
        await s.arun_many(_prompts_then_error(3))
    assert model.calls == 0  # read in full first: nothing was paid for


async def _settle_loop(rounds: int = 2000) -> None:
    """Let every task that can make progress do so (zero-latency fakes: no clock involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_astream_many_holds_back_new_queries_while_the_consumer_lags() -> None:
    # The result queue was unbounded: with a consumer that had taken one result, all 200
    # prompts were started and their results piled up in memory.
    pulled: list[int] = []

    def prompts() -> Any:
        for i in range(200):
            pulled.append(i)
            yield f"q{i}"

    s = BeaconSampler(FakeModel(p=0.0), bin_score, bern(horizon=3), max_concurrency=8)
    stream = s.astream_many(prompts(), max_active=2)
    got = [await stream.__anext__()]
    await _settle_loop()
    # max_active results queued + one held by each blocked worker, plus the one yielded
    assert len(pulled) <= 2 * 2 + 1
    n_idle = len(pulled)
    got.append(await stream.__anext__())
    await _settle_loop()
    assert len(pulled) == n_idle + 1  # consuming one result lets exactly one more query start
    got += [item async for item in stream]
    # nothing lost, nothing duplicated, every result complete
    assert sorted(i for i, _ in got) == list(range(200))
    assert all(r.prompt == f"q{i}" and r.n_samples == 3 for i, r in got)


async def test_astream_many_closed_early_while_workers_wait_leaves_no_task() -> None:
    model = FakeModel(p=0.0)
    s = BeaconSampler(model, bin_score, bern(horizon=3), max_concurrency=8)
    before = asyncio.all_tasks()
    stream = s.astream_many([f"q{i}" for i in range(100)], max_active=3)
    await stream.__anext__()
    await _settle_loop()  # the queue is full and workers wait on it with finished results
    await stream.aclose()
    assert asyncio.all_tasks() == before
    assert model.in_flight == 0
    # and a query in flight when the consumer leaves is cancelled, not left running
    slow = FakeModel(p=0.0, latency=30.0)
    s2 = BeaconSampler(slow, bin_score, bern(horizon=3), max_concurrency=8)
    stream2 = s2.astream_many([f"q{i}" for i in range(10)], max_active=3)
    waiter = asyncio.ensure_future(stream2.__anext__())
    await _settle_loop(50)
    assert slow.in_flight == 3
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await stream2.aclose()
    assert asyncio.all_tasks() == before and slow.in_flight == 0


def test_astream_many_abandoned_by_break_leaves_no_pending_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Breaking out without aclosing(): the generator is finalized by the loop's asyncgen hooks.
    model = FakeModel(p=0.0)
    s = BeaconSampler(model, bin_score, bern(horizon=3), max_concurrency=8)

    async def main() -> set[asyncio.Task[Any]]:
        async for _ in s.astream_many([f"q{i}" for i in range(100)], max_active=3):
            await _settle_loop()
            break
        await _settle_loop(50)
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    with caplog.at_level("ERROR", logger="asyncio"):
        left = asyncio.run(main())
        import gc

        gc.collect()
    assert left == set() and model.in_flight == 0
    assert "destroyed but it is pending" not in caplog.text


async def test_arun_many_events_carry_query_ids() -> None:
    seen: dict[int | None, int] = {}

    def obs(ev: Any) -> None:
        if isinstance(ev, SampleEvent):
            seen[ev.query_id] = seen.get(ev.query_id, 0) + 1

    s = BeaconSampler(FakeModel(p=0.4), bin_score, bern())
    results = await s.arun_many(["a", "b", "c"], observers=[obs])
    assert seen == {i: len(r.candidates) for i, r in enumerate(results)}
    await s.arun("d", observers=[obs])
    assert None in seen


async def test_cancelling_arun_many_cancels_every_query() -> None:
    model = FakeModel(p=0.0, latency=30.0)
    s = BeaconSampler(model, bin_score, bern(), max_concurrency=8)
    task = asyncio.ensure_future(s.arun_many([f"q{i}" for i in range(20)], max_active=5))
    await asyncio.sleep(0.05)
    assert model.in_flight == 5
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert model.in_flight == 0 and model.cancelled == 5


async def test_a_huge_max_concurrency_starts_no_more_tasks_than_prompts() -> None:
    # max_active defaults to 4 * max_concurrency: 20,000 idle worker tasks were created up
    # front for two prompts (with max_concurrency=10**12, run_many never started at all).
    tasks_seen: list[int] = []

    async def model(prompt: Any) -> str:
        tasks_seen.append(len(asyncio.all_tasks()))
        await asyncio.sleep(0)
        return "r=0"

    s = BeaconSampler(model, bin_score, bern(horizon=3), max_concurrency=5_000)
    results = await s.arun_many(["a", "b"])
    assert [r.n_samples for r in results] == [3, 3]
    assert max(tasks_seen) <= 8  # this test, two queries, their workers and the closer
    # a lazy stream of prompts still runs max_active queries at once
    model2 = FakeModel(p=0.0, latency=0.005)
    s2 = BeaconSampler(model2, bin_score, bern(horizon=2), max_concurrency=5_000)
    got = [i async for i, _ in s2.astream_many((f"q{i}" for i in range(6)), max_active=3)]
    assert sorted(got) == list(range(6)) and model2.max_in_flight == 3


async def test_sync_scorer_returning_awaitable_still_gets_the_timeout() -> None:
    async def hang() -> float:
        await asyncio.sleep(30)
        return 1.0

    def score(p: Any, t: str) -> Any:  # a sync function handing back a coroutine
        return hang()

    cfg = bern(max_failures=0)
    s = BeaconSampler(FakeModel(p=1.0), score, cfg, timeout=0.05, retry=RetryPolicy.none())
    res = await s.arun("q")
    assert res.stop_reason == "error"
    # says which call and how long, as the engine's own per-call timeout does
    assert res.error == "TimeoutError: scorer call timed out after 0.05 s"


# -- bad input: typed errors up front, bad values from models and scorers fail one sample --------
@pytest.mark.parametrize("prompts", ["abc", b"abc", {"a": "first prompt"}, 5, None])
async def test_prompts_that_are_not_a_list_of_prompts_are_config_errors(prompts: Any) -> None:
    model = FakeModel()
    s = BeaconSampler(model, bin_score, bern())
    with pytest.raises(beacon.ConfigError) as exc:
        await s.arun_many(prompts)
    assert exc.value.field == "prompts"
    with pytest.raises(beacon.ConfigError):
        [x async for x in s.astream_many(prompts)]
    assert model.calls == 0


async def test_bad_metadata_and_observers_are_config_errors_before_any_call() -> None:
    model = FakeModel()
    s = BeaconSampler(model, bin_score, bern())
    cases: list[tuple[Any, str]] = [
        (s.arun("q", metadata=5), "metadata"),  # type: ignore[arg-type]
        (s.arun("q", observers=print), "observers"),  # type: ignore[arg-type]
        (s.arun("q", observers=[5]), "observers"),  # type: ignore[list-item]
        (s.arun_many(["a", "b"], metadata=[1, 2]), "metadata[0]"),  # type: ignore[list-item]
        (s.arun_many(["a", "b", "c"], metadata=[{}, {}]), "metadata"),
        (s.arun_many(iter(["a", "b"]), metadata=[{}, {}, {}]), "metadata"),
    ]
    for coro, field in cases:
        with pytest.raises(beacon.ConfigError) as exc:
            await coro
        assert exc.value.field == field
    with pytest.raises(beacon.ConfigError) as exc2:
        [x async for x in s.astream_many(["a", "b"], metadata=[{}])]
    assert exc2.value.field == "metadata"
    # a lazy iterator of prompts is checked against per-prompt metadata up front too
    for n_prompts, n_meta in ((5, 2), (2, 5)):
        with pytest.raises(beacon.ConfigError) as exc2:
            [x async for x in s.astream_many((p for p in range(n_prompts)),
                                             metadata=[{}] * n_meta)]
        assert exc2.value.field == "metadata"
    assert model.calls == 0
    got = [x async for x in s.astream_many((p for p in "ab"), metadata=[{"m": 0}, {"m": 1}])]
    assert sorted((i, r.metadata["m"]) for i, r in got) == [(0, 0), (1, 1)]
    with pytest.raises(beacon.ConfigError, match="observers"):
        BeaconSampler(model, bin_score, bern(), observers=print)  # type: ignore[arg-type]
    res = await BeaconSampler(model, bin_score, bern(), observers=None).arun(  # type: ignore[arg-type]
        "q", observers=None, metadata=None
    )
    seen: list[Any] = []
    res2 = await BeaconSampler(model, bin_score, bern(), observers=(seen.append,)).arun("q")
    assert res.n_samples >= 1 and len(seen) >= 2 * res2.n_samples


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        ({0: 1.0, 1: 1.0}, "dict"),
        ({1.0, 0.0}, "set"),
        ("10", "str"),
        (None, "NoneType"),
    ],
)
async def test_batched_scorer_returning_no_list_fails_the_batch(returned: Any, why: str) -> None:
    cfg = bern(cost=0.001, horizon=4, batch_size=2, max_failures=10)
    res = await BeaconSampler(
        FakeModel(), BatchScorer(lambda p, ts: returned), cfg, retry=FAST_RETRY
    ).arun("q")
    assert res.candidates and all(c.failed for c in res.candidates)
    assert all(c.reward is None and why in (c.error or "") for c in res.candidates)


async def test_batched_scorer_may_return_any_ordered_sequence() -> None:
    np = pytest.importorskip("numpy")
    cfg = bern(cost=0.001, horizon=4, batch_size=2)
    for make in (lambda ts: np.zeros(len(ts)), lambda ts: (0.0 for _ in ts), tuple):
        def score(p: Any, ts: list[str], make: Any = make) -> Any:
            return make([0.0] * len(ts)) if make is tuple else make(ts)

        res = await BeaconSampler(FakeModel(), BatchScorer(score), cfg).arun("q")
        assert res.n_samples == 4 and all(c.reward == 0.0 for c in res.candidates)


async def test_scorer_values_at_the_edges() -> None:
    np = pytest.importorskip("numpy")
    verdicts = iter([np.False_, np.True_])
    res = await BeaconSampler(
        FakeModel(), lambda p, t: next(verdicts), bern(cost=0.001, horizon=4)
    ).arun("q")
    assert [c.reward for c in res.candidates] == [0.0, 1.0]
    assert res.stop_reason == "absorbed"

    huge = await BeaconSampler(
        FakeModel(), lambda p, t: 10**400, bern(max_failures=2), retry=FAST_RETRY
    ).arun("q")
    assert huge.stop_reason == "error"
    assert all("RewardError" in (c.error or "") and "finite" in (c.error or "")
               for c in huge.candidates)


@pytest.mark.parametrize(
    ("gen", "field"),
    [
        ({"text": None}, "text"),
        ({"text": 5}, "text"),
        ({"text": "a", "cost": float("nan")}, "Generation.cost"),
        ({"text": "a", "cost": -1.0}, "Generation.cost"),
        ({"text": "a", "input_tokens": -100}, "Generation.input_tokens"),
        ({"text": "a", "output_tokens": "abc"}, "Generation.output_tokens"),
        ({"text": "a", "output_tokens": 2.5}, "Generation.output_tokens"),
    ],
)
def test_generation_fields_are_checked(gen: dict[str, Any], field: str) -> None:
    with pytest.raises((beacon.ConfigError, TypeError)) as exc:
        Generation(**gen)
    if isinstance(exc.value, beacon.ConfigError):
        assert exc.value.field == field
    else:
        assert field in str(exc.value)


async def test_a_model_reporting_a_nan_cost_fails_its_samples_and_the_budget_holds() -> None:
    np = pytest.importorskip("numpy")
    assert Generation("a", np.int64(3), np.int32(4), np.float32(0.5)) == Generation("a", 3, 4, 0.5)

    async def gen(p: Any) -> Generation:
        return Generation("r=0", cost=float("nan"))

    res = await BeaconSampler(
        gen, bin_score, bern(max_failures=2), budget=Budget(max_cost=0.001)
    ).arun("q")
    assert res.stop_reason == "error" and res.usage.cost is None  # nothing was charged
    assert all("Generation.cost" in (c.error or "") for c in res.candidates)


def test_retry_policy_rejects_what_would_break_a_retry() -> None:
    for kw, field in (
        ({"retry_on": 5}, "retry_on"),
        ({"base_delay": float("inf"), "max_delay": float("inf")}, "base_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
        ({"multiplier": float("inf")}, "multiplier"),
    ):
        with pytest.raises(beacon.ConfigError) as exc:
            RetryPolicy(**kw)
        assert exc.value.field == field
    p = RetryPolicy(max_attempts=5000, multiplier=1e308, max_delay=3.0, jitter=0.0)
    assert p.delay(1) == 0.5 and p.delay(3) == 3.0 and p.delay(4000) == 3.0
    assert RetryPolicy(base_delay=0.0, jitter=0.0).delay(2000) == 0.0


async def test_a_broken_retry_predicate_reports_both_errors() -> None:
    def pred(exc: BaseException) -> bool:
        raise KeyError("oops")

    res = await BeaconSampler(
        FakeModel(fail=lambda n, p: ConnectionError("down")), bin_score, bern(max_failures=1),
        retry=RetryPolicy(retry_on=pred, base_delay=0.0),
    ).arun("q")
    err = res.candidates[0].error or ""
    assert res.stop_reason == "error"
    assert "retry_on" in err and "oops" in err and "ConnectionError('down')" in err
