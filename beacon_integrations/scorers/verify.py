"""Answer checking for math prompts, and the paper's correctness-adjusted reward.

:class:`MathAnswerVerifier` gives a 0/1 reward (for ``family="bernoulli"``): 1 when the last
``\\boxed{...}`` answer of a response is mathematically equal to the reference answer, judged
by math-verify (symbolic equality, not string equality). :class:`CorrectnessAdjusted` combines a
learned reward ``R`` with such a verifier as in the paper's appendix "Reward Adaptation for
BEACON Algorithm".
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import math
import numbers
import re
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from beacon.engine.protocol import Score, _maybe_await, is_batched, make_score, reward_rule
from beacon.errors import ConfigError, RewardError
from beacon_integrations import import_extra

__all__ = ["CorrectnessAdjusted", "MathAnswerVerifier", "adjust_reward", "last_boxed"]

_BOX_CMDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced.

    ``\\boxed 5`` (no braces) yields ``"5"`` (a sentence's period after it dropped); space or a
    line break before the brace is skipped. ``None`` when there is no complete box.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_CMDS)
    while start >= 0:
        cmd = next(c for c in _BOX_CMDS if text.startswith(c, start))
        after = start + len(cmd)
        i = after
        while i < len(text) and text[i] in " \t\r\n":  # TeX skips spaces before the argument
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
                j += 1
        elif i > after:
            rest = text[i:].split("$")[0].strip()
            if rest:
                # "the answer is \\boxed 5." -- the sentence's period is no part of the answer
                word = rest.split()[0].rstrip(".,;:!?")
                if word:
                    return word
        # an unclosed box: look for an earlier one
        start = max(text.rfind(c, 0, start) for c in _BOX_CMDS)
    return None


def _timeouts() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


# An exact number (a power or factorial of numbers) with more digits than this is not compared
# as a number: sympy builds such integers in single C calls that hold the GIL, so off the main
# thread (where math-verify has no timeout) one "\\boxed{9^{9^{9^9}}}" froze the whole process.
_MAX_DIGITS = 100_000


class _TooLarge(Exception):
    """An exact power or factorial in a parsed answer is beyond ``_MAX_DIGITS`` digits."""


def _digits(expr: Any, sympy: Any) -> float | None:
    """Upper bound on the decimal digits of ``expr`` as an exact number; None when symbolic.

    Every part is visited, so a huge power inside a symbolic expression is found too. Raises
    :class:`_TooLarge` at the first power or factorial beyond ``_MAX_DIGITS`` digits.
    """
    kids = [_digits(a, sympy) for a in expr.args]
    if isinstance(expr, sympy.Rational):
        num, den = expr.as_numer_denom()
        return max(int(num).bit_length(), int(den).bit_length()) * math.log10(2) + 1
    if isinstance(expr, sympy.Float):
        value = abs(float(expr))
        return math.log10(value) + 1 if math.isfinite(value) and value >= 1 else 1.0
    sizes = [k for k in kids if k is not None]
    if not sizes or len(sizes) < len(kids):
        return None
    size: float
    if expr.is_Pow:
        b, e = expr.args
        if b.is_Number and e.is_Number:  # literal: its digits, not a bound (2^{4096}: 1,234)
            bf, ef = abs(float(b)), abs(float(e))
            size = ef * math.log10(bf) + 1 if bf > 1 else 1.0
        elif e.is_Number:  # (5000!)^{-1}: as many digits as the base, times |e|
            size = max(abs(float(e)), 1.0) * sizes[0]
        else:
            base, exp = sizes
            size = 10.0 ** min(exp, 300.0) * base  # |exponent| < 10**exp digits
    elif isinstance(expr, sympy.factorial | sympy.factorial2):
        n = expr.args[0]
        if n.is_Number and float(n) >= 0:  # literal: log10(n!) from lgamma (5000!: ~16,300)
            size = math.lgamma(float(n) + 1) / math.log(10) + 1
        else:
            size = 10.0 ** min(sizes[0], 300.0) * sizes[0]
    elif expr.is_Mul:
        return sum(sizes)
    elif expr.is_Add:
        return max(sizes) + 1
    else:
        return None
    if size > _MAX_DIGITS:
        raise _TooLarge
    return size


def _bounded(parsed: list[Any]) -> list[Any]:
    """``parsed`` with any expression too large to compare as a number dropped.

    The answer's text stays, so two identical huge answers still match as strings.
    """
    sympy = import_extra("sympy", __name__, "verify")  # math-verify's own dependency

    out = []
    for p in parsed:
        if isinstance(p, sympy.Basic):
            try:
                _digits(p, sympy)
            except (_TooLarge, RecursionError):  # a tower nested past the stack is huge too
                continue
        out.append(p)
    return out


@lru_cache(maxsize=4096)
def _parse(expr: str, boxed: bool = True) -> list[Any]:
    """An answer parsed by math-verify: boxed as a model's final answer is (or, ``boxed``
    False, bare, as prose), and bounded.

    A reference and a response are parsed alike. Parsed bare, LaTeX kept only its first number
    ("2\\sqrt{3}" was 2); ``$...$`` is tried when the parse yields no expression ("3." boxed,
    "Monday" bare).
    """
    parse = import_extra("math_verify", __name__, "verify").parse

    t: Any = _timeouts()
    out = parse(f"\\boxed{{{expr}}}" if boxed else expr, parsing_timeout=t)
    if not out or (boxed and all(isinstance(p, str) for p in out)):
        out = parse(f"${expr}$", parsing_timeout=t) or out
    return _bounded(list(out))


# A word (three letters or more, not a LaTeX command's name) or a unit after a number ("5 m/s"):
# inside a box math-verify reads them as products of one-letter symbols ("30 dollars" became
# 30*a*d*l*...), so such a reference is parsed as prose, for the number it states.
_PROSE = re.compile(r"(?<![\\A-Za-z{])[A-Za-z]{3,}(?![A-Za-z])|\d\s+[A-Za-z]")
# \text{...} and the like: words there are the reference's own text, not prose around it
_TEXT_CMD = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{[^{}]*\}")


def _parse_reference(ref: str, boxed: bool) -> list[Any]:
    """A reference answer parsed: as a boxed answer (:func:`_parse`: all of ``2\\sqrt{3}``,
    not its first number), unless it reads as prose (a word, a unit after its number: "30
    dollars", "The answer is 42", "5 m/s"), which is parsed bare, as text for the number it
    states. A reference that was boxed itself is always a boxed answer."""
    return _parse(ref, boxed=boxed or not _PROSE.search(_TEXT_CMD.sub("", ref)))


def _number_text(ref: numbers.Real | decimal.Decimal) -> str:
    """A numeric reference (numpy's too, as a DataFrame row holds it) written as LaTeX reads it.

    Positional notation: ``str(1e-07)`` is "1e-07", which LaTeX reads as ``e*1 - 7``.
    """
    if isinstance(ref, numbers.Integral):
        return str(int(ref))
    if isinstance(ref, numbers.Rational):  # a Fraction stays exact
        return f"\\frac{{{ref.numerator}}}{{{ref.denominator}}}"
    if not math.isfinite(float(ref)):
        raise ConfigError("reference", ref, "a numeric reference answer must be finite")
    # str() is the shortest text of the value's own precision (numpy's float32 0.1 is "0.1")
    text = format(decimal.Decimal(str(ref)), "f")
    return text[:-2] if text.endswith(".0") else text


class MathAnswerVerifier:
    """0/1 reward: is the response's last ``\\boxed{}`` answer equal to the reference?

    The reference comes from the prompt record:

    * ``reference=callable``: ``reference(prompt)`` returns it;
    * ``reference=None`` (default): ``prompt[reference_key]`` when the prompt is a mapping
      (e.g. ``{"problem": ..., "answer": "\\frac{1}{2}"}``), else ``prompt.<reference_key>``;
    * ``reference="..."``: a fixed reference for every prompt.

    A missing reference raises :class:`beacon.ConfigError` naming ``reference_key``; a response
    without a boxed answer scores 0 (and :meth:`check` returns ``None``).
    """

    def __init__(
        self,
        reference: str | Callable[[Any], Any] | None = None,
        *,
        reference_key: str = "answer",
        float_rounding: int = 6,
    ) -> None:
        if reference is not None and not (isinstance(reference, str) or callable(reference)):
            raise ConfigError("reference", reference, "must be a string, a callable or None")
        self.reference = reference
        self.reference_key = reference_key
        self.float_rounding = float_rounding

    def reference_for(self, prompt: Any) -> str:
        ref: Any
        if isinstance(self.reference, str):
            ref = self.reference
        elif callable(self.reference):
            ref = self.reference(prompt)
        elif isinstance(prompt, Mapping):
            if self.reference_key not in prompt:
                raise ConfigError(
                    "reference_key", self.reference_key, "the prompt record has no such field"
                )
            ref = prompt[self.reference_key]
        else:
            ref = getattr(prompt, self.reference_key, None)
            if ref is None:
                raise ConfigError(
                    "reference_key",
                    self.reference_key,
                    f"prompt of type {type(prompt).__name__} has no such field; pass "
                    "reference=callable or a mapping prompt",
                )
        if isinstance(ref, numbers.Real | decimal.Decimal) and not isinstance(ref, bool):
            ref = _number_text(ref)
        if not isinstance(ref, str) or not ref.strip():
            raise ConfigError("reference", ref, "the reference answer must be a non-empty string")
        return ref

    def check(self, prompt: Any, text: str) -> bool | None:
        """True / False for a correct / incorrect boxed answer; None when there is none."""
        verify = import_extra("math_verify", __name__, "verify").verify

        answer = last_boxed(text)
        if answer is None:
            return None
        ref = self.reference_for(prompt)
        ref_box = last_boxed(ref)
        gold = _parse_reference(ref_box if ref_box is not None else ref, ref_box is not None)
        pred = _parse(answer)
        if not gold or not pred:
            return False
        return bool(
            verify(gold, pred, float_rounding=self.float_rounding, timeout_seconds=_timeouts())
        )

    def __call__(self, prompt: Any, text: str) -> float:
        return 1.0 if self.check(prompt, text) else 0.0

    def __repr__(self) -> str:
        return f"MathAnswerVerifier(reference_key={self.reference_key!r})"


def adjust_reward(r: float, correct: bool | None) -> float:
    """The paper's reward adaptation (appendix "Reward Adaptation for BEACON Algorithm").

    ``R_BEACON`` = 2R if correct and R > 0; R/2 if correct and R <= 0; R/2 if incorrect and
    R > 0; 2R if incorrect and R <= 0; R unchanged when there is no boxed answer (None).
    """
    if correct is None:
        return r
    if correct:
        return 2.0 * r if r > 0 else r / 2.0
    return r / 2.0 if r > 0 else 2.0 * r


class CorrectnessAdjusted:
    """A scorer returning ``adjust_reward(R, correct)``: learned reward R adapted by a verifier.

    ``scorer`` is any engine scorer (sync or async, single or batched; batching is inherited);
    ``verifier`` an object with ``check(prompt, text) -> bool | None`` such as
    :class:`MathAnswerVerifier`, or a callable returning a truthy/falsy correctness (then
    "no boxed answer" cannot be told apart and counts as incorrect). Either may be async (an
    LLM judge): what it returns is awaited before its truth is read, and the checks of a batch
    run concurrently.

    Each learned reward is checked by the scorer's own rule, as the engine checks it (a real
    number or a bool; :func:`beacon.engine.protocol.reward_rule`): an invalid one (a string,
    ``None``) is a :class:`beacon.RewardError` naming the value, and that response is not
    verified. In a batch such an error -- or one the scorer or the verifier gives for one
    response -- is returned in that response's place, so it fails that sample alone. A
    :class:`beacon.Score` from the scorer (an LLM judge reporting its tokens and money) is
    returned as that ``Score`` with its reward adjusted, so its spend is still counted; when
    that response fails (an invalid learned reward, a verifier that raises), as that ``Score``
    with the error in its reward's place: the sample fails with it, the judge's spend is
    counted, and the paid judge call is not retried for the verifier's failure.
    """

    def __init__(self, scorer: Any, verifier: Any) -> None:
        if not callable(scorer):
            raise ConfigError("scorer", scorer, "must be callable")
        if not (callable(getattr(verifier, "check", None)) or callable(verifier)):
            raise ConfigError("verifier", verifier, "must have check(prompt, text) or be callable")
        self.scorer = scorer
        self.verifier = verifier
        self.batched = is_batched(scorer)
        self._score, _ = make_score(scorer)
        self._rule = reward_rule(scorer)

    async def _correct(self, prompt: Any, text: str) -> bool | None:
        check = getattr(self.verifier, "check", None)
        if callable(check):
            out = await _maybe_await(check(prompt, text))
            return None if out is None else bool(out)
        return bool(await _maybe_await(self.verifier(prompt, text)))

    async def _adjusted(self, prompt: Any, r: Any, text: str) -> float | Score:
        if isinstance(r, Score):
            # an LLM judge's spend stays with its adjusted reward (the engine counts it), and
            # with the error that fails this response (an invalid reward, a failing verifier):
            # the judge was paid all the same, and a retry of the call would pay it again
            try:
                reward = await self._adjusted(prompt, r.reward, text)
            except Exception as exc:
                return dataclasses.replace(r, reward=exc)
            return dataclasses.replace(r, reward=reward)
        if isinstance(r, Exception):  # the scorer's own error for this response
            raise r
        try:
            learned = self._rule(r, None)
        except RewardError as exc:
            err = RewardError(None, r, exc.reason)
            err.args = (f"invalid learned reward: {r!r} ({exc.reason})",)
            raise err from None
        return adjust_reward(learned, await self._correct(prompt, text))

    async def __call__(self, prompt: Any, response: Any) -> Any:
        if not self.batched:
            (raw,) = await self._score(prompt, [response])
            return await self._adjusted(prompt, raw, response)
        texts = list(response)
        raws = await self._score(prompt, texts)
        got = await asyncio.gather(
            *(self._adjusted(prompt, r, t) for r, t in zip(raws, texts, strict=True)),
            return_exceptions=True,
        )
        for v in got:  # a cancellation is no per-response error
            if isinstance(v, BaseException) and not isinstance(v, Exception):
                raise v
        return got

    def __repr__(self) -> str:
        return f"CorrectnessAdjusted({self.scorer!r}, {self.verifier!r})"
