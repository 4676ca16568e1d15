"""Offline LlamaIndex stand-ins shared by the ``llamaindex_*`` examples (not an example itself).

A deterministic hashed bag-of-words embedding, enough for a toy ``VectorStoreIndex``, and a
completion LLM that answers from a script, so the examples never leave the machine. The examples
import it as ``from _shared import ...``: run as ``python examples/NAME.py``, Python puts
``examples/`` first on ``sys.path``. tests/test_examples.py skips names starting with ``_``.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator
from typing import Any

from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from pydantic import Field, PrivateAttr

__all__ = ["BagOfWordsEmbedding", "ScriptedLLM"]


class BagOfWordsEmbedding(BaseEmbedding):
    """Deterministic hashed bag-of-words embedding (unit norm); enough for a toy index."""

    dim: int = 256

    def _vec(self, text: str) -> list[float]:
        v = [0.0] * self.dim
        for w in re.findall(r"[a-z0-9]+", text.lower()):
            v[zlib.crc32(w.encode()) % self.dim] += 1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        return [x / norm for x in v]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)


class ScriptedLLM(CustomLLM):
    """Completion LLM answering from a script, in call order (cycling)."""

    script: list[str] = Field(default_factory=list)
    _i: int = PrivateAttr(default=0)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        text = self.script[self._i % len(self.script)]
        self._i += 1
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> Iterator[CompletionResponse]:
        yield self.complete(prompt, formatted=formatted)
