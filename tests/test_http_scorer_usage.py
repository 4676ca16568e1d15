"""HttpRewardScorer reporting what the reward endpoint billed (``usage``), against a real aiohttp
server on 127.0.0.1 (random port), through the engine's Usage and Budget."""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

import beacon
from beacon.engine import BeaconSampler
from beacon.engine.calls import SPEND_ATTR
from beacon.retry import RetryPolicy
from beacon_integrations.scorers import HttpRewardScorer, RewardResponseError, UsageWarning


class Server:
    """Records every request; answers per the settings below, with token counts derived from
    the request (so each test computes what should be counted from what was sent)."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[Any]] = {}
        self.url = ""
        self.content = "reward:{n}"  # the chat answer's text; {n} = the response's length
        self.usage: Any = "openai"  # "openai", "none" (no usage key), or a raw usage value
        self.answer: Any = None  # what /answer answers: a JSON value, or f(request body)

    def record(self, name: str, body: Any) -> None:
        self.bodies.setdefault(name, []).append(body)


def chat_usage(body: Any) -> dict[str, Any]:
    """The usage /v1/chat/completions reports for a request: input tokens from the request's
    length, a few completion tokens, a cached part of the prompt."""
    text = json.dumps(body["messages"])
    return {
        "prompt_tokens": len(text),
        "completion_tokens": 3,
        "total_tokens": len(text) + 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def batch_usage(body: Any) -> dict[str, int]:
    """Anthropic-style usage /batch reports for one call over all its responses."""
    return {"input_tokens": 5 * len(body["responses"]) + 1, "output_tokens": 2}


def make_app(srv: Server) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("chat", body)
        n = len(body["messages"][-1]["content"])
        doc: dict[str, Any] = {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": srv.content.format(n=n)}}
            ]
        }
        if srv.usage == "openai":
            doc["usage"] = chat_usage(body)
        elif srv.usage != "none":
            doc["usage"] = srv.usage
        return web.json_response(doc)

    async def batch(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("batch", body)
        return web.json_response(
            {
                "scores": [float(len(r)) for r in body["responses"]],
                "meta": {"usage": batch_usage(body)},
            }
        )

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("answer", body)
        return web.json_response(srv.answer(body) if callable(srv.answer) else srv.answer)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/batch", batch)
    app.router.add_post("/answer", answer)
    return app


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    runner = web.AppRunner(make_app(srv))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    await runner.cleanup()


def texts() -> Any:
    """A model whose answers differ in length (so the judge's counts differ per sample)."""
    n = iter(range(1000))

    async def gen(p: Any) -> str:
        return "x" * (1 + next(n) % 7)

    return gen


async def test_openai_compatible_counts_the_judges_tokens(server: Server) -> None:
    cfg = beacon.BeaconConfig(cost=0.5, horizon=6)
    budget = beacon.Budget(price_per_input_token=0.001, price_per_output_token=0.01)
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        res = await BeaconSampler(texts(), s, cfg, budget=budget).arun("q")
    sent = server.bodies["chat"]
    assert len(sent) == res.n_samples == len(res.candidates) > 1
    want_in = sum(chat_usage(b)["prompt_tokens"] for b in sent)
    want_out = sum(chat_usage(b)["completion_tokens"] for b in sent)
    assert res.usage.score_input_tokens == want_in
    assert res.usage.score_output_tokens == want_out
    # no cost reported: priced by the budget's per-token prices, as a model response
    assert res.usage.score_cost == pytest.approx(0.001 * want_in + 0.01 * want_out)
    assert res.usage.input_tokens is None  # the policy model's own tokens stay apart
    # each sample carries its own call's spend, and the reward is still read
    for c, b in zip(res.candidates, sent, strict=True):
        assert c.usage.score_input_tokens == chat_usage(b)["prompt_tokens"]
        assert c.reward == float(len(c.text))


async def test_direct_call_returns_a_score_with_the_cache_reads(server: Server) -> None:
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        got = await s("q", "abcd")
        plain = await s.score("q", "abcd")  # the reward alone
    u = chat_usage(server.bodies["chat"][0])
    assert isinstance(got, beacon.Score)
    assert (got.reward, got.input_tokens, got.output_tokens, got.cost, got.cache_read_tokens) == (
        4.0,
        u["prompt_tokens"],
        u["completion_tokens"],
        None,
        4,
    )
    assert type(plain) is float and plain == 4.0


async def test_budget_max_tokens_binds_on_judge_tokens(server: Server) -> None:
    # The model reports 0 tokens: only the judge's tokens can reach the cap.
    def model() -> Any:
        inner = texts()

        async def gen(p: Any) -> beacon.Generation:
            return beacon.Generation(await inner(p), input_tokens=0, output_tokens=0)

        return gen

    cfg = beacon.BeaconConfig(cost=1e-6, horizon=40)
    budget = beacon.Budget(max_tokens=300)
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        res = await BeaconSampler(model(), s, cfg, budget=budget).arun("q")
    assert res.stop_reason == "budget" and res.n_samples < cfg.horizon
    assert res.usage.total_tokens >= 300 and res.usage.input_tokens == 0
    assert res.usage.total_tokens == (res.usage.score_input_tokens or 0) + (
        res.usage.score_output_tokens or 0
    )
    # the same run without usage is not stopped by the cap: the judge's tokens did it
    async with HttpRewardScorer.openai_compatible(
        server.url + "/v1", "rm", api_key_env=None, usage=None
    ) as s:
        blind = await BeaconSampler(model(), s, cfg, budget=budget).arun("q")
    assert blind.stop_reason != "budget" and blind.n_samples > res.n_samples
    assert blind.usage.score_input_tokens is None


async def test_batched_usage_is_counted_once_per_call(server: Server) -> None:
    cfg = beacon.BeaconConfig(cost=0.5, horizon=7, batch_size=3)
    async with HttpRewardScorer(
        server.url + "/batch", batched=True, score_path="scores", usage="meta.usage"
    ) as s:
        direct = await s("p", ["a", "bb", "ccc"])
        assert isinstance(direct[0], beacon.Score) and direct[0].reward == 1.0
        assert direct[1:] == [2.0, 3.0] and all(type(v) is float for v in direct[1:])
        assert direct[0].input_tokens == batch_usage(server.bodies["batch"][0])["input_tokens"]
        server.bodies.clear()
        res = await BeaconSampler(texts(), s, cfg).arun("q")
    calls = server.bodies["batch"]
    assert len(calls) >= 2 and any(len(b["responses"]) > 1 for b in calls)
    assert res.usage.score_calls == len(calls)
    assert res.usage.score_input_tokens == sum(batch_usage(b)["input_tokens"] for b in calls)
    assert res.usage.score_output_tokens == sum(batch_usage(b)["output_tokens"] for b in calls)
    # one sample per call carries it; the candidates' usages add up to the query's once
    carrying = [c for c in res.candidates if c.usage.score_input_tokens is not None]
    assert len(carrying) == len(calls)
    assert (
        sum(c.usage.score_output_tokens or 0 for c in res.candidates)
        == res.usage.score_output_tokens
    )


BAD_USAGE = [
    ({"prompt_tokens": -1, "completion_tokens": 2}, "usage.prompt_tokens", -1),
    ({"prompt_tokens": 1.5, "completion_tokens": 2}, "usage.prompt_tokens", 1.5),
    ({"prompt_tokens": 7, "completion_tokens": True}, "usage.completion_tokens", True),
    ({"prompt_tokens": "7", "completion_tokens": 2}, "usage.prompt_tokens", "7"),
    ({"prompt_tokens": 7, "completion_tokens": None}, "usage.completion_tokens", None),
    ({"prompt_tokens": 7}, "usage.completion_tokens", ["prompt_tokens"]),
    ({"total_tokens": 9}, "usage", ["total_tokens"]),
    (12, "usage", 12),
    (
        {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 5}},
        "usage.prompt_tokens_details.cached_tokens",
        5,
    ),
    (
        {
            "prompt_tokens": 3,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": -2},
        },
        "usage.prompt_tokens_details.cached_tokens",
        -2,
    ),
    (
        {
            "input_tokens": 3,
            "output_tokens": 1,
            "cache_creation_input_tokens": 2,
            "cache_creation": {"ephemeral_1h_input_tokens": 4},
        },
        "usage.cache_creation.ephemeral_1h_input_tokens",
        4,
    ),
]


@pytest.mark.parametrize(("usage", "field", "value"), BAD_USAGE)
async def test_malformed_usage_is_an_error_naming_the_field(
    server: Server, usage: Any, field: str, value: Any
) -> None:
    server.usage = usage
    async with HttpRewardScorer.openai_compatible(
        server.url + "/v1", "rm", api_key_env=None, usage="usage"
    ) as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("q", "abc")
        assert ei.value.path == field and ei.value.value == value
        assert repr(field) in str(ei.value) and repr(value) in str(ei.value)
        # under the engine: the sample fails with it (not retried), naming the field
        cfg = beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=0)
        res = await BeaconSampler(
            lambda p: "abc", s, cfg, retry=RetryPolicy(max_attempts=3, base_delay=0.001)
        ).arun("q")
    assert res.candidates[0].failed and field in (res.candidates[0].error or "")
    assert res.usage.retries == 0  # a malformed answer is not asked again


async def test_unreadable_reward_with_usage_still_counts_the_spend(server: Server) -> None:
    server.content = "I cannot rate this"
    cfg = beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=2)
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("q", "abc")
        spent = getattr(ei.value, SPEND_ATTR)
        assert spent.input_tokens == chat_usage(server.bodies["chat"][0])["prompt_tokens"]
        server.bodies.clear()
        res = await BeaconSampler(texts(), s, cfg, retry=RetryPolicy.none()).arun("q")
    sent = server.bodies["chat"]
    assert res.stop_reason == "error" and all(c.failed for c in res.candidates)
    assert "no number in the text" in (res.candidates[0].error or "")
    assert res.usage.score_input_tokens == sum(chat_usage(b)["prompt_tokens"] for b in sent)
    assert res.usage.score_output_tokens == 3 * len(sent)


async def test_failed_batch_with_usage_still_counts_the_spend(server: Server) -> None:
    server.answer = {"oops": [], "usage": {"prompt_tokens": 11, "completion_tokens": 0}}
    cfg = beacon.BeaconConfig(cost=0.5, horizon=4, batch_size=2, max_failures=1)
    async with HttpRewardScorer(
        server.url + "/answer", batched=True, score_path="scores", usage="usage"
    ) as s:
        res = await BeaconSampler(texts(), s, cfg, retry=RetryPolicy.none()).arun("q")
    n_calls = len(server.bodies["answer"])
    assert n_calls >= 1 and all(c.failed for c in res.candidates)
    assert res.usage.score_input_tokens == 11 * n_calls


async def test_invalid_score_in_a_batch_keeps_the_spend_on_its_error(server: Server) -> None:
    # the first response of every call has no valid score: its Score carries the error
    server.answer = lambda body: {
        "scores": [None] + [0.5] * (len(body["responses"]) - 1),
        "usage": {"input_tokens": 8, "output_tokens": 1},
    }
    async with HttpRewardScorer(
        server.url + "/answer", batched=True, score_path="scores", usage="usage"
    ) as s:
        got = await s("q", ["a", "b"])
        cfg = beacon.BeaconConfig(cost=0.5, horizon=6, batch_size=2, max_failures=6)
        res = await BeaconSampler(texts(), s, cfg).arun("q")
    assert isinstance(got[0], beacon.Score) and isinstance(got[0].reward, RewardResponseError)
    assert got[1] == 0.5
    batches = [b["responses"] for b in server.bodies["answer"][1:]]
    assert res.usage.score_input_tokens == 8 * len(batches)
    # the spend is counted on the failed sample, and only that sample fails
    failed = [c for c in res.candidates if c.failed]
    assert len(failed) == len(batches)
    assert all(c.usage.score_input_tokens == 8 and "scores[0]" in (c.error or "") for c in failed)
    assert sum(not c.failed for c in res.candidates) == sum(len(b) - 1 for b in batches) > 0


@pytest.mark.parametrize("usage", ["none", None])
async def test_answers_without_usage_are_unchanged(server: Server, usage: Any) -> None:
    server.usage = usage  # no "usage" key, or "usage": null
    cfg = beacon.BeaconConfig(cost=0.5, horizon=4)
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        got = await s("q", "abc")
        res = await BeaconSampler(texts(), s, cfg).arun("q")
    assert type(got) is float and got == 3.0
    assert res.usage.score_input_tokens is None and res.usage.score_cost is None
    assert all(c.reward == float(len(c.text)) for c in res.candidates)


async def test_usage_is_not_read_unless_asked(server: Server) -> None:
    # a plain scorer ignores the usage an answer holds (the default usage=None)
    server.answer = {"score": 0.25, "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    async with HttpRewardScorer(server.url + "/answer") as s:
        got = await s("q", "abc")
    assert type(got) is float and got == 0.25


async def test_anthropic_usage_adds_the_cache_to_the_input(server: Server) -> None:
    server.answer = {
        "score": 1.0,
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 20,
            "cache_creation_input_tokens": 30,
            "cache_creation": {"ephemeral_1h_input_tokens": 12},
        },
    }
    async with HttpRewardScorer(server.url + "/answer", usage="usage") as s:
        got = await s("q", "abc")
    assert isinstance(got, beacon.Score)
    assert (
        got.input_tokens,
        got.output_tokens,
        got.cache_read_tokens,
        got.cache_write_tokens,
        got.cache_write_1h_tokens,
    ) == (60, 5, 20, 30, 12)


async def test_usage_callable_may_report_money(server: Server) -> None:
    server.answer = {"score": 0.5, "billing": {"tokens": [7, 2], "usd": 0.125}}

    def spend(doc: Any) -> beacon.Score:
        b = doc["billing"]
        return beacon.Score(None, b["tokens"][0], b["tokens"][1], b["usd"])

    cfg = beacon.BeaconConfig(cost=0.5, horizon=4)
    async with HttpRewardScorer(server.url + "/answer", usage=spend) as s:
        res = await BeaconSampler(lambda p: "t", s, cfg).arun("q")
        by_mapping = HttpRewardScorer(
            server.url + "/answer", usage=lambda d: {"input_tokens": 1, "output_tokens": 1}
        )
        got = await by_mapping("q", "t")
        await by_mapping.aclose()
    n = len(server.bodies["answer"]) - 1
    assert res.usage.score_cost == pytest.approx(0.125 * n)
    assert res.usage.score_input_tokens == 7 * n
    assert isinstance(got, beacon.Score) and (got.input_tokens, got.output_tokens) == (1, 1)


async def test_usage_callable_returning_nonsense_names_usage(server: Server) -> None:
    server.answer = {"score": 0.5}
    async with HttpRewardScorer(server.url + "/answer", usage=lambda d: 42) as s:
        with pytest.raises(beacon.ConfigError, match="usage"):
            await s("q", "t")


async def test_vllm_score_usage_opt_in(server: Server) -> None:
    server.answer = {
        "data": [{"index": 0, "score": 0.75}],
        "usage": {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0},
    }
    async with HttpRewardScorer.vllm_score(
        server.url, "m", batched=False, path="/answer", usage="usage"
    ) as s:
        got = await s("q", "t")
    assert isinstance(got, beacon.Score) and (got.reward, got.input_tokens) == (0.75, 9)


@pytest.mark.parametrize(("usage", "reason"), [(5, "dotted path"), ("data.*.usage", "bills once")])
def test_usage_setting_is_checked(usage: Any, reason: str) -> None:
    with pytest.raises(beacon.ConfigError, match=reason) as ei:
        HttpRewardScorer("http://127.0.0.1/x", usage=usage)
    assert ei.value.field == "usage"


async def test_usage_path_into_a_scalar_is_an_error(server: Server) -> None:
    server.answer = {"score": 0.5, "meta": 3}
    async with HttpRewardScorer(server.url + "/answer", usage="meta.usage") as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("q", "t")
    assert ei.value.path == "meta.usage"


@pytest.mark.parametrize(("usage", "field", "value"), BAD_USAGE)
async def test_malformed_usage_read_by_default_warns_once_and_counts_nothing(
    server: Server, usage: Any, field: str, value: Any
) -> None:
    # openai_compatible reads usage unasked: a server's partial block must not fail samples
    server.usage = usage
    async with HttpRewardScorer.openai_compatible(server.url + "/v1", "rm", api_key_env=None) as s:
        with pytest.warns(UsageWarning, match=repr(field)):
            assert await s("q", "abc") == 3.0
        cfg = beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per scorer: no second warning
            res = await BeaconSampler(lambda p: "abc", s, cfg).arun("q")
    assert res.error is None and res.n_failed == 0 and res.n_samples >= 1
    assert not res.usage.score_input_tokens and not res.usage.score_output_tokens


async def test_score_and_score_batch_do_not_read_usage(server: Server) -> None:
    # they return the rewards alone: an explicitly strict usage cannot fail them
    server.usage = {"prompt_tokens": 7}
    async with HttpRewardScorer.openai_compatible(
        server.url + "/v1", "rm", api_key_env=None, usage="usage"
    ) as s:
        assert await s.score("q", "abcd") == 4.0
        assert await s.score_batch("q", ["ab", "abcde"]) == [2.0, 5.0]


def test_an_empty_usage_path_is_refused() -> None:
    with pytest.raises(beacon.ConfigError, match="usage"):
        HttpRewardScorer("http://127.0.0.1:1/score", usage="")
