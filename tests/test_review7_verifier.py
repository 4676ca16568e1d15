"""Review findings on the MathAnswerVerifier audit: a reference written as prose (a word, a unit
after its number) is read for the number it states, as before, not as a product of one-letter
symbols; exact numbers of a few thousand digits are still compared as numbers."""

from __future__ import annotations

import pytest

from beacon_integrations.scorers import MathAnswerVerifier


def _boxed(answer: str) -> str:
    return f"So the final answer is $\\boxed{{{answer}}}$."


@pytest.mark.parametrize(("reference", "answer", "correct"), [
    ("30 dollars", "30", True),
    ("The answer is 42", "42", True),
    ("Answer: 42", "42", True),
    ("72 clips", "72", True),
    ("8 people", "8", True),
    ("5 m/s", "5", True),
    ("Monday", "Monday", True),
    ("yes", "\\text{yes}", True),
    ("30 dollars", "31", False),
    # the audit's fix stays: a bare expression is read whole, not as its first number
    ("2\\sqrt{3}", "2", False),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
])
def test_prose_references(reference: str, answer: str, correct: bool) -> None:
    assert MathAnswerVerifier(reference=reference).check({}, _boxed(answer)) is correct


@pytest.mark.parametrize(("reference", "answer"), [
    (str(2**4096), "2^{4096}"),
    ("24995000", "\\frac{5000!}{4998!}"),
    ("5000", "\\frac{5000!}{4999!}"),
])
def test_exact_numbers_of_thousands_of_digits_are_compared_as_numbers(
    reference: str, answer: str
) -> None:
    assert MathAnswerVerifier(reference=reference).check({}, _boxed(answer)) is True


# -- review finding on the core audit: a whole-number float k0 (a prior read back from JSON) --
def test_a_plugin_prior_with_a_whole_number_float_k0_is_accepted() -> None:
    from beacon.priors import rewards_before_first_decision

    class FloatK0:
        k0 = 2.0

    class HalfK0:
        k0 = 2.5

    assert rewards_before_first_decision(FloatK0()) == 2  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k0"):
        rewards_before_first_decision(HalfK0())  # type: ignore[arg-type]
