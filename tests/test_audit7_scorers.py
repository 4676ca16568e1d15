"""Audit of the math answer verifier: reference parsing, unbraced boxes, numeric references and
answers too large to compare off the main thread."""

from __future__ import annotations

import fractions
import subprocess
import sys
import threading

import numpy as np
import pytest

import beacon
from beacon_integrations.scorers import MathAnswerVerifier, last_boxed


@pytest.mark.parametrize(
    ("reference", "response", "correct"),
    [
        # a bare LaTeX reference was read by its first number only
        ("2\\sqrt{3}", "\\boxed{2}", False),
        ("2\\sqrt{3}", "\\boxed{2\\sqrt 3}", True),
        ("2\\pi", "\\boxed{2 \\pi}", True),
        ("x=3", "\\boxed{x = 3}", True),
        ("1{,}000", "\\boxed{1}", False),
        ("1{,}000", "\\boxed{1000}", True),
        ("3, 4", "\\boxed{4}", False),
        # an answer the box yields no expression for is read between dollars
        ("3", "\\boxed{3.}", True),
    ],
)
def test_reference_is_parsed_as_an_answer(reference: str, response: str, correct: bool) -> None:
    assert MathAnswerVerifier().check({"answer": reference}, response) is correct


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed 5.", "5"),
        ("so \\boxed 12, as claimed", "12"),
        ("\\boxed\n{42}", "42"),
        ("\\boxed {\\frac{1}{2}}", "\\frac{1}{2}"),
    ],
)
def test_last_boxed_punctuation_and_space(text: str, expected: str) -> None:
    assert last_boxed(text) == expected
    assert MathAnswerVerifier(reference=expected).check("p", text) is True


@pytest.mark.parametrize(
    ("reference", "response"),
    [
        (1e-7, "\\boxed{10^{-7}}"),
        (np.int64(7), "\\boxed{7}"),  # a DataFrame row's integer
        (np.float32(0.1), "\\boxed{0.1}"),
        (fractions.Fraction(1, 3), "\\boxed{\\frac{1}{3}}"),
    ],
)
def test_numeric_references(reference: object, response: str) -> None:
    v = MathAnswerVerifier()
    assert v.check({"answer": reference}, response) is True
    assert v.check({"answer": reference}, "\\boxed{8}") is False


@pytest.mark.parametrize("reference", [float("nan"), np.float64("inf")])
def test_non_finite_reference_is_refused(reference: float) -> None:
    with pytest.raises(beacon.ConfigError, match=r"reference.*finite"):
        MathAnswerVerifier().check({"answer": reference}, "\\boxed{1}")


_IN_THREAD = """
import sys, threading
from beacon_integrations.scorers import MathAnswerVerifier
out = []
for answer in sys.argv[1:]:
    t = threading.Thread(target=lambda: out.append(
        MathAnswerVerifier().check({"answer": "5"}, "\\\\boxed{" + answer + "}")))
    t.start()
    t.join()
print(out)
"""


def test_huge_answers_off_the_main_thread_do_not_hang() -> None:
    # math-verify has no timeout off the main thread (run() in Jupyter, offload_sync=True), and
    # sympy computed these integers holding the GIL: the whole process froze for good. A child
    # process, as a hang there cannot be interrupted from a thread of this one.
    answers = ["9^{9^{9^{9^{9}}}}", "100!!!", "2^{2^{40}}", "99999999999^{99999999}"]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IN_THREAD, *answers],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("checking a huge answer off the main thread hung")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([False] * len(answers))


def _check_in_thread(reference: str, response: str) -> list[bool | None]:
    out: list[bool | None] = []
    t = threading.Thread(
        target=lambda: out.append(MathAnswerVerifier().check({"answer": reference}, response))
    )
    t.start()
    t.join()
    return out


def test_identical_huge_answers_still_match() -> None:
    assert _check_in_thread("2^{2^{40}}", "\\boxed{2^{2^{40}}}") == [True]
    assert _check_in_thread("2^{1000}", "\\boxed{2^{1000}}") == [True]
    assert _check_in_thread("2^{1000}", "\\boxed{2^{999}}") == [False]
