"""BeaconRunnable against LangChain's real classes (fake chat models, no network)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
from langchain_core.callbacks import (
    AsyncCallbackHandler,
    BaseCallbackHandler,
    UsageMetadataCallbackHandler,
)
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.load import dumpd
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.rate_limiters import BaseRateLimiter, InMemoryRateLimiter
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool
from pydantic import Field, PrivateAttr, ValidationError

import beacon
from beacon import BeaconConfig, Draw, NIGPrior, Stopper
from beacon.engine import BatchScorer, BeaconSampler
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconChunk, BeaconRunnable, BeaconSamplingError

# -- fakes ----------------------------------------------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """Chat model answering from a script in call order, natively async (no executor).

    Records the threads it ran on and the peak number of calls in flight; ``fail`` maps a call
    number (0-based) to an exception raised instead of answering.
    """

    script: list[str]
    delay: float = 0.0
    usage: dict[str, int] | None = None
    fail: dict[int, Exception] = Field(default_factory=dict)
    _calls: int = PrivateAttr(default=0)
    _inflight: int = PrivateAttr(default=0)
    _peak: int = PrivateAttr(default=0)
    _threads: set[int] = PrivateAttr(default_factory=set)
    _inputs: list[list[BaseMessage]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _next(self, messages: list[BaseMessage]) -> ChatResult:
        i = self._calls
        self._calls += 1
        self._inputs.append(messages)
        if i in self.fail:
            raise self.fail[i]
        text = self.script[i % len(self.script)]
        msg = AIMessage(content=text, usage_metadata=dict(self.usage) if self.usage else None)
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._threads.add(threading.get_ident())
        return self._next(messages)

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self._threads.add(threading.get_ident())
        self._inflight += 1
        self._peak = max(self._peak, self._inflight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._next(messages)
        finally:
            self._inflight -= 1


REWARDS = {"a": 0.10, "b": 0.35, "c": 0.20, "d": 0.90, "e": 0.15, "f": 0.30, "g": 0.05}


def table_scorer(prompt: str, response: str) -> float:
    return REWARDS[response]


def expected(rewards: list[float], cfg: BeaconConfig) -> tuple[int, str]:
    """Independent replay: samples BEACON uses on this reward stream, and its stop reason."""
    s = Stopper(cfg)
    it = iter(rewards)
    while isinstance(d := s.next_decision(), Draw):
        for _ in range(d.count):
            s.observe(next(it))
    assert s.stopped is not None
    return s.k, s.stopped.reason


CFG = BeaconConfig(cost=0.02, horizon=7, family="normal")
SCRIPT = list("abcdefg")


def make(script: list[str] | None = None, scorer: Any = table_scorer, **kw: Any) -> BeaconRunnable:
    model = kw.pop("model", None) or ScriptedChatModel(script=script or SCRIPT)
    return BeaconRunnable(model=model, scorer=scorer, config=kw.pop("config", CFG), **kw)


def check_choice(msg: AIMessage, script: list[str], cfg: BeaconConfig) -> None:
    rewards = [REWARDS[t] for t in script]
    n, reason = expected(rewards, cfg)
    used = script[:n]
    best = max(used, key=lambda t: REWARDS[t])
    assert msg.content == best
    meta = msg.response_metadata["beacon"]
    assert meta["n_samples"] == n
    assert meta["stop_reason"] == reason
    assert sorted(meta["rewards"]) == sorted(rewards[:n])
    assert meta["reward"] == REWARDS[best]


# -- invoke / ainvoke ---------------------------------------------------------------------------


def test_invoke_returns_best_message_and_stops_like_the_stopper() -> None:
    msg = make().invoke("question?")
    assert isinstance(msg, AIMessage)
    check_choice(msg, SCRIPT, CFG)


async def test_ainvoke_is_native_async_on_the_callers_thread() -> None:
    model = ScriptedChatModel(script=SCRIPT)
    score_threads: set[int] = set()

    async def scorer(prompt: str, response: str) -> float:
        score_threads.add(threading.get_ident())
        return REWARDS[response]

    msg = await make(model=model, scorer=scorer).ainvoke("q")
    check_choice(msg, SCRIPT, CFG)
    me = threading.get_ident()
    assert model._threads == {me}
    assert score_threads == {me}


async def test_invoke_works_inside_a_running_event_loop() -> None:
    msg = make().invoke("q")  # sync call from a coroutine: no "event loop is running" error
    check_choice(msg, SCRIPT, CFG)


def test_input_forms_str_messages_prompt_value_and_prompt_pipe() -> None:
    seen: list[str] = []

    def scorer(prompt: str, response: str) -> float:
        seen.append(prompt)
        return REWARDS[response]

    r = make(scorer=scorer)
    r.invoke("plain question")
    assert set(seen) == {"plain question"}
    seen.clear()
    r = make(scorer=scorer)
    r.invoke([SystemMessage(content="be brief"), HumanMessage(content="from messages")])
    assert set(seen) == {"from messages"}
    seen.clear()
    model = ScriptedChatModel(script=SCRIPT)
    prompt = ChatPromptTemplate.from_messages([("system", "sys"), ("human", "Q: {q}")])
    chain = prompt | make(model=model, scorer=scorer) | StrOutputParser()
    out = chain.invoke({"q": "templated"})
    assert set(seen) == {"Q: templated"}
    assert model._inputs[0][0].content == "sys"  # the model got the full prompt
    n, _ = expected([REWARDS[t] for t in SCRIPT], CFG)
    assert out == max(SCRIPT[:n], key=lambda t: REWARDS[t])


def test_model_may_be_a_runnable_producing_strings() -> None:
    it = iter(SCRIPT)
    chain = RunnableLambda(lambda _q: next(it))
    msg = make(model=chain).invoke("q")
    check_choice(msg, SCRIPT, CFG)


def test_return_result_and_declared_output_schema() -> None:
    r = make(return_result=True)
    assert r.OutputType is BeaconResult
    assert make().OutputType is AIMessage
    assert "BeaconResult" in str(r.get_output_schema().model_json_schema())
    res = r.invoke("q")
    assert isinstance(res, BeaconResult)
    n, reason = expected([REWARDS[t] for t in SCRIPT], CFG)
    assert (res.n_samples, res.stop_reason) == (n, reason)
    assert res.prompt == "q"
    assert [t.decision for t in res.trace][-1] == "stop"


def test_runnable_and_judge_model_scorers() -> None:
    # A scorer chain returning a numeric string, and a judge chat model answering a number.
    chain_scorer = RunnableLambda(lambda d: str(REWARDS[d["response"]])) | StrOutputParser()
    check_choice(make(scorer=chain_scorer).invoke("q"), SCRIPT, CFG)
    judge = RunnableLambda(lambda d: f"{REWARDS[d['response']]}") | GenericFakeChatModel(
        messages=iter([])
    ).with_fallbacks([RunnableLambda(lambda _m: AIMessage(content="0.5"))])
    res = make(scorer=judge, return_result=True).invoke("q")
    assert res.scored and all(c.reward == 0.5 for c in res.scored)


def test_non_numeric_scores_fail_samples_and_raise_a_typed_error() -> None:
    r = make(scorer=lambda p, t: "not a number", config=CFG.replace(max_failures=2))
    with pytest.raises(BeaconSamplingError) as ei:
        r.invoke("q")
    assert ei.value.result.stop_reason == "error"
    assert "RewardError" in (ei.value.result.error or "")
    assert isinstance(ei.value, beacon.BeaconError)



@pytest.mark.filterwarnings("ignore:This API is in beta")
def test_templated_model_declares_its_templates_input_schema() -> None:
    # the input goes to the model's prompt template unchanged, so the declared input schema is
    # the template's variables (was LanguageModelInput: as_tool / LangServe rejected the dict)
    model = ChatPromptTemplate.from_template("Answer: {q}") | ScriptedChatModel(script=SCRIPT)
    r = make(model=model.with_retry())
    assert r.get_input_jsonschema() == model.get_input_jsonschema()
    assert r.get_input_schema().model_validate({"q": "why?"}).model_dump() == {"q": "why?"}
    tool = r.as_tool(name="best_answer", description="Answer carefully.")
    msg = tool.invoke({"q": "why?"})
    check_choice(msg, SCRIPT, CFG)
    # a bare chat model still declares LanguageModelInput
    bare = make().get_input_schema()
    assert bare.__name__ == "BeaconRunnableInput"
    assert bare.model_validate("why?").model_dump() == "why?"

# -- batch ---------------------------------------------------------------------------------------


async def test_abatch_honours_max_concurrency_across_the_batch() -> None:
    model = ScriptedChatModel(script=SCRIPT, delay=0.01)
    r = make(model=model)
    outs = await r.abatch(["q1", "q2", "q3", "q4"], {"max_concurrency": 2})
    assert len(outs) == 4 and all(isinstance(o, AIMessage) for o in outs)
    assert model._peak == 2  # concurrent, never above the limit
    model3 = ScriptedChatModel(script=SCRIPT, delay=0.01)
    await make(model=model3).abatch(["q1", "q2", "q3", "q4"], {"max_concurrency": 3})
    assert model3._peak == 3


def test_batch_sync_and_one_failing_input_does_not_lose_the_others() -> None:
    class Picky(ScriptedChatModel):
        def _next(self, messages: list[BaseMessage]) -> ChatResult:
            if messages[-1].content == "bad":
                raise ValueError("refused")
            return super()._next(messages)

    r = make(model=Picky(script=SCRIPT))
    outs = r.batch(["ok1", "bad", "ok2"], return_exceptions=True)
    assert isinstance(outs[0], AIMessage) and isinstance(outs[2], AIMessage)
    assert isinstance(outs[1], BeaconSamplingError)
    assert outs[1].result.stop_reason == "error"
    with pytest.raises(BeaconSamplingError):
        make(model=Picky(script=SCRIPT)).batch(["ok", "bad"])


# -- streaming -----------------------------------------------------------------------------------


async def test_astream_yields_each_scored_candidate_then_the_choice() -> None:
    chunks = [c async for c in make().astream("q")]
    assert all(isinstance(c, BeaconChunk) for c in chunks)
    *cands, final = chunks
    assert [c.kind for c in cands] == ["candidate"] * len(cands)
    assert final.kind == "final"
    n, reason = expected([REWARDS[t] for t in SCRIPT], CFG)
    assert len(cands) == n == final.n_samples
    assert [c.k for c in cands] == list(range(1, n + 1))
    assert all(c.reward == REWARDS[c.text] for c in cands)
    assert final.stop_reason == reason
    assert isinstance(final.output, AIMessage)
    check_choice(final.output, SCRIPT, CFG)
    assert final.text == final.output.content


async def test_sync_stream_inside_a_running_loop_and_early_close() -> None:
    chunks = list(make().stream("q"))
    assert chunks[-1].kind == "final"
    check_choice(chunks[-1].output, SCRIPT, CFG)
    gen = make(model=ScriptedChatModel(script=SCRIPT, delay=0.02)).stream("q")
    first = next(gen)
    assert first.kind == "candidate"
    gen.close()  # cancels the sampling thread instead of hanging


def _join_stream_threads() -> None:
    for t in threading.enumerate():
        if t.name == "beacon-stream":
            t.join()


def test_closing_a_sync_stream_after_its_loop_finished_raises_nothing() -> None:
    from beacon_integrations.langchain import _iterate_in_thread

    async def one() -> Any:
        yield "only"

    it = _iterate_in_thread(one)
    assert next(it) == "only"
    _join_stream_threads()  # the generator is exhausted and its private loop closed
    it.close()  # was: RuntimeError("Event loop is closed")


def test_breaking_out_of_stream_at_the_final_chunk_reports_no_error() -> None:
    import sys

    unraisable: list[Any] = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        gen = make().stream("q")
        for chunk in gen:
            if chunk.kind == "final":
                break
        _join_stream_threads()
        gen.close()
        del gen
    finally:
        sys.unraisablehook = old_hook
    assert chunk.kind == "final"
    check_choice(chunk.output, SCRIPT, CFG)
    assert [u.exc_value for u in unraisable] == []


async def test_chain_streams_through_beacon_runnable_like_invoke() -> None:
    # prompt | BeaconRunnable | parser: the chain's stream reaches BeaconRunnable through
    # transform/atransform, which must hand the next step what invoke returns (a message), not
    # BeaconChunks (StrOutputParser failed with a pydantic ValidationError on them).
    def chain() -> Any:
        return ChatPromptTemplate.from_template("Q: {q}") | make() | StrOutputParser()

    n, _ = expected([REWARDS[t] for t in SCRIPT], CFG)
    best = max(SCRIPT[:n], key=lambda t: REWARDS[t])
    assert [c async for c in chain().astream({"q": "x"})] == [best]
    assert list(chain().stream({"q": "x"})) == [best]  # sync, inside a running loop
    # the runnable's own stream still yields the candidates, then the choice
    assert [c.kind for c in make().stream("q")] == ["candidate"] * n + ["final"]


async def test_astream_events_v2_shows_custom_events_and_child_runs() -> None:
    r = make()
    events = [e async for e in r.astream_events("q", version="v2")]

    def named(kind: str, name: str) -> list[Any]:
        return [e for e in events if e["event"] == kind and e["name"] == name]

    root_id = named("on_chain_start", "BeaconRunnable")[0]["run_id"]
    samples = named("on_custom_event", "beacon_sample")
    decisions = named("on_custom_event", "beacon_decision")
    n, reason = expected([REWARDS[t] for t in SCRIPT], CFG)
    assert len(samples) == n
    for s in samples:
        assert {"k", "reward", "index", "text"} <= set(s["data"])
        assert s["data"]["reward"] == REWARDS[s["data"]["text"]]
        assert s["run_id"] == root_id
    for d in decisions:
        assert {"k", "zhat", "h", "threshold", "decision"} <= set(d["data"])
    assert decisions[-1]["data"]["decision"] == "stop"
    assert decisions[-1]["data"]["reason"] == reason
    # After k0 = 3 rewards every draw decision compares h with c / sigma and h exceeded it.
    mid = [d["data"] for d in decisions if d["data"]["decision"] == "draw" and d["data"]["k"] >= 3]
    assert mid and all(d["h"] > d["threshold"] for d in mid)
    if reason == "index":
        last = decisions[-1]["data"]
        assert last["h"] <= last["threshold"]
    model_runs = [e for e in events if e["event"] == "on_chat_model_start"]
    scorer_runs = named("on_chain_start", "table_scorer")
    assert len(model_runs) == n and len(scorer_runs) == n
    assert all(root_id in e["parent_ids"] for e in model_runs + scorer_runs)


def test_callbacks_tags_and_metadata_propagate_to_child_runs() -> None:
    class Recorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.chain_starts: list[tuple[str, Any, Any]] = []
            self.model_starts: list[tuple[Any, list[str], dict[str, Any]]] = []
            self.custom: list[str] = []

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any,
                           parent_run_id: Any = None, **kw: Any) -> None:
            self.chain_starts.append((kw.get("name"), run_id, parent_run_id))

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any,
                                parent_run_id: Any = None, tags: Any = None,
                                metadata: Any = None, **kw: Any) -> None:
            self.model_starts.append((parent_run_id, tags or [], metadata or {}))

        def on_custom_event(self, name: str, data: Any, **kw: Any) -> None:
            self.custom.append(name)

    rec = Recorder()
    make().invoke("q", {"callbacks": [rec], "tags": ["exp-1"], "metadata": {"user": "u1"}})
    root = next(rid for name, rid, _ in rec.chain_starts if name == "BeaconRunnable")
    assert rec.model_starts
    for parent, tags, metadata in rec.model_starts:
        assert parent == root
        assert "exp-1" in tags
        assert metadata.get("user") == "u1"
    assert "beacon_sample" in rec.custom and "beacon_decision" in rec.custom


async def test_usage_metadata_callback_sees_every_sample() -> None:
    usage = {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}
    model = GenericFakeChatModel(
        messages=iter([
            AIMessage(
                content=t, usage_metadata=dict(usage), response_metadata={"model_name": "fake-1"}
            )
            for t in SCRIPT
        ])
    )
    cb = UsageMetadataCallbackHandler()
    res = await make(model=model, return_result=True).ainvoke("q", {"callbacks": [cb]})
    calls = res.usage.model_calls
    assert calls == len(res.candidates) > 0
    totals = cb.usage_metadata["fake-1"]
    assert totals["input_tokens"] == 11 * calls
    assert totals["output_tokens"] == 4 * calls
    assert res.usage.input_tokens == 11 * calls and res.usage.output_tokens == 4 * calls


# -- retries and rate limits ---------------------------------------------------------------------


def test_rate_limiter_is_acquired_before_every_model_call() -> None:
    class Counting(BaseRateLimiter):
        def __init__(self) -> None:
            self.n = 0

        def acquire(self, *, blocking: bool = True) -> bool:
            self.n += 1
            return True

        async def aacquire(self, *, blocking: bool = True) -> bool:
            self.n += 1
            return True

    lim = Counting()
    res = make(rate_limiter=lim, return_result=True).invoke("q")
    assert lim.n == res.usage.model_calls > 0
    fast = InMemoryRateLimiter(requests_per_second=500, check_every_n_seconds=0.001,
                               max_bucket_size=10)
    check_choice(make(rate_limiter=fast).invoke("q"), SCRIPT, CFG)


def test_rate_limiter_wait_does_not_count_toward_the_timeout() -> None:
    # 2 requests/s and 6 samples drawn at once: the last one waits ~2.5 s for its token, far
    # beyond the 1 s timeout; only the model call itself is timed (the hung call 1 times out).
    starts: list[float] = []

    async def model(x: Any) -> str:
        i = len(starts)
        starts.append(time.perf_counter())
        if i == 1:
            await asyncio.sleep(30)
        return f"t {i}"

    lim = InMemoryRateLimiter(requests_per_second=2, check_every_n_seconds=0.01,
                              max_bucket_size=1)
    r = BeaconRunnable(model=RunnableLambda(model), scorer=lambda p, t: float(t.split()[1]),
                       config=BeaconConfig(cost=0.001, horizon=6, batch_size=6),
                       rate_limiter=lim, timeout=1.0, retry=RetryPolicy.none(),
                       return_result=True)
    t0 = time.perf_counter()
    res = r.invoke("q")
    assert time.perf_counter() - t0 < 10
    failed = [c for c in res.candidates if c.failed]
    assert [c.index for c in failed] == [1]
    assert failed[0].error == "TimeoutError: model call timed out after 1 s"
    assert len(res.scored) == 6 and res.stop_reason == "horizon"
    # The rate holds: call i starts no earlier than i token intervals of 0.5 s after the first
    # (a lower bound on each start: a loaded machine can only delay a call after its token, so
    # this holds however busy the machine is, unlike a bound on the gaps between calls).
    since = np.asarray(starts) - starts[0]
    assert len(starts) == 7 and all(since[i] >= 0.5 * i - 0.05 for i in range(7)), since


class GateLimiter(BaseRateLimiter):
    """Rate limiter under the test's control: the first caller gets its token once ``n``
    callers wait at once; the others never get one."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.waiting = 0
        self.all_waiting = asyncio.Event()

    def acquire(self, *, blocking: bool = True) -> bool:
        raise AssertionError("BeaconRunnable is async inside")

    async def aacquire(self, *, blocking: bool = True) -> bool:
        self.waiting += 1
        me = self.waiting
        if me == self.n:
            self.all_waiting.set()
        await self.all_waiting.wait()
        if me > 1:
            await asyncio.Event().wait()  # no token for the others
        return True


@pytest.mark.parametrize("max_concurrency", [1, 3])
async def test_rate_limiter_wait_holds_no_slot_and_calls_count_when_they_start(
    max_concurrency: int,
) -> None:
    # Three samples drawn at once (k0 = 3) all wait for a token together even with a single
    # concurrency slot; only the first gets one, and its model call fails (max_failures=0),
    # which stops the query and cancels the two still waiting: they made no model call.
    model_calls = 0

    async def model(x: Any) -> str:
        nonlocal model_calls
        model_calls += 1
        raise ValueError("model down")

    lim = GateLimiter(3)
    r = BeaconRunnable(model=RunnableLambda(model), scorer=table_scorer,
                       config=CFG.replace(max_failures=0), rate_limiter=lim,
                       max_concurrency=max_concurrency, retry=RetryPolicy.none(),
                       return_result=True)
    res = await asyncio.wait_for(r.ainvoke("q"), 10)
    assert lim.waiting == 3 and model_calls == 1
    assert res.stop_reason == "error" and res.usage.model_calls == 1
    assert res.usage.cancelled == 2 and res.usage.failed_calls == 1


def test_rate_limiter_throttles_model_calls_not_scorer_calls() -> None:
    class Counting(BaseRateLimiter):
        def __init__(self) -> None:
            self.n = 0

        def acquire(self, *, blocking: bool = True) -> bool:
            raise AssertionError("BeaconRunnable is async inside")

        async def aacquire(self, *, blocking: bool = True) -> bool:
            self.n += 1
            return True

    lim = Counting()
    scorer_calls = 0

    async def scorer(prompt: str, response: str) -> float:
        nonlocal scorer_calls
        scorer_calls += 1
        return REWARDS[response]

    res = make(scorer=scorer, rate_limiter=lim, return_result=True).invoke("q")
    assert lim.n == res.usage.model_calls == res.n_samples
    assert scorer_calls == res.usage.score_calls == res.n_samples


BATCH_OUT: dict[str, Any] = {"a": "0.1", "b": float("nan"), "c": "high", "d": {"score": 0.9},
                             "e": AIMessage(content="0.15"), "f": 0.3, "g": True}


def test_one_invalid_reward_in_a_batch_fails_only_its_sample() -> None:
    # As in the engine: b (NaN) and c (a non-numeric string) fail, each on its own sample and
    # named by its position; a, d, e, f, g (numeric string, dict, message, float, bool) count.
    calls: list[list[str]] = []

    def score_many(prompt: str, responses: list[str]) -> list[Any]:
        calls.append(list(responses))
        return [BATCH_OUT[t] for t in responses]

    cfg = BeaconConfig(cost=0.001, horizon=7, batch_size=3, max_failures=10)
    res = make(scorer=BatchScorer(score_many), config=cfg, return_result=True).invoke("q")
    assert calls[0] == ["a", "b", "c"]  # one call scored a batch with both kinds
    assert res.stop_reason in ("index", "horizon") and len(res.scored) == res.n_samples
    for c in res.candidates:
        if c.text in ("b", "c"):
            assert c.failed and c.reward is None
            assert c.error is not None
            assert c.error.startswith(f"RewardError: invalid reward at position {c.index}: ")
        else:
            assert not c.failed and c.reward == {"a": 0.1, "d": 0.9, "e": 0.15, "f": 0.3,
                                                 "g": 1.0}[c.text]
    assert {c.text for c in res.candidates if c.failed} == {"b", "c"}


def test_a_scorers_own_error_for_one_value_is_kept_on_its_sample() -> None:
    # A batched scorer may put an exception in a response's place (the HTTP scorer does, for
    # an invalid score); that sample fails with exactly that error, the others count.
    own = beacon.RewardError("scores[1]", None, "judge gave no score")

    def score_many(prompt: str, responses: list[str]) -> list[Any]:
        return [own if t == "b" else REWARDS[t] for t in responses]

    cfg = BeaconConfig(cost=0.001, horizon=4, batch_size=3, max_failures=10)
    res = make(scorer=BatchScorer(score_many), config=cfg, return_result=True).invoke("q")
    failed = [c for c in res.candidates if c.failed]
    assert failed and all(c.text == "b" for c in failed)
    assert failed[0].error == f"RewardError: {own}"
    assert all(c.reward == REWARDS[c.text] for c in res.candidates if not c.failed)


def test_model_with_retry_handles_its_own_failures_without_engine_retries() -> None:
    model = ScriptedChatModel(script=SCRIPT, fail={0: ValueError("flaky"), 2: ValueError("x")})
    retrying = model.with_retry(stop_after_attempt=3, wait_exponential_jitter=False,
                                retry_if_exception_type=(ValueError,))
    r = make(model=retrying, return_result=True)
    assert r._retry_policy().max_attempts == 1  # no multiplied retries
    res = r.invoke("q")
    assert res.n_failed == 0 and res.usage.retries == 0
    assert model._calls == res.n_samples + 2


def test_engine_retries_retryable_model_errors() -> None:
    model = ScriptedChatModel(script=SCRIPT, fail={1: TimeoutError("slow")})
    r = make(model=model, return_result=True, retry=RetryPolicy(base_delay=0.0, jitter=0.0))
    res = r.invoke("q")
    assert res.usage.retries == 1 and res.n_failed == 0


def test_beacon_runnable_with_retry_retries_a_query_that_got_no_answer() -> None:
    # The first query fails all max_failures + 1 samples; with_retry runs it again.
    cfg = CFG.replace(max_failures=1)
    fails: dict[int, Exception] = {i: ValueError("down") for i in range(4)}
    model = ScriptedChatModel(script=SCRIPT, fail=fails)
    r = make(model=model, config=cfg).with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False,
        retry_if_exception_type=(BeaconSamplingError,),
    )
    msg = r.invoke("q")
    assert isinstance(msg, AIMessage) and msg.response_metadata["beacon"]["n_samples"] >= 3


# -- agent tool ----------------------------------------------------------------------------------


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel that accepts bind_tools (it replays scripted tool calls)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _best_answer() -> str:
    n, _ = expected([REWARDS[t] for t in SCRIPT], CFG)
    return max(SCRIPT[:n], key=lambda t: REWARDS[t])


async def test_as_beacon_tool_returns_a_base_tool_with_the_best_answer() -> None:
    tool = make().as_beacon_tool("best_of_n", "Answer a question with BEACON best-of-N.")
    assert isinstance(tool, BaseTool)
    assert tool.name == "best_of_n" and "question" in tool.args
    assert tool.invoke({"question": "q"}) == _best_answer()
    msg = await make().as_beacon_tool("best_of_n", "desc").ainvoke(
        {"type": "tool_call", "id": "call-1", "name": "best_of_n", "args": {"question": "q"}}
    )
    assert msg.content == _best_answer()
    assert msg.artifact["stop_reason"] in beacon.STOP_REASONS
    assert msg.artifact["best_text"] == _best_answer()
    with pytest.raises(ValueError, match="name"):
        make().as_beacon_tool("", "desc")


class RunTree(BaseCallbackHandler):
    """Records (kind, name, run_id, parent_run_id) of every tool and chain run start."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, Any, Any, Any]] = []

    def on_tool_start(self, serialized: Any, input_str: Any, *, run_id: Any,
                      parent_run_id: Any = None, **kw: Any) -> None:
        self.starts.append(("tool", serialized.get("name"), run_id, parent_run_id))

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any,
                       parent_run_id: Any = None, **kw: Any) -> None:
        self.starts.append(("chain", kw.get("name"), run_id, parent_run_id))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_beacon_run_nests_under_the_tool_run(mode: str) -> None:
    tool = make().as_beacon_tool("best_of_n", "desc")
    rec = RunTree()
    cfg: Any = {"callbacks": [rec], "run_name": "outer", "tags": ["t1"]}
    call = {"type": "tool_call", "id": "call-1", "name": "best_of_n", "args": {"question": "q"}}
    msg = tool.invoke(call, cfg) if mode == "sync" else await tool.ainvoke(call, cfg)
    assert msg.content == _best_answer()
    tool_run = next(rid for kind, _, rid, _ in rec.starts if kind == "tool")
    beacon_runs = [(rid, parent) for kind, name, rid, parent in rec.starts
                   if kind == "chain" and name == "BeaconRunnable"]
    assert len(beacon_runs) == 1, rec.starts  # the tool's run_name stays on the tool run
    assert beacon_runs[0][1] == tool_run


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_agent_loop_calls_the_tool_and_gets_the_best_answer(mode: str) -> None:
    from langchain.agents import create_agent

    tool = make().as_beacon_tool("best_of_n", "Answer a hard question with BEACON best-of-N.")
    agent_model = ToolCallingFake(messages=iter([
        AIMessage(content="", tool_calls=[
            {"name": "best_of_n", "args": {"question": "hard q"}, "id": "call-1"}
        ]),
        AIMessage(content="Here is the answer."),
    ]))
    agent = create_agent(agent_model, [tool])
    inp = {"messages": [HumanMessage(content="please answer")]}
    out = agent.invoke(inp) if mode == "sync" else await agent.ainvoke(inp)
    tool_msgs = [m for m in out["messages"] if m.type == "tool"]
    assert len(tool_msgs) == 1
    assert tool_msgs[0].content == _best_answer()
    assert tool_msgs[0].artifact["n_samples"] == expected([REWARDS[t] for t in SCRIPT], CFG)[0]
    assert out["messages"][-1].content == "Here is the answer."


def test_a_tool_call_only_reply_is_scored_on_its_calls() -> None:
    """An agent model's reply with empty text and tool calls: the scorer sees the calls as JSON,
    not an empty string, and the chosen message keeps its tool_calls."""
    replies = [
        AIMessage(content="", tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "c1"}]),
        AIMessage(content="", tool_calls=[{"name": "calc", "args": {"expr": "2+2"}, "id": "c2"}]),
    ]
    seen: list[str] = []

    def score(prompt: str, response: str) -> float:
        seen.append(response)
        return 1.0 if json.loads(response)[0]["name"] == "calc" else 0.0

    model = ToolCallingFake(messages=iter(replies * 4))
    out = BeaconRunnable(model=model, scorer=score,
                         config=BeaconConfig(cost=0.5, horizon=4)).invoke("q")
    assert seen[:2] == ['[{"args": {"q": "x"}, "name": "search"}]',
                        '[{"args": {"expr": "2+2"}, "name": "calc"}]']
    assert out.tool_calls and out.tool_calls[0]["name"] == "calc"


# -- configs: priors, transforms, families, serialization ----------------------------------------


def test_prior_and_transform_flow_through() -> None:
    prior = NIGPrior(mu0=0.0, nu0=1.0, alpha0=2.0, beta0=0.5)
    cfg = BeaconConfig(cost=0.05, horizon=7, family="normal", prior=prior, transform="logit")
    assert cfg.k0 < 3  # an informative prior decides earlier than Jeffreys
    res = make(config=cfg, return_result=True).invoke("q")
    n, reason = expected([REWARDS[t] for t in SCRIPT], cfg)
    assert (res.n_samples, res.stop_reason) == (n, reason)
    assert res.config is not None
    assert res.config["prior"] == prior.to_dict()
    assert res.config["transform"]["kind"] == "logit"
    # The decisions were taken on logit-transformed rewards: mu after k rewards is in logit units.
    dec = [t for t in res.trace if t.k >= 1]
    assert dec and any(t.mu < 0 for t in dec)  # logit of rewards < 0.5 is negative


def _bool_scorer(kind: str) -> Any:
    if kind == "bool":
        return lambda p, t: t == "d"
    if kind == "np.bool_":
        return lambda p, t: np.bool_(t == "d")
    return BatchScorer(lambda p, ts: np.array([t == "d" for t in ts]))  # an np.bool_ array


@pytest.mark.parametrize("kind", ["bool", "np.bool_", "batched np.bool_"])
def test_bool_verifier_drives_the_bernoulli_family(kind: str) -> None:
    # As in the engine, True/False (numpy's too) are the rewards 1.0/0.0.
    cfg = BeaconConfig(cost=0.05, horizon=8, family="bernoulli")
    res = make(script=["a", "b", "d", "a"], scorer=_bool_scorer(kind), config=cfg,
               return_result=True).invoke("q")
    assert res.n_failed == 0 and res.error is None
    assert res.stop_reason == "absorbed" and res.n_samples == 3
    assert [c.reward for c in res.candidates] == [0.0, 0.0, 1.0]
    assert all(type(c.reward) is float for c in res.candidates)
    assert res.best is not None and res.best.text == "d"
    msg = make(script=["a", "b", "d"], scorer=lambda p, t: t == "d", config=cfg).invoke("q")
    assert msg.content == "d" and msg.response_metadata["beacon"]["reward"] == 1.0


def test_bernoulli_family_stops_at_the_first_success() -> None:
    cfg = BeaconConfig(cost=0.05, horizon=8, family="bernoulli")
    r = make(script=["a", "b", "d", "a"], scorer=lambda p, t: float(t == "d"), config=cfg,
             return_result=True)
    res = r.invoke("q")
    assert res.stop_reason == "absorbed"
    assert res.best is not None and res.best.text == "d"
    assert res.n_samples == 3


def test_config_serializes_as_its_dict_and_validates() -> None:
    cfg = BeaconConfig(cost=0.05, horizon=9, family="normal", transform="logit",
                       prior=NIGPrior(mu0=0.1, nu0=1.0, alpha0=2.0, beta0=0.5))
    r = make(config=cfg)
    d = dumpd(r)
    assert d["id"][-1] == "BeaconRunnable"
    assert d["kwargs"]["config"] == cfg.to_dict()
    again = make(config=d["kwargs"]["config"])
    assert again.config == cfg
    with pytest.raises(ValidationError, match="cost"):
        make(config={"cost": -1.0})
    with pytest.raises(ValidationError, match="scorer"):
        BeaconRunnable(model=ScriptedChatModel(script=SCRIPT), scorer=42, config=CFG)
    with pytest.raises(ValidationError, match="max_concurrency"):
        make(max_concurrency=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        make().invoke("q", stop=["x"])


def test_batched_callable_scorer_keeps_its_batching() -> None:
    calls: list[int] = []

    def many(prompt: str, texts: list[str]) -> list[float]:
        calls.append(len(texts))
        return [REWARDS[t] for t in texts]

    many.batched = True  # type: ignore[attr-defined]
    cfg = CFG.replace(batch_size=2)
    res = make(scorer=many, config=cfg, return_result=True).invoke("q")
    assert calls[0] == cfg.k0  # the first k0 samples scored in one call
    assert sum(calls) == res.n_samples


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    async def on_custom_event(self, name: str, data: Any, **kw: Any) -> None:
        self.names.append(name)


async def test_async_callback_handlers_receive_custom_events() -> None:
    h = AsyncRecorder()
    res = await make(return_result=True).ainvoke("q", {"callbacks": [h]})
    assert h.names.count("beacon_sample") == len(res.candidates)
    assert h.names.count("beacon_decision") == len(res.trace)


@pytest.mark.parametrize(
    "name",
    ["", "best of n", "best.of.n", "beste_antwort_ü", "a" * 65, "best_of_n\n", "tool/x", 7, None],
)
def test_as_beacon_tool_rejects_names_providers_reject(name: Any) -> None:
    with pytest.raises(beacon.ConfigError, match="name") as info:
        make().as_beacon_tool(name, "desc")
    assert info.value.field == "name" and info.value.value == name


@pytest.mark.parametrize("name", ["a", "best_of_n", "Best-Of-N_2", "x" * 64])
def test_as_beacon_tool_accepts_provider_valid_names(name: str) -> None:
    assert make().as_beacon_tool(name, "desc").name == name


def test_as_beacon_tool_rejects_an_empty_description() -> None:
    with pytest.raises(beacon.ConfigError, match="description"):
        make().as_beacon_tool("best_of_n", "")


def test_tool_reports_a_query_with_no_scored_sample_to_the_agent() -> None:
    r = make(scorer=lambda p, t: float("inf"), config=CFG.replace(max_failures=0))
    out = r.as_beacon_tool("best_of_n", "desc").invoke({"question": "q"})
    assert isinstance(out, str) and "no scored candidate" in out


def test_reward_coercion_of_scorer_outputs() -> None:
    from beacon_integrations._adapt import to_reward

    assert to_reward(0.25) == 0.25
    assert to_reward(" 0.5\n") == 0.5
    assert to_reward(AIMessage(content="7")) == 7.0
    assert to_reward({"score": 3}) == 3.0 and to_reward({"reward": -1.5}) == -1.5
    for bad in ("high", float("nan"), None, [1.0], 10**400):
        with pytest.raises(beacon.RewardError):
            to_reward(bad, 4)


def test_bools_are_rewards_and_errors_name_no_missing_position() -> None:
    from beacon_integrations._adapt import to_reward

    assert to_reward(True) == 1.0 and to_reward(False) == 0.0
    assert to_reward(np.bool_(True)) == 1.0 and to_reward(np.False_) == 0.0
    assert to_reward({"score": True}) == 1.0
    with pytest.raises(beacon.RewardError) as ei:
        to_reward("high")
    assert str(ei.value) == "invalid reward: 'high' (scorer returned a non-numeric string)"
    assert ei.value.position is None and ei.value.value == "high"
    with pytest.raises(beacon.RewardError, match=r"^invalid reward: None \(scorer must return"):
        to_reward(None)
    with pytest.raises(beacon.RewardError, match=r"^invalid reward at position 4: \[1\.0\]"):
        to_reward([1.0], 4)
    # in a query the engine names the sample, as for any scorer
    res = make(scorer=lambda p, t: None, config=CFG.replace(max_failures=0),
               return_result=True).invoke("q")
    assert [c.error for c in res.candidates] == [
        f"RewardError: invalid reward at position {i}: None (scorer must return a real number)"
        for i in range(len(res.candidates))
    ]


# -- input and argument validation ----------------------------------------------------------------


def _seen_scorer() -> tuple[list[str], Any]:
    seen: list[str] = []

    def scorer(prompt: str, response: str) -> float:
        seen.append(prompt)
        return REWARDS[response]

    return seen, scorer


def test_prompt_chain_model_scorer_sees_the_rendered_prompt() -> None:
    prompt = ChatPromptTemplate.from_messages([("system", "sys"), ("human", "Answer: {q}")])
    rendered = prompt.invoke({"q": "Why is the sky blue?"}).to_messages()[-1].text
    for model_of in (lambda m: prompt | m, lambda m: (prompt | m).with_retry()):
        for value in ({"q": "Why is the sky blue?"},
                      {"q": "Why is the sky blue?", "extra": "x"},
                      "Why is the sky blue?"):  # one-variable template: LangChain wraps it
            seen, scorer = _seen_scorer()
            chat = ScriptedChatModel(script=SCRIPT)
            res = make(model=model_of(chat), scorer=scorer, return_result=True).invoke(value)
            assert set(seen) == {rendered}
            assert res.prompt == rendered
            assert chat._inputs[0][0].content == "sys"  # the model still got the full prompt


def test_dict_input_errors_and_json_rendering() -> None:
    prompt = ChatPromptTemplate.from_template("Answer: {q}")
    chat = ScriptedChatModel(script=SCRIPT)
    # A dict that does not fill the template fails before any model call, naming the input.
    with pytest.raises(beacon.ConfigError, match=r"input.*prompt template") as ei:
        make(model=prompt | chat).invoke({"other": "x"})
    assert ei.value.field == "input"
    # A dict straight into a chat model can never work: a TypeError up front.
    with pytest.raises(TypeError, match=r"input.*ScriptedChatModel.*dict"):
        make(model=chat).invoke({"q": "x"})
    assert chat._calls == 0
    # Any other runnable taking a dict: the scorer sees it as JSON with sorted keys.
    it = iter(SCRIPT)
    seen, scorer = _seen_scorer()
    value = {"z": "last", "a": ["first", 1]}
    make(model=RunnableLambda(lambda _d: next(it)), scorer=scorer).invoke(value)
    assert set(seen) == {json.dumps(value, sort_keys=True, ensure_ascii=False)}


@pytest.mark.parametrize("bad", [5, None, 2.5, b"bytes", [5], object()])
def test_unsupported_inputs_are_type_errors_naming_input(bad: Any) -> None:
    model = ScriptedChatModel(script=SCRIPT)
    r = make(model=model)
    with pytest.raises(TypeError, match=r"^input must be .*" + type(bad).__name__):
        r.invoke(bad)
    with pytest.raises(TypeError, match=r"^input must be"):
        list(r.stream(bad))
    with pytest.raises(TypeError, match=r"^input must be"):
        asyncio.run(r.ainvoke(bad))
    assert model._calls == 0


def test_batch_with_a_bad_input() -> None:
    model = ScriptedChatModel(script=SCRIPT)
    with pytest.raises(TypeError, match=r"^input must be"):
        make(model=model).batch(["q", 5])
    assert model._calls == 0  # failed before sampling anything
    out = make(model=model).batch(["q", 5, "q"], return_exceptions=True)
    assert isinstance(out[1], TypeError) and "input" in str(out[1])
    assert isinstance(out[0], AIMessage) and isinstance(out[2], AIMessage)
    charged = [m.response_metadata["beacon"]["n_samples"] for m in (out[0], out[2])]
    assert model._calls == sum(charged)  # only the two good inputs were sampled


def test_numeric_fields_validated_at_construction_numpy_accepted() -> None:
    for bad in (float("nan"), 0, -1.0, "5", True):
        with pytest.raises(ValidationError, match="timeout"):
            make(timeout=bad)
    r = make(timeout=np.float32(2.5), max_concurrency=np.int64(4))
    assert type(r.timeout) is float and r.timeout == 2.5
    assert type(r.max_concurrency) is int and r.max_concurrency == 4
    check_choice(r.invoke("q"), SCRIPT, CFG)
    for bad in (np.int64(0), 2.0, True):
        with pytest.raises(ValidationError, match="max_concurrency"):
            make(max_concurrency=bad)


async def test_call_max_concurrency_zero_is_an_error_none_keeps_the_field() -> None:
    for bad in (0, -1, 1.5):
        model = ScriptedChatModel(script=SCRIPT)
        with pytest.raises(beacon.ConfigError, match="max_concurrency") as ei:
            await make(model=model).ainvoke("q", {"max_concurrency": bad})
        assert ei.value.value == bad and model._calls == 0
    model = ScriptedChatModel(script=SCRIPT, delay=0.01)
    cfg = CFG.replace(batch_size=4)
    await make(model=model, config=cfg, max_concurrency=2).abatch(
        ["q1", "q2"], {"max_concurrency": None}
    )
    assert model._peak == 2
    model = ScriptedChatModel(script=SCRIPT, delay=0.01)
    await make(model=model, config=cfg).abatch(["q1", "q2"], {"max_concurrency": np.int64(3)})
    assert model._peak == 3


@pytest.mark.parametrize("shape", [np.array, lambda v: (x for x in v), tuple])
def test_batched_scorer_may_return_any_sequence_like_the_engine(shape: Any) -> None:
    def many(prompt: str, texts: list[str]) -> Any:
        return shape([REWARDS[t] for t in texts])

    cfg = CFG.replace(batch_size=2)
    res = make(scorer=BatchScorer(many), config=cfg, return_result=True).invoke("q")
    it = iter(SCRIPT)
    core = BeaconSampler(lambda p: next(it), BatchScorer(many), cfg).run("q")  # the reference
    assert res.best is not None and core.best is not None and res.n_failed == 0
    assert [c.reward for c in res.candidates] == [c.reward for c in core.candidates]
    assert res.best.text == core.best.text


@pytest.mark.parametrize("out", [{0: 1.0, 1: 2.0}, None, "0.1", 3.0])
def test_batched_scorer_returning_no_sequence_fails_samples_with_a_typed_error(out: Any) -> None:
    r = make(scorer=BatchScorer(lambda p, ts: out), config=CFG.replace(max_failures=1),
             return_result=True)
    res = r.invoke("q")
    assert res.best is None and res.stop_reason == "error"
    assert res.error is not None and "sequence of" in res.error
    assert type(out).__name__ in res.error


def test_configurable_fields_of_model_and_scorer_are_the_runnables_config_specs() -> None:
    from langchain_core.runnables import ConfigurableField

    model = ScriptedChatModel(script=SCRIPT).configurable_alternatives(
        ConfigurableField(id="which_model"), default_key="scripted",
        best=ScriptedChatModel(script=["d"]),
    )
    from langchain_core.prompts import PromptTemplate

    judge = PromptTemplate.from_template("{response}").configurable_fields(
        template=ConfigurableField(id="judge_name")
    ) | RunnableLambda(lambda pv: REWARDS[pv.to_string()])
    r = BeaconRunnable(model=model, scorer=judge, config=CFG)
    assert {s.id for s in r.config_specs} == {"which_model", "judge_name"}
    schema = r.config_schema().model_json_schema()
    assert "which_model" in json.dumps(schema) and "judge_name" in json.dumps(schema)
    chain = ChatPromptTemplate.from_template("{q}") | r  # a chain lists them too
    assert {"which_model", "judge_name"} <= {s.id for s in chain.config_specs}
    # and the configuration reaches the model
    out = r.invoke("q", {"configurable": {"which_model": "best"}})
    assert out.content == "d" and out.response_metadata["beacon"]["rewards"][0] == 0.9


def test_a_configurable_beacon_config_has_a_json_schema_and_takes_a_dict() -> None:
    # configurable_fields(config=...) worked when invoked, but config_schema() (what the
    # LangServe playground reads) raised: BeaconConfig had no JSON schema.
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.runnables import ConfigurableField

    r = BeaconRunnable(
        model=FakeListChatModel(responses=["a", "bb", "ccc", "dd", "e"]),
        scorer=lambda p, t: float(len(t)),
        config=BeaconConfig(cost=0.5, horizon=5),
    ).configurable_fields(config=ConfigurableField(id="beacon_config"))
    schema = r.config_schema().model_json_schema()
    prop = schema["$defs"]["Configurable"]["properties"]["beacon_config"]
    assert prop["default"] == BeaconConfig(cost=0.5, horizon=5).to_dict()
    assert {"cost", "horizon", "family"} <= set(prop["properties"])
    out = r.invoke("q", config={"configurable": {"beacon_config": {"cost": 0.5, "horizon": 4}}})
    assert out.response_metadata["beacon"]["n_samples"] <= 4
