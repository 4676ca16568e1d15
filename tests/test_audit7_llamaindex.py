"""Audit 7 of the LlamaIndex adapters: OpenAI's cached prompt tokens, and bad constructor input.

* LlamaIndex's OpenAI LLM puts the usage totals in a response's ``additional_kwargs`` and the
  whole provider usage (with ``prompt_tokens_details.cached_tokens``) in ``raw``; the token tap
  read ``additional_kwargs`` first, so the cached part was lost and priced as uncached input.
* ``BeaconQueryTransform(include_original="no")`` was taken as ``True``; a ``callback_manager``
  that is no ``CallbackManager`` was stored and failed the first query with an
  ``AttributeError`` from inside LlamaIndex.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_completion_callback

import beacon
from beacon.budget import Budget
from beacon.errors import ConfigError
from beacon_integrations.llama_index import (
    BeaconQueryEngine,
    BeaconQueryTransform,
)

PROMPT, CACHED, COMPLETION = 1000, 800, 10


class OpenAIShapedLLM(CustomLLM):
    """Answers as LlamaIndex's OpenAI LLM does: the SDK response (its ``usage`` with the
    cached prompt tokens) as ``raw``, the totals in ``additional_kwargs``."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        usage = SimpleNamespace(
            prompt_tokens=PROMPT,
            completion_tokens=COMPLETION,
            total_tokens=PROMPT + COMPLETION,
            prompt_tokens_details=SimpleNamespace(cached_tokens=CACHED),
        )
        return CompletionResponse(
            text="about 8 minutes",
            raw=SimpleNamespace(usage=usage),
            additional_kwargs={
                "prompt_tokens": PROMPT,
                "completion_tokens": COMPLETION,
                "total_tokens": PROMPT + COMPLETION,
            },
        )

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError("not streamed in these tests")


def _score(query: str, text: str) -> float:
    return float(len(text))


CFG = beacon.BeaconConfig(cost=0.5, horizon=4)
BUDGET = Budget(
    price_per_input_token=1e-6, price_per_output_token=2e-6, price_per_cache_read_token=1e-7
)


def _engine(mode: str) -> BeaconQueryEngine:
    llm = OpenAIShapedLLM()
    if mode == "llm":
        return BeaconQueryEngine(_score, CFG, llm=llm, budget=BUDGET)
    docs = [Document(text="Sunlight takes about 8 minutes 20 seconds to reach Earth.")]
    index = VectorStoreIndex.from_documents(docs, embed_model=MockEmbedding(embed_dim=8))
    return BeaconQueryEngine(
        _score, CFG, query_engine=index.as_query_engine(llm=llm), budget=BUDGET
    )


@pytest.mark.parametrize("mode", ["llm", "engine"])
def test_openai_cached_prompt_tokens_are_counted_and_priced_as_cache_reads(mode: str) -> None:
    usage = _engine(mode).query("How long does sunlight take?").metadata["usage"]
    calls = usage["model_calls"]
    assert calls >= 1
    assert usage["input_tokens"] == calls * PROMPT
    assert usage["output_tokens"] == calls * COMPLETION
    assert usage["cache_read_tokens"] == calls * CACHED
    per_call = (
        (PROMPT - CACHED) * BUDGET.price_per_input_token
        + CACHED * BUDGET.price_per_cache_read_token
        + COMPLETION * BUDGET.price_per_output_token
    )
    assert usage["cost"] == pytest.approx(calls * per_call)


class KwargsOnlyLLM(OpenAIShapedLLM):
    """Reports its tokens only in ``additional_kwargs`` (as LlamaIndex's Ollama LLM does), its
    ``raw`` a provider dict without ``usage``."""

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(
            text="about 8 minutes",
            raw={"prompt_eval_count": PROMPT, "eval_count": COMPLETION},
            additional_kwargs={"prompt_tokens": PROMPT, "completion_tokens": COMPLETION},
        )


def test_tokens_only_in_additional_kwargs_are_still_counted() -> None:
    engine = BeaconQueryEngine(_score, CFG, llm=KwargsOnlyLLM())
    usage = engine.query("How long does sunlight take?").metadata["usage"]
    assert usage["input_tokens"] == usage["model_calls"] * PROMPT
    assert usage["output_tokens"] == usage["model_calls"] * COMPLETION
    assert usage["cache_read_tokens"] is None


@pytest.mark.parametrize("value", ["no", 0, None])
def test_include_original_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        BeaconQueryTransform(OpenAIShapedLLM(), _score, CFG, include_original=value)
    assert info.value.field == "include_original"
    assert info.value.value == value


def test_callback_manager_must_be_a_callback_manager() -> None:
    with pytest.raises(ConfigError) as info:
        BeaconQueryEngine(_score, CFG, llm=OpenAIShapedLLM(), callback_manager="verbose")
    assert info.value.field == "callback_manager"
    assert info.value.value == "verbose"
