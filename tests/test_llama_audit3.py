"""LlamaIndex adapter audit (3): prompts reach the LLM as LlamaIndex sends them, evaluator kinds.

LlamaIndex's own fake LLMs and evaluators; no network.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.evaluation import EvaluationResult
from llama_index.core.llms import CustomLLM, LLMMetadata
from llama_index.core.prompts import ChatPromptTemplate, PromptTemplate
from llama_index.core.prompts.default_prompts import DEFAULT_HYDE_PROMPT
from pydantic import Field, PrivateAttr
from test_llama_index import CFG, REWARDS, SCRIPT, ScriptedLLM, best_of, table_scorer

from beacon_integrations.llama_index import (
    DEFAULT_REWRITE_PROMPT,
    BeaconQueryEngine,
    BeaconQueryTransform,
    BeaconSamplingError,
)

Q = "capital?"


class RecordingChatLLM(CustomLLM):
    """Chat LLM answering from a script in call order; records the messages of every call."""

    script: list[str] = Field(default_factory=list)
    _i: int = PrivateAttr(default=0)
    _calls: list[list[tuple[str, str]]] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="recording-chat", is_chat_model=True)

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        self._calls.append([(m.role.value, m.content or "") for m in messages])
        text = self.script[self._i % len(self.script)]
        self._i += 1
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise AssertionError("a chat model is called through chat")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise AssertionError("a chat model is called through chat")


def _wrap(prompt: str) -> str:
    return f"<s>[INST] {prompt} [/INST]"


# -- the LLM's own prompt settings (LLM mode) ----------------------------------------------------


@pytest.mark.parametrize("template", [None, "Q: {query_str}\nA:"])
def test_llm_mode_applies_the_llms_system_prompt_and_wrappers_as_predict_does(
    template: str | None,
) -> None:
    # The LLM's system_prompt, query_wrapper_prompt and completion_to_prompt never reached it:
    # BEACON formatted the template itself and sent it with formatted=True.
    settings: dict[str, Any] = {
        "system_prompt": "Answer in one word.",
        "query_wrapper_prompt": PromptTemplate("### Question\n{query_str}\n### Answer"),
        "completion_to_prompt": _wrap,
    }
    llm = ScriptedLLM(script=SCRIPT, **settings)
    resp = BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template).query(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best

    reference = ScriptedLLM(script=SCRIPT, **settings)  # what LlamaIndex itself sends
    reference.predict(PromptTemplate(template or "{query_str}"), query_str=Q)
    assert "Answer in one word." in reference._prompts[0]
    assert llm._prompts == reference._prompts * n


def test_chat_prompt_template_keeps_its_roles_and_the_llms_system_prompt() -> None:
    # A ChatPromptTemplate over a chat model was flattened into one user message
    # "system: ...\nuser: ...\nassistant: ", and the LLM's system_prompt was dropped.
    template = ChatPromptTemplate.from_messages(
        [("system", "You are a geographer."), ("user", "Question: {query_str}")]
    )
    llm = RecordingChatLLM(script=SCRIPT, system_prompt="Be brief.")
    resp = BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template).query(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best

    reference = RecordingChatLLM(script=SCRIPT, system_prompt="Be brief.")
    reference.predict(template, query_str=Q)
    roles = [role for role, _ in reference._calls[0]]
    assert roles.count("system") == 2 and roles[-1] == "user"
    assert llm._calls == reference._calls * n


def test_chat_prompt_template_over_a_completion_model_uses_its_messages_to_prompt() -> None:
    def messages_to_prompt(messages: Any) -> str:
        return " | ".join(f"{m.role.value}={m.content}" for m in messages)

    template = ChatPromptTemplate.from_messages(
        [("system", "You are a geographer."), ("user", "{query_str}")]
    )
    llm = ScriptedLLM(script=SCRIPT, messages_to_prompt=messages_to_prompt)
    BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template).query(Q)
    reference = ScriptedLLM(script=SCRIPT, messages_to_prompt=messages_to_prompt)
    reference.predict(template, query_str=Q)
    assert llm._prompts[0] == reference._prompts[0]
    assert "system=You are a geographer." in llm._prompts[0]


@pytest.mark.parametrize("mode", ["rewrite", "hyde"])
def test_query_transform_applies_the_llms_system_prompt(mode: str) -> None:
    llm = ScriptedLLM(script=SCRIPT, system_prompt="Write for a search engine.")
    transform = BeaconQueryTransform(llm, table_scorer, CFG, mode=mode)  # type: ignore[arg-type]
    transform.run(Q)
    reference = ScriptedLLM(script=SCRIPT, system_prompt="Write for a search engine.")
    if mode == "hyde":
        reference.predict(DEFAULT_HYDE_PROMPT, context_str=Q)
    else:
        reference.predict(DEFAULT_REWRITE_PROMPT, query_str=Q)
    assert llm._prompts[0] == reference._prompts[0]
    assert llm._prompts[0].startswith("Write for a search engine.")


def test_chat_model_query_transform_sends_the_llms_system_prompt() -> None:
    llm = RecordingChatLLM(script=SCRIPT, system_prompt="Write for a search engine.")
    BeaconQueryTransform(llm, table_scorer, CFG).run(Q)
    reference = RecordingChatLLM(script=SCRIPT, system_prompt="Write for a search engine.")
    reference.predict(DEFAULT_REWRITE_PROMPT, query_str=Q)
    assert llm._calls[0] == reference._calls[0]
    assert llm._calls[0][0] == ("system", "Write for a search engine.")


# -- evaluators of every kind --------------------------------------------------------------------


class SyncAevaluate:
    """Evaluator-like object whose ``aevaluate`` is a plain function (returns the result)."""

    def aevaluate(self, query: str | None = None, response: str | None = None,
                  contexts: Any = None, **kwargs: Any) -> EvaluationResult:
        assert response is not None
        return EvaluationResult(query=query, response=response, score=REWARDS[response])


class SyncOnlyEvaluator:
    """Evaluator-like object with a blocking ``evaluate`` only (no ``aevaluate``)."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def evaluate(self, query: str | None = None, response: str | None = None,
                 contexts: Any = None, **kwargs: Any) -> EvaluationResult:
        assert response is not None
        self.threads.add(threading.get_ident())
        return EvaluationResult(query=query, response=response, score=REWARDS[response])


class FloatEvaluator:
    """Evaluator-like object whose ``aevaluate`` returns a bare number, not a result."""

    async def aevaluate(self, query: str | None = None, response: str | None = None,
                        **kwargs: Any) -> float:
        return 0.5


@pytest.mark.parametrize("make", [SyncAevaluate, SyncOnlyEvaluator])
def test_evaluators_with_a_sync_aevaluate_or_only_evaluate_score_samples(make: Any) -> None:
    # Before: a sync aevaluate failed every sample ("can't be used in 'await' expression") and
    # an evaluate-only evaluator was refused as "not a callable or a LlamaIndex evaluator".
    evaluator = make()
    resp = BeaconQueryEngine(evaluator, CFG, llm=ScriptedLLM(script=SCRIPT)).query(Q)
    best, n, reason = best_of(SCRIPT, CFG)
    md = resp.metadata or {}
    assert resp.response == best
    assert md["n_samples"] == n and md["stop_reason"] == reason
    assert md["rewards"] == [REWARDS[t] for t in SCRIPT[:n]]
    if isinstance(evaluator, SyncOnlyEvaluator):  # the blocking judge ran off the caller
        assert threading.get_ident() not in evaluator.threads


def test_evaluator_returning_no_result_is_a_reward_error_naming_it() -> None:
    with pytest.raises(BeaconSamplingError) as info:
        BeaconQueryEngine(FloatEvaluator(), CFG, llm=ScriptedLLM(script=SCRIPT)).query(Q)
    error = info.value.result.error or ""
    assert error.startswith("RewardError") and "'float'" in error
    assert "EvaluationResult" in error


def test_object_that_neither_scores_nor_evaluates_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="scorer must be a callable or a LlamaIndex evaluator"):
        BeaconQueryEngine(object(), CFG, llm=ScriptedLLM(script=SCRIPT))
