"""HttpRewardScorer against a real aiohttp server on 127.0.0.1 (random port)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

import beacon
from beacon.engine import BeaconSampler
from beacon.retry import RetryPolicy, is_retryable
from beacon_integrations.scorers import (
    HttpRewardScorer,
    RewardConnectionError,
    RewardHTTPError,
    RewardResponseError,
    RewardTimeoutError,
)
from beacon_integrations.scorers.errors import RewardRequestError

SECRET = "s3cret-token-value"
MISSING = object()  # a data element without an "index" field


class Server:
    def __init__(self) -> None:
        self.bodies: dict[str, list[Any]] = {}
        self.hits: dict[str, int] = {}
        self.peers: list[Any] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""
        self.vllm_indices: list[Any] = []  # what /vllmidx/score answers as data[*].index
        self.answer: Any = None  # what /answer answers (raw JSON text)
        self.retry_after = ""  # the Retry-After header /retryafter answers 503 with
        self.redirect_to = ""  # where /redirect sends its client (307)
        self.big = 0  # bytes of padding in /big's JSON answer

    def record(self, name: str, body: Any) -> int:
        self.bodies.setdefault(name, []).append(body)
        self.hits[name] = self.hits.get(name, 0) + 1
        return self.hits[name]


def make_app(srv: Server) -> web.Application:
    async def score(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("score", body)
        srv.peers.append(request.transport.get_extra_info("peername") if request.transport
                         else None)
        return web.json_response({"data": [{"score": float(len(body["response"]))}]})

    async def batch(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("batch", body)
        return web.json_response({"scores": [float(len(r)) for r in body["responses"]]})

    async def flaky429(request: web.Request) -> web.Response:
        n = srv.record("flaky429", await request.json())
        if n <= 2:
            return web.Response(status=429, text="slow down", headers={"Retry-After": "0"})
        return web.json_response({"score": 1.0})

    async def flaky500(request: web.Request) -> web.Response:
        n = srv.record("flaky500", await request.json())
        if n % 2 == 1:
            return web.Response(status=500, text="internal error")
        return web.json_response({"score": 0.0})

    async def notfound(request: web.Request) -> web.Response:
        srv.record("notfound", None)
        return web.Response(status=404, text="no such model")

    async def slow(request: web.Request) -> web.Response:
        srv.record("slow", None)
        await asyncio.sleep(2.0)
        return web.json_response({"score": 1.0})

    async def malformed(request: web.Request) -> web.Response:
        srv.record("malformed", None)
        return web.Response(text="{'score': oops", content_type="application/json")

    async def nonnumeric(request: web.Request) -> web.Response:
        srv.record("nonnumeric", None)
        return web.json_response({"data": [{"score": "high"}]})

    async def auth(request: web.Request) -> web.Response:
        srv.record("auth", dict(request.headers))
        if request.headers.get("Authorization") != f"Bearer {SECRET}":
            # A misbehaving server echoing the credential back must not leak it into errors.
            return web.Response(status=401,
                                text=f"bad key {request.headers.get('Authorization')}")
        return web.json_response({"score": 2.5})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("chat", body)
        return web.json_response(
            {"choices": [{"index": 0, "message": {"role": "assistant",
                                                  "content": "reward:-3.25"}}]}
        )

    async def vllm(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("vllm", body)
        t2 = body["text_2"]
        texts = t2 if isinstance(t2, list) else [t2]
        data = [{"index": i, "object": "score", "score": 0.1 * len(t)} for i, t in enumerate(texts)]
        return web.json_response({"id": "x", "object": "list", "data": data[::-1]})

    async def vllm_indices(request: web.Request) -> web.Response:
        body = await request.json()
        srv.record("vllmidx", body)
        t2 = body["text_2"]
        texts = t2 if isinstance(t2, list) else [t2] * len(srv.vllm_indices)
        data = [{"object": "score", "score": 0.1 * len(t)} for t in texts]
        for d, idx in zip(data, srv.vllm_indices, strict=True):
            if idx is not MISSING:
                d["index"] = idx
        return web.json_response({"id": "x", "object": "list", "data": data})

    async def conc(request: web.Request) -> web.Response:
        srv.record("conc", None)
        srv.in_flight += 1
        srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            await asyncio.sleep(0.03)
        finally:
            srv.in_flight -= 1
        return web.json_response({"score": 1.0})

    async def binary(request: web.Request) -> web.Response:
        body = await request.json()
        n = srv.record("binary", body)
        if n == 3:
            return web.Response(status=503, text="overloaded")
        return web.json_response({"scores": [1.0 if "good" in r else 0.0
                                             for r in body["responses"]]})

    async def answer(request: web.Request) -> web.Response:
        srv.record("answer", await request.json())
        return web.Response(text=srv.answer, content_type="application/json")

    async def retryafter(request: web.Request) -> web.Response:
        srv.record("retryafter", None)
        return web.Response(status=503, text="busy", headers={"Retry-After": srv.retry_after})

    async def echo(request: web.Request) -> web.Response:
        # A misbehaving server echoing the query string and credentials in its error page.
        srv.record("echo", None)
        pad = "x" * int(request.query.get("pad", "0"))
        return web.Response(
            status=400, content_type="text/html",
            text=f"<html>{pad}bad request ?{request.query_string} "
                 f"auth={request.headers.get('Authorization')} "
                 f"key={request.headers.get('x-api-key')}</html>",
        )

    async def redirect(request: web.Request) -> web.Response:
        srv.record("redirect", None)
        return web.Response(status=int(request.query.get("status", "307")),
                            headers={"Location": srv.redirect_to})

    async def target(request: web.Request) -> web.Response:
        srv.record("target", dict(request.headers))
        return web.json_response({"score": 1.0})

    async def big(request: web.Request) -> web.StreamResponse:
        srv.record("big", None)
        body = json.dumps({"score": 1.0, "pad": "x" * srv.big}).encode()
        if request.query.get("chunked"):
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(body), 4096):
                await resp.write(body[i:i + 4096])
            await resp.write_eof()
            return resp
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/answer", answer)
    for path, h in [("/retryafter", retryafter), ("/echo", echo), ("/redirect", redirect),
                    ("/target", target), ("/big", big)]:
        app.router.add_post(path, h)
    for path, h in [("/score", score), ("/batch", batch), ("/flaky429", flaky429),
                    ("/flaky500", flaky500), ("/notfound", notfound), ("/slow", slow),
                    ("/malformed", malformed), ("/nonnumeric", nonnumeric), ("/auth", auth),
                    ("/v1/chat/completions", chat), ("/vllm/score", vllm), ("/conc", conc),
                    ("/binary", binary), ("/vllmidx/score", vllm_indices)]:
        app.router.add_post(path, h)
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


async def test_single_score_and_one_shared_session(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/score", score_path="data.0.score") as s:
        assert [await s("p", "abc"), await s("p", "hello")] == [3.0, 5.0]
        assert len(s._sessions) == 1
    assert server.bodies["score"] == [{"prompt": "p", "response": "abc"},
                                      {"prompt": "p", "response": "hello"}]
    assert server.peers[0] == server.peers[1]  # the same keep-alive connection
    assert len(s._sessions) == 0


async def test_template_placeholders_keep_json_types(server: Server) -> None:
    tmpl = {"input": {"conv": "{messages}", "note": "Q: {prompt} / A: {response}"},
            "response": "{response}", "k": [1, "{prompt}"]}
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    async with HttpRewardScorer(server.url + "/score", request_template=tmpl,
                                score_path="data.0.score") as s:
        assert await s(prompt, "4") == 1.0
    body = server.bodies["score"][0]
    assert body["input"]["conv"] == [*prompt, {"role": "assistant", "content": "4"}]
    assert body["k"] == [1, prompt]
    assert body["input"]["note"] == f"Q: {json.dumps(prompt)} / A: 4"


async def test_batched_mode_one_request_per_batch(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/batch", batched=True, score_path="scores") as s:
        assert await s("p", ["a", "bb", "ccc"]) == [1.0, 2.0, 3.0]
        assert await s.score("p", "dddd") == 4.0
    assert server.hits["batch"] == 2
    assert server.bodies["batch"][0] == {"prompt": "p", "responses": ["a", "bb", "ccc"]}


async def test_429_is_retryable_with_retry_after(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/flaky429") as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
    e = ei.value
    assert e.status == 429 and e.retry_after == 0.0 and is_retryable(e)
    assert "429" in str(e) and "slow down" in str(e)


async def test_500_retryable_404_not(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/flaky500") as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
        assert ei.value.status == 500 and is_retryable(ei.value)
        assert await s("p", "x") == 0.0
    async with HttpRewardScorer(server.url + "/notfound") as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
    assert ei.value.status == 404 and not is_retryable(ei.value)


async def test_slow_response_times_out_retryably(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/slow", timeout=0.1) as s:
        with pytest.raises(RewardTimeoutError) as ei:
            await s("p", "x")
    assert is_retryable(ei.value) and isinstance(ei.value, TimeoutError)


async def test_malformed_json_names_body_and_value(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/malformed") as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("p", "x")
    e = ei.value
    assert e.path == "<body>" and "oops" in str(e) and not is_retryable(e)
    assert isinstance(e, beacon.RewardError)


async def test_non_numeric_score_names_path_and_value(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/nonnumeric", score_path="data.0.score") as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("p", "x")
        assert ei.value.path == "data.0.score" and ei.value.value == "high"
        assert "'high'" in str(ei.value) and "data.0.score" in str(ei.value)
    async with HttpRewardScorer(server.url + "/nonnumeric", score_path="data.0.reward") as s:
        with pytest.raises(RewardResponseError, match=r"data\.0\.reward.*score"):
            await s("p", "x")
    async with HttpRewardScorer(server.url + "/nonnumeric", score_path="data.3.score") as s:
        with pytest.raises(RewardResponseError, match=r"data\.3"):
            await s("p", "x")


async def test_auth_header_from_env_never_leaks(server: Server,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BEACON_TEST_RM_KEY", SECRET)
    s = HttpRewardScorer(server.url + "/auth?key=abc", api_key_env="BEACON_TEST_RM_KEY")
    assert SECRET not in repr(s) and "BEACON_TEST_RM_KEY" in repr(s) and "key=abc" not in repr(s)
    assert await s("p", "x") == 2.5
    assert server.bodies["auth"][0]["Authorization"] == f"Bearer {SECRET}"
    await s.aclose()

    monkeypatch.setenv("BEACON_TEST_RM_KEY", "wrong-" + SECRET)
    bad = HttpRewardScorer(server.url + "/auth", api_key_env="BEACON_TEST_RM_KEY")
    with pytest.raises(RewardHTTPError) as ei:
        await bad("p", "x")
    await bad.aclose()
    assert ei.value.status == 401 and SECRET not in str(ei.value) and "***" in str(ei.value)

    monkeypatch.delenv("BEACON_TEST_RM_KEY")
    with pytest.raises(beacon.ConfigError, match="BEACON_TEST_RM_KEY"):
        HttpRewardScorer(server.url + "/auth", api_key_env="BEACON_TEST_RM_KEY")


async def test_openai_compatible_preset(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BEACON_TEST_OAI", SECRET)
    s = HttpRewardScorer.openai_compatible(server.url + "/v1", "nvidia/reward",
                                           api_key_env="BEACON_TEST_OAI")
    async with s:
        assert await s("What is 2+2?", "4") == -3.25
    assert server.bodies["chat"][0] == {
        "model": "nvidia/reward",
        "messages": [{"role": "user", "content": "What is 2+2?"},
                     {"role": "assistant", "content": "4"}],
    }


async def test_vllm_score_preset_batched_and_single(server: Server) -> None:
    async with HttpRewardScorer.vllm_score(server.url + "/vllm", "BAAI/bge-reranker") as s:
        assert s.batched
        assert await s("query", ["a", "bbb", "cc"]) == pytest.approx([0.1, 0.3, 0.2])
    assert server.bodies["vllm"][0] == {"model": "BAAI/bge-reranker", "text_1": "query",
                                        "text_2": ["a", "bbb", "cc"]}
    async with HttpRewardScorer.vllm_score(server.url + "/vllm", "m", batched=False) as s1:
        assert await s1("query", "abcd") == pytest.approx(0.4)
    assert server.bodies["vllm"][1]["text_2"] == "abcd"


@pytest.mark.parametrize("indices", [
    [0, 0, 0],              # duplicates: every score would go to the first response
    [1, 2, 3],              # 1-based
    [0, 2, 2],
    [2, 0, 5],
    [0, "1", 2],            # not integers
    [0, True, 2],
    [0, MISSING, 2],        # one element without an index
], ids=["dup", "one-based", "dup-last", "out-of-range", "str", "bool", "missing"])
async def test_vllm_score_indices_must_be_a_permutation(server: Server,
                                                        indices: list[Any]) -> None:
    server.vllm_indices = indices
    async with HttpRewardScorer.vllm_score(server.url + "/vllmidx", "m") as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("query", ["a", "bbb", "cc"])
    e = ei.value
    shown = ["<missing>" if i is MISSING else i for i in indices]
    assert e.path == "data.*.index" and e.value == shown and not is_retryable(e)
    assert str(e) == (f"invalid reward response at 'data.*.index': {shown!r} "
                      "(indices must be a permutation of 0..2 (each response exactly once))")


@pytest.mark.parametrize("indices", [[1], ["0"], [True], [0, 1], []],
                         ids=["one", "str", "bool", "two", "none"])
async def test_vllm_single_score_checks_the_index(server: Server, indices: list[Any]) -> None:
    # As batched mode: a score whose index is not 0 (the one response sent), or an answer
    # with other than one score, is a typed error naming the field and the value.
    server.vllm_indices = indices
    async with HttpRewardScorer.vllm_score(server.url + "/vllmidx", "m", batched=False) as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("query", "abc")
    e = ei.value
    if len(indices) == 1:
        assert e.path == "data.0.index" and e.value == indices[0] and not is_retryable(e)
        assert str(e) == (f"invalid reward response at 'data.0.index': {indices[0]!r} "
                          "(expected 0 (one response was sent))")
    else:
        assert e.path == "data" and len(e.value) == len(indices)
        assert "expected a list of exactly 1 score" in str(e)
    server.vllm_indices = [0]
    async with HttpRewardScorer.vllm_score(server.url + "/vllmidx", "m", batched=False) as s:
        assert await s("query", "abc") == pytest.approx(0.3)
    server.vllm_indices = [MISSING]  # no index at all: the only score
    async with HttpRewardScorer.vllm_score(server.url + "/vllmidx", "m", batched=False) as s:
        assert await s("query", "abcd") == pytest.approx(0.4)


async def test_json_bool_scores_are_rewards_as_in_the_engine(server: Server) -> None:
    # A binary verifier's true/false is 1.0/0.0, as the engine takes a bool from a scorer.
    url = server.url + "/answer"
    for text, want in (("true", 1.0), ("false", 0.0), ('{"score": true}', 1.0)):
        server.answer = text
        path = "score" if text.startswith("{") else ""
        async with HttpRewardScorer(url, score_path=path) as s:
            assert await s("p", "r") == want
    server.answer = '{"scores": [true, false, 0.5]}'
    async with HttpRewardScorer(url, score_path="scores", batched=True) as s:
        assert await s("p", ["a", "b", "c"]) == [1.0, 0.0, 0.5]
    server.answer = '{"data": [{"index": 0, "score": true}]}'
    async with HttpRewardScorer.vllm_score(url.removesuffix("/answer"), "m", path="/answer",
                                           batched=False) as s:
        assert await s("p", "r") == 1.0
    sampler = BeaconSampler(lambda p: "r", HttpRewardScorer(url, score_path=""),
                            beacon.BeaconConfig(cost=0.05, horizon=4, family="bernoulli"))
    server.answer = "true"
    res = await sampler.arun("q")
    assert res.stop_reason == "absorbed" and res.best is not None and res.best.reward == 1.0


@pytest.mark.parametrize(("text", "reason"), [
    ('{"score": "0.5"}', "real number"),
    ('{"score": null}', "real number"),
    ('{"score": 1' + "0" * 400 + "}", "finite"),  # an integer beyond the float range
    ('{"score": [1.0]}', "real number"),
])
async def test_invalid_json_scores_are_typed_errors(server: Server, text: str,
                                                    reason: str) -> None:
    server.answer = text
    async with HttpRewardScorer(server.url + "/answer") as s:
        with pytest.raises(RewardResponseError) as ei:
            await s("p", "r")
    assert ei.value.path == "score" and reason in str(ei.value)
    assert ei.value.value == json.loads(text)["score"]


async def test_one_invalid_score_in_a_batch_fails_only_its_sample(server: Server) -> None:
    # As the engine does for any batched scorer: null for response 1 fails sample 1 alone,
    # with the error naming the field; score_batch (a direct call) still raises it.
    server.answer = '{"scores": [0.5, null, 0.25]}'
    scorer = HttpRewardScorer(server.url + "/answer", score_path="scores", batched=True)
    out = await scorer("p", ["a", "b", "c"])
    assert out[0] == 0.5 and out[2] == 0.25 and isinstance(out[1], RewardResponseError)
    with pytest.raises(RewardResponseError) as ei:
        await scorer.score_batch("p", ["a", "b", "c"])
    assert ei.value.path == "scores[1]" and ei.value.value is None
    cfg = beacon.BeaconConfig(cost=0.001, horizon=4, batch_size=3)
    res = await BeaconSampler(lambda p: "t", scorer, cfg, retry=RetryPolicy.none()).arun("q")
    await scorer.aclose()
    assert [c.reward for c in res.candidates[:3]] == [0.5, None, 0.25]  # the first batch
    assert res.candidates[1].error == (
        "RewardResponseError: invalid reward response at 'scores[1]': None "
        "(scorer must return a real number)"
    )
    # vLLM: an element without a score fails its own response (found by its index)
    server.answer = json.dumps({"data": [{"index": 1, "score": 0.5}, {"index": 0},
                                         {"index": 2, "score": 0.75}]})
    async with HttpRewardScorer.vllm_score(server.url, "m", path="/answer") as v:
        got = await v("q", ["a", "b", "c"])
        assert isinstance(got[0], RewardResponseError) and got[1:] == [0.5, 0.75]
        assert got[0].path == "data.0.score"


async def test_connection_limit_is_honoured(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/conc", max_connections=2) as s:
        out = await asyncio.gather(*(s("p", str(i)) for i in range(8)))
    assert out == [1.0] * 8 and server.max_in_flight == 2


async def test_connection_refused_is_retryable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    async with HttpRewardScorer(f"http://127.0.0.1:{port}/score") as s:
        with pytest.raises(RewardConnectionError) as ei:
            await s("p", "x")
    assert is_retryable(ei.value)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(beacon.ConfigError, match="url"):
        HttpRewardScorer("ftp://example.com/x")
    with pytest.raises(beacon.ConfigError, match="timeout"):
        HttpRewardScorer("http://127.0.0.1/x", timeout=0)
    with pytest.raises(beacon.ConfigError, match="max_connections"):
        HttpRewardScorer("http://127.0.0.1/x", max_connections=-1)
    with pytest.raises(beacon.ConfigError, match=r"request_template.*\['responses'\].*single"):
        HttpRewardScorer("http://127.0.0.1/x", request_template={"r": "{responses}"})
    with pytest.raises(beacon.ConfigError, match=r"request_template.*\{responses\}"):
        HttpRewardScorer("http://127.0.0.1/x", batched=True, request_template={"p": "{prompt}"})
    with pytest.raises(beacon.ConfigError, match="total_timeout"):
        HttpRewardScorer("http://127.0.0.1/x", total_timeout=0)


async def test_sampler_end_to_end_with_retries_over_http(server: Server) -> None:
    texts = iter(["bad 1", "bad 2", "bad 3", "good 4"] * 20)

    async def gen(p: Any) -> str:
        return next(texts)

    cfg = beacon.BeaconConfig(cost=0.01, horizon=8, family="bernoulli", batch_size=2)
    async with HttpRewardScorer(server.url + "/binary", batched=True, score_path="scores") as s:
        sampler = BeaconSampler(gen, s, cfg,
                                retry=RetryPolicy(max_attempts=3, base_delay=0.001))
        res = await sampler.arun("q")
    assert res.stop_reason == "absorbed" and res.best is not None
    # k0 = 1, then batches of 2: [bad 1], [bad 2, bad 3], [good 4, bad 1] -> 5 charged
    assert res.best.text == "good 4" and res.n_samples == 5
    assert [c.reward for c in res.candidates] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert res.usage.retries == 1 and res.usage.score_calls == 4  # 3 batches + 1 retried 503


async def test_sampler_over_http_non_retryable_errors_fail_samples(server: Server) -> None:
    cfg = beacon.BeaconConfig(cost=0.01, horizon=8, family="bernoulli", max_failures=1)
    async with HttpRewardScorer(server.url + "/nonnumeric", score_path="data.0.score") as s:
        res = await BeaconSampler(lambda p: "x", s, cfg).arun("q")
    assert res.stop_reason == "error" and res.usage.score_calls == 2  # never retried
    assert res.error is not None and "RewardResponseError" in res.error
    assert "data.0.score" in res.error and "'high'" in res.error


def test_sync_run_uses_a_session_per_loop(server_url_sync: str) -> None:
    cfg = beacon.BeaconConfig(cost=0.01, horizon=4, family="bernoulli")
    s = HttpRewardScorer(server_url_sync + "/binary", batched=True, score_path="scores")
    sampler = BeaconSampler(lambda p: "good", s, cfg)
    assert sampler.run("q").stop_reason == "absorbed"
    assert sampler.run("q").stop_reason == "absorbed"  # a new loop: a new session
    asyncio.run(s.aclose())
    assert len(s._sessions) == 0


def test_sync_runs_do_not_accumulate_finished_loops_and_sessions(server_url_sync: str) -> None:
    import gc
    import weakref

    cfg = beacon.BeaconConfig(cost=0.01, horizon=4, family="bernoulli")
    s = HttpRewardScorer(server_url_sync + "/binary", batched=True, score_path="scores")
    loops: list[Any] = []

    async def gen(prompt: Any) -> str:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return "good"

    sampler = BeaconSampler(gen, s, cfg)
    for _ in range(5):  # each sync run: a fresh event loop, closed when it returns
        assert sampler.run("q").stop_reason == "absorbed"
    gc.collect()
    # only the latest loop's (closed) session may remain until the next request
    assert len(s._sessions) <= 1
    alive = {id(lp) for ref in loops if (lp := ref()) is not None}
    assert len(alive) <= 1  # finished loops are freed (at most the latest one is held)


@pytest.fixture
def server_url_sync() -> Any:
    """The test server on its own loop in a thread, for tests using the sync API."""
    import threading

    srv = Server()
    ready = threading.Event()
    state: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        state["loop"] = loop
        runner = web.AppRunner(make_app(srv))
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{state['port']}"
    state["loop"].call_soon_threadsafe(state["loop"].stop)
    t.join(10)


# -- argument and request validation ---------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://", "https:///path", "http://:80/x", "http://user@/x",
                                 "http://[::1/x", "http://x:abc/", "ftp://host/x", None, 5])
def test_url_needs_http_scheme_and_host(url: Any) -> None:
    with pytest.raises(beacon.ConfigError, match="url") as ei:
        HttpRewardScorer(url)
    assert ei.value.field == "url"


@pytest.mark.parametrize(
    ("headers", "field"),
    [("abc", "headers"), ([("X-A", "b")], "headers"), ({"X-N": 5}, "headers['X-N']"),
     ({5: "x"}, "headers"), ({"": "x"}, "headers"), ({"X-A": "a\r\nX-B: b"}, "headers['X-A']")],
)
def test_headers_must_map_strings_to_strings(headers: Any, field: str) -> None:
    with pytest.raises(beacon.ConfigError, match="header") as ei:
        HttpRewardScorer("http://127.0.0.1/x", headers=headers)
    assert ei.value.field == field


async def test_extra_headers_are_sent_with_the_json_body(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RM_KEY", SECRET)
    async with HttpRewardScorer(server.url + "/auth", api_key_env="RM_KEY",
                                headers={"X-Trace": "t-1"}) as s:
        assert await s("p", "r") == 2.5
    sent = server.bodies["auth"][0]
    assert sent["X-Trace"] == "t-1" and sent["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("prompt", "response", "field"),
    [({1, 2}, "r", "prompt"), (object(), "r", "prompt"), (float("nan"), "r", "prompt"),
     ("p", {"x"}, "response")],
)
async def test_unencodable_request_is_a_typed_error_before_any_request(
    server: Server, prompt: Any, response: Any, field: str
) -> None:
    async with HttpRewardScorer(server.url + "/score", score_path="data.0.score") as s:
        with pytest.raises(RewardRequestError, match=f"{field}=") as ei:
            await s(prompt, response)
    assert isinstance(ei.value, TypeError) and not is_retryable(ei.value)
    assert ei.value.field == field and ei.value.value is (prompt if field == "prompt" else response)
    assert "score" not in server.hits  # nothing was sent


async def test_unencodable_batch_names_the_responses(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/batch", batched=True, score_path="scores") as s:
        with pytest.raises(RewardRequestError, match="responses=") as ei:
            await s("p", ["ok", {"x"}])
    assert ei.value.field == "responses" and "batch" not in server.hits


async def test_batched_scorer_refuses_a_lone_text(server: Server) -> None:
    async with HttpRewardScorer(server.url + "/batch", batched=True, score_path="scores") as s:
        for lone in ("hello", b"hello", None):
            with pytest.raises(RewardRequestError) as ei:
                await s("p", lone)
            assert ei.value.field == "responses"
    assert "batch" not in server.hits


async def test_sampler_does_not_retry_an_unencodable_prompt(server: Server) -> None:
    cfg = beacon.BeaconConfig(cost=0.5, horizon=4, max_failures=1)
    async with HttpRewardScorer(server.url + "/score", score_path="data.0.score") as s:
        res = await BeaconSampler(lambda p: "x", s, cfg,
                                  retry=RetryPolicy(max_attempts=3, base_delay=0.001)).arun({1})
    assert res.stop_reason == "error" and res.usage.retries == 0
    assert res.error is not None and "RewardRequestError" in res.error and "prompt" in res.error
    assert "score" not in server.hits


# -- Retry-After, redirects, huge bodies, secrets in error bodies --------------------------------


async def test_retry_after_as_an_http_date_is_seconds_from_now(server: Server) -> None:
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    async with HttpRewardScorer(server.url + "/retryafter") as s:
        server.retry_after = format_datetime(datetime.now(UTC) + timedelta(seconds=120),
                                             usegmt=True)
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
        assert ei.value.status == 503 and is_retryable(ei.value)
        assert ei.value.retry_after is not None and 60 < ei.value.retry_after <= 120
        server.retry_after = "Wed, 21 Oct 2015 07:28:00 GMT"  # in the past: retry at once
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
        assert ei.value.retry_after == 0.0
        for bad in ("soon", "-3", "nan"):  # unreadable: the backoff policy decides
            server.retry_after = bad
            with pytest.raises(RewardHTTPError) as ei:
                await s("p", "x")
            assert ei.value.retry_after is None


async def _second_origin(srv: Server) -> tuple[web.AppRunner, str]:
    """The same app on another port: another origin."""
    runner = web.AppRunner(make_app(srv))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_redirects_are_not_followed_and_the_key_goes_nowhere_else(
    server: Server, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    monkeypatch.setenv("BEACON_TEST_RM_KEY", SECRET)
    runner, other = await _second_origin(server)
    try:
        server.redirect_to = other + "/target?token=abc"
        async with HttpRewardScorer(
            server.url + f"/redirect?status={status}", api_key_env="BEACON_TEST_RM_KEY",
            auth_header="x-api-key", auth_scheme="",
        ) as s:
            with pytest.raises(RewardHTTPError) as ei:
                await s("p", "x")
    finally:
        await runner.cleanup()
    assert "target" not in server.hits  # neither the key nor a body-less GET went elsewhere
    e = ei.value
    assert e.status == status and not is_retryable(e)
    assert f"{other}/target" in str(e) and "token=abc" not in str(e) and SECRET not in str(e)


async def test_huge_response_is_a_typed_error_not_read_whole(server: Server) -> None:
    # the default cap (10 MiB), with and without a Content-Length
    server.big = 11 * 2**20
    for query in ("", "?chunked=1"):
        async with HttpRewardScorer(server.url + "/big" + query) as s:
            with pytest.raises(RewardResponseError, match="max_response_bytes") as ei:
                await s("p", "x")
        assert ei.value.path == "<body>" and not is_retryable(ei.value)
    server.big = 64 * 1024
    for query in ("", "?chunked=1"):
        async with HttpRewardScorer(server.url + "/big" + query, max_response_bytes=4096) as s:
            with pytest.raises(RewardResponseError, match="4096"):
                await s("p", "x")
        async with HttpRewardScorer(server.url + "/big" + query,
                                    max_response_bytes=server.big + 100) as s:
            assert await s("p", "x") == 1.0
    with pytest.raises(beacon.ConfigError, match="max_response_bytes"):
        HttpRewardScorer(server.url, max_response_bytes=0)


async def test_secrets_echoed_in_an_html_error_page_are_scrubbed(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BEACON_TEST_RM_KEY", SECRET)
    # the URL's query (a key in it) and its user info never reach the message
    url = server.url.replace("http://", "http://bob:hunter2pw@") + "/echo?api_key=qk-123456"
    async with HttpRewardScorer(url) as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
    msg = str(ei.value)
    assert ei.value.status == 400 and "<html>" in msg and not is_retryable(ei.value)
    assert "qk-123456" not in msg and "hunter2pw" not in msg
    assert "Ym9iOmh1bnRlcjJwdw" not in msg  # base64("bob:hunter2pw"), the Basic credential
    # a key cut by the 200-character snippet leaves none of its characters behind
    for pad in range(150, 200, 7):
        async with HttpRewardScorer(
            server.url + f"/echo?pad={pad}", api_key_env="BEACON_TEST_RM_KEY",
            auth_header="x-api-key", auth_scheme="",
        ) as s:
            with pytest.raises(RewardHTTPError) as ei:
                await s("p", "x")
        assert SECRET[:4] not in str(ei.value), pad


async def test_an_error_page_over_the_read_cap_still_shows_its_start(server: Server) -> None:
    # a 9 KB error page (a proxy's HTML): its first bytes are read and shown, not dropped
    async with HttpRewardScorer(server.url + "/echo?pad=9000") as s:
        with pytest.raises(RewardHTTPError) as ei:
            await s("p", "x")
    assert ei.value.status == 400 and "<html>xxx" in str(ei.value)
