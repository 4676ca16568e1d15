"""Vectorised offline replay of logged rewards through the stopping rule.

``rewards`` is a 2-D array, one row per prompt, its rewards in the order the samples were drawn;
NaN marks a sample that was not logged (rows may have different lengths) and is skipped. For
every prompt the replay feeds rewards to the policy exactly as :class:`beacon.Stopper` would and
reports how many samples it used, which one it chose (the best raw reward among those used, the
first on ties) and why it stopped. When a row runs out of logged samples before the policy stops,
the prompt stops with reason ``horizon`` and ``truncated`` is set.

The built-in ``normal``, ``bernoulli`` and ``judge`` families run in numba kernels (one pass,
parallel over prompts); any other registered family (a plugin, also one registered over a
built-in's name) is replayed through the Stopper itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from beacon._checks import is_integer, real_as_float
from beacon.config import BeaconConfig
from beacon.errors import ConfigTypeError, RewardError
from beacon.families import get_family
from beacon.families.bernoulli import BernoulliFamily, reservation_cost
from beacon.families.judge import WIN_THRESHOLD, JudgeFamily
from beacon.families.normal import (
    MAX_ABS_REWARD,
    OVERFLOW_MESSAGE,
    TOO_LARGE_MESSAGE,
    NormalFamily,
    predictive_quantile,
)
from beacon.priors import BetaPrior, NIGPrior
from beacon.stopper import Draw, Stopper
from beacon.transforms import check_transformed_range

__all__ = ["REASONS", "ReplayResult", "replay"]

REASONS = np.array(["index", "horizon", "absorbed"], dtype=object)


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """Per-prompt outcome of a replay (arrays of length = number of prompts).

    Two results are equal when every array is (``best_reward`` NaN where the row was empty);
    a result is not hashable (its arrays are not).

    Attributes:
        n_samples: samples used (K).
        chosen: column of the chosen sample in the input array (-1 if the row was empty).
        best_reward: raw reward of the chosen sample (NaN if the row was empty).
        stop_reason: ``index`` | ``horizon`` | ``absorbed``.
        truncated: the row ran out of logged samples before the policy stopped.
    """

    n_samples: NDArray[np.int64]
    chosen: NDArray[np.int64]
    best_reward: NDArray[np.float64]
    stop_reason: NDArray[np.object_]
    truncated: NDArray[np.bool_]

    @property
    def mean_samples(self) -> float:
        """Average number of samples used per prompt."""
        return float(np.mean(self.n_samples))

    def __len__(self) -> int:
        return int(self.n_samples.shape[0])

    def __eq__(self, other: object) -> bool:
        # the generated __eq__ compares tuples of arrays, whose truth value numpy refuses
        if not isinstance(other, ReplayResult):
            return NotImplemented
        return (
            np.array_equal(self.n_samples, other.n_samples)
            and np.array_equal(self.chosen, other.chosen)
            and np.array_equal(self.best_reward, other.best_reward, equal_nan=True)
            and np.array_equal(self.stop_reason, other.stop_reason)
            and np.array_equal(self.truncated, other.truncated)
        )


def _as_matrix(rewards: ArrayLike) -> NDArray[np.float64]:
    try:
        if isinstance(rewards, np.ma.MaskedArray):
            # np.asarray would drop the mask and replay the hidden values: masked is missing
            if rewards.dtype.kind not in "biuf":
                raise TypeError(f"elements of dtype {rewards.dtype} are not real numbers")
            rewards = np.ma.filled(rewards.astype(np.float64), np.nan)
        given = np.asarray(rewards)
        # numpy would parse "0.5" and drop an imaginary part; the Stopper refuses both
        if given.dtype.kind not in "biufO":
            raise TypeError(f"elements of dtype {given.dtype} are not real numbers")
        if given.dtype.kind == "O":
            for flat, v in enumerate(given.flat):
                if v is None or type(v) is float:  # the common cells: missing, a number
                    continue
                if isinstance(v, str | bytes | complex | np.complexfloating):
                    raise TypeError(f"element {v!r} is not a real number")
                if isinstance(v, int) and not math.isfinite(real_as_float(v)):
                    # an int beyond the float range: the Stopper's "must be finite"
                    idx = np.unravel_index(flat, given.shape)
                    pos = tuple(int(i) for i in idx) if given.ndim == 2 else "rewards"
                    raise RewardError(pos, v, "rewards must be finite (NaN marks missing)")
        x = np.asarray(given, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, RewardError):
            raise
        raise RewardError("rewards", "<array>", f"must be a numeric 2-D array ({exc})") from exc
    if x.ndim == 1:
        raise RewardError("rewards", f"shape {x.shape}", "must be 2-D (prompts x samples)")
    if x.ndim != 2:
        raise RewardError("rewards", f"shape {x.shape}", "must be 2-D (prompts x samples)")
    bad = np.isinf(x)
    if bad.any():
        r, c = (int(v) for v in np.argwhere(bad)[0])
        raise RewardError((r, c), float(x[r, c]), "rewards must be finite (NaN marks missing)")
    if x.shape[1] == 0:  # no samples logged at all: the same as one missing sample per prompt
        return np.full((x.shape[0], 1), np.nan)
    return np.ascontiguousarray(x)


def replay(rewards: ArrayLike, cfg: BeaconConfig) -> ReplayResult:
    """Replay ``cfg``'s stopping rule over logged ``rewards`` (prompts x samples, NaN = missing)."""
    if not isinstance(cfg, BeaconConfig):
        raise ConfigTypeError(
            "cfg", cfg, f"must be a beacon.BeaconConfig, got {type(cfg).__name__}"
        )
    raw = _as_matrix(rewards)
    prior = cfg.resolved_prior
    # The kernels replicate the built-in families; a family registered over a built-in name (or
    # a subclass of one) decides its own way, so it is replayed through the Stopper.
    kind = type(get_family(cfg.family))
    if kind is NormalFamily and isinstance(prior, NIGPrior):
        x = raw if cfg.transform is None else np.ascontiguousarray(cfg.transform.apply(raw))
        bad = np.isinf(x) | (np.isnan(x) & ~np.isnan(raw))
        if bad.any():
            r, c = (int(v) for v in np.argwhere(bad)[0])
            raise RewardError((r, c), float(raw[r, c]), "outside the domain of the transform")
        if cfg.transform is not None:
            # the user's reward, and why its transform is refused (as the Stopper says it)
            check_transformed_range(raw, x, cfg.transform.kind)
        else:
            with np.errstate(invalid="ignore"):
                big = np.abs(x) > MAX_ABS_REWARD
            if big.any():
                r, c = (int(v) for v in np.argwhere(big)[0])
                raise RewardError((r, c), float(x[r, c]), TOO_LARGE_MESSAGE)
        from beacon._kernels.replay import replay_normal
        from beacon.index import get_table

        table = get_table(cfg.horizon, prior.alpha0, prior.nu0)
        # the robust rule's Student-t quantile per k, at dof 2 alpha_k with alpha_k summed half
        # by half as the Stopper's update does (2 alpha0 + k can differ in the last bit)
        tq = np.empty(cfg.horizon + 1, dtype=np.float64)
        alpha_k = prior.alpha0
        for k in range(cfg.horizon + 1):
            tq[k] = -np.inf
            if alpha_k > 0:
                tq[k] = predictive_quantile(2.0 * alpha_k, cfg.robust_quantile)
            alpha_k = alpha_k + 0.5
        used, chosen, code, trunc, overflow = replay_normal(
            x,
            raw,
            cfg.horizon,
            cfg.k0,
            prior.k0,
            cfg.batch_size,
            cfg.robust,
            tq,
            prior.mu0,
            prior.nu0,
            prior.alpha0,
            prior.beta0,
            cfg.cost,
            tuple(table.lookup_arrays()),
        )
        over = np.flatnonzero(overflow >= 0)
        if over.size:  # the reward on which the Stopper raises, in the first such prompt
            r = int(over[0])
            c = int(overflow[r])
            raise RewardError((r, c), float(x[r, c]), OVERFLOW_MESSAGE)
    elif kind in (BernoulliFamily, JudgeFamily) and isinstance(prior, BetaPrior):
        judge = kind is JudgeFamily
        if not judge:
            ok = np.isnan(raw) | (raw == 0.0) | (raw == 1.0)
            why = "the bernoulli family needs rewards 0 or 1"
            wins = raw
        else:
            # judge: the Bernoulli rule on win indicators 1{r > 1/2} (beacon.families.judge)
            ok = np.isnan(raw) | ((raw >= 0.0) & (raw <= 1.0))
            why = "the judge family needs probabilities in [0, 1]"
            wins = np.where(np.isnan(raw), np.nan, (raw > WIN_THRESHOLD).astype(np.float64))
        if not ok.all():
            r, c = (int(v) for v in np.argwhere(~ok)[0])
            raise RewardError((r, c), float(raw[r, c]), why)
        from beacon._kernels.replay import replay_bernoulli

        # h^B_{n,k}(a0, b_k) before any success; b_k summed one failure at a time as the
        # Stopper's update does (b0 + k itself can differ in the last bit, and so can h^B)
        h_b = np.empty(cfg.horizon, dtype=np.float64)
        b_k = prior.b0
        for k in range(cfg.horizon):
            h_b[k] = reservation_cost(cfg.horizon, k, prior.a0, b_k)
            b_k += 1.0
        used, chosen, code, trunc = replay_bernoulli(
            np.ascontiguousarray(wins), cfg.horizon, cfg.k0, cfg.batch_size, h_b, cfg.cost
        )
        if judge:
            chosen = _first_argmax_among_used(raw, used)
    else:
        return _replay_with_stopper(raw, cfg)
    best = np.where(chosen >= 0, raw[np.arange(raw.shape[0]), np.maximum(chosen, 0)], np.nan)
    return ReplayResult(used, chosen, best, REASONS[code], trunc)


def _first_argmax_among_used(
    raw: NDArray[np.float64], used: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Column of the best raw reward among each row's first ``used`` logged (non-NaN) samples."""
    order = np.cumsum(~np.isnan(raw), axis=1)
    in_use = ~np.isnan(raw) & (order <= used[:, None])
    masked = np.where(in_use, raw, -np.inf)
    chosen: NDArray[np.int64] = np.argmax(masked, axis=1).astype(np.int64)
    chosen[used == 0] = -1
    return chosen


def _replay_with_stopper(raw: NDArray[np.float64], cfg: BeaconConfig) -> ReplayResult:
    """Exact but slow path for plugin families: drive a Stopper per prompt."""
    n_rows = raw.shape[0]
    used = np.zeros(n_rows, dtype=np.int64)
    chosen = np.full(n_rows, -1, dtype=np.int64)
    best = np.full(n_rows, np.nan)
    reasons = np.empty(n_rows, dtype=object)
    trunc = np.zeros(n_rows, dtype=np.bool_)
    for i in range(n_rows):
        cols = np.flatnonzero(~np.isnan(raw[i]))
        s = Stopper(cfg)
        pos = 0
        try:
            while isinstance(d := s.next_decision(), Draw):
                if pos + d.count > cols.size:
                    trunc[i] = True
                    s.observe(raw[i, cols[pos:]])
                    pos = cols.size
                    break
                s.observe(raw[i, cols[pos : pos + d.count]])
                pos += d.count
        except RewardError as exc:
            raise _in_array(exc, i, cols) from exc
        used[i] = s.k
        reasons[i] = "horizon" if trunc[i] else d.reason  # type: ignore[union-attr]
        if s.best_index >= 0:
            chosen[i] = cols[s.best_index]
            best[i] = raw[i, chosen[i]]
    return ReplayResult(used, chosen, best, reasons, trunc)


def _in_array(exc: RewardError, row: int, cols: NDArray[np.intp]) -> RewardError:
    """The Stopper's error for a reward of ``row``, placed at its ``(row, column)`` in the
    array, as the kernels place theirs: the Stopper counts the row's logged rewards, so its
    position 3 is the fourth non-NaN cell of the row, not column 3 of row 0."""
    p = exc.position
    if is_integer(p) and 0 <= p < cols.size:
        return RewardError((row, int(cols[int(p)])), exc.value, exc.reason)
    # a plugin's own position (not the Stopper's count): keep it, with the row it is in
    return RewardError(f"row {row}, position {p!r} of its logged rewards", exc.value, exc.reason)
