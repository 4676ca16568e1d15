"""Integrations audit (2): multi-input agent tools, async reward adapters, Retry-After, HTTP scorer
settings.

LangChain / LlamaIndex fake models; HTTP against a real aiohttp server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from llama_index.core.evaluation import BaseEvaluator, EvaluationResult
from llama_index.core.llms import MockLLM
from pydantic import PrivateAttr, ValidationError
from test_langchain import RunTree

import beacon
from beacon import BeaconConfig
from beacon.engine import BatchScorer, BeaconSampler
from beacon.retry import RetryAfterTooLongError, RetryPolicy, is_retryable
from beacon_integrations.langchain import BeaconRunnable
from beacon_integrations.llama_index import BeaconQueryEngine, BeaconSamplingError
from beacon_integrations.scorers import (
    CorrectnessAdjusted,
    HttpRewardScorer,
    RewardHTTPError,
    RewardResponseError,
    adjust_reward,
)

# -- fakes ----------------------------------------------------------------------------------------


class RecordingChat(BaseChatModel):
    """Chat model answering from a script in call order; records the messages of every call."""

    script: list[str]
    _calls: int = PrivateAttr(default=0)
    _inputs: list[list[BaseMessage]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._inputs.append(messages)
        text = self.script[self._calls % len(self.script)]
        self._calls += 1
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._generate(messages, stop, run_manager, **kwargs)


REWARDS = {"a": 0.10, "b": 0.35, "c": 0.20, "d": 0.90, "e": 0.15, "f": 0.30, "g": 0.05}
CFG = BeaconConfig(cost=0.02, horizon=7, family="normal")
ROLE_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "You are a {role}"), ("human", "{question}")]
)


def table_scorer(prompt: str, response: str) -> float:
    return REWARDS[response]


def check_tool_message(msg: Any, call_id: str) -> dict[str, Any]:
    """The tool answered the call with the best scored candidate; returns its artifact."""
    assert isinstance(msg, ToolMessage) and msg.tool_call_id == call_id
    art = msg.artifact
    scored = [c for c in art["candidates"] if c["reward"] is not None]
    assert scored and len(scored) == art["n_samples"]
    assert msg.content == max(scored, key=lambda c: c["reward"])["text"]
    return dict(art)


# -- as_beacon_tool: the runnable's own input variables ------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_tool_over_a_multi_variable_template_takes_its_variables(mode: str) -> None:
    chat = RecordingChat(script=list("abcdefg"))
    runnable = BeaconRunnable(model=ROLE_PROMPT | chat, scorer=table_scorer, config=CFG)
    tool = runnable.as_beacon_tool("best_of_n", "Answer in a given role.")
    assert set(tool.args) == {"role", "question"}
    assert tool.tool_call_schema.model_json_schema()["required"] == sorted(
        ROLE_PROMPT.input_variables
    )
    call = {"name": "best_of_n", "args": {"role": "poet", "question": "Why is the sky blue?"},
            "id": "call-7", "type": "tool_call"}
    rec = RunTree()
    cfg: Any = {"callbacks": [rec]}
    msg = tool.invoke(call, cfg) if mode == "sync" else await tool.ainvoke(call, cfg)
    art = check_tool_message(msg, "call-7")
    assert art["prompt"] == "Why is the sky blue?"  # the scorer saw the rendered question
    assert chat._inputs and all(m[0].content == "You are a poet" for m in chat._inputs)
    tool_run = next(rid for kind, _, rid, _ in rec.starts if kind == "tool")
    beacon_runs = [parent for kind, name, _, parent in rec.starts
                   if kind == "chain" and name == "BeaconRunnable"]
    assert beacon_runs == [tool_run]  # the BEACON run nests under the tool run


async def test_tool_call_missing_a_variable_is_rejected_before_sampling() -> None:
    chat = RecordingChat(script=list("abcdefg"))
    tool = BeaconRunnable(model=ROLE_PROMPT | chat, scorer=table_scorer,
                          config=CFG).as_beacon_tool("best_of_n", "desc")
    call = {"name": "best_of_n", "args": {"question": "q"}, "id": "c", "type": "tool_call"}
    with pytest.raises(ValidationError, match="role"):
        tool.invoke(call)
    with pytest.raises(ValidationError, match="role"):
        await tool.ainvoke(call)
    assert chat._calls == 0


def test_tool_leaves_an_optional_variable_the_call_omits_to_the_template() -> None:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a {role}"), MessagesPlaceholder("history", optional=True),
         ("human", "{question}")]
    )
    chat = RecordingChat(script=list("abcdefg"))
    tool = BeaconRunnable(model=prompt | chat, scorer=table_scorer,
                          config=CFG).as_beacon_tool("best_of_n", "desc")
    assert set(tool.args) == {"role", "history", "question"}
    args: dict[str, Any] = {"role": "poet", "question": "q"}
    check_tool_message(tool.invoke({"name": "best_of_n", "args": args, "id": "c1",
                                    "type": "tool_call"}), "c1")
    assert {len(m) for m in chat._inputs} == {2}  # no history: system + question
    n = chat._calls
    args["history"] = [{"type": "human", "content": "hi"}, {"type": "ai", "content": "hello"}]
    check_tool_message(tool.invoke({"name": "best_of_n", "args": args, "id": "c2",
                                    "type": "tool_call"}), "c2")
    assert {tuple(m.text for m in msgs) for msgs in chat._inputs[n:]} == {
        ("You are a poet", "hi", "hello", "q")
    }


def test_tool_variables_named_like_langchains_injected_arguments() -> None:
    # ``config`` / ``callbacks`` / ``run_manager`` are what LangChain injects into a tool
    # function; as prompt variables they must reach the prompt, not be overwritten.
    prompt = ChatPromptTemplate.from_messages(
        [("system", "config={config} callbacks={callbacks} run_manager={run_manager}"),
         ("human", "{question}")]
    )
    chat = RecordingChat(script=list("abcdefg"))
    tool = BeaconRunnable(model=prompt | chat, scorer=table_scorer,
                          config=CFG).as_beacon_tool("best_of_n", "desc")
    args = {"config": "x1", "callbacks": "x2", "run_manager": "x3", "question": "q"}
    msg = tool.invoke({"name": "best_of_n", "args": args, "id": "c", "type": "tool_call"})
    check_tool_message(msg, "c")
    assert {m[0].content for m in chat._inputs} == {"config=x1 callbacks=x2 run_manager=x3"}


def test_tool_and_input_schema_over_a_retrieval_step() -> None:
    # A RAG chain whose first step reads the input dict's "question": the runnable and its
    # tool take {"question": ...}, not a bare string (which itemgetter cannot read).
    docs = {"sky": "Rayleigh scattering"}
    retrieve = RunnableLambda(lambda q: docs["sky"] if "sky" in q else "")
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Context: {context}"), ("human", "{question}")]
    )
    chat = RecordingChat(script=list("abcdefg"))
    model = {"context": itemgetter("question") | retrieve,
             "question": itemgetter("question")} | prompt | chat
    runnable = BeaconRunnable(model=model, scorer=table_scorer, config=CFG)
    assert runnable.get_input_jsonschema() == model.get_input_jsonschema()
    tool = runnable.as_beacon_tool("best_of_n", "desc")
    assert set(tool.args) == {"question"}
    msg = tool.invoke({"name": "best_of_n", "args": {"question": "Why is the sky blue?"},
                       "id": "c", "type": "tool_call"})
    check_tool_message(msg, "c")
    assert {m[0].content for m in chat._inputs} == {"Context: Rayleigh scattering"}


def test_tool_over_a_chat_model_keeps_its_question_argument() -> None:
    chat = RecordingChat(script=list("abcdefg"))
    tool = BeaconRunnable(model=chat, scorer=table_scorer,
                          config=CFG).as_beacon_tool("best_of_n", "desc")
    assert list(tool.args) == ["question"]
    msg = tool.invoke({"name": "best_of_n", "args": {"question": "q"}, "id": "c",
                       "type": "tool_call"})
    assert check_tool_message(msg, "c")["prompt"] == "q"
    assert tool.invoke("q") == msg.content  # a bare string is the question, as before


# -- CorrectnessAdjusted: async verifiers, per-sample errors ---------------------------------------


async def test_correctness_adjusted_awaits_an_async_verifier() -> None:
    in_flight = [0, 0]  # now, peak

    async def judge(prompt: Any, text: str) -> bool:
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return text.startswith("right")

    class AsyncChecker:
        async def check(self, prompt: Any, text: str) -> bool | None:
            await asyncio.sleep(0)
            return None if text == "no box" else text.startswith("right")

    single = CorrectnessAdjusted(lambda p, t: 2.0, judge)
    assert await single("q", "right") == adjust_reward(2.0, True)
    assert await single("q", "wrong") == adjust_reward(2.0, False)
    checked = CorrectnessAdjusted(lambda p, t: -1.0, AsyncChecker())
    assert await checked("q", "no box") == adjust_reward(-1.0, None)
    assert await checked("q", "wrong") == adjust_reward(-1.0, False)
    batched = CorrectnessAdjusted(BatchScorer(lambda p, ts: [1.0] * len(ts)), judge)
    texts = ["right 1", "wrong", "right 2"]
    assert await batched("q", texts) == [adjust_reward(1.0, t.startswith("right")) for t in texts]
    assert in_flight[1] == len(texts)  # the checks of a batch run concurrently


async def test_correctness_adjusted_invalid_learned_reward_fails_only_its_sample() -> None:
    texts = iter(["t0", "t1", "t2", "t3"])
    bad = RewardResponseError("scores[1]", None, "reward must be a real number")

    def learned(prompt: Any, ts: list[str]) -> list[Any]:
        out: list[Any] = [0.5, bad, None, 0.25]
        return [out[int(t[1])] for t in ts]

    checked: list[str] = []

    def verifier(prompt: Any, text: str) -> bool:
        checked.append(text)
        return True

    async def gen(prompt: Any) -> str:
        return next(texts)

    cfg = BeaconConfig(cost=1e-9, horizon=4, batch_size=4)
    adj = CorrectnessAdjusted(BatchScorer(learned), verifier)
    res = await BeaconSampler(gen, adj, cfg, retry=RetryPolicy.none()).arun("q")
    by_text = {c.text: c for c in res.candidates}
    assert by_text["t0"].reward == adjust_reward(0.5, True)
    assert by_text["t3"].reward == adjust_reward(0.25, True)
    assert by_text["t1"].failed and by_text["t1"].error == f"RewardResponseError: {bad}"
    assert by_text["t2"].failed and "invalid learned reward: None" in str(by_text["t2"].error)
    assert sorted(checked) == ["t0", "t3"]  # an unusable reward is not verified


# -- LlamaIndex evaluators -------------------------------------------------------------------------


class NoScoreEvaluator(BaseEvaluator):
    """An evaluator that could not parse its judge's answer (as AnswerRelevancyEvaluator does)."""

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    async def aevaluate(self, query: Any = None, response: Any = None, contexts: Any = None,
                        **kwargs: Any) -> EvaluationResult:
        return EvaluationResult(query=query, response=response, contexts=["CONTEXT " * 500],
                                feedback="FEEDBACK " * 500, score=None, invalid_result=True,
                                invalid_reason="Unable to parse the output string.")


def test_evaluator_without_a_score_says_why_without_its_whole_result() -> None:
    engine = BeaconQueryEngine(NoScoreEvaluator(), BeaconConfig(cost=0.1, horizon=4,
                                                                max_failures=0),
                               llm=MockLLM(max_tokens=4))
    with pytest.raises(BeaconSamplingError) as ei:
        engine.query("Why is the sky blue?")
    errors = [c.error for c in ei.value.result.candidates]
    assert errors and all(e is not None for e in errors)
    for e in errors:
        assert e is not None
        assert "evaluator returned no score" in e and "Unable to parse the output string." in e
        assert "CONTEXT" not in e and "FEEDBACK" not in e and len(e) < 300


class SlowEvaluator(BaseEvaluator):
    """Scores by length; the answer "slow" never finishes in time. Records cancellations."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def _get_prompts(self) -> dict[str, Any]:
        return {}

    def _update_prompts(self, prompts: Any) -> None:
        pass

    async def aevaluate(self, query: Any = None, response: Any = None, contexts: Any = None,
                        **kwargs: Any) -> EvaluationResult:
        try:
            await asyncio.sleep(30 if response == "slow" else 0)
        except asyncio.CancelledError:
            self.cancelled.append(str(response))
            raise
        return EvaluationResult(score=float(len(str(response))))


async def test_async_evaluator_is_timed_out_and_cancelled_per_sample() -> None:
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata

    class Script(CustomLLM):
        answers: list[str]
        _i: int = PrivateAttr(default=0)

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name="script")

        def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
            self._i += 1
            return CompletionResponse(text=self.answers[(self._i - 1) % len(self.answers)])

        def stream_complete(self, prompt: str, formatted: bool = False, **kw: Any) -> Any:
            raise NotImplementedError

    ev = SlowEvaluator()
    engine = BeaconQueryEngine(ev, BeaconConfig(cost=1e-9, horizon=4), timeout=0.2,
                               retry=RetryPolicy.none(),
                               llm=Script(answers=["ok", "slow", "okay", "fine!"]))
    res = await engine.arun("q")
    failed = [c for c in res.candidates if c.failed]
    assert [c.text for c in failed] == ["slow"]
    assert failed[0].error == "TimeoutError: scorer call timed out after 0.2 s"
    assert ev.cancelled == ["slow"]
    assert res.best is not None and res.best.text == "fine!"


# -- Retry-After against a real server ------------------------------------------------------------


class Limited:
    """A reward endpoint answering 429 with ``Retry-After: wait`` to the first ``refuse``
    requests (all of them when ``refuse`` is None), then scores; records when each came."""

    def __init__(self) -> None:
        self.wait = "0"
        self.refuse: int | None = None
        self.times: list[float] = []
        self.url = ""


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a free loopback port; yields the URL of its ``/score`` route."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/score"
    finally:
        await runner.cleanup()


@pytest.fixture
async def limited() -> AsyncIterator[Limited]:
    srv = Limited()

    async def score(request: web.Request) -> web.Response:
        body = await request.json()
        srv.times.append(time.monotonic())
        if srv.refuse is None or len(srv.times) <= srv.refuse:
            return web.Response(status=429, text="rate limited",
                                headers={"Retry-After": srv.wait})
        return web.json_response({"score": 1.0 if "ok" in body["response"] else 0.0})

    app = web.Application()
    app.router.add_post("/score", score)
    async with serving(app) as srv.url:
        yield srv


async def test_retry_after_beyond_max_delay_is_waited_for_in_full(limited: Limited) -> None:
    limited.wait, limited.refuse = "0.3", 1
    # the backoff cap is below the server's wait; max_retry_after (default 60 s) is above it
    policy = RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.05)

    async def gen(prompt: Any) -> str:
        return "ok"

    # bernoulli: one sample first, and its success stops the query
    cfg = BeaconConfig(cost=0.1, horizon=2, family="bernoulli")
    async with HttpRewardScorer(limited.url) as scorer:
        res = await BeaconSampler(gen, scorer, cfg, retry=policy).arun("q")
    assert [c.reward for c in res.candidates] == [1.0]
    assert len(limited.times) == 2 and res.usage.retries == 1
    assert limited.times[1] - limited.times[0] >= 0.25  # the server's wait, not the 0 s backoff


async def test_retry_after_beyond_max_retry_after_ends_the_call_at_once(
    limited: Limited,
) -> None:
    limited.wait = "30"  # every request: come back in 30 s
    policy = RetryPolicy(max_attempts=3, base_delay=0.0, max_retry_after=0.2)

    async def gen(prompt: Any) -> str:
        return "ok"

    cfg = BeaconConfig(cost=0.1, horizon=2, family="bernoulli", max_failures=2)
    async with HttpRewardScorer(limited.url) as scorer:
        res = await BeaconSampler(gen, scorer, cfg, retry=policy).arun("q")
    assert res.candidates and all(c.failed for c in res.candidates)
    # one request per sample: no retry before the server's time, which only earns a 429
    assert len(limited.times) == len(res.candidates)
    assert res.usage.retries == 0
    for c in res.candidates:
        assert c.error is not None and c.error.startswith("RetryAfterTooLongError: ")
        assert "max_retry_after=0.2" in c.error and "30 s" in c.error


async def test_should_retry_raises_a_typed_error_from_the_servers_refusal(
    limited: Limited,
) -> None:
    limited.wait = "5"
    async with HttpRewardScorer(limited.url) as scorer:
        with pytest.raises(RewardHTTPError) as ei:
            await scorer("q", "abc")
    refusal = ei.value
    assert refusal.retry_after == 5.0
    policy = RetryPolicy(max_attempts=3, max_retry_after=2.0)
    with pytest.raises(RetryAfterTooLongError) as te:
        policy.should_retry(refusal, 1)
    err = te.value
    assert isinstance(err, beacon.ConfigError) and err.field == "max_retry_after"
    assert err.value == 2.0
    assert err.retry_after == 5.0 and err.__cause__ is refusal and not is_retryable(err)
    assert RetryPolicy(max_attempts=3, max_retry_after=5.0).should_retry(refusal, 1) is True
    # the backoff cap does not bound the server's wait
    assert RetryPolicy(max_attempts=3, max_delay=1.0).should_retry(refusal, 1) is True
    assert policy.should_retry(refusal, 3) is False  # attempts spent: the refusal itself
    refusal.retry_after = float("inf")
    with pytest.raises(RetryAfterTooLongError, match="inf s") as te:
        policy.should_retry(refusal, 1)
    assert "raise max_retry_after" not in str(te.value)


# -- HttpRewardScorer settings --------------------------------------------------------------------


def test_api_key_with_a_trailing_newline_is_a_config_error_without_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BEACON_AUDIT2_KEY", "k3y-secret-value\n")
    with pytest.raises(beacon.ConfigError) as ei:
        HttpRewardScorer("http://127.0.0.1:9/score", api_key_env="BEACON_AUDIT2_KEY")
    assert ei.value.field == "api_key_env" and ei.value.value == "BEACON_AUDIT2_KEY"
    assert "k3y-secret-value" not in str(ei.value) and "line break" in str(ei.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout": float("inf")}, "timeout"),
        ({"total_timeout": float("inf")}, "total_timeout"),
        ({"headers": {"X-Trace": "a\x01b"}}, "headers['X-Trace']"),
        ({"auth_scheme": "Bearer\n"}, "auth_scheme"),
        ({"auth_header": "X-Key\r\n"}, "auth_header"),
        ({"auth_header": ""}, "auth_header"),
    ],
)
def test_settings_aiohttp_would_reject_at_request_time_fail_at_creation(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(beacon.ConfigError) as ei:
        HttpRewardScorer("http://127.0.0.1:9/score", **kwargs)
    assert ei.value.field == field


async def test_numpy_timeouts_are_accepted(limited: Limited) -> None:
    limited.refuse = 0
    async with HttpRewardScorer(limited.url, timeout=np.int64(5),
                                total_timeout=np.float64(10.0)) as s:
        assert await s("q", "ok") == 1.0
    assert s.timeout == 5.0 and type(s.timeout) is float


async def test_unbatched_score_batch_leaves_no_request_running_when_one_fails() -> None:
    started: list[str] = []
    finished: list[str] = []

    async def score(request: web.Request) -> web.Response:
        text = (await request.json())["response"]
        started.append(text)
        if text == "bad":
            return web.Response(status=404, text="no such model")
        await asyncio.sleep(0.5)
        finished.append(text)
        return web.json_response({"score": 1.0})

    app = web.Application()
    app.router.add_post("/score", score)
    async with serving(app) as url, HttpRewardScorer(url) as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s.score_batch("q", ["slow 1", "bad", "slow 2"])
        assert ei.value.status == 404
        me = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not me and not t.done()
                and "score" in repr(t.get_coro())] == []
    assert sorted(started) == ["bad", "slow 1", "slow 2"]


@pytest.mark.parametrize("bad", [float("inf"), -1.0, float("nan"), "60"])
def test_max_retry_after_is_validated(bad: Any) -> None:
    with pytest.raises(beacon.ConfigError) as ei:
        RetryPolicy(max_retry_after=bad)
    assert ei.value.field == "max_retry_after"
    assert RetryPolicy(max_retry_after=0).max_retry_after == 0.0
    assert RetryPolicy().to_dict()["max_retry_after"] == 60.0
