"""Integrations audit (6): a LangChain chain's tokens are counted from its LLM calls.

A chain whose last step drops the message (``prompt | llm | StrOutputParser()``) as the model or
as an LLM judge, or a chain of several LLM calls, reported no tokens (or only the last call's):
the sample's usage had none, a budget's token and money caps were not enforced, and a judge's
spend was lost. Every model and scorer call now runs with a per-call token counter on its
callbacks; see each test.

LangChain's own chat model base class with a tiny subclass that reports ``usage_metadata`` (and
no ``response_metadata["model_name"]``, which LangChain's ``UsageMetadataCallbackHandler`` needs).
"""

from __future__ import annotations

import warnings
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.llms import BaseLLM
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult, LLMResult
from langchain_core.outputs import Generation as LCGeneration
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from pydantic import PrivateAttr

import beacon
from beacon import BeaconConfig, Budget
from beacon.budget import BudgetNotEnforcedWarning
from beacon.engine import BatchScorer
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable

CFG = BeaconConfig(cost=0.0001, horizon=6, family="normal")
ANSWERS = ["a", "bb", "ccc", "dd", "e", "ffff"]
MODEL_USAGE = {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37}
JUDGE_USAGE = {
    "input_tokens": 200, "output_tokens": 3, "total_tokens": 203,
    "input_token_details": {"cache_read": 150, "cache_creation": 20},
}


class UsageChat(BaseChatModel):
    """Answers from ``answers`` in call order (cycling), each ``AIMessage`` reporting ``usage``
    as ``usage_metadata``; ``fail_first`` calls raise before answering (nothing reported)."""

    answers: list[str]
    usage: dict[str, Any]
    fail_first: int = 0
    _calls: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "usage-chat"

    def _answer(self) -> ChatResult:
        i = self._calls
        self._calls += 1
        if i < self.fail_first:
            raise TimeoutError("provider timed out")
        text = self.answers[(i - self.fail_first) % len(self.answers)]
        msg = AIMessage(content=text, usage_metadata=dict(self.usage))  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._answer()

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._answer()


def _model(**kw: Any) -> UsageChat:
    return UsageChat(answers=ANSWERS, usage=MODEL_USAGE, **kw)


def _judge() -> UsageChat:
    # its reply is read by the judge prompt's chain: the reward is 0.1 per answer letter
    return UsageChat(answers=["0.5"], usage=JUDGE_USAGE)


PROMPT = ChatPromptTemplate.from_messages([("human", "Answer: {question}")])
JUDGE_PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Rate the answer {response} to {prompt} from 0 to 1.")]
)


def _length(prompt: str, response: str) -> float:
    return 0.1 * len(response)


def _run(model: Any, scorer: Any = _length, **kw: Any) -> BeaconResult:
    """``model``'s BEACON result for the question ``"q"`` (a dict of the prompt's variables
    unless ``_dict=False``)."""
    value: Any = {"question": "q"} if kw.pop("_dict", True) else "q"
    r: BeaconRunnable[BeaconResult] = BeaconRunnable(
        model=model, scorer=scorer, config=kw.pop("config", CFG), return_result=True,
        retry=kw.pop("retry", RetryPolicy.none()), **kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetNotEnforcedWarning)  # every cap must hold
        return r.invoke(value)


def _ok(res: BeaconResult) -> list[beacon.Candidate]:
    return [c for c in res.candidates if not c.failed]


# -- 1. a model chain ending in a parser --------------------------------------------------------


def test_a_model_chain_ending_in_a_parser_reports_its_tokens() -> None:
    # Was: input_tokens None for every sample (the parser dropped the message).
    res = _run(PROMPT | _model() | StrOutputParser())
    n = len(res.candidates)
    assert n > 0 and not res.budget_unenforced
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == (30, 7)
        assert c.text in ANSWERS
    assert (res.usage.input_tokens, res.usage.output_tokens) == (30 * n, 7 * n)


def test_a_max_tokens_budget_stops_a_parser_chain() -> None:
    # 37 tokens a sample: a cap of 100 is reached at the third sample. Was: the cap could not
    # be enforced (budget_unenforced, a BudgetNotEnforcedWarning) and all six were drawn.
    res = _run(PROMPT | _model() | StrOutputParser(), budget=Budget(max_tokens=100),
               max_concurrency=1)
    assert res.stop_reason == "budget"
    assert len(res.candidates) == 3
    assert res.usage.total_tokens == 3 * 37
    assert res.budget_unenforced == []


def test_a_max_cost_budget_prices_a_parser_chains_tokens() -> None:
    b = Budget(max_cost=1.0, price_per_input_token=0.01, price_per_output_token=0.02)
    res = _run(PROMPT | _model() | StrOutputParser(), budget=b, max_concurrency=1)
    assert res.stop_reason == "budget" and res.budget_unenforced == []
    assert res.usage.cost == pytest.approx(len(res.candidates) * (30 * 0.01 + 7 * 0.02))


# -- 2. a judge chain ending in a parser ----------------------------------------------------------


def test_a_judge_chain_ending_in_a_parser_counts_the_judges_tokens() -> None:
    # Was: score_input_tokens None: the judge's spend was lost.
    res = _run(_model(), scorer=JUDGE_PROMPT | _judge() | StrOutputParser(), _dict=False)
    ok = _ok(res)
    assert ok and len(ok) == len(res.candidates)
    for c in ok:
        assert c.reward == pytest.approx(0.5)
        assert (c.usage.score_input_tokens, c.usage.score_output_tokens) == (200, 3)
    n = len(ok)
    assert (res.usage.score_input_tokens, res.usage.score_output_tokens) == (200 * n, 3 * n)
    assert (res.usage.input_tokens, res.usage.output_tokens) == (30 * n, 7 * n)


def test_a_judge_chains_cache_split_is_priced() -> None:
    # 200 input tokens, 150 read from the cache and 20 written to it, 30 uncached; 3 output.
    b = Budget(max_cost=1e9, price_per_input_token=1.0, price_per_output_token=10.0,
               price_per_cache_read_token=0.1, price_per_cache_write_token=1.25)
    res = _run(_model(), scorer=JUDGE_PROMPT | _judge() | StrOutputParser(), budget=b,
               _dict=False)
    judge_cost = 30 * 1.0 + 150 * 0.1 + 20 * 1.25 + 3 * 10.0
    for c in _ok(res):
        assert c.usage.score_cost == pytest.approx(judge_cost)


def test_a_judge_chains_tokens_count_toward_max_tokens() -> None:
    # 37 (model) + 203 (judge) = 240 a sample: a cap of 400 is reached at the second sample
    # (the model's 37 alone would reach it at the eleventh), before the Stopper's first
    # decision at k0 = 3.
    res = _run(_model(), scorer=JUDGE_PROMPT | _judge() | StrOutputParser(),
               budget=Budget(max_tokens=400), max_concurrency=1, _dict=False)
    assert res.stop_reason == "budget" and len(_ok(res)) == 2, res.candidates
    # a third sample generated meanwhile (its 37 model tokens paid) is cancelled unscored
    assert res.usage.total_tokens == 2 * 240 + 37 * res.usage.cancelled


# -- 3. several LLM calls in one chain ------------------------------------------------------------


def test_a_chain_with_two_llm_calls_counts_both() -> None:
    # draft, then a refine call on the draft: both are paid. Was: none counted (parser).
    refine = UsageChat(answers=["zz"], usage={"input_tokens": 50, "output_tokens": 2,
                                              "total_tokens": 52})
    to_vars = RunnableLambda(lambda text: {"question": f"refine {text}"})
    chain = PROMPT | _model() | StrOutputParser() | to_vars | PROMPT | refine
    res = _run(chain)
    n = len(res.candidates)
    assert n > 0
    for c in res.candidates:
        # the output is the refine call's own message: its usage is not counted on top
        assert (c.usage.input_tokens, c.usage.output_tokens) == (80, 9)
    assert res.usage.input_tokens == 80 * n


def test_a_parser_retried_with_retry_counts_every_paid_llm_call() -> None:
    # The first reply is no JSON: the parser fails after the LLM was paid, and with_retry
    # calls it again. Both calls count in the sample's usage.
    chat = UsageChat(answers=["not json", '{"a": 1}'], usage=MODEL_USAGE)
    chain = (PROMPT | chat | JsonOutputParser()).with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False
    )
    res = _run(chain, max_concurrency=1)  # one call at a time: each sample pays two calls
    assert res.candidates
    for c in res.candidates:
        assert not c.failed and c.text == '{"a": 1}'
        assert (c.usage.input_tokens, c.usage.output_tokens) == (60, 14)


class UsageLLM(BaseLLM):
    """A completion LLM reporting its tokens as OpenAI's does: ``llm_output["token_usage"]``
    (its output is a plain string, with no usage of its own)."""

    @property
    def _llm_type(self) -> str:
        return "usage-llm"

    def _generate(self, prompts: list[str], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> LLMResult:
        return LLMResult(
            generations=[[LCGeneration(text=ANSWERS[len(p) % len(ANSWERS)])] for p in prompts],
            llm_output={"token_usage": {"prompt_tokens": 11 * len(prompts),
                                        "completion_tokens": 4 * len(prompts)}},
        )


def test_a_completion_llms_token_usage_is_counted() -> None:
    res = _run(UsageLLM(), _dict=False)
    assert res.candidates
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == (11, 4)


# -- 4. a plain chat model: counted exactly once ----------------------------------------------


def test_a_plain_chat_model_is_counted_once() -> None:
    res = _run(_model(), _dict=False)
    n = len(res.candidates)
    assert n > 0
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens) == (30, 7)
        assert isinstance(c.raw, AIMessage)
    assert res.usage.input_tokens == 30 * n


def test_a_plain_judge_chat_model_is_counted_once() -> None:
    res = _run(_model(), scorer=JUDGE_PROMPT | _judge(), _dict=False)
    for c in _ok(res):
        assert (c.usage.score_input_tokens, c.usage.score_output_tokens) == (200, 3)


def test_engine_retries_count_only_the_attempt_that_answered() -> None:
    # The first attempt raises before any usage is reported; its retry answers and is counted.
    res = _run(_model(fail_first=1), retry=RetryPolicy(max_attempts=2, base_delay=0.0),
               max_concurrency=1, _dict=False)
    assert res.candidates[0].usage.retries == 1 and res.usage.retries == 1
    for c in res.candidates:
        assert not c.failed
        assert (c.usage.input_tokens, c.usage.output_tokens) == (30, 7)


def test_a_scorers_own_score_is_not_counted_twice() -> None:
    # A judge that calls an LLM and reports its spend itself: its Score is taken as it is.
    judge = _judge()

    async def score(d: dict[str, Any]) -> beacon.Score:
        msg = await judge.ainvoke(f"rate {d['response']}")  # under the scorer's run
        # its own accounting (another call it made, say): not the 200 / 3 the LLM reported
        return beacon.Score(float(str(msg.content)), input_tokens=999, output_tokens=9)

    res = _run(_model(), scorer=RunnableLambda(score), _dict=False)
    assert _ok(res)
    for c in _ok(res):
        assert (c.usage.score_input_tokens, c.usage.score_output_tokens) == (999, 9)


def test_a_runnable_returning_a_generation_with_its_own_tokens_keeps_them() -> None:
    chat = _model()

    async def gen(question: str) -> beacon.Generation:
        msg = await chat.ainvoke(question)
        return beacon.Generation(str(msg.content), input_tokens=1, output_tokens=2, cost=0.5)

    res = _run(RunnableLambda(gen), _dict=False)
    for c in res.candidates:
        assert (c.usage.input_tokens, c.usage.output_tokens, c.usage.cost) == (1, 2, 0.5)


def test_a_batched_judge_callable_puts_its_llm_calls_on_the_first_value() -> None:
    judge = _judge()

    async def score_many(prompt: str, responses: list[str]) -> list[float]:
        # one judge call for the whole batch, made under the scorer's run (the context's config)
        await judge.ainvoke(f"rate {responses}")
        return [0.1 * len(r) for r in responses]

    cfg = BeaconConfig(cost=0.0001, horizon=4, family="normal", batch_size=2)
    res = _run(_model(), scorer=BatchScorer(score_many), config=cfg, _dict=False)
    assert res.usage.score_calls >= 1
    assert res.usage.score_input_tokens == 200 * res.usage.score_calls
    assert res.usage.score_output_tokens == 3 * res.usage.score_calls


# -- 5. the caller's callbacks and run nesting --------------------------------------------------


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.llm_ends = 0
        self.parents: dict[UUID, UUID | None] = {}
        self.names: dict[UUID, str] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kw: Any) -> None:
        self.parents[run_id] = parent_run_id
        self.names[run_id] = kw.get("name") or ""

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kw: Any) -> None:
        self.parents[run_id] = parent_run_id
        self.names[run_id] = "chat"

    def on_llm_end(self, response: Any, **kw: Any) -> None:
        self.llm_ends += 1


def test_user_callbacks_still_see_every_llm_call_nested_under_the_beacon_run() -> None:
    rec = Recorder()
    r: BeaconRunnable[BeaconResult] = BeaconRunnable(
        model=PROMPT | _model() | StrOutputParser(),
        scorer=JUDGE_PROMPT | _judge() | StrOutputParser(), config=CFG, return_result=True,
    )
    res = r.invoke({"question": "q"}, {"callbacks": [rec]})
    assert res.usage.input_tokens == 30 * res.usage.model_calls
    assert rec.llm_ends == res.usage.model_calls + res.usage.score_calls
    root = next(rid for rid, name in rec.names.items() if name == "BeaconRunnable")
    chats = [rid for rid, name in rec.names.items() if name == "chat"]
    assert len(chats) == rec.llm_ends
    for rid in chats:
        run: UUID | None = rid
        while run is not None and run != root:
            run = rec.parents.get(run)
        assert run == root  # every LLM call nests under the BEACON run
