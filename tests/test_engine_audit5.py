"""BeaconSampler audit 5: prompt-cache tokens in token and money accounting, and engine edges.

The usage classes below have the fields of the Anthropic SDK's ``Usage`` (the SDK is not
installed here): ``input_tokens`` there counts only the prompt tokens not read from or written
to the prompt cache, which it reports apart.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import beacon
from beacon.budget import Budget
from beacon.engine import BeaconSampler, Generation
from beacon.engine.protocol import coerce_generation
from beacon.retry import RetryPolicy


@dataclass
class TextBlock:
    text: str
    type: str = "text"


@dataclass
class CachedUsage:
    """anthropic.types.Usage with prompt caching."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


@dataclass
class AnthropicMessage:
    content: list[Any]
    usage: CachedUsage
    role: str = "assistant"


def _cfg(**kw: Any) -> beacon.BeaconConfig:
    return beacon.BeaconConfig(**{"cost": 0.05, "horizon": 6, "family": "normal", **kw})


def _scorer() -> Any:
    n = [0]

    def score(prompt: Any, text: str) -> float:
        n[0] += 1
        return float(n[0] % 3)

    return score


# -- 1. prompt cache tokens ------------------------------------------------------------------
def test_an_anthropic_message_counts_its_cache_read_and_write_tokens_as_input() -> None:
    # Before: only usage.input_tokens (the uncached 10) was counted; the 2,000 tokens read
    # from the cache and the 300 written to it were processed and billed, but escaped.
    msg = AnthropicMessage([TextBlock("ok")], CachedUsage(10, 7, 300, 2000))
    gen = coerce_generation(msg)
    assert gen.input_tokens == 10 + 300 + 2000
    assert gen.output_tokens == 7
    assert (gen.cache_read_tokens, gen.cache_write_tokens) == (2000, 300)


def test_an_anthropic_message_without_cache_fields_is_read_as_before() -> None:
    gen = coerce_generation(AnthropicMessage([TextBlock("ok")], CachedUsage(10, 7)))
    assert (gen.input_tokens, gen.output_tokens) == (10, 7)
    assert (gen.cache_read_tokens, gen.cache_write_tokens) == (None, None)


def test_langchain_and_openai_cache_details_split_without_double_counting() -> None:
    # LangChain's usage_metadata and OpenAI's prompt_tokens already include cached tokens.
    class AIMessage:
        content = "ok"
        usage_metadata: ClassVar[dict[str, Any]] = {
            "input_tokens": 2310, "output_tokens": 7, "total_tokens": 2317,
            "input_token_details": {"cache_read": 2000, "cache_creation": 300},
        }

    gen = coerce_generation(AIMessage())
    assert (gen.input_tokens, gen.cache_read_tokens, gen.cache_write_tokens) == (2310, 2000, 300)

    class Msg:
        content = "ok"

    class Choice:
        message = Msg()

    class Completion:
        choices: ClassVar[list[Any]] = [Choice()]
        usage: ClassVar[dict[str, Any]] = {"prompt_tokens": 2010, "completion_tokens": 7,
                 "prompt_tokens_details": {"cached_tokens": 2000}}

    gen = coerce_generation(Completion())
    assert (gen.input_tokens, gen.cache_read_tokens, gen.cache_write_tokens) == (2010, 2000, None)


async def test_max_tokens_counts_cached_input_tokens() -> None:
    # Each call processes 2,310 input tokens (2,300 of them cached) + 7 output: a cap of 5,000
    # tokens is reached by the third sample. Before, each call counted 17 tokens and the
    # query ran to its stopping rule (far past the cap).
    async def gen(prompt: Any) -> AnthropicMessage:
        await asyncio.sleep(0)
        return AnthropicMessage([TextBlock("ok")], CachedUsage(10, 7, 300, 2000))

    s = BeaconSampler(gen, _scorer(), _cfg(horizon=20, cost=1e-6),
                      retry=RetryPolicy.none(), budget=Budget(max_tokens=5000))
    res = await s.arun("q")
    assert res.stop_reason == "budget"
    assert len(res.candidates) == 3
    assert res.usage.input_tokens == 3 * 2310
    assert res.budget_unenforced == []


async def test_cache_tokens_are_priced_at_their_own_prices() -> None:
    async def gen(prompt: Any) -> AnthropicMessage:
        await asyncio.sleep(0)
        return AnthropicMessage([TextBlock("ok")], CachedUsage(10, 7, 300, 2000))

    budget = Budget(price_per_input_token=1.0, price_per_output_token=5.0,
                    price_per_cache_read_token=0.1, price_per_cache_write_token=1.25)
    s = BeaconSampler(gen, _scorer(), _cfg(), retry=RetryPolicy.none(), budget=budget)
    res = await s.arun("q")
    per_call = 10 * 1.0 + 7 * 5.0 + 2000 * 0.1 + 300 * 1.25
    for c in res.candidates:
        assert c.usage.cost == pytest.approx(per_call)
    # without cache prices, cached tokens are priced as input tokens
    plain = Budget(price_per_input_token=1.0, price_per_output_token=5.0)
    assert plain.price(2310, 7, 2000, 300) == pytest.approx(2310 + 35)


def test_budget_cache_prices_round_trip_and_are_checked() -> None:
    b = Budget(max_cost=1.0, price_per_cache_read_token=0.1)
    assert Budget.from_dict(b.to_dict()) == b
    assert "price_per_cache_write_token" not in b.to_dict()  # unset: the dict as before
    with pytest.raises(beacon.ConfigError, match="price_per_cache_read_token"):
        Budget(price_per_cache_read_token=-1.0)


def test_generation_cache_counts_must_be_part_of_its_input_tokens() -> None:
    with pytest.raises(beacon.ConfigError, match=r"Generation\.input_tokens"):
        Generation("x", input_tokens=10, cache_read_tokens=20)
    with pytest.raises(beacon.ConfigError, match=r"Generation\.cache_write_tokens"):
        Generation("x", input_tokens=10, cache_write_tokens=-1)
    assert Generation("x", input_tokens=30, cache_read_tokens=20).cache_read_tokens == 20


# -- 3. an asyncio Semaphore as the rate limiter, over successive run() calls ----------------
def test_an_asyncio_semaphore_rate_limiter_serves_successive_runs() -> None:
    # Before: the semaphore bound itself to the first run()'s loop when a call waited for it;
    # on every later run() each call that had to wait failed ("bound to a different event
    # loop") and the query ended with stop_reason="error".
    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0.001)
        return "ok"

    async def score(prompt: Any, text: str) -> float:
        await asyncio.sleep(0.001)
        return 1.0

    sem = asyncio.Semaphore(2)
    s = BeaconSampler(gen, score, _cfg(horizon=8, batch_size=4), rate_limiter=sem,
                      retry=RetryPolicy.none())
    for _ in range(3):
        res = s.run("q")
        assert res.error is None and res.n_failed == 0, res.error
        assert res.n_samples > 2

    async def inside_a_loop() -> beacon.BeaconResult:  # Jupyter: run() from a running loop
        return s.run("q")

    res = asyncio.run(inside_a_loop())
    assert res.error is None and res.n_failed == 0, res.error
    res = asyncio.run(s.arun("q"))
    assert res.error is None and res.n_failed == 0, res.error
    assert sem._value == 2  # every permit given back


# -- 3. an OpenAI Responses API Response returned as it is ------------------------------------
@dataclass
class ResponsesUsage:
    """openai.types.responses.ResponseUsage."""

    input_tokens: int
    output_tokens: int
    input_tokens_details: dict[str, int]


@dataclass
class FunctionCallItem:
    name: str
    arguments: str
    type: str = "function_call"


@dataclass
class Response:
    """openai.types.responses.Response (output_text is a property there)."""

    output_text: str
    usage: ResponsesUsage
    output: list[Any]
    text: dict[str, Any] | None = None  # its text *format* config, not the answer


async def test_an_openai_responses_api_response_is_scored_on_its_output_text() -> None:
    # Before: every sample failed with "TypeError: generate must return str, Generation, or
    # a message/response with text content; got Response".
    seen: list[str] = []

    async def gen(prompt: Any) -> Response:
        await asyncio.sleep(0)
        return Response("It is 4.", ResponsesUsage(1200, 9, {"cached_tokens": 1024}), [],
                        text={"format": {"type": "text"}})

    def score(prompt: Any, text: str) -> float:
        seen.append(text)
        return float(len(seen) % 3)

    s = BeaconSampler(gen, score, _cfg(), retry=RetryPolicy.none(),
                      budget=Budget(max_tokens=100_000))
    res = await s.arun("2+2?")
    assert res.error is None and res.n_failed == 0 and res.n_samples >= 3
    assert seen == ["It is 4."] * len(seen)
    assert res.usage.input_tokens == 1200 * len(res.candidates)  # cached ones are part of it
    assert res.budget_unenforced == []
    gen_ = coerce_generation(res.candidates[0].raw)
    assert (gen_.cache_read_tokens, gen_.cache_write_tokens) == (1024, None)
    calls = Response("", ResponsesUsage(10, 3, {}), [FunctionCallItem("add", '{"a": 2}')])
    assert coerce_generation(calls).text == '[{"args": {"a": 2}, "name": "add"}]'


# -- 3. network failures of httpx and the model SDKs are retried ------------------------------
def _sdk_errors(package: str) -> tuple[type[Exception], type[Exception]]:
    """``(APIConnectionError, APITimeoutError)`` shaped as ``package``'s (openai / anthropic:
    ``APIError(Exception)`` at the root, defined in ``package._exceptions``)."""
    ns = {"__module__": f"{package}._exceptions"}
    api_error = type("APIError", (Exception,), ns)
    conn = type("APIConnectionError", (api_error,), ns)
    return conn, type("APITimeoutError", (conn,), ns)


def test_httpx_and_sdk_connection_errors_are_retryable() -> None:
    # Before: none of these is an OSError, so a dropped connection or a read timeout raised by
    # httpx, or by the OpenAI / Anthropic SDKs around it, failed its sample at once.
    import httpx

    from beacon.retry import is_retryable

    req = httpx.Request("POST", "https://api.example/v1")
    for exc in (httpx.ConnectError("refused", request=req), httpx.ReadTimeout("slow"),
                httpx.RemoteProtocolError("server disconnected"), httpx.PoolTimeout("pool")):
        assert is_retryable(exc), exc
    for package in ("openai", "anthropic"):
        for cls in _sdk_errors(package):
            assert is_retryable(cls("Connection error.")), cls
    # not transient: a malformed request, an invalid URL, another package's same-named class
    assert not is_retryable(httpx.LocalProtocolError("bad request line"))
    assert not is_retryable(httpx.InvalidURL("no scheme"))
    other = type("APIConnectionError", (Exception,), {"__module__": "mylib.errors"})
    assert not is_retryable(other("x"))


async def test_a_model_call_failing_with_an_sdk_connection_error_is_retried() -> None:
    conn, timeout = _sdk_errors("anthropic")
    fails = [conn("Connection error."), timeout("Request timed out.")]

    async def gen(prompt: Any) -> str:
        await asyncio.sleep(0)
        if fails:
            raise fails.pop(0)
        return "ok"

    s = BeaconSampler(gen, _scorer(), _cfg(), retry=RetryPolicy(max_attempts=3, base_delay=0))
    res = await s.arun("q")
    assert res.n_failed == 0 and res.error is None
    assert res.usage.failed_calls == 2 and res.usage.retries == 2


def test_an_openai_refusal_is_scored_on_its_refusal_text() -> None:
    # Before: a refused completion (content None, refusal set) became the text "", so the
    # candidate showed an empty answer and the scorer judged an empty string.
    class Message:
        content = None
        refusal = "I'm sorry, I can't help with that."
        tool_calls = None

    class Choice:
        message = Message()

    class Completion:
        choices: ClassVar[list[Any]] = [Choice()]
        usage: ClassVar[dict[str, int]] = {"prompt_tokens": 20, "completion_tokens": 9}

    gen = coerce_generation(Completion())
    assert gen.text == "I'm sorry, I can't help with that."
    assert (gen.input_tokens, gen.output_tokens) == (20, 9)
