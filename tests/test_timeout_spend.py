"""A call cut by its per-attempt timeout after some of its LLM calls answered keeps their spend:
the adapters put it on the cancellation, the engine carries it to the TimeoutError it raises
and counts it for the failed attempt (as for any failed call, beacon/engine/calls.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.runnables import RunnableLambda
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.query_engine import CustomQueryEngine
from test_lc_nested_usage import INNER, _leaf

import beacon
from beacon.engine import BeaconSampler
from beacon.engine.calls import SPEND_ATTR
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable
from beacon_integrations.llama_index import BeaconQueryEngine

CFG = beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=10)


def _length(prompt: Any, text: str) -> float:
    return 0.1 * len(text)


async def test_the_engine_counts_the_spend_on_a_timed_out_calls_cancellation() -> None:
    async def model(prompt: Any) -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            # what an adapter does: the call's LLM calls so far had reported this
            setattr(exc, SPEND_ATTR, beacon.Score(None, 100, 5))
            raise
        return "never"

    res = await BeaconSampler(
        model, _length, CFG, timeout=0.05, retry=RetryPolicy(max_attempts=2, base_delay=0)
    ).arun("q")
    assert res.n_samples == 0 and res.usage.model_calls == res.usage.failed_calls > 0
    attempts = res.usage.model_calls
    assert res.usage.input_tokens == 100 * attempts and res.usage.output_tokens == 5 * attempts
    assert all("timed out" in (c.error or "") for c in res.candidates)


async def _stall(text: Any) -> str:
    await asyncio.sleep(10)
    return str(text)


async def test_a_langchain_chain_timed_out_after_its_llm_answered_keeps_the_tokens() -> None:
    chain = _leaf() | RunnableLambda(_stall)
    r = BeaconRunnable(
        model=chain, scorer=_length, config=CFG, return_result=True, timeout=0.2,
        retry=RetryPolicy.none(),
    )
    res = await r.ainvoke("q")
    calls = res.usage.model_calls
    assert calls > 0 and res.usage.failed_calls == calls and res.n_samples == 0
    assert res.usage.input_tokens == INNER["input_tokens"] * calls
    assert res.usage.output_tokens == INNER["output_tokens"] * calls


class SlowSecondCall(CustomLLM):
    """Answers its odd calls at once (reporting 100 + 10 tokens) and stalls on its even ones."""

    calls: int = 0

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
        raise NotImplementedError

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kw: Any
    ) -> CompletionResponse:
        self.calls += 1
        if self.calls % 2 == 0:
            await asyncio.sleep(10)
        return CompletionResponse(
            text="8 minutes", additional_kwargs={"prompt_tokens": 100, "completion_tokens": 10}
        )

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kw: Any) -> Any:
        raise NotImplementedError


class TwoSteps(CustomQueryEngine):
    llm: SlowSecondCall

    def custom_query(self, query_str: str) -> str:
        raise NotImplementedError

    async def acustom_query(self, query_str: str) -> str:
        await self.llm.acomplete("draft")
        return str(await self.llm.acomplete("refine"))


async def test_a_llamaindex_engine_timed_out_on_its_second_call_keeps_the_first() -> None:
    llm = SlowSecondCall()
    eng = BeaconQueryEngine(
        _length, CFG, query_engine=TwoSteps(llm=llm), timeout=0.2, retry=RetryPolicy.none()
    )
    res = await eng.arun("q")
    samples = res.usage.model_calls
    # each sample timed out on its second call (or, the failure cap reached, was cancelled)
    assert samples > 0 and res.usage.failed_calls + res.usage.cancelled == samples
    answered = (llm.calls + 1) // 2  # each sample's first call answers at once
    assert answered == samples and res.n_samples == 0
    assert res.usage.input_tokens == 100 * answered and res.usage.output_tokens == 10 * answered


# -- review findings: nested BEACON, a query's deadline, a client swallowing its cancellation --
async def test_nested_beacon_cut_by_the_outer_timeout_counts_all_the_inner_calls() -> None:
    made = {"calls": 0}

    async def stall_from_the_fourth(text: Any) -> str:
        made["calls"] += 1
        if made["calls"] >= 4:  # the inner query's 4th sample stalls after its LLM answered
            await asyncio.sleep(10)
        return str(text)

    inner = BeaconRunnable(
        model=_leaf() | RunnableLambda(stall_from_the_fourth), scorer=_length,
        config=beacon.BeaconConfig(cost=0.0001, horizon=10, max_failures=10),
        retry=RetryPolicy.none(),
    )
    outer = BeaconRunnable(
        model=inner, scorer=_length, config=beacon.BeaconConfig(cost=0.5, horizon=4),
        return_result=True, timeout=0.5, max_concurrency=1, retry=RetryPolicy.none(),
    )
    res = await outer.ainvoke("q")
    assert res.usage.failed_calls >= 1 and made["calls"] >= 4
    # every inner LLM call answered (the stalled step comes after it): all were paid
    assert res.usage.input_tokens == INNER["input_tokens"] * made["calls"]


async def test_a_sample_cut_by_the_querys_deadline_keeps_its_finished_llm_calls() -> None:
    llm = SlowSecondCall()
    eng = BeaconQueryEngine(
        _length, CFG, query_engine=TwoSteps(llm=llm), budget=beacon.Budget(max_seconds=0.3),
        retry=RetryPolicy.none(),
    )
    res = await eng.arun("q")
    answered = (llm.calls + 1) // 2  # each sample's first call answers, its second stalls
    assert res.stop_reason == "budget" and res.usage.cancelled > 0 and answered > 0
    assert res.usage.input_tokens == 100 * answered and res.usage.output_tokens == 10 * answered


async def test_a_late_answer_after_a_swallowed_timeout_is_counted() -> None:
    async def model(prompt: Any) -> beacon.Generation:
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:  # an SDK retry loop that swallows the cancellation
            await asyncio.sleep(0.02)
        return beacon.Generation("late", input_tokens=100, output_tokens=5)

    res = await BeaconSampler(
        model, _length, beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=0),
        timeout=0.05, retry=RetryPolicy.none(),
    ).arun("q")
    calls = res.usage.model_calls
    assert calls > 0 and res.usage.failed_calls == calls and res.n_samples == 0
    assert res.usage.input_tokens == 100 * calls and res.usage.output_tokens == 5 * calls
