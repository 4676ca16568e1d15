"""What ``bench.quality`` and ``bench.priors`` share: paths, cross-fitting, judge replay, tables.

Cross-fitting is :func:`beacon.evaluation.cross_fit` (split by
:func:`beacon.evaluation.fold_assignment`; fold ``f``'s prior and transform are fitted on the
prompts outside ``f``). The benchmarks also replay variants without a fitted prior (Jeffreys /
Beta(1, 1)) and their own stopper scales, so :func:`unfitted_fitter` and :class:`FoldScale` let
:func:`~beacon.evaluation.cross_fit` carry those per-fold fits through the same split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

import beacon
from beacon.families.judge import WIN_THRESHOLD
from beacon.priors import Prior
from beacon.replay import replay
from beacon.transforms import LogitTransform, RewardTransform
from bench.baselines import prefix_best

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO.parent / "shared" / "data"


@dataclass(frozen=True)
class FoldScale:
    """A fold's fit without :class:`beacon.fitting.FitResult`'s fitted prior.

    ``prior`` None is the family default; ``within_scale`` is the unit of the bench's
    standardized cost ``c_std`` for that fold (what ``cross_fit`` stores as ``s_f``).
    """

    prior: Prior | None
    transform: RewardTransform | None
    within_scale: float


def base_transform(spec: str | None, train_raw: FloatArray) -> RewardTransform | None:
    """The reward transform of ``spec`` for one fold: ``gaussianize`` is fitted on ``train_raw``."""
    if spec is None or spec == "none":
        return None
    if spec == "logit":
        return LogitTransform()
    if spec == "gaussianize":
        from beacon.fitting import GaussianizeTransform

        return GaussianizeTransform.fit(train_raw)
    raise beacon.ConfigError("transform", spec, "the benchmarks know none, logit, gaussianize")


def pooled_within_sd(x: FloatArray) -> float:
    """sqrt(mean_i var_i) with the unbiased (ddof=1) within-prompt variance of each row."""
    with np.errstate(invalid="ignore"):
        v = np.nanvar(x, axis=1, ddof=1)
    return float(np.sqrt(np.nanmean(v)))


Fitter = Callable[[FloatArray, str, "str | RewardTransform | None"], FoldScale]


def unfitted_fitter(
    scale: Callable[[FloatArray], float] = pooled_within_sd,
) -> Fitter:
    """A ``cross_fit`` fitter for the family's default prior: per fold only the transform
    (fitted on the training prompts for ``gaussianize``) and ``scale`` of the training
    prompts' transformed rewards (1 for the Beta families, whose ``c`` is in successes)."""

    def fit(train: FloatArray, family: str, spec: str | RewardTransform | None) -> FoldScale:
        if family != "normal":
            return FoldScale(None, None, 1.0)
        tr = spec if isinstance(spec, RewardTransform) else base_transform(spec, train)
        x = train if tr is None else np.asarray(tr.apply(train), dtype=np.float64)
        return FoldScale(None, tr, scale(x))

    return fit


def judge_replay(raw: FloatArray, cfg: beacon.BeaconConfig) -> tuple[IntArray, IntArray]:
    """Samples used and chosen column of the ``judge`` family on raw rewards in [0, 1].

    The judge family decides exactly as ``bernoulli`` on the win indicators ``1{r > 1/2}``
    (same update, same index, a win absorbs; tests/test_bench_quality.py checks it against the
    family itself), so the vectorised Bernoulli kernel replays it, ~50x faster than the Stopper
    loop of plugin families. The chosen sample is the best *raw* reward among the K used.
    """
    wins = np.where(np.isnan(raw), np.nan, (raw > WIN_THRESHOLD).astype(np.float64))
    k = replay(wins, cfg.replace(family="bernoulli")).n_samples
    return k, prefix_best(raw, k)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
