"""LlamaIndex adapter audit (6): the tokens of every LLM call made under a model or scorer call.

An inner query engine's LLM calls (synthesizer, refine steps, a streamed answer, a BEACON
query transform inside it) and a LlamaIndex evaluator's or judge's calls are counted through
LlamaIndex's instrumentation, each provider call once. LlamaIndex's own classes (``CustomLLM``,
a ``VectorStoreIndex`` over in-memory documents with ``MockEmbedding``); no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.evaluation import BaseEvaluator, EvaluationResult, FaithfulnessEvaluator
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.query_engine import CustomQueryEngine, TransformQueryEngine
from pydantic import PrivateAttr
from test_llama_index import DOCS, make_index

from beacon import BeaconConfig, Budget, Score
from beacon.budget import BudgetNotEnforcedWarning
from beacon.engine import BatchScorer
from beacon_integrations.llama_index import BeaconQueryEngine, BeaconQueryTransform

Q = "What is the capital of France?"
# a tiny cost and varied rewards: BEACON samples to the horizon unless a budget stops it
CFG = BeaconConfig(cost=1e-4, horizon=4, family="normal")


class UsageLLM(CustomLLM):
    """LLM answering ``ans0``, ``ans1``... in call order, reporting each call's usage as a
    provider does: in ``raw["usage"]`` (OpenAI's names) or, ``in_kwargs``, in
    ``additional_kwargs`` (LlamaIndex's OpenAI LLM's way). Input tokens depend on the prompt,
    so that calls differ. ``chat_model``: a chat model (``CustomLLM.achat`` runs ``chat``,
    which runs ``complete``: three end events for one call). Streamed answers report their
    usage on the last chunk only. ``calls`` holds ``(text, input, output)`` of every call."""

    chat_model: bool = False
    in_kwargs: bool = False
    _calls: list[tuple[str, int, int]] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="usage", is_chat_model=self.chat_model)

    @property
    def calls(self) -> list[tuple[str, int, int]]:
        return self._calls

    def _next(self, prompt: str) -> tuple[str, int, int]:
        i = len(self._calls)
        call = (f"ans{i}", 100 + len(prompt) % 97 + 10 * i, 3 + i)
        self._calls.append(call)
        return call

    def _response(self, text: str, it: int, ot: int, delta: str | None = None) -> Any:
        if self.in_kwargs:
            extra = {"prompt_tokens": it, "completion_tokens": ot}
            return CompletionResponse(text=text, delta=delta, additional_kwargs=extra)
        usage = {"prompt_tokens": it, "completion_tokens": ot, "total_tokens": it + ot}
        return CompletionResponse(text=text, delta=delta, raw={"usage": usage})

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        return self._response(*self._next(prompt))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> Iterator[CompletionResponse]:
        text, it, ot = self._next(prompt)
        yield CompletionResponse(text=text[:2], delta=text[:2])  # no usage before the end
        yield self._response(text, it, ot, delta=text[2:])


class SlowLLM(UsageLLM):
    """A :class:`UsageLLM` whose async calls wait a while first, so that concurrent samples'
    calls interleave (their events fire while other samples' calls are in flight)."""

    _started: int = PrivateAttr(default=0)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        n = self._started
        self._started += 1
        await asyncio.sleep(0.002 * ((n * 7) % 5))
        return self.complete(prompt, formatted=formatted)


def spent(llm: UsageLLM) -> tuple[int, int]:
    """The input and output tokens ``llm`` reported over all its calls."""
    return sum(c[1] for c in llm.calls), sum(c[2] for c in llm.calls)


def varied(q: str, r: str) -> float:
    """A reward that differs from answer to answer (``ansN``)."""
    return float(int(r.strip()[3:]) % 3)


# -- query-engine mode --------------------------------------------------------------------------


def test_engine_mode_counts_every_llm_call_of_the_inner_engine() -> None:
    # was: the sample's Generation carried no tokens (usage None), whatever the engine spent
    llm = UsageLLM()
    inner = make_index().as_query_engine(llm=llm, similarity_top_k=3, response_mode="refine")
    res = asyncio.run(BeaconQueryEngine(varied, CFG, query_engine=inner).arun(Q))
    assert res.n_samples >= 2 and res.n_failed == 0
    assert len(llm.calls) == len(DOCS) * res.n_samples  # refine: one call per retrieved node
    assert (res.usage.input_tokens, res.usage.output_tokens) == spent(llm)
    assert res.budget_unenforced == []


def test_engine_mode_concurrent_samples_are_each_counted_their_own_calls() -> None:
    llm = SlowLLM()
    inner = make_index().as_query_engine(llm=llm, similarity_top_k=1)
    res = asyncio.run(BeaconQueryEngine(varied, CFG, query_engine=inner).arun(Q))
    assert len(llm.calls) == res.n_samples >= 2
    by_text = {text: (it, ot) for text, it, ot in llm.calls}
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == by_text[c.text]


def test_engine_mode_max_tokens_budget_stops_the_query() -> None:
    # was: max_tokens listed in budget_unenforced, a BudgetNotEnforcedWarning, the query ran
    # to its horizon
    llm = UsageLLM()
    inner = make_index().as_query_engine(llm=llm, similarity_top_k=1)
    cfg = BeaconConfig(cost=1e-4, horizon=12, family="normal")
    qe = BeaconQueryEngine(varied, cfg, query_engine=inner, max_concurrency=1,
                           budget=Budget(max_tokens=300))
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotEnforcedWarning)
        resp = qe.query(Q)
    md = resp.metadata or {}
    assert md["stop_reason"] == "budget"
    assert 0 < md["n_samples"] < cfg.horizon
    used = md["usage"]
    assert (used["input_tokens"], used["output_tokens"]) == spent(llm)
    assert used["input_tokens"] + used["output_tokens"] >= 300


@pytest.mark.parametrize("chat_model", [False, True])
def test_streaming_inner_engine_counts_each_streamed_call_once(chat_model: bool) -> None:
    # a streamed CustomLLM call fires an end event per layer (astream_chat, stream_chat,
    # stream_complete) with the same usage: one call
    llm = UsageLLM(chat_model=chat_model)
    inner = make_index().as_query_engine(llm=llm, similarity_top_k=1, streaming=True)
    res = asyncio.run(BeaconQueryEngine(varied, CFG, query_engine=inner).arun(Q))
    assert len(llm.calls) == res.n_samples >= 2
    assert (res.usage.input_tokens, res.usage.output_tokens) == spent(llm)


def test_llm_call_in_a_thread_that_copies_the_context_is_counted() -> None:
    class ThreadedEngine(CustomQueryEngine):
        llm: Any

        def custom_query(self, query_str: str) -> str:
            return str(self.llm.complete(query_str).text)

        async def acustom_query(self, query_str: str) -> str:
            return await asyncio.to_thread(self.custom_query, query_str)  # copies contextvars

    llm = UsageLLM()
    res = asyncio.run(BeaconQueryEngine(varied, CFG, query_engine=ThreadedEngine(llm=llm)).arun(Q))
    assert len(llm.calls) == res.n_samples
    assert (res.usage.input_tokens, res.usage.output_tokens) == spent(llm)


def test_beacon_transform_inside_the_inner_engine_is_counted_in_the_outer_sample() -> None:
    rewriter, answerer = UsageLLM(), UsageLLM()
    transform = BeaconQueryTransform(rewriter, lambda q, r: float(len(r) % 5),
                                     BeaconConfig(cost=1e-4, horizon=4, family="normal"))
    inner = TransformQueryEngine(
        make_index().as_query_engine(llm=answerer, similarity_top_k=1), transform
    )
    res = asyncio.run(BeaconQueryEngine(varied, CFG, query_engine=inner).arun(Q))
    assert len(answerer.calls) == res.n_samples >= 2
    assert len(rewriter.calls) >= 3 * res.n_samples  # each transform run: k0 = 3 rewrites
    it_r, ot_r = spent(rewriter)
    it_a, ot_a = spent(answerer)
    assert (res.usage.input_tokens, res.usage.output_tokens) == (it_r + it_a, ot_r + ot_a)
    last = transform.last_result
    assert last is not None and last.usage.input_tokens is not None
    assert 0 < last.usage.input_tokens < it_r  # the transform counts its own query's calls


# -- LLM mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("in_kwargs", [False, True])
def test_llm_mode_chat_model_is_counted_once_per_sample(in_kwargs: bool) -> None:
    # CustomLLM.achat runs chat, which runs complete: three end events for one call. A chat
    # model's usage in additional_kwargs was lost (chat puts the completion's on the message)
    llm = UsageLLM(chat_model=True, in_kwargs=in_kwargs)
    res = asyncio.run(BeaconQueryEngine(varied, CFG, llm=llm).arun(Q))
    assert len(llm.calls) == res.n_samples >= 2
    by_text = {text: (it, ot) for text, it, ot in llm.calls}
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == by_text[c.text]


# -- scorers ------------------------------------------------------------------------------------


class JudgeEvaluator(BaseEvaluator):
    """An LLM judge: one call of ``judge`` per evaluation (async, or blocking ``evaluate``)."""

    def __init__(self, judge: UsageLLM) -> None:
        self.judge = judge

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    async def aevaluate(self, query: str | None = None, response: str | None = None,
                        contexts: Any = None, **kwargs: Any) -> EvaluationResult:
        verdict = await self.judge.acomplete(f"Rate {response!r} for {query!r}")
        return EvaluationResult(query=query, response=response, score=varied("", verdict.text))


def test_evaluator_judge_tokens_count_as_the_scorers() -> None:
    # was: a LlamaIndex evaluator's LLM calls were never counted (score tokens None)
    llm, judge = UsageLLM(), UsageLLM()
    res = asyncio.run(BeaconQueryEngine(JudgeEvaluator(judge), CFG, llm=llm).arun(Q))
    assert len(judge.calls) == res.n_samples >= 2
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == spent(judge)
    assert (res.usage.input_tokens, res.usage.output_tokens) == spent(llm)


def test_faithfulness_evaluator_tokens_are_counted() -> None:
    judge = UsageLLM()
    inner = make_index().as_query_engine(llm=UsageLLM(), similarity_top_k=2)
    cfg = BeaconConfig(cost=0.02, horizon=3, family="bernoulli")
    res = asyncio.run(
        BeaconQueryEngine(FaithfulnessEvaluator(llm=judge), cfg, query_engine=inner).arun(Q)
    )
    assert res.n_failed == 0 and judge.calls
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == spent(judge)


def test_blocking_evaluator_run_in_a_thread_is_counted() -> None:
    class BlockingJudge:
        def __init__(self, judge: UsageLLM) -> None:
            self.judge = judge

        def evaluate(self, query: str, response: str, **kwargs: Any) -> EvaluationResult:
            verdict = self.judge.complete(f"Rate {response!r}")
            return EvaluationResult(score=varied("", verdict.text))

    judge = UsageLLM()
    res = asyncio.run(BeaconQueryEngine(BlockingJudge(judge), CFG, llm=UsageLLM()).arun(Q))
    assert len(judge.calls) == res.n_samples
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == spent(judge)


def test_batched_judge_tokens_go_on_the_batch() -> None:
    judge = UsageLLM()

    async def judge_batch(q: str, texts: list[str]) -> list[float]:
        await judge.acomplete(f"Rate each of {texts!r}")  # one call for the whole batch
        return [varied(q, t) for t in texts]

    cfg = BeaconConfig(cost=1e-4, horizon=4, family="normal", batch_size=2)
    res = asyncio.run(BeaconQueryEngine(BatchScorer(judge_batch), cfg, llm=UsageLLM()).arun(Q))
    assert res.n_samples == 4 and judge.calls
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == spent(judge)


def test_a_score_reporting_its_own_spend_is_taken_as_it_is() -> None:
    judge = UsageLLM()

    async def scorer(q: str, r: str) -> Score:
        await judge.acomplete(f"Rate {r!r}")
        return Score(varied(q, r), input_tokens=7, output_tokens=1)  # its own accounting

    res = asyncio.run(BeaconQueryEngine(scorer, CFG, llm=UsageLLM()).arun(Q))
    assert res.usage.score_input_tokens == 7 * res.n_samples
    assert res.usage.score_output_tokens == res.n_samples


# -- the handlers' registration -----------------------------------------------------------------


def test_handlers_are_put_on_the_root_dispatcher_once_when_an_adapter_is_built() -> None:
    code = textwrap.dedent(
        """
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.llms import MockLLM
        import beacon_integrations.llama_index as bli

        root = get_dispatcher()

        def ours():
            names = [type(h).__name__ for h in [*root.event_handlers, *root.span_handlers]]
            return [n for n in names if n.startswith("_BeaconToken")]

        def score(q, r):
            return 1.0

        print(len(ours()))  # importing the adapter registers nothing
        bli.BeaconQueryEngine(score, llm=MockLLM())
        print(len(ours()))
        bli.BeaconQueryTransform(MockLLM(), score)
        print(len(ours()))
        root.event_handlers = []  # code that resets the root's handlers
        root.span_handlers = []
        bli.BeaconQueryEngine(score, llm=MockLLM())
        print(len(ours()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["0", "2", "2", "2"]
