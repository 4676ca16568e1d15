"""MathAnswerVerifier (math-verify) and the paper's correctness-adjusted reward."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import beacon
from beacon.engine import BatchScorer, BeaconSampler
from beacon_integrations.scorers import (
    CorrectnessAdjusted,
    MathAnswerVerifier,
    adjust_reward,
    last_boxed,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{a{b}c} end", "a{b}c"),
        ("\\boxed 5$", "5"),
        ("\\fbox{7}", "7"),
        ("\\boxed{1} and an unclosed \\boxed{2", "1"),
        ("no box at all", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("reference", "response", "correct"),
    [
        ("\\frac{1}{2}", "so \\boxed{0.5}", True),
        ("\\frac{1}{2}", "first \\boxed{0.5}, finally \\boxed{\\frac{1}{3}}", False),
        ("x^2+1", "\\boxed{1+x^2}", True),
        ("\\sqrt{2}", "$\\boxed{\\sqrt 2}$", True),
        ("\\boxed{3}", "\\boxed{3}", True),
        ("(1,2)", "\\boxed{(1, 2)}", True),
        ("10", "\\boxed{11}", False),
    ],
)
def test_verifier_uses_math_equivalence(reference: str, response: str, correct: bool) -> None:
    v = MathAnswerVerifier()
    assert v.check({"answer": reference}, response) is correct
    assert v({"answer": reference}, response) == (1.0 if correct else 0.0)


def test_verifier_reference_sources() -> None:
    assert MathAnswerVerifier().check({"answer": "4"}, "no box") is None
    assert MathAnswerVerifier()({"answer": "4"}, "no box") == 0.0
    refs = {"q1": "4", "q2": "5"}
    v = MathAnswerVerifier(reference=refs.__getitem__)
    assert v("q1", "\\boxed{4}") == 1.0 and v("q2", "\\boxed{4}") == 0.0
    assert MathAnswerVerifier(reference="4")("anything", "\\boxed{2+2}") == 1.0
    assert MathAnswerVerifier(reference_key="gold")({"gold": 3}, "\\boxed{3}") == 1.0
    with pytest.raises(beacon.ConfigError, match="reference_key"):
        MathAnswerVerifier()({"problem": "x"}, "\\boxed{1}")
    with pytest.raises(beacon.ConfigError, match="reference_key"):
        MathAnswerVerifier()("plain string prompt", "\\boxed{1}")
    with pytest.raises(beacon.ConfigError, match="reference"):
        MathAnswerVerifier(reference=lambda p: "")("p", "\\boxed{1}")


def test_verifier_works_off_the_main_thread() -> None:
    # math-verify's signal-based timeouts only work in the main thread; run() may use a worker.
    import threading

    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(MathAnswerVerifier()({"answer": "1/2"},
                                                                          "\\boxed{0.5}")))
    t.start()
    t.join()
    assert out == [1.0]


@pytest.mark.parametrize(
    ("r", "correct", "expected"),
    [
        (1.5, True, 3.0),
        (-1.0, True, -0.5),
        (0.0, True, 0.0),
        (1.5, False, 0.75),
        (-1.0, False, -2.0),
        (0.0, False, 0.0),
        (1.5, None, 1.5),
        (-1.0, None, -1.0),
    ],
)
def test_adjust_reward_rule(r: float, correct: bool | None, expected: float) -> None:
    assert adjust_reward(r, correct) == expected


async def test_correctness_adjusted_single_and_batched() -> None:
    prompt = {"answer": "6"}
    texts = ["\\boxed{6}", "\\boxed{7}", "no box", "\\boxed{6}"]
    learned = {"\\boxed{6}": 2.0, "\\boxed{7}": 2.0, "no box": -1.0}

    async def single(p: Any, t: str) -> float:
        return learned[t]

    adj = CorrectnessAdjusted(single, MathAnswerVerifier())
    assert not adj.batched
    assert [await adj(prompt, t) for t in texts] == [4.0, 1.0, -1.0, 4.0]

    calls: list[int] = []

    def batch(p: Any, ts: list[str]) -> list[float]:
        calls.append(len(ts))
        return [learned[t] - 3.0 for t in ts]  # all non-positive

    badj = CorrectnessAdjusted(BatchScorer(batch), MathAnswerVerifier())
    assert badj.batched
    assert await badj(prompt, texts) == [-0.5, -2.0, -4.0, -0.5]
    assert calls == [4]

    plain = CorrectnessAdjusted(single, lambda p, t: t.endswith("{6}"))
    assert await plain(prompt, "\\boxed{7}") == 1.0
    assert await plain(prompt, "no box") == -2.0  # a plain callable: no box counts as incorrect


async def test_verifier_drives_bernoulli_sampler() -> None:
    answers = iter(["\\boxed{3}", "I think \\boxed{4}", "\\boxed{2+3}", "\\boxed{5}"])

    async def gen(p: Any) -> str:
        await asyncio.sleep(0)
        return next(answers)

    cfg = beacon.BeaconConfig(cost=0.01, horizon=4, family="bernoulli")
    res = await BeaconSampler(gen, MathAnswerVerifier(), cfg).arun({"q": "2+3", "answer": "5"})
    assert res.stop_reason == "absorbed" and res.n_samples == 3
    assert [c.reward for c in res.candidates] == [0.0, 0.0, 1.0]
    assert res.best is not None and res.best.text == "\\boxed{2+3}"
    pair = res.preference_pair()
    assert pair is not None and pair[0].index == 2 and pair[1].index == 0
