"""BeaconSampler audit 4: the vendor SDKs' response objects returned as they are by ``generate``.

The classes below have the attributes of the Anthropic and OpenAI SDK responses (the SDKs are
not installed here); the engine reads them by duck typing, as it reads LangChain messages.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import beacon
from beacon.budget import Budget
from beacon.engine import BeaconSampler
from beacon.retry import RetryPolicy


# -- Anthropic SDK shapes (anthropic.types.Message and its content blocks) ---------------------
@dataclass
class TextBlock:
    text: str
    type: str = "text"


@dataclass
class ToolUseBlock:
    name: str
    input: dict[str, Any]
    id: str = "toolu_1"
    type: str = "tool_use"


@dataclass
class AnthropicUsage:
    input_tokens: int
    output_tokens: int


@dataclass
class AnthropicMessage:
    content: list[Any]
    usage: AnthropicUsage
    role: str = "assistant"
    stop_reason: str = "end_turn"


# -- OpenAI SDK shapes (openai.types.chat.ChatCompletion, completions.Completion) --------------
@dataclass
class Function:
    name: str
    arguments: str


@dataclass
class ToolCall:
    function: Function
    id: str = "call_1"
    type: str = "function"


@dataclass
class ChatMessage:
    content: str | None
    tool_calls: list[ToolCall] | None = None
    role: str = "assistant"


@dataclass
class ChatChoice:
    message: ChatMessage
    index: int = 0
    finish_reason: str = "stop"


@dataclass
class CompletionChoice:
    text: str
    index: int = 0


@dataclass
class CompletionUsage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int = 0


@dataclass
class ChatCompletion:
    choices: list[Any]
    usage: CompletionUsage | None = None
    model: str = "m"
    id: str = "chatcmpl-1"
    extra: dict[str, Any] = field(default_factory=dict)


def _sampler(gen: Any, seen: list[str], **kw: Any) -> BeaconSampler:
    def score(prompt: Any, text: str) -> float:
        seen.append(text)
        return float(len(seen) % 3)

    cfg = beacon.BeaconConfig(cost=0.05, horizon=6, family="normal")
    return BeaconSampler(gen, score, cfg, retry=RetryPolicy(max_attempts=1), **kw)


async def test_an_anthropic_message_is_scored_on_its_text_blocks_and_its_usage_counts() -> None:
    # Before: the text of block *objects* (TextBlock) was dropped, so every sample was scored
    # on "" without an error, and the message's usage was ignored (max_tokens unenforced).
    async def gen(prompt: Any) -> AnthropicMessage:
        await asyncio.sleep(0)
        return AnthropicMessage(
            [TextBlock("The answer "), TextBlock("is 4.")], AnthropicUsage(11, 5)
        )

    seen: list[str] = []
    res = await _sampler(gen, seen, budget=Budget(max_tokens=10_000)).arun("2+2?")
    assert res.error is None and res.n_failed == 0 and res.n_samples >= 3
    assert seen == ["The answer is 4."] * len(seen)
    assert all(c.text == "The answer is 4." for c in res.candidates)
    assert isinstance(res.candidates[0].raw, AnthropicMessage)
    assert res.usage.input_tokens == 11 * len(res.candidates)
    assert res.usage.output_tokens == 5 * len(res.candidates)
    assert res.budget_unenforced == []


async def test_an_anthropic_message_that_only_uses_tools_is_scored_on_its_calls() -> None:
    # Before: a reply of tool_use blocks alone was scored as "" (the calls were lost).
    async def gen(prompt: Any) -> AnthropicMessage:
        await asyncio.sleep(0)
        return AnthropicMessage(
            [ToolUseBlock("lookup", {"q": "x"})], AnthropicUsage(3, 2)
        )

    seen: list[str] = []
    res = await _sampler(gen, seen).arun("q")
    assert res.error is None and seen
    assert all(json.loads(t) == [{"name": "lookup", "args": {"q": "x"}}] for t in seen)


async def test_an_openai_chat_completion_is_scored_on_its_first_choice_with_its_usage() -> None:
    # Before: every sample failed ("generate must return str, Generation, ...; got
    # ChatCompletion"), and the query stopped with "error".
    async def gen(prompt: Any) -> ChatCompletion:
        await asyncio.sleep(0)
        return ChatCompletion(
            [ChatChoice(ChatMessage("first")), ChatChoice(ChatMessage("second"), index=1)],
            CompletionUsage(prompt_tokens=9, completion_tokens=4, total_tokens=13),
        )

    seen: list[str] = []
    res = await _sampler(
        gen, seen,
        budget=Budget(max_cost=1e6, price_per_input_token=0.5, price_per_output_token=1.0),
    ).arun("q")
    assert res.error is None and res.n_failed == 0
    assert seen == ["first"] * len(seen)
    n = len(res.candidates)
    assert res.usage.input_tokens == 9 * n and res.usage.output_tokens == 4 * n
    assert res.usage.cost == sum(c.usage.cost or 0.0 for c in res.candidates)
    assert res.candidates[0].usage.cost == 9 * 0.5 + 4 * 1.0
    assert res.budget_unenforced == []


async def test_openai_tool_calls_and_legacy_completions_are_read() -> None:
    async def tools(prompt: Any) -> ChatCompletion:
        await asyncio.sleep(0)
        calls = [ToolCall(Function("lookup", '{"q": "x"}')), ToolCall(Function("f", "not json"))]
        return ChatCompletion([ChatChoice(ChatMessage(None, calls))])

    seen: list[str] = []
    res = await _sampler(tools, seen).arun("q")
    assert res.error is None and seen
    assert json.loads(seen[0]) == [
        {"name": "lookup", "args": {"q": "x"}}, {"name": "f", "args": "not json"},
    ]

    def legacy(prompt: Any) -> ChatCompletion:
        return ChatCompletion([CompletionChoice("plain")], CompletionUsage(2, 1))

    seen = []
    res = await _sampler(legacy, seen).arun("q")
    assert res.error is None and set(seen) == {"plain"}
    assert res.usage.output_tokens == len(res.candidates)


async def test_a_completion_with_no_choices_fails_its_sample_saying_so() -> None:
    def empty(prompt: Any) -> ChatCompletion:
        return ChatCompletion([])

    res = await _sampler(empty, []).arun("q")
    assert res.stop_reason == "error" and res.n_samples == 0
    assert all(
        c.failed and c.error == "TypeError: model response ChatCompletion has no choices"
        for c in res.candidates
    )
