"""Integrations audit (5): the LlamaIndex prompt is formatted once per query, an LLM's
output parser parses its replies, and the tokens its responses report are counted; a
LangChain chain ending in a parsing output parser is a model, a reasoning judge's content
blocks are read, and a two-argument RunnableLambda scorer is refused at construction; HTTP
scorer headers and timeouts; see each test.

LlamaIndex's own fake LLMs (``CustomLLM``) and LangChain's fake chat models; HTTP scorers
against a real aiohttp server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import BaseOutputParser
from pydantic import BaseModel, ValidationError
from test_llama_audit3 import RecordingChatLLM
from test_llama_index import CFG, SCRIPT, ScriptedLLM, best_of, table_scorer

from beacon import BeaconConfig, Budget, ConfigError, RewardError
from beacon.result import BeaconResult
from beacon_integrations._adapt import to_reward
from beacon_integrations.langchain import BeaconRunnable
from beacon_integrations.llama_index import BeaconQueryEngine, BeaconQueryTransform
from beacon_integrations.scorers import HttpRewardScorer, RewardTimeoutError

Q = "capital?"


def _counting_template(text: str) -> tuple[PromptTemplate, list[int]]:
    """A template whose ``{shots}`` comes from a function mapping counting its calls: one call
    per formatting of the prompt."""
    calls: list[int] = []

    def shots(**kwargs: Any) -> str:
        calls.append(1)
        return "Example: 2+2=4\n"

    return PromptTemplate(text, function_mappings={"shots": shots}), calls


# -- 1. one prompt formatting per query ---------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True])
def test_query_engine_formats_the_prompt_once_per_query(chat: bool) -> None:
    # Every sample of a query gets the same prompt, yet it was formatted again for each
    # sample (and once more, as a plain string that an LLM never received).
    template, calls = _counting_template("{shots}Q: {query_str}\nA:")
    llm: Any = RecordingChatLLM(script=SCRIPT) if chat else ScriptedLLM(script=SCRIPT)
    engine = BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template)
    resp = engine.query(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    assert resp.metadata["n_samples"] == n > 1
    assert len(calls) == 1
    sent = llm._calls if chat else llm._prompts
    assert len(sent) == n
    assert all(s == sent[0] for s in sent)  # the same prompt for every sample
    assert "Example: 2+2=4" in str(sent[0])

    engine.query(Q)  # a new query formats its own prompt
    assert len(calls) == 2


def test_query_transform_formats_the_prompt_once_per_query() -> None:
    template, calls = _counting_template("{shots}Rewrite: {query_str}\nRewritten: ")
    llm = ScriptedLLM(script=SCRIPT)
    transform = BeaconQueryTransform(llm, table_scorer, CFG, prompt=template)
    out = transform.run(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert out.query_str == best
    assert len(llm._prompts) == n > 1
    assert len(calls) == 1


def test_a_template_that_cannot_be_formatted_fails_the_query_before_any_sample() -> None:
    # Formatting happens once, before sampling: its own error reaches the caller, and no
    # model call is made (it is not turned into one failed sample after another).
    def broken(**kwargs: Any) -> str:
        raise LookupError("no examples for this query")

    llm = ScriptedLLM(script=SCRIPT)
    template = PromptTemplate("{shots}Q: {query_str}", function_mappings={"shots": broken})
    engine = BeaconQueryEngine(table_scorer, CFG, llm=llm, prompt_template=template)
    with pytest.raises(LookupError, match="no examples"):
        engine.query(Q)
    transform = BeaconQueryTransform(llm, table_scorer, CFG, prompt=template)
    with pytest.raises(LookupError, match="no examples"):
        transform.run(Q)
    assert llm._prompts == []


class EditingChatLLM(RecordingChatLLM):
    """A chat LLM that edits the message list it is given (as some clients trim or append)."""

    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        resp = self.chat(messages, **kwargs)
        messages.append(ChatMessage(role=MessageRole.ASSISTANT, content="edited"))
        return resp


def test_a_chat_llm_editing_its_messages_does_not_change_the_next_samples_prompt() -> None:
    # The messages are made once per query: each sample still gets a list of its own.
    llm = EditingChatLLM(script=SCRIPT)
    resp = BeaconQueryEngine(table_scorer, CFG, llm=llm).query(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    assert len(llm._calls) == n > 1
    assert all(c == [("user", Q)] for c in llm._calls)


class AnswerParser(BaseOutputParser):
    """Asks for ``ANSWER: <text>`` and parses the text out (a reply without it is an error)."""

    def format(self, query: str) -> str:
        return query + "\nReply as ANSWER: <answer>"

    def parse(self, output: str) -> Any:
        _head, sep, answer = output.partition("ANSWER: ")
        if not sep:
            raise ValueError(f"no ANSWER in {output!r}")
        return answer.strip()


def test_the_llms_output_parser_parses_every_sample_as_predict_does() -> None:
    # The parser's format instructions were sent (the prompt is formatted as LLM.predict
    # formats it) but its parse() was never applied: the scorer and the Response got the raw
    # "ANSWER: d" where predict returns "d".
    llm = ScriptedLLM(script=[f"ANSWER: {t}" for t in SCRIPT], output_parser=AnswerParser())
    resp = BeaconQueryEngine(table_scorer, CFG, llm=llm).query(Q)
    best, n, _ = best_of(SCRIPT, CFG)
    assert resp.response == best
    assert resp.metadata["candidates"] == SCRIPT[:n]
    assert all(p.endswith("Reply as ANSWER: <answer>") for p in llm._prompts)

    reference = ScriptedLLM(script=["ANSWER: d"], output_parser=AnswerParser())
    assert reference.predict(PromptTemplate("{query_str}"), query_str=Q) == "d"


def test_a_reply_the_output_parser_rejects_fails_its_sample_alone() -> None:
    script = ["ANSWER: a", "no answer here", "ANSWER: d", "ANSWER: b", "ANSWER: c"]
    llm = ScriptedLLM(script=script, output_parser=AnswerParser())
    transform = BeaconQueryTransform(llm, table_scorer, CFG)
    bundle, res = asyncio.run(transform.arun_with_result(Q))
    assert bundle.query_str == "d"
    failed = [c for c in res.candidates if c.failed]
    assert failed and failed[0].index == 1
    assert all(c.error is not None and "no ANSWER" in c.error for c in failed)
    assert [c.text for c in res.candidates if not c.failed][:4] == ["a", "d", "b", "c"]


class TokenLLM(ScriptedLLM):
    """Completion LLM reporting its tokens as LlamaIndex's OpenAI LLM does: ``additional_kwargs``
    (``where="kwargs"``) or only in the provider's raw response dict (``where="raw"``)."""

    where: str = "kwargs"

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        resp = self.complete(prompt, formatted=formatted)
        usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        if self.where == "kwargs":
            resp.additional_kwargs = dict(usage)
        else:
            resp.raw = {"id": "x", "usage": usage}
        return resp


class TokenChatLLM(RecordingChatLLM):
    async def achat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        resp = self.chat(messages, **kwargs)
        resp.additional_kwargs = {"prompt_tokens": 12, "completion_tokens": 5}
        return resp


@pytest.mark.parametrize("kind", ["kwargs", "raw", "chat"])
def test_tokens_a_llama_index_llm_reports_are_counted_and_a_token_budget_holds(
    kind: str,
) -> None:
    # LlamaIndex LLMs report tokens in additional_kwargs (or the raw response); none was read:
    # usage said None tokens and a Budget(max_tokens=...) was never enforced (only warned).
    llm: Any = (
        TokenChatLLM(script=SCRIPT) if kind == "chat" else TokenLLM(script=SCRIPT, where=kind)
    )
    engine = BeaconQueryEngine(table_scorer, CFG, llm=llm, budget=Budget(max_tokens=10_000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a BudgetNotEnforcedWarning would fail the test
        resp = engine.query(Q)
    n = resp.metadata["n_samples"]
    assert n == best_of(SCRIPT, CFG)[1]
    assert resp.metadata["usage"]["input_tokens"] == 12 * n
    assert resp.metadata["usage"]["output_tokens"] == 5 * n

    # a cap the query crosses stops it: 17 tokens a sample, 40 crossed at the third sample
    capped = BeaconQueryEngine(
        table_scorer,
        CFG,
        llm=TokenLLM(script=SCRIPT),
        budget=Budget(max_tokens=40),
        max_concurrency=1,
    )
    res = asyncio.run(capped.arun(Q))
    assert res.stop_reason == "budget" and res.budget_unenforced == []
    assert res.n_samples == 3


# -- 2. LangChain: a chain ending in a parsing output parser ------------------------------------

ANSWERS = [
    '{"answer": "Lyon", "confidence": 0.2}',
    '{"answer": "Paris", "confidence": 0.9}',
    '{"answer": "Nice", "confidence": 0.4}',
    '{"answer": "Rome", "confidence": 0.1}',
]
CONFIDENCES = [0.2, 0.9, 0.4, 0.1]
LC_CFG = BeaconConfig(cost=0.01, horizon=4, family="normal")
PROMPT = ChatPromptTemplate.from_messages([("human", "{question}")])


class Answer(BaseModel):
    answer: str
    confidence: float


def confidence(prompt: str, response: str) -> float:
    """Reward: the confidence the JSON answer states (it must be JSON to be read)."""
    return float(json.loads(response)["confidence"])


def test_a_chain_ending_in_a_json_output_parser_is_a_model() -> None:
    # Every sample failed with "generate must return str, Generation, or a message": a dict
    # is no message, so BeaconSamplingError for any chain ending in JsonOutputParser.
    chat = FakeListChatModel(responses=ANSWERS)
    runnable = BeaconRunnable(
        model=PROMPT | chat | JsonOutputParser(),
        scorer=confidence,
        config=LC_CFG,
        return_result=True,
    )
    res = runnable.invoke({"question": "capital of France?"})
    assert isinstance(res, BeaconResult)
    assert res.error is None and res.n_failed == 0
    assert res.n_samples >= 3
    assert [c.reward for c in res.candidates] == CONFIDENCES[: res.n_samples]
    assert res.best is not None
    assert res.best.raw == {"answer": "Paris", "confidence": 0.9}  # the parsed object
    assert json.loads(res.best.text) == res.best.raw


def test_a_chain_ending_in_a_pydantic_output_parser_is_a_model() -> None:
    chat = FakeListChatModel(responses=ANSWERS)
    parser = PydanticOutputParser(pydantic_object=Answer)
    runnable = BeaconRunnable(model=PROMPT | chat | parser, scorer=confidence, config=LC_CFG)
    msg = runnable.invoke({"question": "capital of France?"})
    assert isinstance(msg, AIMessage)
    assert Answer.model_validate_json(msg.text) == Answer(answer="Paris", confidence=0.9)
    rewards = msg.response_metadata["beacon"]["rewards"]
    assert len(rewards) >= 3 and rewards == CONFIDENCES[: len(rewards)]


def test_a_model_output_that_is_neither_text_nor_parsed_still_fails_its_sample() -> None:
    # None (what with_structured_output gives when the model calls no tool) is no answer.
    runnable = BeaconRunnable(
        model=lambda _x: None, scorer=confidence, config=LC_CFG, return_result=True
    )
    res = runnable.invoke("q")
    assert res.best is None
    assert res.error is not None and "TypeError" in res.error


# -- 2b. a judge whose reply is a list of content blocks ----------------------------------------

REASONING_REPLY = [
    {"type": "reasoning", "reasoning": "The answer is 42 words long, so 3 of 10?"},
    {"type": "text", "text": " 0.8 "},
]


def test_a_reasoning_judges_content_blocks_are_read_as_its_text() -> None:
    # A judge chat model with reasoning (Anthropic's thinking, OpenAI's Responses API) replies
    # with a list of content blocks; every such reward was "scorer must return a real number".
    judge = RunnableLambda(lambda _d: AIMessage(content=REASONING_REPLY))
    runnable = BeaconRunnable(
        model=FakeListChatModel(responses=["a", "b", "c", "d"]),
        scorer=judge,
        config=LC_CFG,
        return_result=True,
    )
    res = runnable.invoke("q")
    assert res.n_failed == 0 and res.n_samples >= 3
    assert all(c.reward == 0.8 for c in res.candidates)


def test_content_block_rewards_read_text_blocks_only() -> None:
    # dict blocks (LangChain) and block objects (vendor SDKs); other block kinds are ignored
    sdk_blocks = [
        SimpleNamespace(type="thinking", thinking="7?"),
        SimpleNamespace(type="text", text="0.25"),
    ]
    assert to_reward(AIMessage(content=REASONING_REPLY)) == 0.8
    assert to_reward(SimpleNamespace(content=sdk_blocks)) == 0.25
    with pytest.raises(RewardError, match="non-numeric string"):
        to_reward(AIMessage(content=[{"type": "reasoning", "reasoning": "0.5"}]))


def _two_args(prompt: str, response: str) -> float:
    return float(len(response))


def test_a_runnable_lambda_over_a_two_argument_scorer_is_refused_at_construction() -> None:
    # RunnableLambda(score) calls score with the one dict {"prompt", "response"}: every
    # sample failed with a TypeError, each after a paid model call.
    with pytest.raises(ValidationError, match=r"scorer.*2 arguments \(prompt, response\)"):
        BeaconRunnable(model=FakeListChatModel(responses=["a"]), scorer=RunnableLambda(_two_args))

    async def two_async(prompt: str, response: str) -> float:
        return 1.0

    with pytest.raises(ValidationError, match="pass the function itself"):
        BeaconRunnable(model=FakeListChatModel(responses=["a"]), scorer=RunnableLambda(two_async))

    # the function itself works; so does a one-dict function taking LangChain's config
    runnable = BeaconRunnable(
        model=FakeListChatModel(responses=["a", "bbb", "cc", "dddd"]),
        scorer=_two_args,
        config=LC_CFG,
    )
    assert runnable.invoke("q").content == "dddd"

    def with_config(d: dict[str, Any], config: Any) -> float:
        return float(len(d["response"]))

    runnable = BeaconRunnable(
        model=FakeListChatModel(responses=["a", "bbb", "cc", "dddd"]),
        scorer=RunnableLambda(with_config),
        config=LC_CFG,
    )
    assert runnable.invoke("q").content == "dddd"


# -- 3. HTTP scorer: headers and timeouts -------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[list[str]]]]:
    """``(base url, the Content-Type values of each request)``; ``/score`` answers at once,
    ``/slow`` after a second."""
    seen: list[list[str]] = []

    async def score(request: web.Request) -> web.Response:
        seen.append(request.headers.getall("Content-Type", []))
        body = await request.json()
        return web.json_response({"score": float(len(body["response"]))})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.json_response({"score": 1.0})

    app = web.Application()
    app.router.add_post("/score", score)
    app.router.add_post("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


@pytest.mark.parametrize("name", ["content-type", "CONTENT-TYPE", "Content-Type"])
async def test_a_content_type_header_in_any_case_replaces_the_default(
    server: tuple[str, list[list[str]]], name: str
) -> None:
    # "content-type" was sent next to the default "Content-Type": a duplicated header, which
    # the server refused with 400 (not retryable), failing every sample.
    url, seen = server
    ct = "application/json; charset=utf-8"
    async with HttpRewardScorer(url + "/score", headers={name: ct}) as s:
        assert await s("p", "abc") == 3.0
    assert seen == [[ct]]


async def test_the_default_content_type_is_json(server: tuple[str, list[list[str]]]) -> None:
    url, seen = server
    async with HttpRewardScorer(url + "/score", headers={"X-Trace": "1"}) as s:
        assert await s("p", "ab") == 2.0
    assert seen == [["application/json"]]


def test_header_names_differing_only_in_case_are_a_config_error() -> None:
    with pytest.raises(ConfigError) as ei:
        HttpRewardScorer("http://127.0.0.1:1/score", headers={"X-Key": "a", "x-key": "b"})
    assert ei.value.field == "headers" and ei.value.value == "x-key"
    assert "'X-Key'" in str(ei.value)


async def test_the_timeout_error_names_the_limit_that_ran_out(
    server: tuple[str, list[list[str]]],
) -> None:
    # The whole-request cap (total_timeout=0.2) ran out, but the error said "timed out after
    # 30.0s": the between-bytes limit, which had not.
    url, _ = server
    async with HttpRewardScorer(url + "/slow", timeout=30.0, total_timeout=0.2) as s:
        with pytest.raises(RewardTimeoutError) as ei:
            await s("p", "x")
    assert "total_timeout=0.2s" in str(ei.value) and "30.0" not in str(ei.value)

    async with HttpRewardScorer(url + "/slow", timeout=0.2, total_timeout=30.0) as s:
        with pytest.raises(RewardTimeoutError) as ei:
            await s("p", "x")
    assert "timed out after 0.2s" in str(ei.value) and "total_timeout" not in str(ei.value)
