"""A chat model wrapping another chat model is counted once (LangChain token tap).

A wrapper chat model (router or fallback style) whose ``_generate`` / ``_agenerate`` calls an
inner chat model made two LLM runs that both ended with usage: the inner call's and the
wrapper's (a copy of it), so the sample's or the judge's tokens, and the cost and budget built on
them, were doubled. Now each real call is counted once: an LLM run whose usage is counted covers
the LLM runs it is nested in; a wrapper reporting usage with no counted call beneath it (a plain
model) still counts. A wrapper nests its inner call either under its own run (callbacks built as
a child of its run manager: ``parent_run_id`` is the wrapper's run, maybe through chains) or by
calling ``inner.invoke(messages)`` with no config (the inner run's parent is the wrapper's
parent, in a chain: it started inside the wrapper's run in the same context); both are tested.

LangChain's own chat model base class with tiny subclasses (no network).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import PrivateAttr

from beacon import BeaconConfig
from beacon.budget import BudgetNotEnforcedWarning
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable

CFG = BeaconConfig(cost=0.0001, horizon=5, family="normal")
ANSWERS = ["a", "bb", "ccc", "dd", "e"]
INNER = {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}
CLASSIFY = {"input_tokens": 11, "output_tokens": 1, "total_tokens": 12}
OWN = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
JUDGE = {"input_tokens": 200, "output_tokens": 3, "total_tokens": 203}

PROMPT = ChatPromptTemplate.from_messages([("human", "Answer: {question}")])
JUDGE_PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Rate the answer {response} to {prompt} from 0 to 1.")]
)


class Leaf(BaseChatModel):
    """A provider call: answers from ``answers`` in call order, each ``AIMessage`` reporting
    ``usage`` (``None``: none) as ``usage_metadata``."""

    answers: list[str]
    usage: dict[str, int] | None
    _calls: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "leaf"

    def _answer(self) -> ChatResult:
        text = self.answers[self._calls % len(self.answers)]
        self._calls += 1
        usage = dict(self.usage) if self.usage is not None else None
        msg = AIMessage(content=text, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return self._answer()

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return self._answer()


def _child(run_manager: Any, manager: type[Any]) -> Any:
    """Callbacks for a run nested in the LLM run of ``run_manager``, as a chain's run manager
    builds them (``get_child``, which an LLM run manager lacks)."""
    child = manager(handlers=[], parent_run_id=run_manager.run_id)
    child.set_handlers(run_manager.inheritable_handlers)
    child.add_tags(run_manager.inheritable_tags)
    child.add_metadata(run_manager.inheritable_metadata)
    return child


class SyncWrapper(BaseChatModel):
    """A chat model that answers by calling ``inner`` (any runnable returning a message),
    synchronously (LangChain runs it in a thread for ``ainvoke``).

    ``nest``: ``"tree"`` calls it as a child run of its own, ``"context"`` with no config.
    ``report``: what its own message reports as usage: ``"copy"`` the inner message's,
    ``"none"`` nothing, ``"own"`` the fixed :data:`OWN`. ``classify``: a model called first
    (a router's choice), nested the same way."""

    inner: Runnable[Any, Any]
    nest: str = "tree"
    report: str = "copy"
    classify: Runnable[Any, Any] | None = None

    @property
    def _llm_type(self) -> str:
        return "wrapper"

    def _config(self, run_manager: Any, manager: type[Any]) -> RunnableConfig | None:
        """The inner call's config: a child of this run (``"tree"``), or none."""
        if self.nest != "tree":
            return None
        return RunnableConfig(callbacks=_child(run_manager, manager))

    def _result(self, msg: AIMessage) -> ChatResult:
        usage = {"copy": msg.usage_metadata, "none": None, "own": dict(OWN)}[self.report]
        out = AIMessage(content=msg.content, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=out)])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        config = self._config(run_manager, CallbackManager)
        if self.classify is not None:
            self.classify.invoke(messages, config=config)
        return self._result(self.inner.invoke(messages, config=config))


class AsyncWrapper(SyncWrapper):
    """:class:`SyncWrapper` with a native ``_agenerate`` calling ``inner.ainvoke``."""

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        config = self._config(run_manager, AsyncCallbackManager)
        if self.classify is not None:
            await self.classify.ainvoke(messages, config=config)
        return self._result(await self.inner.ainvoke(messages, config=config))


def _wrapper(kind: str, inner: Any, **kw: Any) -> SyncWrapper:
    """A wrapper of ``kind`` (``"sync-tree"``, ``"async-context"``, ...) over ``inner``."""
    mode, nest = kind.split("-")
    return (SyncWrapper if mode == "sync" else AsyncWrapper)(inner=inner, nest=nest, **kw)


WRAPPERS = ["sync-tree", "async-tree", "sync-context", "async-context"]


class BrokenStream(BaseChatModel):
    """A streaming provider call that fails after its usage chunk arrived (a paid call that
    then broke), so that a fallback answers instead."""

    streaming: bool = True

    @property
    def _llm_type(self) -> str:
        return "broken-stream"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        raise AssertionError("only streamed")

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        chunk = AIMessageChunk(content="par", usage_metadata=dict(INNER))  # type: ignore[arg-type]
        yield ChatGenerationChunk(message=chunk)
        raise ConnectionError("stream cut")


def _leaf(usage: dict[str, int] | None = INNER, answers: list[str] = ANSWERS) -> Leaf:
    return Leaf(answers=answers, usage=usage)


def _length(prompt: str, response: str) -> float:
    return 0.1 * len(response)


def _runnable(model: Any, scorer: Any = _length) -> BeaconRunnable[BeaconResult]:
    return BeaconRunnable(
        model=model, scorer=scorer, config=CFG, return_result=True, retry=RetryPolicy.none()
    )


def _run(model: Any, scorer: Any = _length, value: Any = "q") -> BeaconResult:
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotEnforcedWarning)
        return _runnable(model, scorer).invoke(value)


def _arun(model: Any, scorer: Any = _length, value: Any = "q") -> BeaconResult:
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotEnforcedWarning)
        return asyncio.run(_runnable(model, scorer).ainvoke(value))


def _each_sample(res: BeaconResult, usage: dict[str, int]) -> None:
    """Every sample (none failed) counted ``usage`` once, and the run their sum."""
    n = len(res.candidates)
    assert n > 0 and not any(c.failed for c in res.candidates), res.candidates
    want = (usage["input_tokens"], usage["output_tokens"])
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == want
    assert (res.usage.input_tokens, res.usage.output_tokens) == (want[0] * n, want[1] * n)


def _sum(*usages: dict[str, int]) -> dict[str, int]:
    return {k: sum(u[k] for u in usages) for k in ("input_tokens", "output_tokens")}


# -- a wrapper as the model ----------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("run", [_run, _arun])
def test_a_wrapper_copying_its_inner_usage_is_counted_once(wrapper: str, run: Any) -> None:
    # Was: (60, 14) a sample: the inner call's and the wrapper's copy of it.
    _each_sample(run(_wrapper(wrapper, _leaf())), INNER)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_in_a_parser_chain_is_counted_once(wrapper: str) -> None:
    res = _run(PROMPT | _wrapper(wrapper, _leaf()) | StrOutputParser(), value={"question": "q"})
    _each_sample(res, INNER)
    assert {c.text for c in res.candidates} <= set(ANSWERS)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_chain_between_the_wrapper_and_its_inner_model_still_nests(wrapper: str) -> None:
    # the inner run's parent is a chain whose parent is the wrapper's run
    inner = RunnableLambda(lambda m: m, name="preprocess") | _leaf()
    _each_sample(
        _arun(PROMPT | _wrapper(wrapper, inner) | StrOutputParser(), value={"question": "q"}), INNER
    )


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_router_counts_each_inner_call_once_and_not_its_own_total(wrapper: str) -> None:
    # a classifier call, then the chosen model: both paid; the wrapper's own figure (here
    # unrelated to them) is not added on top
    model = _wrapper(wrapper, _leaf(), classify=_leaf(CLASSIFY, ["route"]), report="own")
    _each_sample(_run(PROMPT | model, value={"question": "q"}), _sum(INNER, CLASSIFY))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_reporting_nothing_counts_its_inner_call(wrapper: str) -> None:
    _each_sample(
        _run(
            PROMPT | _wrapper(wrapper, _leaf(), report="none") | StrOutputParser(),
            value={"question": "q"},
        ),
        INNER,
    )


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_over_a_model_reporting_nothing_counts_its_own(wrapper: str) -> None:
    # no call beneath it reported usage: the wrapper's is the only figure there is
    _each_sample(
        _run(
            PROMPT | _wrapper(wrapper, _leaf(None), report="own") | StrOutputParser(),
            value={"question": "q"},
        ),
        OWN,
    )


@pytest.mark.parametrize("nest", ["tree", "context"])
def test_two_wrappers_deep_are_counted_once(nest: str) -> None:
    model = AsyncWrapper(inner=SyncWrapper(inner=_leaf(), nest=nest), nest=nest)
    _each_sample(_arun(PROMPT | model | StrOutputParser(), value={"question": "q"}), INNER)


def test_one_call_generating_several_inputs_counts_each() -> None:
    # ``generate`` over two message lists starts both LLM runs before either runs: the second
    # did not start inside the first, and both were paid
    leaf = _leaf()

    def twice(messages: Any, config: RunnableConfig) -> str:
        out = leaf.generate([messages.to_messages()] * 2, callbacks=config["callbacks"])
        return "".join(str(g[0].text) for g in out.generations)

    _each_sample(_run(PROMPT | RunnableLambda(twice), value={"question": "q"}), _sum(INNER, INNER))


# -- fallbacks ----------------------------------------------------------------------------------


def test_a_fallback_counts_the_call_that_answered_once() -> None:
    # the failed call reported nothing (``ainvoke`` drops a stream's chunks on an error)
    model = BrokenStream().with_fallbacks([_leaf()])
    _each_sample(_run(PROMPT | model | StrOutputParser(), value={"question": "q"}), INNER)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapper_over_fallbacks_counts_the_answer_once(wrapper: str) -> None:
    model = _wrapper(wrapper, BrokenStream().with_fallbacks([_leaf()]))
    _each_sample(_arun(PROMPT | model | StrOutputParser(), value={"question": "q"}), INNER)


def test_a_stream_cut_after_its_usage_arrived_is_spend() -> None:
    # a runnable streaming the model: the usage chunk came, then the stream broke. Its usage
    # reaches the callbacks only with the error (on_llm_error); the attempt failed, paid.
    # Was: not counted.
    broken = BrokenStream()

    async def streamed(messages: Any) -> str:
        return "".join([str(c.content) async for c in broken.astream(messages)])

    res = _arun(PROMPT | RunnableLambda(streamed), value={"question": "q"})
    n = len(res.candidates)
    assert n > 0 and all(c.failed and "stream cut" in (c.error or "") for c in res.candidates)
    assert (res.usage.input_tokens, res.usage.output_tokens) == (30 * n, 7 * n)


# -- a wrapper as the judge ---------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_wrapped_judge_is_counted_once(wrapper: str) -> None:
    judge = JUDGE_PROMPT | _wrapper(wrapper, _leaf(JUDGE, ["0.5"])) | StrOutputParser()
    res = _arun(_leaf(), scorer=judge)
    _each_sample(res, INNER)
    n = len(res.candidates)
    for c in res.candidates:
        assert c.reward == pytest.approx(0.5)
        assert (c.usage.score_input_tokens, c.usage.score_output_tokens) == (200, 3)
    assert res.usage.score_input_tokens == 200 * n


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_batched_judge_running_wrapped_calls_concurrently_counts_each_once(
    wrapper: str,
) -> None:
    # one tap sees the wrapped judge calls of a whole batch at once (abatch): each nests under
    # its own wrapper run, none under a sibling's
    chain = JUDGE_PROMPT | _wrapper(wrapper, _leaf(JUDGE, ["0.5"])) | StrOutputParser()

    async def judge_all(prompt: str, responses: list[str]) -> list[float]:
        outs = await chain.abatch([{"prompt": prompt, "response": r} for r in responses])
        return [float(o) for o in outs]

    judge_all.batched = True  # type: ignore[attr-defined]
    res = _arun(_leaf(), scorer=judge_all)
    n = len(res.candidates)
    assert n > 0 and not any(c.failed for c in res.candidates)
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == (200 * n, 3 * n)
