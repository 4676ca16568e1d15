"""Audit 3: job-spec retry settings, overflow-safe evaluation means, and clients that swallow
their cancellation (per-call timeout, query deadline, caller cancelling ``arun``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import warnings
from collections.abc import AsyncIterator
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

import beacon
from beacon.budget import Budget
from beacon.engine import BeaconSampler
from beacon.evaluation import (
    evaluate,
    evaluate_fixed,
    interpolate_fixed,
    load_logged,
    logged_from_records,
    matched_difference,
    quality_per_prompt,
)
from beacon.jobs import FactorySpec, JobInputError, JobSpec, PromptExecutor, run_job
from beacon.retry import RetryPolicy

ROOT = Path(__file__).resolve().parents[1]


# -- 1. retry settings of a job spec ------------------------------------------------------------
def _spec(sampling: dict[str, Any], scorer: FactorySpec | None = None) -> JobSpec:
    return JobSpec(FactorySpec("beacon.demo:generator"),
                   scorer or FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=4), sampling)


def test_spec_retry_settings_reach_the_executors_retry_policy() -> None:
    sampling = {"max_attempts": 5, "base_delay": 0.25, "max_delay": 3, "max_retry_after": 300}
    spec = JobSpec.from_dict(_spec(sampling).to_dict())  # as a worker reads it (JSON)
    assert dict(spec.sampling) == sampling
    retry = PromptExecutor(spec, allowed=None).retry
    assert (retry.max_attempts, retry.base_delay, retry.max_delay, retry.max_retry_after) == (
        5, 0.25, 3.0, 300.0)
    # unset ones keep the engine's defaults
    default = RetryPolicy()
    only = PromptExecutor(_spec({"max_retry_after": 120}), allowed=None).retry
    assert only.max_retry_after == 120.0
    assert (only.max_attempts, only.base_delay, only.max_delay) == (
        default.max_attempts, default.base_delay, default.max_delay)


@pytest.mark.parametrize("key", ["base_delay", "max_delay", "max_retry_after"])
@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan, "60", True])
def test_bad_retry_settings_name_the_key_and_value(key: str, bad: Any) -> None:
    with pytest.raises(JobInputError) as ei:
        _spec({key: bad})
    assert ei.value.field == f"sampling.{key}"
    assert ei.value.value is bad or (isinstance(bad, float) and math.isnan(bad))
    assert "must be a finite number >= 0" in ei.value.reason  # a known key, a bad value


class _Server:
    """An aiohttp reward server on 127.0.0.1 in its own thread: the first ``n429`` requests
    get 429 with ``Retry-After: <retry_after>``, the others a score."""

    def __init__(self, n429: int, retry_after: str) -> None:
        self.n429, self.retry_after = n429, retry_after
        self.times: list[tuple[float, int]] = []  # (arrival, status)
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        status = 429 if len(self.times) < self.n429 else 200
        self.times.append((time.monotonic(), status))
        if status == 429:
            return web.Response(status=429, text="slow down",
                                headers={"Retry-After": self.retry_after})
        return web.json_response({"score": float(len(body["response"]) % 7)})

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/score", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/score"
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    def __enter__(self) -> _Server:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _run_one(tmp_path: Path, srv: _Server, sampling: dict[str, Any]) -> dict[str, Any]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q1", "prompt": "2+2?"}) + "\n")
    scorer = FactorySpec("beacon_integrations.scorers:HttpRewardScorer", {"url": srv.url})
    out = tmp_path / "out.jsonl"
    run_job(prompts, _spec(sampling, scorer), out, concurrency=1)
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    assert len(lines) == 1
    rec: dict[str, Any] = lines[0]
    return rec


@pytest.mark.timeout(60)
def test_job_waits_for_a_retry_after_within_its_max_retry_after(tmp_path: Path) -> None:
    k0 = _spec({}).config.k0  # the first samples, drawn together: each one's call gets 429
    with _Server(n429=k0, retry_after="0.4") as srv:
        rec = _run_one(tmp_path, srv, {"max_retry_after": 1.0, "timeout": 10})
    assert rec["ok"] is True and rec["n_failed"] == 0, rec
    assert rec["usage"]["retries"] == k0
    first429 = min(t for t, status in srv.times if status == 429)
    first_ok = min(t for t, status in srv.times if status == 200)
    assert first_ok - first429 >= 0.35  # the server's 0.4 s wait was honoured (lower bound)


@pytest.mark.timeout(60)
def test_job_with_a_short_max_retry_after_fails_the_call_naming_the_setting(
    tmp_path: Path,
) -> None:
    # The server asks for 0.5 s, the spec allows 0.2 s: the call fails at once, with the
    # setting to raise named, instead of being retried too early and refused again.
    with _Server(n429=100, retry_after="0.5") as srv:
        rec = _run_one(tmp_path, srv, {"max_retry_after": 0.2, "max_attempts": 3})
    assert rec["ok"] is False
    assert "RetryAfterTooLongError" in rec["error"]["message"]
    assert "max_retry_after" in rec["error"]["message"]
    assert rec["usage"]["retries"] == 0  # no call was retried
    assert all(status == 429 for _, status in srv.times)


@pytest.mark.timeout(60)
def test_beacon_run_max_retry_after_option_reaches_the_job(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q1", "prompt": "2+2?"}) + "\n")
    out = tmp_path / "out.jsonl"
    with _Server(n429=100, retry_after="0.5") as srv:
        res = CliRunner().invoke(app, [
            "run", str(prompts), "-g", "beacon.demo:generator",
            "-s", "beacon_integrations.scorers:HttpRewardScorer",
            "--scorer-kwargs", json.dumps({"url": srv.url}), "-o", str(out),
            "--max-retry-after", "0.2",
        ])
    assert res.exit_code == 1, res.output  # the prompt failed (a job with failures exits 1)
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["ok"] is False and "max_retry_after" in rec["error"]["message"]
    bad = CliRunner().invoke(app, [
        "run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
        "-o", str(tmp_path / "o2.jsonl"), "--max-retry-after", "-1",
    ])
    assert bad.exit_code == 2 and "--max-retry-after" in bad.output


# -- 2. overflow-safe means in evaluation ---------------------------------------------------------
def _exact_mean(xs: Any) -> float:
    vals = [Fraction(float(x)) for x in xs]
    return float(sum(vals, Fraction(0)) / len(vals))


def _huge_log(n: int = 12, m: int = 6, seed: int = 3) -> Any:
    rng = np.random.default_rng(seed)
    return logged_from_records(
        {"id": f"p{i}", "rewards": ((1.0 + 0.7 * rng.random(m)) * 1e308).tolist()}
        for i in range(n)
    )


def test_mean_best_reward_near_the_float_limit_is_finite_and_exact() -> None:
    data = _huge_log()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow RuntimeWarning
        fixed = evaluate_fixed(data, 6, 0.1)
    for m in fixed:
        assert m.n is not None
        best = data.rewards[:, : m.n].max(axis=1)
        assert math.isfinite(m.mean_best_reward)
        assert m.mean_best_reward == pytest.approx(_exact_mean(best), rel=1e-12)


def test_replay_with_a_fitted_prior_reports_finite_reward_means_in_json() -> None:
    data = _huge_log(n=20, m=8)
    cf = beacon.evaluation.cross_fit(data, "normal")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ev = evaluate(data, beacon.BeaconConfig(cost=0.1, horizon=8), cf)
        d = json.loads(json.dumps(ev.to_dict(), allow_nan=False))
    assert d["beacon"]["mean_best_reward"] == pytest.approx(
        _exact_mean(ev.beacon.outcomes.best_reward), rel=1e-12)  # type: ignore[union-attr]
    assert all(math.isfinite(m["mean_best_reward"]) for m in d["fixed"])
    assert math.isfinite(d["matched_fixed"]["mean_best_reward"])
    reward = d["matched_difference"]["reward"]
    per = matched_difference(ev.beacon, ev.fixed, "reward").per_prompt
    assert per is not None
    with localcontext() as ctx:
        ctx.prec = 40
        ds = [Decimal(float(x)) for x in per]
        mean = sum(ds, Decimal(0)) / len(ds)
        sd = (sum(((x - mean) ** 2 for x in ds), Decimal(0)) / (len(ds) - 1)).sqrt()
    assert reward["se"] == pytest.approx(float(sd) / math.sqrt(len(ds)), rel=1e-9)


def test_interpolating_mean_rewards_of_opposite_signs_near_the_limit() -> None:
    # best-of-1 mean -1.6e308, best-of-2 +1.6e308: the slope between them overflows.
    data = logged_from_records(
        [{"id": "a", "rewards": [-1.6e308, 1.6e308]}, {"id": "b", "rewards": [-1.6e308, 1.6e308]}]
    )
    fixed = evaluate_fixed(data, 2, 0.1)
    ys = [Fraction(m.mean_best_reward) for m in fixed]
    f = Fraction(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = interpolate_fixed(fixed, 1.25, "reward")
    assert got == pytest.approx(float((1 - f) * ys[0] + f * ys[1]), rel=1e-12)


def test_ordinary_means_are_numpys_own_bit_for_bit() -> None:
    data = load_logged(ROOT / "examples" / "data" / "tot_creative_writing_gpt4.jsonl")
    ev = evaluate(data, beacon.BeaconConfig(cost=0.1, horizon=8))
    for m in (ev.beacon, *ev.fixed):
        assert m.mean_best_reward == float(np.mean(quality_per_prompt(m, "reward")))
        assert m.mean_standardized_reward == float(np.mean(quality_per_prompt(m, "standardized")))
    md = ev.matched("reward")
    assert md.per_prompt is not None and md.se is not None
    assert md.se == float(np.std(md.per_prompt, ddof=1) / math.sqrt(md.per_prompt.size))


# -- 3. clients that swallow their cancellation ---------------------------------------------------
class _Swallower:
    """A model (or scorer) whose calls after the first ``fast`` catch their cancellation and
    go on until ``release`` is set (bounded by ``cap`` seconds), then return normally."""

    def __init__(self, fast: int, cap: float = 30.0) -> None:
        self.fast, self.cap = fast, cap
        self.calls = 0
        self.stuck = asyncio.Event()
        self.release = asyncio.Event()
        self.swallowed = 0

    async def _hang(self) -> None:
        end = time.monotonic() + self.cap
        self.stuck.set()
        while not self.release.is_set() and time.monotonic() < end:
            try:
                await asyncio.wait_for(self.release.wait(), end - time.monotonic())
            except asyncio.CancelledError:
                self.swallowed += 1  # the bare ``except:`` of a client's own retry loop
            except TimeoutError:
                pass

    async def generate(self, prompt: Any) -> str:
        self.calls += 1
        if self.calls > self.fast:
            await self._hang()
        return f"answer {self.calls}"

    async def score(self, prompt: Any, text: str) -> float:
        self.calls += 1
        if self.calls > self.fast:
            await self._hang()
        return float(self.calls % 5)


def _fast_score(prompt: Any, text: str) -> float:
    return float(len(text) + int(text.split()[-1]) % 5)


def _cfg() -> beacon.BeaconConfig:
    # cost ~0: BEACON would sample to the horizon; max_failures 0: one failed sample ends it
    return beacon.BeaconConfig(cost=1e-9, horizon=8, max_failures=0)


@pytest.fixture
async def released() -> AsyncIterator[list[_Swallower]]:
    # Stuck clients still running when a test ends are let go, so the test's loop can close
    # (an async fixture: its teardown runs on that loop, before it is closed).
    made: list[_Swallower] = []
    yield made
    for s in made:
        s.release.set()


@pytest.mark.timeout(8)
async def test_per_call_timeout_refuses_a_late_result_of_a_call_that_swallowed_its_cancellation(
) -> None:
    # The call is awaited inline (no task per call): it is timed out when it returns, 0.6 s
    # after its start, and what it returns then is refused; before, it was taken as a sample.
    model = _Swallower(fast=3, cap=0.6)
    s = BeaconSampler(model.generate, _fast_score, _cfg(), timeout=0.3,
                      retry=RetryPolicy.none())
    res = await s.arun("p")
    assert model.swallowed >= 1
    good = [c for c in res.candidates if not c.failed]
    bad = [c for c in res.candidates if c.failed]
    assert len(good) == 3 and res.n_samples == 3 and res.best is not None  # nothing lost
    assert res.stop_reason == "error" and len(bad) == 1
    assert bad[0].error is not None and "timed out after 0.3 s" in bad[0].error


@pytest.mark.timeout(8)
@pytest.mark.parametrize(("stuck", "timeout"), [("model", None), ("model", 30.0),
                                                ("scorer", None)])
async def test_query_deadline_is_kept_when_a_client_swallows_its_cancellation(
    released: list[_Swallower], caplog: pytest.LogCaptureFixture, stuck: str,
    timeout: float | None,
) -> None:
    client = _Swallower(fast=3)
    released.append(client)
    if stuck == "model":
        s = BeaconSampler(client.generate, _fast_score, _cfg(), timeout=timeout,
                          budget=Budget(max_seconds=0.4), retry=RetryPolicy.none())
    else:
        async def gen(prompt: Any) -> str:
            return "x 1"
        s = BeaconSampler(gen, client.score, _cfg(), timeout=timeout,
                          budget=Budget(max_seconds=0.4), retry=RetryPolicy.none())
    with caplog.at_level(logging.WARNING, logger="beacon.engine"):
        res = await s.arun("p")
    assert client.swallowed >= 1
    assert res.stop_reason == "budget"
    assert res.n_samples == 3 and len(res.candidates) == 3  # the samples before it are kept
    assert res.usage.cancelled == 1
    assert "ignores asyncio.CancelledError" in caplog.text


@pytest.mark.timeout(8)
async def test_cancelling_arun_is_not_held_up_by_a_client_that_swallows_it(
    released: list[_Swallower],
) -> None:
    # with a deadline the sample runs as its own task, which the cancellation abandons
    model = _Swallower(fast=3)
    released.append(model)
    s = BeaconSampler(model.generate, _fast_score, _cfg(), timeout=30.0,
                      budget=Budget(max_seconds=30), retry=RetryPolicy.none())
    await _cancel_while_stuck(s, model)
    assert model.swallowed >= 1


async def _cancel_while_stuck(s: BeaconSampler, model: _Swallower) -> None:
    """Cancel ``s.arun`` once ``model`` is stuck: the query must end cancelled, drawing
    nothing after the cancellation."""
    task = asyncio.ensure_future(s.arun("p"))
    await model.stuck.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert model.calls == 4


@pytest.mark.timeout(8)
async def test_a_swallowed_cancellation_without_timeout_still_ends_the_query() -> None:
    # No per-call timeout: the call is awaited inline, so the cancellation waits for the
    # client (here 0.3 s); it must then end the query, not be lost (the query went on).
    model = _Swallower(fast=3, cap=0.3)
    s = BeaconSampler(model.generate, _fast_score, _cfg(), timeout=None,
                      retry=RetryPolicy.none())
    await _cancel_while_stuck(s, model)
    assert model.swallowed == 1
