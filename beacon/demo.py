"""Offline demo generator and scorers: no API key, no server, deterministic by seed.

They stand in for an LLM and a reward model so that a bulk job runs on a fresh machine::

    beacon run examples/prompts.jsonl --generator beacon.demo:generator \\
        --scorer beacon.demo:scorer --out out.jsonl --dpo dpo.jsonl

Reward model (``scorer``): each prompt ``p`` has a latent quality ``mu_p ~ N(0, 1)`` and spread
``sigma_p = exp(N(-0.5, 0.4^2))`` (reward-model units); a response ``r`` to ``p`` scores
``mu_p + sigma_p * e`` with ``e`` a standard normal, except for a 4% share of degenerate
responses that score ``mu_p - 4 sigma_p`` (the low outliers the robust update is for). All draws
come from SHA-256 of (seed, prompt, response), so equal inputs give equal rewards on every
machine.

Verifier (``verifier``, for ``family="bernoulli"``): 1.0 when the last ``\\boxed{...}`` answer of
the response equals the record's ``reference``, else 0.0. The generator answers a prompt that
has a ``reference`` correctly with a per-prompt probability ``q_p ~ U(0.05, 0.95)``.

Each factory returns an object with ``bind(record)``; the job runner binds it once per prompt,
so the ``i``-th sample of a prompt is the same whatever process or order runs it. Optional
``latency_ms`` (per call, asyncio sleep) and ``fail_rate`` (share of call attempts raising
:class:`DemoTransientError`, retryable: each retry of a call draws anew, so a failure is
transient) simulate a real endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from beacon._checks import is_integer, is_real

__all__ = ["DemoGenerator", "DemoScorer", "DemoTransientError", "DemoVerifier", "generator",
           "scorer", "verifier"]

_OPENINGS = (
    "Here is a concise answer.",
    "Let me think step by step.",
    "Short version first, details after.",
    "There are a few ways to look at this.",
    "Good question.",
    "In brief:",
)
_BOXED = re.compile(r"\\boxed\{")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces (``\\frac{1}{2}`` whole).

    None when there is none, or the last one is never closed.
    """
    for m in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
        return None
    return None


class DemoTransientError(ConnectionError):
    """A simulated transient endpoint failure (retryable: a ``ConnectionError``)."""

    retryable = True


def _text_of(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def _uniforms(*parts: Any, n: int = 2) -> list[float]:
    """``n`` independent U(0, 1) from SHA-256 of ``parts`` (8 bytes each, never 0 or 1)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    while len(h) < 8 * n:
        h += hashlib.sha256(h).digest()
    return [(int.from_bytes(h[8 * i:8 * i + 8], "big") + 0.5) / 2.0**64 for i in range(n)]


def _normal(*parts: Any) -> float:
    u1, u2 = _uniforms(*parts, n=2)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _check(name: str, value: Any, lo: float, hi: float) -> float:
    from beacon.errors import ConfigError

    if not is_real(value) or not lo <= value <= hi:
        raise ConfigError(name, value, f"must be a number in [{lo}, {hi}]")
    return float(value)


class _Base:
    def __init__(self, seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0) -> None:
        if not is_integer(seed):
            from beacon.errors import ConfigError

            raise ConfigError("seed", seed, "must be an integer")
        self.seed = int(seed)
        self.latency = _check("latency_ms", latency_ms, 0.0, 600_000.0) / 1000.0
        self.fail_rate = _check("fail_rate", fail_rate, 0.0, 1.0)
        # unbound use only (a bound call keeps its own: see _io)
        self._failed: dict[tuple[Any, ...], int] = {}

    async def _io(self, *parts: Any, failed: dict[tuple[Any, ...], int] | None = None) -> None:
        """Latency, then a simulated 503 with probability ``fail_rate``.

        ``failed``: the failed attempts so far of each call being retried (an entry is dropped
        once its call succeeds), for a call that a retry repeats with the same ``parts`` (a
        scorer call): each attempt draws anew, numbered, or a call that failed once would fail
        on every retry and no failure would be transient. One dict per bound prompt, so that
        a prompt's outcomes do not depend on what other prompts did in this process. ``None``:
        every call has ``parts`` of its own (the generator numbers its calls), and one draw per
        call is all there is.
        """
        if self.latency:
            await asyncio.sleep(self.latency)
        if not self.fail_rate:
            return
        attempt = failed.get(parts, 0) if failed is not None else 0
        # a first attempt draws as it always has; a retry adds its number
        drawn = parts if attempt == 0 else (*parts, "attempt", attempt)
        if _uniforms(self.seed, "fail", *drawn, n=1)[0] < self.fail_rate:
            if failed is not None:
                failed[parts] = attempt + 1
            raise DemoTransientError("demo endpoint: simulated 503")
        if attempt and failed is not None:
            del failed[parts]


class DemoGenerator(_Base):
    """Canned responses; ``bind(record)`` gives the per-prompt ``async generate(prompt)``."""

    def __init__(self, seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0) -> None:
        super().__init__(seed, latency_ms, fail_rate)
        self._unbound: dict[str, Callable[[Any], Awaitable[str]]] = {}

    def bind(self, record: Mapping[str, Any]) -> Callable[[Any], Awaitable[str]]:
        reference = record.get("reference")
        counter = [0]

        async def generate(prompt: Any) -> str:
            i = counter[0]
            counter[0] += 1
            text = _text_of(prompt)
            await self._io(text, "gen", i)
            u_open, u_ok, u_wrong = _uniforms(self.seed, "gen", text, i, n=3)
            opening = _OPENINGS[int(u_open * len(_OPENINGS))]
            body = f"{opening} Draft {i} for: {text[:60]}"
            if reference is None:
                return body
            q = 0.05 + 0.9 * _uniforms(self.seed, "difficulty", text, n=1)[0]
            answer = str(reference) if u_ok < q else f"{reference}{1 + int(u_wrong * 9)}"
            return f"{body} The answer is \\boxed{{{answer}}}."

        return generate

    async def __call__(self, prompt: Any) -> str:
        """Unbound use (e.g. directly in a BeaconSampler): one counter per prompt text."""
        text = _text_of(prompt)
        bound = self._unbound.get(text)
        if bound is None:
            bound = self._unbound[text] = self.bind({})
        return await bound(prompt)


class DemoScorer(_Base):
    """Reward-model stand-in: ``mu_p + sigma_p * e`` (see the module docstring)."""

    #: The reward families its rewards fit: they are continuous (any real number), so neither
    #: bernoulli (0/1) nor judge (probabilities in [0, 1]); ``beacon run`` refuses the others.
    families: tuple[str, ...] = ("normal",)

    def __init__(self, seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0,
                 outlier_rate: float = 0.04) -> None:
        super().__init__(seed, latency_ms, fail_rate)
        self.outlier_rate = _check("outlier_rate", outlier_rate, 0.0, 1.0)

    def reward(self, prompt: Any, response: str) -> float:
        text = _text_of(prompt)
        mu = _normal(self.seed, "mu", text)
        sigma = math.exp(-0.5 + 0.4 * _normal(self.seed, "sigma", text))
        if _uniforms(self.seed, "outlier", text, response, n=1)[0] < self.outlier_rate:
            return mu - 4.0 * sigma
        return mu + sigma * _normal(self.seed, "e", text, response)

    def bind(self, record: Mapping[str, Any]) -> Callable[[Any, str], Awaitable[float]]:
        return functools.partial(self._score, failed={})

    async def __call__(self, prompt: Any, response: str) -> float:
        """Unbound use: retries are counted per (prompt text, response) for this object."""
        return await self._score(prompt, response, failed=self._failed)

    async def _score(self, prompt: Any, response: str, *,
                     failed: dict[tuple[Any, ...], int]) -> float:
        await self._io(_text_of(prompt), "score", response, failed=failed)
        return self.reward(prompt, response)


class DemoVerifier(_Base):
    """1.0 if the last ``\\boxed{}`` answer equals the record's ``reference``, else 0.0."""

    def bind(self, record: Mapping[str, Any]) -> Callable[[Any, str], Awaitable[float]]:
        reference = record.get("reference")
        if reference is None:
            from beacon.errors import ConfigError

            raise ConfigError("reference", None,
                              f"the demo verifier needs a reference answer (prompt id "
                              f"{record.get('id')!r})")
        want = str(reference).strip()
        failed: dict[tuple[Any, ...], int] = {}

        async def verify(prompt: Any, response: str) -> float:
            await self._io(_text_of(prompt), "verify", response, failed=failed)
            found = _last_boxed(response)
            return 1.0 if found is not None and found.strip() == want else 0.0

        return verify


def generator(seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0) -> DemoGenerator:
    """Factory for ``--generator beacon.demo:generator``."""
    return DemoGenerator(seed, latency_ms, fail_rate)


def scorer(seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0,
           outlier_rate: float = 0.04) -> DemoScorer:
    """Factory for ``--scorer beacon.demo:scorer`` (continuous rewards, ``normal`` family)."""
    return DemoScorer(seed, latency_ms, fail_rate, outlier_rate)


def verifier(seed: int = 0, latency_ms: float = 0.0, fail_rate: float = 0.0) -> DemoVerifier:
    """Factory for ``--scorer beacon.demo:verifier`` (0/1 rewards, ``bernoulli`` family)."""
    return DemoVerifier(seed, latency_ms, fail_rate)
