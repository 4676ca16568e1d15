"""Peer stopping rules, replayed on logged samples (vectorised numpy, one row per prompt).

Every rule sees the same logged samples in the same order as BEACON and the same horizon ``n``
(the most samples any method may draw for a prompt). Two kinds of logs:

* **Rewards** — a 2-D float array ``(prompts, samples)``; ``NaN`` marks a sample that was not
  logged and is skipped (the convention of :func:`beacon.replay`, so rows may have different
  lengths). A rule that wants more samples than a row holds stops at the end of the log and is
  marked ``truncated``; ``chosen`` is always a column of the input array.
* **Final answers** — a 2-D int array of per-row answer ids (``factorize_answers`` builds it
  from any hashable answers): ids ``>= 0`` are answers, ``-1`` a sample without a parsable
  answer (it costs a sample but casts no vote).

Rules (``K`` = samples drawn, in ``1..n``):

* :func:`best_of_n` — draw ``N`` samples, return the best reward
  (:func:`beacon.evaluation.fixed_best_of_n` on the logged samples).
* :func:`threshold_stop` — DSPy ``BestOfN`` style: stop at the first reward ``>= threshold``
  and return it; if none reaches it within ``n``, return the best of ``n``.
* :func:`majority_vote` — self-consistency: ``N`` samples, majority answer.
* :func:`adaptive_consistency_beta` — Adaptive-Consistency (Aggarwal et al., 2023) Beta
  criterion: with ``v1 >= v2`` the counts of the two most frequent answers after ``k`` samples,
  stop as soon as ``P(p1 > p2) = P(B > 1/2)``, ``B ~ Beta(v1 + 1, v2 + 1)``, reaches
  ``confidence``; return the majority answer.
* :func:`esc_window` — Early-Stopping Self-Consistency (Li et al., ICLR 2024): sample in
  windows of ``w``; stop at the end of the first window whose ``w`` answers are all identical
  (zero entropy); return the majority over everything drawn.

Majority ties go to the answer seen first (what ``collections.Counter.most_common`` does on
an insertion-ordered count). A chosen reward is the first occurrence of the maximum (the
Stopper's rule: a later equal reward does not replace the best).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import betainc

from beacon.errors import ConfigError, RewardError
from beacon.evaluation import fixed_best_of_n

__all__ = [
    "StopResult",
    "VoteResult",
    "adaptive_consistency_beta",
    "as_reward_log",
    "best_of_n",
    "esc_window",
    "factorize_answers",
    "log_lengths",
    "majority_answer",
    "majority_vote",
    "prefix_best",
    "threshold_stop",
]

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class StopResult:
    """Per-row outcome of a reward-based rule.

    ``n_samples`` (K, samples drawn), ``chosen`` (column of the returned sample; -1 when no
    sample was drawn), ``truncated`` (the rule wanted more samples than the log holds).
    """

    n_samples: IntArray
    chosen: IntArray
    truncated: NDArray[np.bool_]


@dataclass(frozen=True)
class VoteResult:
    """Per-row outcome of an answer-voting rule: ``n_samples`` and the returned ``answer``
    id (-1 when no drawn sample had an answer)."""

    n_samples: IntArray
    answer: IntArray


# -- validation ------------------------------------------------------------------------------
def _check_int(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(name, value, "must be an integer")
    if int(value) < lo:
        raise ConfigError(name, value, f"must be >= {lo}")
    return int(value)


def as_reward_log(rewards: ArrayLike) -> FloatArray:
    """The rewards as a 2-D float array (NaN = not logged); inf is a :class:`RewardError`."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ConfigError("rewards", f"array of shape {r.shape}", "must be 2-D (prompts x samples)")
    if np.isinf(r).any():
        i, j = np.argwhere(np.isinf(r))[0]
        raise RewardError((int(i), int(j)), float(r[i, j]), "rewards must be finite or NaN")
    return r


def _compact(r: FloatArray) -> tuple[FloatArray, IntArray]:
    """Logged rewards moved to the front of each row (order kept) and the column map back."""
    order = np.argsort(np.isnan(r), axis=1, kind="stable").astype(np.int64)
    return np.take_along_axis(r, order, axis=1), order


def _to_columns(order: IntArray, chosen: IntArray) -> IntArray:
    out = np.take_along_axis(order, np.maximum(chosen, 0)[:, None], axis=1)[:, 0]
    return np.where(chosen >= 0, out, -1).astype(np.int64)


def log_lengths(rewards: FloatArray) -> IntArray:
    """Logged (non-NaN) samples per row."""
    return np.asarray((~np.isnan(rewards)).sum(axis=1), dtype=np.int64)


def prefix_best(rewards: FloatArray, k: ArrayLike) -> IntArray:
    """Column of the best reward among the first ``k[i]`` logged samples of row ``i``.

    -1 where k = 0; ties go to the earliest sample; NaN entries are skipped, not counted.
    """
    r = np.asarray(rewards, dtype=np.float64)
    nan = np.isnan(r)
    has_nan = bool(nan.any())
    c, order = _compact(r) if has_nan else (r, None)
    kk = np.broadcast_to(np.asarray(k, dtype=np.int64), (c.shape[0],))
    cols = np.arange(c.shape[1])
    keep = cols[None, :] < kk[:, None]
    if has_nan:
        keep &= ~np.isnan(c)
    best = np.argmax(np.where(keep, c, -np.inf), axis=1).astype(np.int64)
    best[kk <= 0] = -1
    return best if order is None else _to_columns(order, best)


# -- reward rules ----------------------------------------------------------------------------
def best_of_n(rewards: ArrayLike, n: int) -> StopResult:
    """Fixed best-of-N: K = min(N, log length), the best of those K."""
    r = as_reward_log(rewards)
    n = _check_int("n", n, 1)
    length = log_lengths(r)
    k = np.minimum(n, length)
    compact, order = _compact(r)
    chosen, _ = fixed_best_of_n(compact, n)  # the CLI's best-of-N, on the logged samples
    chosen = np.where(k > 0, _to_columns(order, chosen), -1).astype(np.int64)
    return StopResult(k, chosen, length < n)


def threshold_stop(rewards: ArrayLike, threshold: ArrayLike, horizon: int) -> StopResult:
    """Stop at the first reward >= ``threshold`` (a scalar or one per row), at most ``horizon``.

    DSPy ``BestOfN(module, N=horizon, reward_fn, threshold)``: returns the first sample that
    reaches the threshold, otherwise the best of the ``horizon`` samples.
    """
    r = as_reward_log(rewards)
    horizon = _check_int("horizon", horizon, 1)
    thr = np.broadcast_to(np.asarray(threshold, dtype=np.float64), (r.shape[0],))
    if np.isnan(thr).any():
        raise ConfigError("threshold", float(thr[np.isnan(thr)][0]), "must not be NaN")
    c, _ = _compact(r)
    length = log_lengths(r)
    with np.errstate(invalid="ignore"):
        hit = c[:, :horizon] >= thr[:, None]  # NaN compares False: padding never hits
    any_hit = hit.any(axis=1)
    first = np.argmax(hit, axis=1).astype(np.int64)
    k = np.where(any_hit, first + 1, np.minimum(horizon, length))
    return StopResult(k, prefix_best(r, k), ~any_hit & (length < horizon))


# -- answer rules ----------------------------------------------------------------------------
def factorize_answers(answers: Sequence[Sequence[Hashable | None]]) -> IntArray:
    """Per-row dense answer ids (order of first appearance); ``None`` becomes -1.

    Rows must have equal length (the horizon of the log).
    """
    lengths = {len(row) for row in answers}
    if len(lengths) > 1:
        raise ConfigError("answers", sorted(lengths), "all rows must have the same length")
    width = lengths.pop() if lengths else 0
    out = np.full((len(answers), width), -1, dtype=np.int64)
    for i, row in enumerate(answers):
        ids: dict[Hashable, int] = {}
        for j, a in enumerate(row):
            if a is not None:
                out[i, j] = ids.setdefault(a, len(ids))
    return out


def _as_answers(answers: ArrayLike) -> IntArray:
    a = np.asarray(answers)
    if a.ndim != 2:
        raise ConfigError("answers", f"array of shape {a.shape}", "must be 2-D (prompts x samples)")
    if not np.issubdtype(a.dtype, np.integer):
        raise ConfigError("answers", str(a.dtype), "must be integer answer ids (factorize_answers)")
    if a.size and a.min() < -1:
        raise ConfigError("answers", int(a.min()), "ids must be >= 0, or -1 for no answer")
    return a.astype(np.int64, copy=False)


class _Tally:
    """Vote counts per row, updated one column at a time for the rows still sampling."""

    def __init__(self, answers: IntArray) -> None:
        self.answers = answers
        n_rows, width = answers.shape
        n_ids = int(answers.max()) + 1 if answers.size and answers.max() >= 0 else 1
        self.counts = np.zeros((n_rows, n_ids), dtype=np.int64)
        # First column where each answer appeared, for first-seen tie-breaking.
        self.first = np.full((n_rows, n_ids), width + 1, dtype=np.int64)
        self.rows = np.arange(n_rows)

    def add(self, col: int, active: NDArray[np.bool_]) -> None:
        a = self.answers[:, col]
        sel = active & (a >= 0)
        r, ids = self.rows[sel], a[sel]
        self.counts[r, ids] += 1
        self.first[r, ids] = np.minimum(self.first[r, ids], col)

    def majority(self) -> IntArray:
        width = self.answers.shape[1]
        key = self.counts * (width + 2) - self.first
        best: IntArray = np.argmax(key, axis=1).astype(np.int64)
        best[self.counts.max(axis=1) == 0] = -1
        return best

    def top_two(self) -> tuple[IntArray, IntArray]:
        if self.counts.shape[1] == 1:
            return self.counts[:, 0], np.zeros(self.counts.shape[0], dtype=np.int64)
        part = np.partition(self.counts, self.counts.shape[1] - 2, axis=1)
        return part[:, -1], part[:, -2]


def majority_answer(answers: ArrayLike, k: ArrayLike) -> IntArray:
    """Majority answer among the first ``k[i]`` samples of each row (-1 if none answered)."""
    a = _as_answers(answers)
    kk = np.broadcast_to(np.asarray(k, dtype=np.int64), (a.shape[0],))
    tally = _Tally(a)
    for col in range(a.shape[1]):
        tally.add(col, kk > col)
    return tally.majority()


def majority_vote(answers: ArrayLike, n: int) -> VoteResult:
    """Self-consistency with a fixed N: majority of the first N answers."""
    a = _as_answers(answers)
    n = _check_int("n", n, 1)
    k = np.full(a.shape[0], min(n, a.shape[1]), dtype=np.int64)
    return VoteResult(k, majority_answer(a, k))


def _scan(a: IntArray, horizon: int, rule: str, param: float | int) -> VoteResult:
    n_rows = a.shape[0]
    horizon = min(horizon, a.shape[1])
    tally = _Tally(a)
    active = np.ones(n_rows, dtype=bool)
    k = np.full(n_rows, horizon, dtype=np.int64)
    answer = np.full(n_rows, -1, dtype=np.int64)
    for col in range(horizon):
        tally.add(col, active)
        drawn = col + 1
        if rule == "beta":
            v1, v2 = tally.top_two()
            # P(B > 1/2) for B ~ Beta(v1 + 1, v2 + 1) equals I_{1/2}(v2 + 1, v1 + 1).
            prob = betainc(v2 + 1.0, v1 + 1.0, 0.5)
            stop = active & (v1 > 0) & (prob >= param)
        else:
            w = int(param)
            if drawn % w:
                continue
            win = a[:, drawn - w : drawn]
            stop = active & (win[:, 0] >= 0) & (win == win[:, :1]).all(axis=1)
        if stop.any():
            k[stop] = drawn
            answer[stop] = tally.majority()[stop]
            active &= ~stop
        if not active.any():
            break
    if active.any():
        answer[active] = tally.majority()[active]
    return VoteResult(k, answer)


def adaptive_consistency_beta(
    answers: ArrayLike, horizon: int, confidence: float = 0.95
) -> VoteResult:
    """Adaptive-Consistency Beta stopping (see module docstring), at most ``horizon`` samples."""
    a = _as_answers(answers)
    horizon = _check_int("horizon", horizon, 1)
    if isinstance(confidence, bool) or not (0.5 < float(confidence) < 1.0):
        raise ConfigError("confidence", confidence, "must be in (0.5, 1)")
    return _scan(a, horizon, "beta", float(confidence))


def esc_window(answers: ArrayLike, horizon: int, window: int = 5) -> VoteResult:
    """Early-Stopping Self-Consistency with window ``window``, at most ``horizon`` samples."""
    a = _as_answers(answers)
    horizon = _check_int("horizon", horizon, 1)
    window = _check_int("window", window, 1)
    return _scan(a, horizon, "window", window)
