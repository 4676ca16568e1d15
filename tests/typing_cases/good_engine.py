"""The engine as README.md / docs/engine.md use it (sync and async callables)."""

from __future__ import annotations

import asyncio
import json
import random
from contextlib import aclosing
from typing import assert_type

import beacon
from beacon import (
    BatchScorer,
    BeaconEvent,
    BeaconResult,
    BeaconSampler,
    Budget,
    Candidate,
    DecisionEvent,
    Generation,
    Observer,
    RetryPolicy,
    SampleEvent,
    TransientError,
    Usage,
    cost_from_price,
    is_retryable,
)
from beacon.budget import Budget as Budget2
from beacon.engine import BeaconSampler as BeaconSampler2
from beacon.engine import Generation as Generation2
from beacon.result import BeaconResult as BeaconResult2
from beacon.retry import RetryPolicy as RetryPolicy2

assert_type(BeaconSampler(lambda p: "x", lambda p, t: 1.0, beacon.BeaconConfig()), BeaconSampler2)
assert Generation is Generation2 and Budget is Budget2 and RetryPolicy is RetryPolicy2
assert BeaconResult is BeaconResult2

rng = random.Random(0)


def generate(prompt: str) -> str:
    return f"draft {rng.gauss(0.0, 1.0):.3f}"


def score(prompt: str, response: str) -> float:
    return float(response.split()[-1])


async def agenerate(prompt: str) -> Generation:
    await asyncio.sleep(0.001)
    return Generation(f"answer {rng.gauss(0, 1):.3f}", input_tokens=12, output_tokens=40)


async def ascore(prompt: str, text: str) -> float:
    return float(text.split()[1])


def batch_score(prompt: str, texts: list[str]) -> list[float]:
    return [float(len(t)) for t in texts]


class Model:
    async def ainvoke(self, prompt: str) -> str:
        return "hi"


class Judge:
    batched = True

    async def __call__(self, prompt: str, texts: list[str]) -> list[float]:
        return [1.0] * len(texts)


def retry_on(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


cfg = beacon.BeaconConfig(cost=0.05, horizon=16)
res = BeaconSampler(generate, score, cfg).run("Write a haiku about autumn")
assert_type(res, BeaconResult)
if res.best is not None:
    text: str = res.best.text
    reward: float | None = res.best.reward
    print(res.n_samples, res.stop_reason, text, reward)
bt: str | None = res.best_text
br: float | None = res.best_reward

events: list[BeaconEvent] = []


def on_event(ev: BeaconEvent) -> None:
    if isinstance(ev, SampleEvent):
        print(ev.k, ev.reward, ev.text)
    elif isinstance(ev, DecisionEvent):
        print(ev.zhat, ev.h, ev.decision)


async def aon_event(ev: BeaconEvent) -> None:
    on_event(ev)


observers: list[Observer] = [events.append, on_event, aon_event]

sampler = BeaconSampler(
    agenerate,
    ascore,
    cfg,
    max_concurrency=64,
    rate_limiter=None,
    retry=RetryPolicy(max_attempts=3, base_delay=0.5, retry_on=retry_on),
    timeout=60.0,
    budget=Budget(max_tokens=50_000, max_seconds=120),
    observers=[events.append, on_event, aon_event],
    seed=0,
)
BeaconSampler(Model(), Judge(), cfg, retry=RetryPolicy(retry_on=lambda e: True))
BeaconSampler(lambda p: Generation("x"), BatchScorer(batch_score), cfg, observers=observers)
BeaconSampler(generate, lambda prompt, response: float(len(response)), cfg, timeout=None)
BeaconSampler(agenerate, score, cfg, retry=RetryPolicy.none(), budget=None)


async def main() -> None:
    res = await sampler.arun("What is 2+2?", metadata={"id": 1})
    assert_type(res, BeaconResult)
    out_tokens: int | None = res.usage.output_tokens
    usage: Usage = res.usage
    calls: int = usage.calls
    cost: float | None = usage.cost
    cands: list[Candidate] = res.candidates
    print(res.stop_reason, res.n_samples, out_tokens, calls, cost, cands, res.error)
    results = await sampler.arun_many(["q1", "q2", "q3"])
    assert_type(results, list[BeaconResult])
    async for i, r in sampler.astream_many(["q1", "q2"]):
        assert_type(i, int)
        assert_type(r, BeaconResult)
    async with aclosing(sampler.astream_many(["q1"], max_active=2)) as stream:
        async for _i, _r in stream:
            break
    pair = res.preference_pair()
    if pair is not None:
        chosen, rejected = pair
        print(chosen.text, rejected.reward)
    back = BeaconResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.best is not None and res.best is not None
    assert back.best.index == res.best.index


many: list[BeaconResult] = sampler.run_many(["a", "b"], metadata=[{"i": 0}, None])
c: float = cost_from_price(
    price_per_1m_tokens=0.6, tokens_per_sample=500, value_per_reward_unit=0.01
)
flag: bool = is_retryable(TransientError("x"))
delay: float = RetryPolicy().delay(2)
asyncio.run(main())

# --- less common but correct uses -------------------------------------------------------------
import io  # noqa: E402

from aiolimiter import AsyncLimiter  # noqa: E402

log = io.StringIO()


def retry_on_exception(exc: Exception) -> bool:  # typed on Exception, as most handlers are
    return isinstance(exc, ConnectionError)


BeaconSampler(
    generate,
    score,
    cfg,
    retry=RetryPolicy(retry_on=retry_on_exception),
    rate_limiter=AsyncLimiter(10, 1.0),
    before_model_call=AsyncLimiter(5, 1.0).acquire,
    observers=[lambda ev: log.write(json.dumps(ev.to_dict()) + "\n")],  # returns an int
    offload_sync=True,
)
gen = Generation("text", input_tokens=1, output_tokens=2, cost=0.01, raw=object())
gtext: str = gen.text
gcost: float | None = gen.cost
rec = res.trace[0] if res.trace else None
if rec is not None:
    cnt: int = rec.count
    print(rec.to_dict(), cnt, DecisionEvent.from_record(rec).to_record())
usage_d = res.usage.to_dict()
