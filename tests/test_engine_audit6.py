"""BeaconSampler audit 6: a scorer's own spend (an LLM judge), the cache split in Usage, and
Anthropic's 1-hour cache writes.

1. A scorer that calls an LLM reports its tokens/money with ``beacon.Score``; they count in the
   sample's and query's usage (apart from the model's) and in the Budget's caps. A LangChain
   judge's ``AIMessage.usage_metadata`` is read on its own.
2. ``Usage`` carries the model's cache read/write split (per sample and per query, in JSON).
3. Anthropic's ``cache_creation.ephemeral_1h_input_tokens`` is read, and a Budget prices those
   writes at ``price_per_cache_write_1h_token``.

``beacon.Score`` is looked up inside the tests (not imported at the top), so that each test
fails on its own defect on the code before the fix.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

import beacon
from beacon.budget import Budget
from beacon.engine import BatchScorer, BeaconSampler, Generation
from beacon.engine.protocol import coerce_generation
from beacon.result import BeaconResult, Usage
from beacon.retry import RetryPolicy


def _cfg(**kw: Any) -> beacon.BeaconConfig:
    return beacon.BeaconConfig(**{"cost": 1e-6, "horizon": 8, "family": "normal", **kw})


def _rewards() -> Any:
    """Distinct rewards in a fixed order, so the stopping rule never stops early by chance."""
    vals = [0.1, 0.5, 0.3, 0.9, 0.2, 0.7, 0.4, 0.6, 0.8, 0.05]
    n = [0]

    def nxt() -> float:
        v = vals[n[0] % len(vals)]
        n[0] += 1
        return v

    return nxt


async def _gen(prompt: Any) -> Generation:
    await asyncio.sleep(0)
    return Generation("answer", input_tokens=10, output_tokens=2)


# -- 1. a scorer's own tokens and money -------------------------------------------------------
async def test_a_score_counts_the_judges_tokens_and_money_apart_and_in_the_totals() -> None:
    nxt = _rewards()

    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score(nxt(), input_tokens=100, output_tokens=5, cost=0.01)

    s = BeaconSampler(_gen, judge, _cfg(horizon=4), retry=RetryPolicy.none(),
                      budget=Budget(price_per_input_token=1e-4, price_per_output_token=1e-3))
    res = await s.arun("q")
    assert res.candidates and not any(c.failed for c in res.candidates)
    model_cost = 10 * 1e-4 + 2 * 1e-3
    for c in res.candidates:
        u = c.usage
        assert (u.input_tokens, u.output_tokens) == (10, 2)  # the model's, unchanged
        assert (u.score_input_tokens, u.score_output_tokens) == (100, 5)
        assert u.score_cost == pytest.approx(0.01)
        assert u.cost == pytest.approx(model_cost + 0.01)
        assert u.total_tokens == 117
        assert isinstance(c.reward, float)
    n = len(res.candidates)
    assert res.usage.score_input_tokens == 100 * n
    assert res.usage.score_output_tokens == 5 * n
    assert res.usage.input_tokens == 10 * n
    assert res.usage.cost == pytest.approx(n * (model_cost + 0.01))
    assert res.usage.score_cost == pytest.approx(n * 0.01)
    d = res.to_dict()["usage"]
    assert (d["score_input_tokens"], d["score_output_tokens"]) == (100 * n, 5 * n)
    assert BeaconResult.from_dict(json.loads(json.dumps(res.to_dict()))).to_dict() == \
        res.to_dict()


async def test_max_tokens_counts_the_scorers_tokens() -> None:
    # The model reports 12 tokens a sample, the judge 1,000: a cap of 3,500 is reached at the
    # fourth sample. Uncounted, the query ran all 8 (96 model tokens).
    nxt = _rewards()

    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score(nxt(), input_tokens=990, output_tokens=10)

    s = BeaconSampler(_gen, judge, _cfg(), retry=RetryPolicy.none(),
                      budget=Budget(max_tokens=3500))
    res = await s.arun("q")
    assert res.stop_reason == "budget"
    assert len(res.candidates) == 4
    assert res.usage.total_tokens == 4 * 1012
    assert res.budget_unenforced == []


async def test_max_cost_prices_a_scorers_tokens_with_the_budget() -> None:
    nxt = _rewards()

    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score(nxt(), input_tokens=1000, output_tokens=10)

    b = Budget(max_cost=4.0, price_per_input_token=1e-3, price_per_output_token=1e-2)
    s = BeaconSampler(_gen, judge, _cfg(), retry=RetryPolicy.none(), budget=b)
    res = await s.arun("q")
    judge_cost = 1000 * 1e-3 + 10 * 1e-2  # 1.1 a sample
    model_cost = 10 * 1e-3 + 2 * 1e-2  # 0.03: the model alone would never reach the cap
    assert res.stop_reason == "budget" and len(res.candidates) == 4
    assert res.candidates[0].usage.score_cost == pytest.approx(judge_cost)
    assert res.usage.cost == pytest.approx(4 * (judge_cost + model_cost))
    assert res.budget_unenforced == []


async def test_a_score_with_tokens_but_nothing_to_price_them_leaves_max_cost_unenforced() -> None:
    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score(0.5, input_tokens=1000, output_tokens=10)

    async def gen(prompt: Any) -> Generation:
        return Generation("a", 10, 2, cost=0.001)  # the model's money is known

    s = BeaconSampler(gen, judge, _cfg(horizon=4), retry=RetryPolicy.none(),
                      budget=Budget(max_cost=10.0))
    with pytest.warns(beacon.budget.BudgetNotEnforcedWarning, match="scorer"):
        res = await s.arun("q")
    assert res.budget_unenforced == ["max_cost"]


async def test_a_batched_scorers_scores_count_once_per_sample() -> None:
    nxt = _rewards()

    def judge_batch(prompt: Any, texts: list[str]) -> list[Any]:
        return [beacon.Score(nxt(), input_tokens=50, output_tokens=3, cost=0.5) for _ in texts]

    s = BeaconSampler(_gen, BatchScorer(judge_batch), _cfg(horizon=6, batch_size=3),
                      retry=RetryPolicy.none(), budget=Budget(max_tokens=10**6))
    res = await s.arun("q")
    n = len(res.candidates)
    assert n >= 3
    for c in res.candidates:
        assert (c.usage.score_input_tokens, c.usage.score_output_tokens) == (50, 3)
        assert c.usage.cost == pytest.approx(0.5)
    assert res.usage.score_input_tokens == 50 * n  # not twice (sample and query)
    assert res.usage.cost == pytest.approx(0.5 * n)
    assert res.usage.total_tokens == n * (12 + 53)


async def test_a_judge_whose_reward_is_invalid_still_counts_its_tokens() -> None:
    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score("not a number", input_tokens=7, output_tokens=1)

    s = BeaconSampler(_gen, judge, _cfg(horizon=4, max_failures=1),
                      retry=RetryPolicy.none())
    res = await s.arun("q")
    assert all(c.failed and "RewardError" in (c.error or "") for c in res.candidates)
    assert res.usage.score_input_tokens == 7 * len(res.candidates)


def test_score_checks_its_numbers() -> None:
    with pytest.raises(beacon.ConfigError, match=r"Score\.cost"):
        beacon.Score(1.0, cost=float("nan"))
    with pytest.raises(beacon.ConfigError, match=r"Score\.input_tokens"):
        beacon.Score(1.0, input_tokens=-1)
    with pytest.raises(beacon.ConfigError, match=r"Score\.input_tokens"):
        beacon.Score(1.0, input_tokens=5, cache_read_tokens=9)
    assert "Score" in beacon.__all__


async def test_plain_float_rewards_report_no_scorer_spend() -> None:
    s = BeaconSampler(_gen, lambda p, t: 0.5, _cfg(horizon=4), retry=RetryPolicy.none())
    res = await s.arun("q")
    u = res.usage
    assert (u.score_input_tokens, u.score_output_tokens, u.score_cost) == (None, None, None)
    assert u.total_tokens == 12 * len(res.candidates)


async def test_correctness_adjusted_keeps_a_judges_spend() -> None:
    from beacon_integrations.scorers.verify import CorrectnessAdjusted

    async def judge(prompt: Any, text: str) -> Any:
        return beacon.Score(0.5, input_tokens=40, output_tokens=2)

    scorer = CorrectnessAdjusted(judge, lambda p, t: True)
    out = await scorer("q", "a")
    assert isinstance(out, beacon.Score)
    assert (out.reward, out.input_tokens, out.output_tokens) == (1.0, 40, 2)  # 2R, R > 0


@pytest.mark.filterwarnings("ignore::beacon.budget.BudgetNotEnforcedWarning")  # the fake model
def test_a_langchain_judge_messages_usage_counts_in_the_query() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    from beacon_integrations.langchain import BeaconRunnable

    def judge(d: dict[str, Any]) -> AIMessage:
        return AIMessage(content=str(0.1 * len(d["response"])), usage_metadata={
            "input_tokens": 300, "output_tokens": 4, "total_tokens": 304,
            "input_token_details": {"cache_read": 200},
        })

    r = BeaconRunnable(
        model=FakeListChatModel(responses=["a", "bb", "ccc", "dd", "e", "ffff"]),
        scorer=RunnableLambda(judge), config=_cfg(horizon=6), return_result=True,
        budget=Budget(max_tokens=1000),
    )
    res = r.invoke("q")
    assert res.stop_reason == "budget" and len(res.candidates) == 4  # 304 a sample
    assert [c.reward for c in res.candidates] == pytest.approx([0.1, 0.2, 0.3, 0.2])
    assert res.usage.score_input_tokens == 4 * 300
    assert res.usage.score_output_tokens == 4 * 4


# -- 2. the cache split in Usage ---------------------------------------------------------------
async def test_usage_carries_the_cache_split_per_sample_and_per_query() -> None:
    async def gen(prompt: Any) -> Generation:
        return Generation("a", input_tokens=2310, output_tokens=7,
                          cache_read_tokens=2000, cache_write_tokens=300)

    s = BeaconSampler(gen, _rewards_scorer(), _cfg(horizon=4), retry=RetryPolicy.none())
    res = await s.arun("q")
    n = len(res.candidates)
    for c in res.candidates:
        assert (c.usage.cache_read_tokens, c.usage.cache_write_tokens) == (2000, 300)
        d = c.usage.to_dict()
        assert (d["cache_read_tokens"], d["cache_write_tokens"]) == (2000, 300)
        assert d["input_tokens"] == 2310  # existing keys kept
    assert (res.usage.cache_read_tokens, res.usage.cache_write_tokens) == (2000 * n, 300 * n)
    back = BeaconResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.usage.cache_read_tokens == 2000 * n
    assert back.candidates[0].usage.cache_write_tokens == 300


def test_usage_from_dict_of_an_older_dict_and_bad_cache_values() -> None:
    old = {"model_calls": 1, "input_tokens": 5, "output_tokens": 1, "cost": 0.1}
    u = Usage.from_dict(old)
    assert (u.cache_read_tokens, u.cache_write_tokens, u.score_input_tokens) == (None,) * 3
    with pytest.raises(beacon.ConfigError, match=r"usage\.cache_read_tokens"):
        Usage.from_dict({"cache_read_tokens": -3})
    with pytest.raises(beacon.ConfigError, match=r"usage\.score_cost"):
        Usage.from_dict({"score_cost": float("nan")})


def _rewards_scorer() -> Any:
    nxt = _rewards()
    return lambda p, t: nxt()


# -- 3. Anthropic's 1-hour cache writes --------------------------------------------------------
@dataclass
class CacheCreation:
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


@dataclass
class AnthropicUsage:
    """anthropic.types.Usage with prompt caching and the TTL split of the writes."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation: Any = None


@dataclass
class TextBlock:
    text: str
    type: str = "text"


@dataclass
class AnthropicMessage:
    content: list[Any]
    usage: AnthropicUsage
    role: str = "assistant"


def _msg() -> AnthropicMessage:
    # 10 uncached input tokens, 2,000 read from the cache, 300 written (100 for 1 hour)
    return AnthropicMessage([TextBlock("ok")], AnthropicUsage(
        10, 7, 300, 2000, CacheCreation(ephemeral_5m_input_tokens=200,
                                        ephemeral_1h_input_tokens=100)))


def test_the_anthropic_1h_cache_write_split_is_read() -> None:
    gen = coerce_generation(_msg())
    assert (gen.input_tokens, gen.cache_read_tokens, gen.cache_write_tokens) == (2310, 2000, 300)
    assert gen.cache_write_1h_tokens == 100
    # as a dict (a raw JSON response) too
    as_dict = AnthropicMessage([TextBlock("ok")], AnthropicUsage(
        10, 7, 300, 2000, {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 100}))
    assert coerce_generation(as_dict).cache_write_1h_tokens == 100


def test_langchain_anthropic_usage_metadata_1h_split_is_read() -> None:
    @dataclass
    class Message:
        content: str
        usage_metadata: dict[str, Any]

    gen = coerce_generation(Message("ok", {
        "input_tokens": 2310, "output_tokens": 7, "total_tokens": 2317,
        "input_token_details": {"cache_read": 2000, "cache_creation": 300,
                                "ephemeral_5m_input_tokens": 200,
                                "ephemeral_1h_input_tokens": 100},
    }))
    assert (gen.cache_write_tokens, gen.cache_write_1h_tokens) == (300, 100)
    # a 1-hour count beyond the writes is dropped, not priced twice
    bad = coerce_generation(Message("ok", {
        "input_tokens": 2310, "output_tokens": 7,
        "input_token_details": {"cache_creation": 300, "ephemeral_1h_input_tokens": 900},
    }))
    assert (bad.cache_write_tokens, bad.cache_write_1h_tokens) == (300, None)


async def test_1h_cache_writes_are_priced_at_their_own_price() -> None:
    async def gen(prompt: Any) -> AnthropicMessage:
        await asyncio.sleep(0)
        return _msg()

    budget = Budget(price_per_input_token=1.0, price_per_output_token=5.0,
                    price_per_cache_read_token=0.1, price_per_cache_write_token=1.25,
                    price_per_cache_write_1h_token=2.0)
    s = BeaconSampler(gen, _rewards_scorer(), _cfg(horizon=4), retry=RetryPolicy.none(),
                      budget=budget)
    res = await s.arun("q")
    per_call = 10 * 1.0 + 7 * 5.0 + 2000 * 0.1 + 200 * 1.25 + 100 * 2.0
    for c in res.candidates:
        assert c.usage.cost == pytest.approx(per_call)
        assert c.usage.cache_write_1h_tokens == 100
    assert res.usage.cache_write_1h_tokens == 100 * len(res.candidates)


def test_1h_writes_default_to_the_write_price_then_the_input_price() -> None:
    b = Budget(price_per_input_token=1.0, price_per_cache_write_token=1.25)
    assert b.price(2310, 0, 2000, 300, 100) == pytest.approx(10 + 2000 + 300 * 1.25)
    only_1h = Budget(price_per_input_token=1.0, price_per_cache_write_1h_token=2.0)
    assert only_1h.price(2310, 0, 2000, 300, 100) == pytest.approx(10 + 2000 + 200 + 200)


def test_the_1h_price_round_trips_and_is_checked() -> None:
    b = Budget(max_cost=1.0, price_per_cache_write_1h_token=2.0)
    assert b.to_dict()["price_per_cache_write_1h_token"] == 2.0
    assert Budget.from_dict(b.to_dict()) == b
    assert "price_per_cache_write_1h_token" not in Budget(max_cost=1.0).to_dict()
    with pytest.raises(beacon.ConfigError, match="price_per_cache_write_1h_token"):
        Budget(price_per_cache_write_1h_token=-1.0)


def test_a_generation_1h_count_must_be_part_of_its_writes() -> None:
    with pytest.raises(beacon.ConfigError, match=r"Generation\.cache_write_tokens"):
        Generation("a", input_tokens=500, cache_write_tokens=100, cache_write_1h_tokens=200)
    with pytest.raises(beacon.ConfigError, match=r"Generation\.cache_write_1h_tokens"):
        Generation("a", input_tokens=500, cache_write_tokens=100, cache_write_1h_tokens=-1)
