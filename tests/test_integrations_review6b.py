"""Review of the adapters' token counters: a batched judge returning a generator keeps its
spend, a call that fails after its LLM answered has that spend counted (retried or not),
and a LangChain chain whose last step builds a message with its own usage after an LLM call
the callbacks saw counts both."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.messages import AIMessage
from langchain_core.output_parsers import JsonOutputParser, StrOutputParser
from langchain_core.runnables import RunnableLambda
from llama_index.core.evaluation import BaseEvaluator, EvaluationResult
from test_integrations_audit6 import (
    JUDGE_PROMPT,
    JUDGE_USAGE,
    MODEL_USAGE,
    PROMPT,
    UsageChat,
    _judge,
    _model,
    _run,
)
from test_llama_audit6 import Q, UsageLLM, spent, varied

from beacon import BeaconConfig
from beacon.engine import BatchScorer
from beacon_integrations.llama_index import BeaconQueryEngine

BATCH_CFG = BeaconConfig(cost=1e-4, horizon=4, family="normal", batch_size=2)
FAIL_CFG = BeaconConfig(cost=1e-4, horizon=6, family="normal", max_failures=10)


@pytest.mark.parametrize("shape", ["list", "generator", "map"])
def test_a_batched_langchain_judge_returning_any_iterable_keeps_its_spend(shape: str) -> None:
    """Only a list, tuple or array got the judge's tokens; a generator or map (which the
    engine reads) lost them, and the caps ignored the judge."""
    judge = _judge()

    async def score_many(prompt: Any, responses: list[str]) -> Any:
        await judge.ainvoke(f"rate {responses}")
        vals = [0.1 * len(r) for r in responses]
        return {"list": vals, "generator": (v for v in vals), "map": map(float, vals)}[shape]

    res = _run(_model(), scorer=BatchScorer(score_many), config=BATCH_CFG, _dict=False)
    assert res.n_failed == 0
    assert res.usage.score_input_tokens == JUDGE_USAGE["input_tokens"] * judge._calls > 0


def test_a_batched_llamaindex_judge_returning_a_generator_keeps_its_spend() -> None:
    judge = UsageLLM()

    async def score_many(q: str, responses: list[str]) -> Any:
        await judge.acomplete(f"rate {responses}")
        return (varied(q, r) for r in responses)

    res = asyncio.run(BeaconQueryEngine(BatchScorer(score_many), BATCH_CFG,
                                        llm=UsageLLM()).arun(Q))
    assert res.n_failed == 0 and judge.calls
    assert res.usage.score_input_tokens == spent(judge)[0]


def test_a_langchain_judge_whose_parser_fails_after_its_llm_answered_is_counted() -> None:
    """The judge answered (and was paid), then its JSON parser failed: that attempt's tokens
    were lost (600 of 1000 counted)."""
    judge = UsageChat(answers=['{"score": 0.5}', "I think it is good"], usage=JUDGE_USAGE)
    chain = JUDGE_PROMPT | judge | JsonOutputParser() | RunnableLambda(lambda d: d["score"])
    res = _run(_model(), scorer=chain, config=FAIL_CFG, _dict=False)
    assert res.usage.failed_calls > 0  # the parse failures
    assert res.usage.score_input_tokens == JUDGE_USAGE["input_tokens"] * judge._calls
    assert res.usage.score_calls == judge._calls


def test_a_langchain_model_chain_whose_parser_fails_is_counted_as_model_tokens() -> None:
    """A model chain whose parser fails after the LLM answered: the query's model tokens
    include the failed attempts' (they were paid), not only the answered ones'."""
    model = _model()
    replies = iter(["not json", '{"a": 1}'] * 50)
    chain = PROMPT | model | RunnableLambda(lambda m: next(replies)) | JsonOutputParser()
    res = _run(chain, config=FAIL_CFG)
    assert res.usage.failed_calls > 0 and res.usage.model_calls == model._calls
    assert res.usage.input_tokens == MODEL_USAGE["input_tokens"] * model._calls
    assert res.usage.output_tokens == MODEL_USAGE["output_tokens"] * model._calls


def test_a_message_built_after_a_seen_llm_call_is_counted_too() -> None:
    """``prompt | rewriter | StrOutputParser() | provider_sdk``: the callbacks saw the
    rewriter; the last step's own message (500 input tokens) was dropped (60 of 3060)."""
    rewriter = UsageChat(answers=["rewritten q"],
                         usage={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12})

    async def provider_sdk(q: str) -> AIMessage:
        return AIMessage(content=f"x{len(q)}", usage_metadata={
            "input_tokens": 500, "output_tokens": 50, "total_tokens": 550})

    res = _run(PROMPT | rewriter | StrOutputParser() | RunnableLambda(provider_sdk))
    assert res.usage.model_calls > 0
    assert res.usage.input_tokens == 510 * res.usage.model_calls
    assert res.usage.output_tokens == 52 * res.usage.model_calls


class _FlakyJudge(BaseEvaluator):
    """An LLM judge whose every other reply has no score (an unparseable verdict)."""

    def __init__(self, llm: UsageLLM) -> None:
        self._llm = llm
        self.n = 0

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        return None

    async def aevaluate(self, query: Any = None, response: Any = None, contexts: Any = None,
                        **kw: Any) -> EvaluationResult:
        await self._llm.acomplete(f"judge {response}")
        self.n += 1
        bad = bool(self.n % 2)
        return EvaluationResult(query=query, response=response, score=None if bad else 1.0,
                                invalid_result=bad, invalid_reason="unparseable reply")


def test_a_llamaindex_evaluator_without_a_score_has_its_judge_call_counted() -> None:
    judge_llm = UsageLLM()
    res = asyncio.run(BeaconQueryEngine(_FlakyJudge(judge_llm), FAIL_CFG,
                                        llm=UsageLLM()).arun(Q))
    assert len(judge_llm.calls) > len([c for c in res.candidates if not c.failed])
    assert res.usage.score_input_tokens == spent(judge_llm)[0]
