"""Review of the judge-spend change: a judge's spend is counted on the samples it fails
(CorrectnessAdjusted), and a batched LangChain judge callable returning messages with
``usage_metadata`` is counted as a one-at-a-time one is."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

import beacon
from beacon.engine import BeaconSampler, Generation
from beacon.retry import RetryPolicy
from beacon_integrations.scorers.verify import CorrectnessAdjusted

CFG = beacon.BeaconConfig(cost=1e-6, horizon=4, family="normal")
SPEND = {"input_tokens": 100, "output_tokens": 5, "cost": 0.25}


async def _gen(prompt: Any) -> Generation:
    return Generation("an answer", 10, 2)


async def _judge_invalid(prompt: Any, text: str) -> beacon.Score:
    return beacon.Score("n/a", **SPEND)


async def _judge_ok(prompt: Any, text: str) -> beacon.Score:
    return beacon.Score(0.5, **SPEND)


async def _judge_many(prompt: Any, texts: list[str]) -> list[beacon.Score]:
    return [beacon.Score(0.5, **SPEND) for _ in texts]


_judge_many.batched = True  # type: ignore[attr-defined]


def _broken_verifier(prompt: Any, text: str) -> bool:
    raise RuntimeError("verifier down")


@pytest.mark.parametrize(("scorer", "error"), [
    (CorrectnessAdjusted(_judge_invalid, lambda p, t: True), "invalid learned reward"),
    (CorrectnessAdjusted(_judge_ok, _broken_verifier), "verifier down"),
    (CorrectnessAdjusted(_judge_many, _broken_verifier), "verifier down"),
])
def test_a_judges_spend_is_counted_on_the_samples_it_fails(scorer: Any, error: str) -> None:
    """The wrapper dropped the judge's Score when the learned reward was invalid or the
    verifier raised: the samples failed with no score tokens or money counted, so max_cost
    and max_tokens never saw a paid judge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = asyncio.run(BeaconSampler(_gen, scorer, CFG, retry=RetryPolicy.none()).arun("q"))
    assert res.candidates and all(c.failed and error in (c.error or "") for c in res.candidates)
    n = len(res.candidates)
    assert res.usage.score_input_tokens == n * SPEND["input_tokens"]
    assert res.usage.score_output_tokens == n * SPEND["output_tokens"]
    assert res.usage.score_cost == pytest.approx(n * SPEND["cost"])
    # a failing verifier does not make the engine pay the judge again
    assert res.usage.retries == 0


def test_a_batched_langchain_judge_callable_counts_its_messages_usage() -> None:
    """One at a time, a judge returning AIMessages with usage_metadata was counted; declared
    batched, none of its tokens were."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    from beacon_integrations.langchain import BeaconRunnable

    usage = {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}
    model = RunnableLambda(lambda x: AIMessage(
        content="answer", usage_metadata={"input_tokens": 10, "output_tokens": 2,
                                          "total_tokens": 12}))

    def judge(prompt: Any, response: Any) -> AIMessage:
        return AIMessage(content="0.5", usage_metadata=usage)

    def judge_many(prompt: Any, responses: Any) -> list[AIMessage]:
        return [judge(prompt, r) for r in responses]

    judge_many.batched = True  # type: ignore[attr-defined]
    got = []
    for scorer in (judge, judge_many):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = BeaconRunnable(model=model, scorer=scorer, config=CFG,
                                 return_result=True).invoke("q")
        assert res.usage.score_input_tokens == 100 * len(res.candidates), scorer
        assert res.usage.score_output_tokens == 5 * len(res.candidates), scorer
        got.append(len(res.candidates))
    assert all(n >= 3 for n in got)
