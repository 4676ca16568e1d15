"""Review findings on the LangChain audit (tests/test_audit7_langchain.py): a batch's configs as
a tuple, custom chat models / LLMs that take the scorer's dict, a BeaconConfig given to
as_beacon_tool(config=...), and a with_retry step inside a chain."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.language_models.llms import LLM
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from beacon import BeaconConfig, ConfigTypeError
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable

CFG = BeaconConfig(cost=0.5, horizon=4)
ANSWERS = ["a", "b c", "d e f"]


def length_reward(prompt: str, response: str) -> float:
    return float(len(response.split()))


def make(**kw: Any) -> BeaconRunnable:
    return BeaconRunnable(
        model=kw.pop("model", None) or FakeListChatModel(responses=ANSWERS),
        scorer=kw.pop("scorer", length_reward), config=CFG, retry=RetryPolicy.none(), **kw,
    )


def test_a_tuple_of_per_input_configs_is_accepted_by_batch() -> None:
    r = make()
    configs = ({"tags": ["a"]}, {"tags": ["b"]})
    assert len(r.batch(["q1", "q2"], configs)) == 2  # type: ignore[arg-type]


async def test_a_tuple_of_per_input_configs_is_accepted_by_abatch() -> None:
    r = make()
    configs = ({"tags": ["a"]}, {"tags": ["b"]})
    assert len(await r.abatch(["q1", "q2"], configs)) == 2  # type: ignore[arg-type]


class DictJudge(BaseChatModel):
    """A custom judge chat model whose invoke takes the scorer's dict."""

    @property
    def _llm_type(self) -> str:
        return "dict-judge"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="0"))])

    def invoke(self, input: Any, config: Any = None, **kw: Any) -> AIMessage:
        if isinstance(input, dict):
            return AIMessage(content=str(len(input["response"])))
        return super().invoke(input, config, **kw)  # type: ignore[return-value]

    async def ainvoke(self, input: Any, config: Any = None, **kw: Any) -> AIMessage:
        return self.invoke(input, config, **kw)


class DictLLM(LLM):
    """A custom LLM whose input conversion takes the scorer's dict."""

    @property
    def _llm_type(self) -> str:
        return "dict-llm"

    def _call(self, prompt: str, stop: Any = None, run_manager: Any = None, **kw: Any) -> str:
        return str(len(prompt))

    def _convert_input(self, input: Any) -> Any:
        if isinstance(input, dict):
            input = f"{input['prompt']}|{input['response']}"
        return super()._convert_input(input)


@pytest.mark.parametrize("scorer", [DictJudge(), DictLLM()], ids=["chat", "llm"])
def test_custom_language_models_taking_the_scorer_dict_are_accepted(scorer: Any) -> None:
    res = make(scorer=scorer | StrOutputParser(), return_result=True).invoke("q")
    assert res.n_failed == 0 and res.n_samples > 0


def test_a_stock_chat_model_as_the_scorer_is_still_refused() -> None:
    with pytest.raises(ValueError, match="scorer"):
        make(scorer=FakeListChatModel(responses=["1"]))


def test_a_beacon_config_given_to_as_beacon_tool_is_a_typed_error() -> None:
    with pytest.raises(ConfigTypeError, match="config"):
        make().as_beacon_tool("best", "best answer", config=CFG)  # type: ignore[arg-type]


class DownModel(BaseChatModel):
    """A chat model whose provider is down (a retryable error for the engine too)."""

    calls: list[int]

    @property
    def _llm_type(self) -> str:
        return "down"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.calls.append(1)
        raise ConnectionError("provider down")


def _chain_with_retry(step: str) -> tuple[Any, list[int]]:
    model = DownModel(calls=[])
    retry = {"stop_after_attempt": 2, "wait_exponential_jitter": False,
             "retry_if_exception_type": (ConnectionError,)}
    prompt = ChatPromptTemplate.from_template("{q}")
    if step == "llm":
        return prompt | model.with_retry(**retry) | StrOutputParser(), model.calls
    # another step retries itself (a flaky retriever): the model call is the engine's to retry
    prep = RunnableLambda(lambda d: d).with_retry(**retry)
    return prep | prompt | model | StrOutputParser(), model.calls


@pytest.mark.parametrize("step", ["llm", "other"])
def test_engine_retries_follow_a_with_retry_llm_step_of_a_chain(step: str) -> None:
    chain, made = _chain_with_retry(step)
    r = BeaconRunnable(
        model=chain, scorer=length_reward,
        config=BeaconConfig(cost=0.5, horizon=4, max_failures=0), max_concurrency=1,
        return_result=True, retry=None,
    )
    res = r.invoke({"q": "hello"})
    assert res.stop_reason == "error" and res.usage.model_calls > 0
    if step == "llm":  # with_retry retries the LLM step: no engine retry on top
        assert res.usage.retries == 0 and len(made) >= 2 * res.usage.failed_calls
    else:  # one provider call per engine attempt, retried by the engine
        assert res.usage.retries > 0 and len(made) <= res.usage.model_calls
