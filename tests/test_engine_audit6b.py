"""BeaconSampler audit 6b: budget stops that lost paid samples or hid the Stopper's own reason.

1. With a batched scorer, a token/money cap (or ``max_failures``) reached while a batch was
   being generated threw the texts already generated away unscored (``usage.cancelled``): a
   query whose first ``k0`` generations crossed ``max_tokens`` returned no candidate at all,
   though it had paid for them. They are now scored, as a one-at-a-time scorer's are.
2. A cap reached by the last sample of a query the Stopper ends there anyway (the horizon, the
   index rule) reported ``stop_reason="budget"``: the Stopper decides first now.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import beacon
from beacon.budget import Budget
from beacon.engine import BatchScorer, BeaconSampler, Generation
from beacon.events import DecisionEvent, SampleEvent


def _normal(**kw: Any) -> beacon.BeaconConfig:
    return beacon.BeaconConfig(**{"cost": 1e-6, "horizon": 8, "family": "normal", **kw})


class _StaggeredModel:
    """Sample ``i`` (1-based) takes ``i`` x 10 ms and bills 10 input tokens; its text is ``i``."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, prompt: Any) -> Generation:
        self.calls += 1
        i = self.calls
        await asyncio.sleep(0.01 * i)
        return Generation(str(i), input_tokens=10, output_tokens=0)


def _value(prompt: Any, text: str) -> float:
    return float(text) / 7.0  # distinct rewards: the index rule never stops by chance


# -- 1. a batched scorer keeps the generations that crossed a cap -----------------------------
async def test_a_batched_scorer_scores_the_first_generations_that_cross_max_tokens() -> None:
    scored: list[list[str]] = []

    def judge(prompt: Any, texts: list[str]) -> list[float]:
        scored.append(list(texts))
        return [_value(prompt, t) for t in texts]

    # k0 = 3 samples drawn at once; the second crosses max_tokens=15 while the third runs
    s = BeaconSampler(_StaggeredModel(), BatchScorer(judge), _normal(),
                      budget=Budget(max_tokens=15))
    res = await s.arun("q")
    assert res.stop_reason == "budget"
    assert [c.index for c in res.candidates] == [0, 1]  # paid for: scored and kept
    assert res.n_samples == 2 and all(c.reward is not None for c in res.candidates)
    assert scored == [["1", "2"]] and res.usage.score_calls == 1
    assert res.usage.cancelled == 1  # only the one still generating
    assert res.best is not None and res.best.text == "2"


async def test_batched_and_single_scorers_keep_the_same_samples_at_a_cap() -> None:
    cfg = _normal(batch_size=4)
    out = []
    for score in (BatchScorer(lambda p, ts: [_value(p, t) for t in ts]), _value):
        s = BeaconSampler(_StaggeredModel(), score, cfg, budget=Budget(max_tokens=55))
        res = await s.arun("q")
        out.append((res.stop_reason, [c.index for c in res.candidates], res.n_samples,
                    res.usage.cancelled, res.usage.input_tokens))
    assert out[0] == out[1]
    assert out[0][0] == "budget" and out[0][2] >= 6


async def test_a_batched_scorer_scores_the_finished_generations_at_max_failures() -> None:
    n = [0]

    async def model(prompt: Any) -> str:
        n[0] += 1
        i = n[0]
        await asyncio.sleep(0.01 * i)
        if i in (2, 3):
            raise ValueError(f"bad sample {i}")
        return str(i)

    cfg = _normal(batch_size=4, max_failures=1)
    s = BeaconSampler(model, BatchScorer(lambda p, ts: [_value(p, t) for t in ts]), cfg)
    res = await s.arun("q")
    assert res.stop_reason == "error" and "bad sample 3" in (res.error or "")
    scored = [c.index for c in res.candidates if c.reward is not None]
    assert scored == [0]  # generated before the second failure: scored, not thrown away
    assert res.usage.cancelled == 0  # nothing was still running


async def test_a_deadline_during_batched_generation_still_scores_nothing_more() -> None:
    # The time cap is a deadline: texts generated before it are not scored after it.
    calls: list[int] = []

    async def model(prompt: Any) -> str:
        calls.append(1)
        await asyncio.sleep(0.01 if len(calls) <= 2 else 5)
        return str(len(calls))

    def judge(prompt: Any, texts: list[str]) -> list[float]:
        raise AssertionError("scored after the deadline")

    s = BeaconSampler(model, BatchScorer(judge), _normal(), budget=Budget(max_seconds=0.2),
                      timeout=None)
    res = await s.arun("q")
    assert res.stop_reason == "budget" and res.candidates == []
    assert res.usage.cancelled == 3 and res.usage.score_calls == 0


# -- 2. the Stopper's own stop reason wins over a cap reached at the same sample --------------
async def test_a_cap_reached_at_the_horizon_keeps_the_horizon_stop_reason() -> None:
    events: list[Any] = []
    cfg = _normal(horizon=4)
    # four samples of 10 tokens: the fourth reaches max_tokens=40 and the horizon at once
    s = BeaconSampler(_StaggeredModel(), _value, cfg, budget=Budget(max_tokens=40),
                      observers=[events.append])
    res = await s.arun("q")
    assert res.n_samples == 4 and res.usage.total_tokens == 40
    assert res.stop_reason == "horizon" and res.trace[-1].reason == "horizon"
    decisions = [e for e in events if isinstance(e, DecisionEvent)]
    assert decisions[-1].reason == "horizon"


async def test_a_cap_reached_in_batch_mode_at_the_horizon_keeps_the_horizon() -> None:
    cfg = _normal(horizon=7, batch_size=4)
    for score in (_value, BatchScorer(lambda p, ts: [_value(p, t) for t in ts])):
        s = BeaconSampler(_StaggeredModel(), score, cfg, budget=Budget(max_tokens=70))
        res = await s.arun("q")
        assert (res.stop_reason, res.n_samples) == ("horizon", 7), score


async def test_a_cap_reached_before_the_horizon_still_stops_with_budget() -> None:
    events: list[Any] = []
    s = BeaconSampler(_StaggeredModel(), _value, _normal(horizon=8),
                      budget=Budget(max_tokens=50), observers=[events.append])
    res = await s.arun("q")
    assert (res.stop_reason, res.n_samples) == ("budget", 5)
    assert res.trace[-1].decision == "stop" and res.trace[-1].reason == "budget"
    assert [e.reason for e in events if isinstance(e, DecisionEvent)][-1] == "budget"


# -- 3. Retry-After on errors that carry the headers themselves (aiohttp, urllib) -------------
def _aiohttp_429(retry_after: str) -> Exception:
    import aiohttp
    from multidict import CIMultiDict

    return aiohttp.ClientResponseError(
        None, (), status=429, message="Too Many Requests",  # type: ignore[arg-type]
        headers=CIMultiDict({"Retry-After": retry_after}),
    )


def test_retry_after_is_read_from_an_aiohttp_or_urllib_errors_own_headers() -> None:
    import io
    import urllib.error
    from email.message import Message

    from beacon.retry import retry_after_of

    assert retry_after_of(_aiohttp_429("7")) == 7.0
    hdrs = Message()
    hdrs["Retry-After"] = "3"
    err = urllib.error.HTTPError("http://x", 429, "Too Many Requests", hdrs, io.BytesIO(b""))
    assert retry_after_of(err) == 3.0
    assert retry_after_of(_aiohttp_429("soon")) is None  # unreadable: the backoff decides


async def test_an_aiohttp_429_is_retried_after_its_retry_after() -> None:
    from beacon.retry import RetryPolicy

    n = [0]

    async def model(prompt: Any) -> str:
        n[0] += 1
        if n[0] == 1:
            raise _aiohttp_429("0.3")
        return str(n[0])

    policy = RetryPolicy(max_attempts=2, base_delay=0.001, max_delay=0.001)
    s = BeaconSampler(model, _value, _normal(horizon=4), retry=policy)
    res = await s.arun("q")
    assert res.usage.retries == 1 and res.n_failed == 0
    # every call is instant: the query waited the server's 0.3 s, not the 1 ms backoff
    assert res.usage.wall_seconds >= 0.29


async def test_an_aiohttp_429_asking_too_long_fails_at_once_naming_max_retry_after() -> None:
    from beacon.retry import RetryPolicy

    n = [0]

    async def model(prompt: Any) -> str:
        n[0] += 1
        raise _aiohttp_429("120")

    policy = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.001)
    s = BeaconSampler(model, _value, _normal(max_failures=0), retry=policy)
    res = await s.arun("q")
    assert res.stop_reason == "error"
    assert "RetryAfterTooLongError" in (res.error or "") and "max_retry_after" in (res.error or "")
    assert res.usage.retries == 0  # not retried before the server's 120 s


# -- 4. observers are told of an error stop ---------------------------------------------------
async def test_observers_get_the_error_stop_when_the_decision_data_cannot_load(
    monkeypatch: Any,
) -> None:
    from beacon.families.normal import NormalFamily

    def prepare(self: Any, cfg: beacon.BeaconConfig) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(NormalFamily, "needs_prepare", lambda self, cfg: True)
    monkeypatch.setattr(NormalFamily, "prepare", prepare)
    events: list[Any] = []
    s = BeaconSampler(_StaggeredModel(), _value, _normal(), observers=[events.append])
    res = await s.arun("q")
    assert res.stop_reason == "error" and "disk gone" in (res.error or "")
    assert [(e.decision, e.reason) for e in events] == [("stop", "error")]
    assert events[0] == DecisionEvent.from_record(res.trace[-1])


async def test_an_observer_that_raised_on_a_sample_is_still_told_of_the_stop() -> None:
    events: list[Any] = []

    def observer(ev: Any) -> None:
        events.append(ev)
        if isinstance(ev, SampleEvent) and ev.index == 1:
            raise RuntimeError("dashboard down")

    s = BeaconSampler(_StaggeredModel(), _value, _normal(), observers=[observer])
    res = await s.arun("q")
    assert res.stop_reason == "error" and "dashboard down" in (res.error or "")
    last = events[-1]
    assert isinstance(last, DecisionEvent) and (last.decision, last.reason) == ("stop", "error")


async def test_an_observer_raising_again_on_the_stop_keeps_the_first_error() -> None:
    def observer(ev: Any) -> None:
        raise RuntimeError(f"broken on {ev.kind}")

    res = await BeaconSampler(_StaggeredModel(), _value, _normal(), observers=[observer]).arun("q")
    assert res.stop_reason == "error" and res.error == "RuntimeError: broken on decision"
    assert res.trace[-1].reason == "error"


# -- 5. numpy arrays as rewards -----------------------------------------------------------------
async def test_a_0d_numpy_array_reward_is_a_number() -> None:
    import numpy as np

    res = await BeaconSampler(_StaggeredModel(), lambda p, t: np.array(_value(p, t)),
                              _normal(horizon=4)).arun("q")
    assert res.n_failed == 0 and res.n_samples == 4, res.error
    assert [c.reward for c in res.candidates] == [i / 7.0 for i in range(1, 5)]
    assert all(type(c.reward) is float for c in res.candidates)


async def test_a_batched_scorers_n_by_1_array_fails_each_sample_saying_to_squeeze() -> None:
    import numpy as np

    def rm(prompt: Any, texts: list[str]) -> Any:
        return np.array([[_value(prompt, t)] for t in texts])  # a reward model's logits

    res = await BeaconSampler(_StaggeredModel(), BatchScorer(rm), _normal(max_failures=2)).arun("q")
    assert res.stop_reason == "error" and res.n_samples == 0
    err = res.candidates[0].error or ""
    assert err.startswith("RewardError") and "shape (1,)" in err and "squeeze" in err
    from beacon.engine.protocol import as_reward

    with pytest.raises(beacon.RewardError, match="must be finite"):
        as_reward(np.array(float("nan")), 0)


# -- 6. an integer of hundreds of digits is a ConfigError naming the field --------------------
def test_huge_integer_settings_are_config_errors_naming_the_field() -> None:
    from beacon.budget import cost_from_price
    from beacon.engine import Score
    from beacon.retry import RetryPolicy

    huge = 10**400  # JSON or Python ints have no size limit; float() of it overflows
    cases = [
        ("base_delay", lambda: RetryPolicy(base_delay=huge)),
        ("max_delay", lambda: RetryPolicy(max_delay=huge)),
        ("max_retry_after", lambda: RetryPolicy(max_retry_after=huge)),
        ("multiplier", lambda: RetryPolicy(multiplier=huge)),
        ("max_seconds", lambda: Budget(max_seconds=huge)),
        ("max_cost", lambda: Budget(max_cost=huge)),
        ("price_per_output_token", lambda: Budget(price_per_output_token=huge)),
        ("price_per_cache_write_1h_token", lambda: Budget(price_per_cache_write_1h_token=huge)),
        ("Generation.cost", lambda: Generation("x", cost=huge)),
        ("Score.cost", lambda: Score(0.5, cost=huge)),
        ("price_per_token", lambda: cost_from_price(price_per_token=huge, tokens_per_sample=1,
                                                    value_per_reward_unit=1.0)),
    ]
    for name, make in cases:
        with pytest.raises(beacon.ConfigError) as ei:
            make()
        assert ei.value.field == name and ei.value.value == huge, name
    # in range, ints are still read as the numbers they are
    assert RetryPolicy(base_delay=2, max_delay=7, multiplier=3).max_delay == 7.0
    assert Budget(max_cost=3, max_seconds=10).max_seconds == 10.0
    assert Generation("x", cost=2).cost == 2.0


async def test_a_model_reporting_a_huge_integer_cost_fails_its_sample_naming_the_cost() -> None:
    async def model(prompt: Any) -> Generation:
        return Generation("x", cost=10**400)

    res = await BeaconSampler(model, _value, _normal(max_failures=0)).arun("q")
    assert res.stop_reason == "error"
    assert (res.error or "").startswith("ConfigError") and "Generation.cost" in (res.error or "")


def test_a_huge_integer_timeout_is_no_limit_as_infinity_is() -> None:
    s = BeaconSampler(_StaggeredModel(), _value, _normal(), timeout=10**400)
    assert s.timeout == float("inf")
    with pytest.raises(beacon.ConfigError, match="timeout"):
        BeaconSampler(_StaggeredModel(), _value, _normal(), timeout=-(10**400))
