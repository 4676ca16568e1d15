"""Review findings on the LangChain tap's nesting rule (tests/test_lc_nested_usage.py has the
rule itself): an async chat model's end event runs in a copied context, so the tap must not rely
on it to put the in-progress run back; and a stream being read encloses no model the reader
calls between chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableLambda
from test_lc_nested_usage import INNER, PROMPT, _leaf, _run, _wrapper

from beacon.result import BeaconResult


def _per_sample(res: BeaconResult) -> set[tuple[int | None, int | None]]:
    assert res.candidates and not any(c.failed for c in res.candidates), res.candidates
    return {(c.usage.input_tokens, c.usage.output_tokens) for c in res.candidates}


@pytest.mark.parametrize("kind", ["async-context", "sync-context", "async-tree"])
@pytest.mark.parametrize("report", ["copy", "own"])
def test_a_router_whose_classifier_reports_nothing_counts_the_answer_once(
    kind: str, report: str
) -> None:
    # the classifier's run ends first (async: its end event in a copied context) and covers
    # nothing; the answer call must still be seen as nested in the wrapper
    w = _wrapper(kind, _leaf(), classify=_leaf(None, ["route"]), report=report)
    res = _run(PROMPT | w | StrOutputParser(), value={"question": "q"})
    assert _per_sample(res) == {(INNER["input_tokens"], INNER["output_tokens"])}


MAIN = {"input_tokens": 100, "output_tokens": 50, "total_tokens": 150}
GUARD = {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}


class StreamingModel(BaseChatModel):
    """Streams three chunks, the last with the call's usage (as OpenAI's stream_usage does)."""

    usage: dict[str, int]

    @property
    def _llm_type(self) -> str:
        return "streaming-model"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        msg = AIMessage(content="abc", usage_metadata=dict(self.usage))  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        yield ChatGenerationChunk(message=AIMessageChunk(content="a"))
        yield ChatGenerationChunk(message=AIMessageChunk(content="b"))
        last = AIMessageChunk(content="c", usage_metadata=dict(self.usage))  # type: ignore[arg-type]
        yield ChatGenerationChunk(message=last)

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._stream(messages):
            yield chunk


def test_a_model_called_while_reading_a_stream_is_not_nested_in_it() -> None:
    main, guard = StreamingModel(usage=MAIN), _leaf(GUARD, ["ok"])

    def read(messages: Any) -> str:
        out = []
        for chunk in main.stream(messages):
            out.append(str(chunk.content))
            if len(out) == 1:
                guard.invoke("is this safe? " + out[0])  # a check on the first chunk
        return "".join(out)

    async def aread(messages: Any) -> str:
        out = []
        async for chunk in main.astream(messages):
            out.append(str(chunk.content))
            if len(out) == 1:
                await guard.ainvoke("is this safe? " + out[0])
        return "".join(out)

    want = {(MAIN["input_tokens"] + GUARD["input_tokens"],
             MAIN["output_tokens"] + GUARD["output_tokens"])}
    assert _per_sample(_run(PROMPT | RunnableLambda(read), value={"question": "q"})) == want
    assert _per_sample(_run(PROMPT | RunnableLambda(aread), value={"question": "q"})) == want
