"""Quality benchmark: BEACON against peer stopping rules on real logged rewards.

``python -m bench.quality [--quick] [--out DIR]`` replays every method below on every data set
of ``../shared/data`` and rewrites the generated blocks of ``docs/benchmarks.md`` (between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``) and the figures ``docs/img/bench_*.png``.
It prints its own wall and CPU time. ``--quick`` is the reduced CI run (3 permutations, 5 costs;
written to ``build/bench-quick/`` unless ``--out`` is given). ``--json FILE`` dumps every number.

Methods: fixed best-of-N (N = 1..n); DSPy-style reward threshold (quantiles of other prompts'
rewards); BEACON ``normal`` (Jeffreys, robust on/off, batch 1/2/4/8; cross-fitted empirical-Bayes
prior; ``logit`` and fitted Gaussianizing transforms; an oracle per-prompt-z reference line);
BEACON ``judge`` (Bernoulli on judge wins) on probability-valued judges; BEACON ``bernoulli`` on
0/1 labels; vote-agreement rules (Adaptive-Consistency, ESC) on synthetic answers only.

Protocol (see docs/benchmarks.md for the reasoning)
----------------------------------------------------
* Horizon ``n = min(samples logged per prompt, 32)``, the same for every method.
* Orders: the logged order, and 20 random permutations of each prompt's logged samples (seeded);
  every method replays the first ``n`` samples of each order. "perm" columns are means over the
  permutations.
* What the stopper sees: ``x = (t(r) - m) / s`` with ``t`` the reward transform of the variant
  (identity by default), ``m`` the grand mean and ``s`` the pooled within-prompt standard
  deviation ``sqrt(mean_i var_i)`` of ``t(r)`` over the *other* prompts (5-fold cross-fitting by
  prompt with :func:`beacon.evaluation.cross_fit`, seed ``FOLD_SEED``). So ``c`` is in units of
  a typical prompt's reward spread, learned without the prompt being replayed. Priors and
  transforms are fitted on the same other-fold prompts.
* What the metrics use: the chosen sample's raw reward (mean chosen reward), its per-prompt
  z-score over all logged samples of that prompt (:func:`beacon.evaluation.standardize`), its
  ``correct`` label (accuracy), and the paper's value ``E[zhat_K - K c]`` (z units).
  For the 0/1 labels of ``game24`` the value is ``E[correct_K - K c]`` (one solved puzzle is the
  unit, the unit the Bernoulli family's ``c`` is in).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

import beacon
from beacon.evaluation import (
    CrossFit,
    LoggedRewards,
    cross_fit,
    fold_assignment,
    load_logged,
    standardize,
)
from beacon.families.judge import WIN_THRESHOLD
from beacon.priors import Prior
from beacon.replay import replay
from beacon.transforms import RewardTransform
from bench import baselines as bl
from bench._common import (
    DATA_DIR,
    REPO,
    FloatArray,
    FoldScale,
    IntArray,
    base_transform,
    judge_replay,
    md_table,
)

DEFAULT_DATA = DATA_DIR
DEFAULT_TEMPLATE = REPO / "docs" / "benchmarks.md"

SEED = 20_240_917
# The fold split's seed: np.random.SeedSequence reads an int as little-endian 32-bit words, so
# this is the entropy [SEED, 999] the published docs/benchmarks.md numbers were generated with.
FOLD_SEED = SEED + (999 << 32)
HORIZON_CAP = 32
C_DEFAULT = 0.1
N_FOLDS = 5
PEER_THRESHOLD = "peer: threshold stop (DSPy)"


@dataclass(frozen=True)
class Settings:
    n_perm: int
    costs: tuple[float, ...]
    bernoulli_costs: tuple[float, ...]
    batches: tuple[int, ...]
    threshold_quantiles: tuple[float, ...]
    ac_confidences: tuple[float, ...]
    esc_windows: tuple[int, ...]
    synthetic_prompts: int


FULL = Settings(
    n_perm=20,
    costs=(0.003, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5),
    bernoulli_costs=(0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.07, 0.1,
                     0.15, 0.2, 0.3, 0.5),
    batches=(1, 2, 4, 8),
    threshold_quantiles=(0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99),
    ac_confidences=(0.7, 0.8, 0.9, 0.95, 0.99),
    esc_windows=(2, 3, 4, 5, 6, 8),
    synthetic_prompts=2000,
)
QUICK = Settings(
    n_perm=3,
    costs=(0.01, 0.03, 0.1, 0.3, 1.0),
    bernoulli_costs=(0.005, 0.02, 0.1),
    batches=(1, 2, 4, 8),
    threshold_quantiles=(0.5, 0.9),
    ac_confidences=(0.8, 0.95),
    esc_windows=(3, 5),
    synthetic_prompts=300,
)


# ---------------------------------------------------------------------------------------------
# data and orders
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSpec:
    key: str
    file: str
    title: str
    binary: bool  # the reward is the 0/1 correctness label
    probability: bool  # rewards are probabilities in [0, 1] (logit applies)


DATASETS = (
    DataSpec("alpacaeval", "alpacaeval_tulu2_bon11_dev.jsonl",
             "AlpacaEval (Tulu-2-13B, GPT-4 judge win prob.)", False, True),
    DataSpec("creative", "tot_creative_writing_gpt4_dev.jsonl",
             "ToT creative writing (GPT-4, coherency 1-10)", False, False),
    DataSpec("game24", "tot_game24_gpt4_dev.jsonl",
             "ToT Game of 24 (GPT-4 CoT, 0/1 correct)", True, False),
)


@dataclass
class Stacked:
    """All orders of one data set stacked: row ``o * P + p`` is prompt ``p`` in order ``o``.

    Order 0 is the logged order; orders 1..n_perm are seeded permutations.
    """

    spec: DataSpec
    log: LoggedRewards
    horizon: int
    n_orders: int
    raw: FloatArray  # (O*P, n) raw rewards of the first n samples of each order
    z: FloatArray  # (O*P, n) per-prompt z-scores of the same samples
    correct: FloatArray | None  # (O*P, n) labels or None
    fold: IntArray  # (P,) cross-fitting fold of each prompt

    @property
    def n_prompts(self) -> int:
        return self.log.n_prompts

    def rows_of(self, prompts: NDArray[np.bool_]) -> IntArray:
        """Stacked rows (all orders) of the selected prompts."""
        return np.flatnonzero(np.tile(prompts, self.n_orders)).astype(np.int64)


def load_stacked(spec: DataSpec, data_dir: Path, n_perm: int) -> Stacked:
    log = load_logged(data_dir / spec.file)
    if spec.binary:
        log = log.for_family("bernoulli")
    counts = log.counts
    if counts.min() != counts.max():
        # Permuting within a prompt is defined for any length, but one horizon for all methods
        # needs every prompt to hold at least n samples.
        raise beacon.ConfigError("data", spec.file, "prompts have different sample counts")
    m = int(counts[0])
    horizon = min(m, HORIZON_CAP)
    n_prompts = log.n_prompts
    orders = [np.tile(np.arange(m), (n_prompts, 1))]
    for s in range(n_perm):
        rng = np.random.default_rng([SEED, s])
        orders.append(rng.permuted(np.tile(np.arange(m), (n_prompts, 1)), axis=1))
    idx = np.concatenate(orders, axis=0)[:, :horizon]
    rows = np.tile(np.arange(n_prompts), len(orders))
    zall = standardize(log.rewards)
    raw = log.rewards[rows[:, None], idx]
    z = zall[rows[:, None], idx]
    corr = None if log.correct is None else log.correct[rows[:, None], idx]
    fold = fold_assignment(n_prompts, N_FOLDS, FOLD_SEED)
    return Stacked(spec, log, horizon, len(orders), raw, z, corr, fold)


# ---------------------------------------------------------------------------------------------
# outcomes and summaries
# ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """Per (order, prompt) result of one method-setting: samples used and the chosen sample."""

    k: FloatArray  # (O, P)
    reward: FloatArray
    z: FloatArray
    correct: FloatArray | None


def outcome(st: Stacked, k: ArrayLike, chosen: ArrayLike) -> Outcome:
    kk = np.asarray(k, dtype=np.float64)
    ch = np.asarray(chosen, dtype=np.int64)
    if (ch < 0).any():
        raise RuntimeError("a method chose no sample on a non-empty log")
    rows = np.arange(st.raw.shape[0])
    shape = (st.n_orders, st.n_prompts)
    corr = None if st.correct is None else st.correct[rows, ch].reshape(shape)
    return Outcome(
        kk.reshape(shape), st.raw[rows, ch].reshape(shape), st.z[rows, ch].reshape(shape), corr
    )


@dataclass
class Row:
    """One method-setting with its summary numbers (logged order and permutation mean)."""

    dataset: str
    method: str
    setting: str
    param: float
    out: Outcome = field(repr=False)

    def mean(self, attr: str, which: str) -> float:
        a = getattr(self.out, attr)
        if a is None:
            return math.nan
        return float(a[0].mean()) if which == "logged" else float(a[1:].mean())

    def per_prompt(self, attr: str) -> FloatArray:
        """Permutation-mean of ``attr`` per prompt (the unit of paired standard errors)."""
        a = getattr(self.out, attr)
        return np.asarray(a[1:].mean(axis=0), dtype=np.float64)

    def value(self, c: float, which: str, binary: bool) -> float:
        q = self.mean("correct" if binary else "z", which)
        return q - c * self.mean("k", which)

    def to_dict(self, binary: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "setting": self.setting, "param": self.param}
        for which in ("logged", "perm"):
            d[f"k_{which}"] = self.mean("k", which)
            d[f"reward_{which}"] = self.mean("reward", which)
            d[f"z_{which}"] = self.mean("z", which)
            d[f"acc_{which}"] = self.mean("correct", which)
            d[f"value01_{which}"] = self.value(C_DEFAULT, which, binary)
        return d


# ---------------------------------------------------------------------------------------------
# the stopper's input scale, cross-fitted
# ---------------------------------------------------------------------------------------------
class Standardized(RewardTransform):
    """x = (t(r) - loc) / scale for a strictly increasing ``t`` (identity when None)."""

    kind = "bench-standardized"

    def __init__(self, inner: RewardTransform | None, loc: float, scale: float) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise beacon.ConfigError("scale", scale, "must be finite and > 0")
        self.inner, self.loc, self.scale = inner, float(loc), float(scale)

    def apply(self, rewards: ArrayLike) -> FloatArray:
        r = np.asarray(rewards, dtype=np.float64)
        x = r if self.inner is None else self.inner.apply(r)
        return (np.asarray(x, dtype=np.float64) - self.loc) / self.scale

    def to_dict(self) -> dict[str, Any]:
        inner = None if self.inner is None else self.inner.to_dict()
        return {"kind": self.kind, "inner": inner, "loc": self.loc, "scale": self.scale}


def pooled_location_scale(x: FloatArray) -> tuple[float, float]:
    """Grand mean and pooled within-prompt SD sqrt(mean_i var_i) of a (prompts, samples) array."""
    with np.errstate(invalid="ignore"):
        var = np.nanvar(x, axis=1)
    scale = float(np.sqrt(np.nanmean(var)))
    if not scale > 0:
        scale = float(np.nanstd(x)) or 1.0
    return float(np.nanmean(x)), scale


@dataclass(frozen=True)
class Variant:
    """A BEACON variant: how its transform and prior are obtained from training prompts."""

    label: str
    transform: str | None  # None | "logit" | "gaussianize"
    fit_prior: bool
    robust: bool = True
    batch: int = 1
    # Feed each prompt's rewards z-scored by its own mean and SD over *all* its logged samples:
    # what "standardized rewards" can mean in an offline evaluation, but it uses samples not yet
    # drawn, so it is a reference line, never a deployable rule.
    oracle_z: bool = False


@dataclass
class FoldModels:
    """Per-fold stopper scale (and fitted prior) of one transform, from :func:`cross_fit`.

    ``x`` holds every stacked row on the stopper's scale, each row through its own fold's
    transform, so variants without a fitted prior replay all rows in one call.
    """

    crossfit: CrossFit
    rows: list[IntArray]  # stacked rows (all orders) of each fold's prompts
    x: FloatArray

    def priors(self) -> list[Prior | None]:
        return [fit.prior for fit in self.crossfit.fits]


def fit_nig(x_train: FloatArray) -> beacon.NIGPrior:
    """Empirical-Bayes NIG prior (:func:`beacon.fitting.fit_prior`) on stopper-scale rewards."""
    from beacon.fitting import fit_prior

    prior = fit_prior(x_train, family="normal")
    assert isinstance(prior, beacon.NIGPrior)
    return prior


def stopper_scale_fitter(
    fit_prior: bool,
) -> Callable[[FloatArray, str, str | RewardTransform | None], FoldScale]:
    """A :func:`cross_fit` fitter: per fold, ``Standardized(t, m, s)`` from the training prompts
    (``t`` fitted there for ``gaussianize``) and, with ``fit_prior``, the NIG prior fitted on the
    training prompts on that scale. ``within_scale`` is 1: the transform already divides by s."""

    def fit(train: FloatArray, family: str, spec: str | RewardTransform | None) -> FoldScale:
        base = spec if isinstance(spec, RewardTransform) else base_transform(spec, train)
        t_train = train if base is None else base.apply(train)
        loc, scale = pooled_location_scale(np.asarray(t_train, dtype=np.float64))
        tr = Standardized(base, loc, scale)
        prior = fit_nig(tr.apply(train)) if fit_prior else None
        return FoldScale(prior, tr, 1.0)

    return fit


def fold_models(st: Stacked, transform: str | None, fit_prior: bool) -> FoldModels:
    cf = cross_fit(st.log, "normal", transform, N_FOLDS, FOLD_SEED,
                   fitter=stopper_scale_fitter(fit_prior))  # type: ignore[arg-type]
    rows = []
    x = np.empty_like(st.raw)
    for f, fit in enumerate(cf.fits):
        assert fit.transform is not None
        r = st.rows_of(cf.folds == f)
        x[r] = fit.transform.apply(st.raw[r])
        rows.append(r)
    return FoldModels(cf, rows, x)


def run_beacon(
    st: Stacked, fm: FoldModels, cfg: beacon.BeaconConfig, fitted: bool
) -> Outcome:
    """Replay ``cfg`` on the stopper-scale rewards; the chosen sample is the best *raw* one."""
    if not fitted:
        k = replay(fm.x, cfg).n_samples
    else:
        k = np.zeros(st.raw.shape[0], dtype=np.int64)
        for rows, prior in zip(fm.rows, fm.priors(), strict=True):
            k[rows] = replay(fm.x[rows], cfg.replace(prior=prior)).n_samples
    # An increasing transform keeps the argmax, but clipping (logit) can create ties: take the
    # first best raw reward among the K used, as the Stopper does.
    return outcome(st, k, bl.prefix_best(st.raw, k))


# ---------------------------------------------------------------------------------------------
# methods
# ---------------------------------------------------------------------------------------------
def bon_rows(st: Stacked) -> list[Row]:
    rows = []
    for n in range(1, st.horizon + 1):
        r = bl.best_of_n(st.raw, n)
        rows.append(Row(st.spec.key, "best-of-N", f"N={n}", float(n), outcome(st, r.n_samples,
                                                                            r.chosen)))
    return rows


def threshold_rows(st: Stacked, s: Settings) -> list[Row]:
    """DSPy BestOfN thresholds: quantiles of the other folds' raw rewards (1.0 for 0/1 labels)."""
    rows = []
    qs: Sequence[float] = (1.0,) if st.spec.binary else s.threshold_quantiles
    for q in qs:
        thr = np.empty(st.raw.shape[0])
        for f in range(N_FOLDS):
            train = st.log.rewards[st.fold != f]
            value = 1.0 if st.spec.binary else float(np.nanquantile(train, q))
            thr[st.rows_of(st.fold == f)] = value
        r = bl.threshold_stop(st.raw, thr, st.horizon)
        label = "first success" if st.spec.binary else f"q={q:g}"
        rows.append(Row(st.spec.key, "threshold", label, q, outcome(st, r.n_samples, r.chosen)))
    return rows


def continuous_variants(spec: DataSpec, s: Settings) -> list[Variant]:
    vs = [
        Variant(f"Jeffreys, robust={'on' if rb else 'off'}, b={b}", None, False, rb, b)
        for rb in (True, False)
        for b in s.batches
    ]
    vs.append(Variant("fitted prior", None, True))
    vs.append(Variant("fitted prior, robust=off", None, True, robust=False))
    if spec.probability:
        vs.append(Variant("Jeffreys + logit", "logit", False))
        vs.append(Variant("fitted prior + logit", "logit", True))
    vs.append(Variant("Jeffreys + gauss", "gaussianize", False))
    vs.append(Variant("fitted prior + gauss", "gaussianize", True))
    vs.append(Variant("Jeffreys, oracle per-prompt z (leaks)", None, False, oracle_z=True))
    return vs


def beacon_sweep(
    st: Stacked, variant: Variant, costs: Sequence[float],
    models: dict[tuple[str | None, bool], FoldModels], method: str = "BEACON",
) -> list[Row]:
    base = beacon.BeaconConfig(
        cost=C_DEFAULT, horizon=st.horizon, family="normal", batch_size=variant.batch,
        robust=variant.robust,
    )
    if variant.oracle_z:
        out = []
        for c in costs:
            k = replay(st.z, base.replace(cost=c)).n_samples
            out.append(Row(st.spec.key, method, variant.label, c,
                           outcome(st, k, bl.prefix_best(st.raw, k))))
        return out
    key = (variant.transform, variant.fit_prior)
    if key not in models:
        models[key] = fold_models(st, variant.transform, variant.fit_prior)
    fm = models[key]
    return [
        Row(st.spec.key, method, variant.label, c,
            run_beacon(st, fm, base.replace(cost=c), variant.fit_prior))
        for c in costs
    ]


def beta_priors(st: Stacked, family: str, fitted: bool) -> list[Prior | None]:
    """Per fold: the Beta prior cross-fitted on the other folds (``fitted``), else Beta(1, 1)."""
    if not fitted:
        return [None] * N_FOLDS
    cf = cross_fit(st.log, family, None, N_FOLDS, FOLD_SEED)
    return [fit.prior for fit in cf.fits]


def bernoulli_sweep(st: Stacked, costs: Sequence[float], fitted: bool) -> list[Row]:
    rows = []
    priors = beta_priors(st, "bernoulli", fitted)
    label = "fitted Beta prior" if fitted else "Beta(1,1)"
    for c in costs:
        n_rows = st.raw.shape[0]
        k = np.zeros(n_rows, dtype=np.int64)
        chosen = np.full(n_rows, -1, dtype=np.int64)
        for f, prior in enumerate(priors):
            rows_f = st.rows_of(st.fold == f)
            cfg = beacon.BeaconConfig(cost=c, horizon=st.horizon, family="bernoulli", prior=prior)
            res = replay(st.raw[rows_f], cfg)
            k[rows_f], chosen[rows_f] = res.n_samples, res.chosen
        rows.append(Row(st.spec.key, "BEACON bernoulli", label, c, outcome(st, k, chosen)))
    return rows


JUDGE_WIN = WIN_THRESHOLD  # the judge's own decision boundary: r > 1/2 beats the reference


def judge_sweep(st: Stacked, costs: Sequence[float], fitted: bool) -> list[Row]:
    """The ``judge`` family (beacon/families/judge.py): Beta-Bernoulli learning of wins
    ``w = 1{r > 1/2}``, a win is absorbing, otherwise continue iff ``c < h^B_{n,k}(a, b)``.

    That rule is exactly the ``bernoulli`` family run on ``w`` (same update, same index, same
    absorption), so it is replayed with the vectorised Bernoulli kernel on ``w``
    (:func:`bench._common.judge_replay`). ``c`` is in wins.
    """
    priors = beta_priors(st, "judge", fitted)
    label = "judge wins, fitted Beta" if fitted else "judge wins, Beta(1,1)"
    rows = []
    for c in costs:
        k = np.zeros(st.raw.shape[0], dtype=np.int64)
        chosen = np.full(st.raw.shape[0], -1, dtype=np.int64)
        for f, prior in enumerate(priors):
            rf = st.rows_of(st.fold == f)
            cfg = beacon.BeaconConfig(cost=c, horizon=st.horizon, family="bernoulli", prior=prior)
            k[rf], chosen[rf] = judge_replay(st.raw[rf], cfg)
        rows.append(Row(st.spec.key, "BEACON judge", label, c, outcome(st, k, chosen)))
    return rows


# ---------------------------------------------------------------------------------------------
# synthetic answers for the vote-agreement rules
# ---------------------------------------------------------------------------------------------
def synthetic_answers(n_prompts: int, horizon: int, seed: int) -> tuple[IntArray, FloatArray]:
    """Final answers of ``n_prompts`` synthetic questions, ``horizon`` samples each.

    Answer 0 is correct, drawn with probability ``p ~ Beta(1.5, 1.5)``; the rest of the mass is
    spread over ``1 + Poisson(3)`` wrong answers by a Dirichlet(0.7); 5% of samples carry no
    parsable answer (-1). Returns (answers, correct labels).
    """
    rng = np.random.default_rng([SEED, seed])
    answers = np.empty((n_prompts, horizon), dtype=np.int64)
    for i in range(n_prompts):
        p = rng.beta(1.5, 1.5)
        n_wrong = 1 + rng.poisson(3.0)
        probs = np.concatenate(([p], (1.0 - p) * rng.dirichlet(np.full(n_wrong, 0.7))))
        answers[i] = rng.choice(probs.size, size=horizon, p=probs)
    answers[rng.random(answers.shape) < 0.05] = -1
    return answers, (answers == 0).astype(np.float64)


@dataclass
class VoteRow:
    method: str
    setting: str
    k: float
    accuracy: float


def vote_study(s: Settings, horizon: int = HORIZON_CAP) -> list[VoteRow]:
    answers, correct = synthetic_answers(s.synthetic_prompts, horizon, 1)
    rows: list[VoteRow] = []

    def add(method: str, setting: str, k: ArrayLike, acc: ArrayLike) -> None:
        rows.append(VoteRow(method, setting, float(np.mean(np.asarray(k, dtype=np.float64))),
                            float(np.mean(np.asarray(acc, dtype=np.float64)))))

    for n in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32):
        if n <= horizon:
            r = bl.majority_vote(answers, n)
            add("self-consistency (fixed N)", f"N={n}", r.n_samples, r.answer == 0)
    for conf in s.ac_confidences:
        r = bl.adaptive_consistency_beta(answers, horizon, conf)
        add("Adaptive-Consistency (Beta)", f"conf={conf:g}", r.n_samples, r.answer == 0)
    for w in s.esc_windows:
        r = bl.esc_window(answers, horizon, w)
        add("ESC (unanimous window)", f"w={w}", r.n_samples, r.answer == 0)
    # Verifier-based rules see a different signal (a per-sample correctness check).
    t = bl.threshold_stop(correct, 1.0, horizon)
    add("verifier: first success", "thr=1", t.n_samples, correct[np.arange(len(t.chosen)),
                                                                  t.chosen])
    for c in s.bernoulli_costs:
        cfg = beacon.BeaconConfig(cost=c, horizon=horizon, family="bernoulli")
        res = replay(correct, cfg)
        add("verifier: BEACON bernoulli", f"c={c:g}", res.n_samples, res.best_reward)
    return rows


# ---------------------------------------------------------------------------------------------
# derived comparisons
# ---------------------------------------------------------------------------------------------
def se(x: FloatArray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan


def curve(rows: Sequence[Row], attr: str) -> tuple[FloatArray, FloatArray, list[Row]]:
    """(mean K, mean attr) of a sweep sorted by K (perm means)."""
    srt = sorted(rows, key=lambda r: (r.mean("k", "perm"), r.param))
    return (
        np.array([r.mean("k", "perm") for r in srt]),
        np.array([r.mean(attr, "perm") for r in srt]),
        srt,
    )


def interp_per_prompt(rows: Sequence[Row], attr: str, k_target: float) -> FloatArray | None:
    """Per-prompt ``attr`` of the sweep interpolated (linearly in mean K) at ``k_target``.

    The weights come from the mean curve, so the mean of the result is the interpolated mean:
    the quality of mixing the two neighbouring costs over prompts. None outside the sweep.
    """
    ks, _, srt = curve(rows, attr)
    if k_target < ks[0] - 1e-12 or k_target > ks[-1] + 1e-12:
        return None
    j = int(np.searchsorted(ks, k_target, side="left"))
    if j < ks.size and abs(ks[j] - k_target) < 1e-12:
        return srt[j].per_prompt(attr)
    lo, hi = srt[j - 1], srt[j]
    w = (k_target - ks[j - 1]) / (ks[j] - ks[j - 1])
    out: FloatArray = (1.0 - w) * lo.per_prompt(attr) + w * hi.per_prompt(attr)
    return out


def quality_attr(binary: bool) -> str:
    return "correct" if binary else "reward"


@dataclass
class Matched:
    variant: str
    n: int
    diff_reward: float
    se_reward: float
    diff_z: float
    se_z: float


def matched_table(bon: Sequence[Row], sweeps: dict[str, list[Row]], binary: bool) -> list[Matched]:
    out = []
    qa = quality_attr(binary)
    for label, rows in sweeps.items():
        for b in bon:
            n = int(b.param)
            qi = interp_per_prompt(rows, qa, float(n))
            zi = interp_per_prompt(rows, "z", float(n))
            if qi is None or zi is None:
                continue
            dq, dz = qi - b.per_prompt(qa), zi - b.per_prompt("z")
            out.append(Matched(label, n, float(dq.mean()), se(dq), float(dz.mean()), se(dz)))
    return out


def best_fixed_value(bon: Sequence[Row], c: float, binary: bool) -> tuple[int, float]:
    vals = [(r.value(c, "perm", binary), int(r.param)) for r in bon]
    v, n = max(vals)
    return n, v


# ---------------------------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------------------------
def fmt(x: float, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}"


def main_table(rows: Sequence[Row], binary: bool) -> str:
    header = ["method", "setting", "c / param", "K logged", "K perm", "reward logged",
              "reward perm", "zhat perm"]
    if binary:
        header += ["acc logged", "acc perm"]
    header += ["value@0.1 perm"]
    body = []
    for r in rows:
        line = [r.method, r.setting, f"{r.param:g}", fmt(r.mean("k", "logged"), 2),
                fmt(r.mean("k", "perm"), 2), fmt(r.mean("reward", "logged")),
                fmt(r.mean("reward", "perm")), fmt(r.mean("z", "perm"))]
        if binary:
            line += [fmt(r.mean("correct", "logged")), fmt(r.mean("correct", "perm"))]
        line += [fmt(r.value(C_DEFAULT, "perm", binary))]
        body.append(line)
    return md_table(header, body)


def sweep_table(sweeps: dict[str, list[Row]], bon: Sequence[Row], binary: bool) -> str:
    qa = quality_attr(binary)
    header = ["variant", "c", "K perm", "quality perm", "BoN at same K", "diff",
              "value@c", "best fixed N value@c (N)"]
    body = []
    bk = np.array([b.mean("k", "perm") for b in bon])
    bq = np.array([b.mean(qa, "perm") for b in bon])
    for label, rows in sweeps.items():
        for r in rows:
            k = r.mean("k", "perm")
            q = r.mean(qa, "perm")
            qb = float(np.interp(k, bk, bq))
            n_best, v_best = best_fixed_value(bon, r.param, binary)
            body.append([label, f"{r.param:g}", fmt(k, 2), fmt(q), fmt(qb), fmt(q - qb),
                         fmt(r.value(r.param, "perm", binary)), f"{fmt(v_best)} ({n_best})"])
    return md_table(header, body)


def matched_md(ms: Sequence[Matched], binary: bool) -> str:
    qname = "accuracy" if binary else "reward"
    header = ["variant", "N", f"Δ{qname} (± SE)", "Δzhat (± SE)"]
    body = [[m.variant, str(m.n), f"{m.diff_reward:+.4f} ± {m.se_reward:.4f}",
             f"{m.diff_z:+.3f} ± {m.se_z:.3f}"] for m in ms]
    return md_table(header, body)


def _summary_cells(sub: Sequence[Matched]) -> list[str]:
    lo = min(sub, key=lambda m: m.diff_reward)
    hi = max(sub, key=lambda m: m.diff_reward)
    worse = [str(m.n) for m in sub if m.diff_reward < -2 * m.se_reward]
    better = [str(m.n) for m in sub if m.diff_reward > 2 * m.se_reward]
    return [f"{sub[0].n}–{sub[-1].n}", f"{np.mean([m.diff_reward for m in sub]):+.4f}",
            f"{lo.diff_reward:+.4f} ({lo.n})", f"{hi.diff_reward:+.4f} ({hi.n})",
            ",".join(worse) or "none", ",".join(better) or "none"]


SUMMARY_HEADER = ["N range", "mean Δ", "min Δ (N)", "max Δ (N)", "N with Δ < -2 SE",
                  "N with Δ > 2 SE"]


def matched_summary(ms: Sequence[Matched]) -> str:
    body = []
    for label in dict.fromkeys(m.variant for m in ms):
        sub = [m for m in ms if m.variant == label]
        body.append([label, *_summary_cells(sub)])
    return md_table(["variant", *SUMMARY_HEADER], body)


def headline_matched(results: Sequence[DatasetResult]) -> str:
    """Headline (2): matched-sample Δ for the default, every prior/transform variant, the peer."""
    body = []
    for res in results:
        for label in dict.fromkeys(m.variant for m in res.matched):
            if _is_jeffreys_grid(label) and label != default_label(res.stack.spec.binary):
                continue
            sub = [m for m in res.matched if m.variant == label]
            body.append([res.stack.spec.key, label, *_summary_cells(sub)])
    return md_table(["data set", "variant", *SUMMARY_HEADER], body)


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------
# Not tab:blue, which the paper default (Jeffreys, b=1) keeps in both panels.
OTHER_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:purple", "tab:orange",
                "tab:red", "tab:green", "tab:gray")


def _is_jeffreys_grid(label: str) -> bool:
    return label.startswith("Jeffreys, robust=")


def frontier_plot(
    path: Path, title: str, bon: Sequence[Row], thr: Sequence[Row],
    sweeps: dict[str, list[Row]], binary: bool,
) -> None:
    """Quality versus average samples; continuous data: Jeffreys grid | priors and transforms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qa = quality_attr(binary)
    if binary:
        groups = [("", dict(sweeps))]
    else:
        default = default_label(binary)
        groups = [
            ("Jeffreys prior: robust update on (solid) / off (dashed), batch size b",
             {k: v for k, v in sweeps.items() if _is_jeffreys_grid(k)}),
            ("fitted priors and transforms (cross-fitted)",
             {k: v for k, v in sweeps.items() if not _is_jeffreys_grid(k) or k == default}),
        ]
    fig, axes = plt.subplots(1, len(groups), figsize=(7.2 * len(groups), 5.4), dpi=100,
                             squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab10")
    for ax, (sub, group) in zip(axes[0], groups, strict=True):
        ax.plot([b.mean("k", "perm") for b in bon], [b.mean(qa, "perm") for b in bon], "k-o",
                ms=4, lw=2.2, label="best-of-N", zorder=5)
        if thr:
            ax.plot([t.mean("k", "perm") for t in thr], [t.mean(qa, "perm") for t in thr], "s:",
                    color="grey", ms=5, lw=1.5, label="threshold stop (DSPy), q swept")
        for i, (label, rows) in enumerate(group.items()):
            color: Any
            if _is_jeffreys_grid(label) and not binary:
                b = int(label.rsplit("b=", 1)[1])
                color = cmap([1, 2, 4, 8].index(b) if b in (1, 2, 4, 8) else 9)
                style = "-" if "robust=on" in label else "--"
            else:
                color, style = OTHER_COLORS[i % len(OTHER_COLORS)], "-"
            ks, qs, srt = curve(rows, qa)
            ax.plot(ks, qs, style, marker=".", color=color, lw=1.4, label=f"BEACON {label}")
            for r in srt:
                if abs(r.param - C_DEFAULT) < 1e-12:
                    ax.plot(r.mean("k", "perm"), r.mean(qa, "perm"), "*", color=color, ms=13,
                            mec="k", mew=0.6, zorder=6)
        ax.set_xlabel("average samples used per prompt (mean over permutations)")
        ax.set_title(sub, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ylabel = "accuracy of chosen sample" if binary else "mean raw reward of chosen sample"
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(f"{title}   (★ = BEACON at c = 0.1)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def vote_plot(path: Path, rows: Sequence[VoteRow]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.6), dpi=110)
    styles = {"self-consistency (fixed N)": "k-o", "Adaptive-Consistency (Beta)": "b-s",
              "ESC (unanimous window)": "g-^", "verifier: first success": "r*",
              "verifier: BEACON bernoulli": "m-d"}
    for m, st in styles.items():
        sub = sorted((r for r in rows if r.method == m), key=lambda r: r.k)
        if sub:
            ax.plot([r.k for r in sub], [r.accuracy for r in sub], st, ms=5, label=m)
    ax.set_xlabel("average samples")
    ax.set_ylabel("accuracy")
    ax.set_title("Synthetic final answers: vote-agreement rules (verifier rules use labels)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def hist_plot(path: Path, stacks: Sequence[Stacked]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cont = [s for s in stacks if not s.spec.binary]
    fig, axes = plt.subplots(1, len(cont), figsize=(4.2 * len(cont), 3.4), dpi=110)
    for ax, s in zip(np.atleast_1d(axes), cont, strict=True):
        ax.hist(s.log.rewards.ravel(), bins=40, color="steelblue")
        ax.set_title(s.spec.title, fontsize=8)
        ax.set_xlabel("raw reward")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
@dataclass
class DatasetResult:
    stack: Stacked
    bon: list[Row]
    thr: list[Row]
    sweeps: dict[str, list[Row]]
    matched: list[Matched]


def run_dataset(spec: DataSpec, data_dir: Path, s: Settings) -> DatasetResult:
    st = load_stacked(spec, data_dir, s.n_perm)
    bon = bon_rows(st)
    thr = threshold_rows(st, s)
    sweeps: dict[str, list[Row]] = {}
    models: dict[tuple[str | None, bool], FoldModels] = {}
    if spec.binary:
        sweeps["bernoulli Beta(1,1)"] = bernoulli_sweep(st, s.bernoulli_costs, fitted=False)
        sweeps["bernoulli fitted Beta"] = bernoulli_sweep(st, s.bernoulli_costs, fitted=True)
        sweeps["normal Jeffreys on 0/1"] = beacon_sweep(
            st, Variant("normal Jeffreys on 0/1", None, False), s.costs, models, "BEACON normal"
        )
    else:
        for v in continuous_variants(spec, s):
            sweeps[v.label] = beacon_sweep(st, v, s.costs, models)
        if spec.probability:
            for fitted in (False, True):
                rows = judge_sweep(st, s.bernoulli_costs, fitted)
                sweeps[rows[0].setting] = rows
    # The threshold rule's q sweep is a (K, quality) curve too: matched samples for the peer.
    matched = matched_table(bon, {**sweeps, PEER_THRESHOLD: thr}, spec.binary)
    return DatasetResult(st, bon, thr, sweeps, matched)


def default_label(binary: bool) -> str:
    return "bernoulli Beta(1,1)" if binary else "Jeffreys, robust=on, b=1"


def at_cost(rows: Sequence[Row], c: float) -> Row | None:
    for r in rows:
        if abs(r.param - c) < 1e-12:
            return r
    return None


def headline(results: Sequence[DatasetResult]) -> tuple[str, list[dict[str, Any]]]:
    header = ["data set", "variant", "n", "K at c=0.1 (perm)", "samples saved vs best-of-n",
              "Δquality vs best-of-n (± SE)", "Δzhat (± SE)", "value@0.1 BEACON",
              "best fixed-N value@0.1 (N)"]
    body, recs = [], []
    for res in results:
        binary = res.stack.spec.binary
        qa = quality_attr(binary)
        full = res.bon[-1]
        for label, rows in res.sweeps.items():
            r = at_cost(rows, C_DEFAULT)
            if r is None:
                continue
            k = r.mean("k", "perm")
            dq = r.per_prompt(qa) - full.per_prompt(qa)
            dz = r.per_prompt("z") - full.per_prompt("z")
            n_best, v_best = best_fixed_value(res.bon, C_DEFAULT, binary)
            v = r.value(C_DEFAULT, "perm", binary)
            rec: dict[str, Any] = {
                   "dataset": res.stack.spec.key, "variant": label, "horizon": res.stack.horizon,
                   "k": k, "saved": 1.0 - k / res.stack.horizon, "dq": float(dq.mean()),
                   "dq_se": se(dq), "dz": float(dz.mean()), "dz_se": se(dz), "value": v,
                   "best_fixed_n": n_best, "best_fixed_value": v_best}
            recs.append(rec)
            body.append([res.stack.spec.key, label, str(res.stack.horizon), fmt(k, 2),
                         f"{100 * rec['saved']:.0f}%", f"{rec['dq']:+.4f} ± {rec['dq_se']:.4f}",
                         f"{rec['dz']:+.3f} ± {rec['dz_se']:.3f}", fmt(v),
                         f"{fmt(v_best)} ({n_best})"])
    return md_table(header, body), recs


def findings(results: Sequence[DatasetResult], recs: Sequence[dict[str, Any]]) -> str:
    """Plain statements computed from the numbers (so they cannot drift from the tables)."""
    lines = []
    for res in results:
        key = res.stack.spec.key
        binary = res.stack.spec.binary
        dflt = default_label(binary)
        sub = [m for m in res.matched if m.variant == dflt]
        rec = next((r for r in recs if r["dataset"] == key and r["variant"] == dflt), None)
        if rec is not None:
            ahead = rec["value"] >= rec["best_fixed_value"]
            lines.append(
                f"- **{key}**, paper default ({dflt}, c = 0.1): {rec['k']:.2f} of "
                f"{rec['horizon']} samples ({100 * rec['saved']:.0f}% saved), quality "
                f"{rec['dq']:+.4f} ± {rec['dq_se']:.4f} vs best-of-{rec['horizon']}; value@0.1 "
                f"{rec['value']:.3f} vs best fixed N={rec['best_fixed_n']} "
                f"{rec['best_fixed_value']:.3f} "
                f"({'BEACON ahead' if ahead else 'BEACON behind'})."
            )
        if sub:
            worse = [m for m in sub if m.diff_reward < -2 * m.se_reward]
            better = [m for m in sub if m.diff_reward > 2 * m.se_reward]
            lines.append(
                f"  At matched average samples (N = {sub[0].n}..{sub[-1].n}) the default is "
                f"significantly below best-of-N at {len(worse)} N, above at {len(better)} N "
                f"(mean Δ {np.mean([m.diff_reward for m in sub]):+.4f})."
            )
        per_variant = {}
        for label in res.sweeps:
            vs = [m for m in res.matched if m.variant == label]
            if vs:
                per_variant[label] = float(np.mean([m.diff_reward for m in vs]))
        if per_variant:
            best = max(per_variant, key=lambda k: per_variant[k])
            worst = min(per_variant, key=lambda k: per_variant[k])
            lines.append(
                f"  Mean matched-sample Δ over BEACON variants ranges from "
                f"{per_variant[worst]:+.4f} ({worst}) to {per_variant[best]:+.4f} ({best}) "
                f"(each over the N its own curve covers)."
            )
        peer = [m for m in res.matched if m.variant == PEER_THRESHOLD]
        if peer:
            lines.append(
                f"  Peer threshold stop (DSPy), N = {peer[0].n}..{peer[-1].n}: mean Δ "
                f"{np.mean([m.diff_reward for m in peer]):+.4f}, significantly above best-of-N "
                f"at {sum(m.diff_reward > 2 * m.se_reward for m in peer)} N, below at "
                f"{sum(m.diff_reward < -2 * m.se_reward for m in peer)} N."
            )
    return "\n".join(lines)


def vote_md(rows: Sequence[VoteRow]) -> str:
    return md_table(["method", "setting", "avg samples", "accuracy"],
                    [[r.method, r.setting, fmt(r.k, 2), fmt(r.accuracy)] for r in rows])


def _replacer(body: str) -> Callable[[re.Match[str]], str]:
    def sub(m: re.Match[str]) -> str:
        return f"{m.group(1)}\n{body}\n{m.group(3)}"

    return sub


def render(template: str, blocks: dict[str, str]) -> str:
    """Replace every ``<!-- bench:NAME -->...<!-- /bench:NAME -->`` block; all must exist."""
    found = set(re.findall(r"<!-- bench:([\w.-]+) -->", template))
    missing, unknown = set(blocks) - found, found - set(blocks)
    if missing or unknown:
        raise beacon.ConfigError(
            "template", sorted(missing | unknown),
            f"generated blocks missing from the template: {sorted(missing)}; blocks in the "
            f"template that nothing generates: {sorted(unknown)}",
        )
    out = template
    for name, body in blocks.items():
        tag = re.escape(name)
        pat = re.compile(rf"(<!-- bench:{tag} -->)(.*?)(<!-- /bench:{tag} -->)", re.S)
        if not pat.search(out):
            raise beacon.ConfigError("template", name, "block has no closing marker")
        out = pat.sub(_replacer(body), out)
    return out


def run(
    out_dir: Path, data_dir: Path, quick: bool, template: Path, json_path: Path | None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    t0, cpu0 = time.perf_counter(), time.process_time()
    s = QUICK if quick else FULL
    img = out_dir / "img"
    img.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in DATASETS:
        t = time.perf_counter()
        results.append(run_dataset(spec, data_dir, s))
        log(f"{spec.key}: {time.perf_counter() - t:.1f} s")
    votes = vote_study(s)
    blocks: dict[str, str] = {}
    head_md, recs = headline(results)
    blocks["headline"] = head_md
    blocks["headline_matched"] = headline_matched(results)
    blocks["findings"] = findings(results, recs)
    summary: dict[str, Any] = {"quick": quick, "n_perm": s.n_perm, "headline": recs,
                               "datasets": {}, "votes": [vars(v) for v in votes]}
    for res in results:
        key, binary = res.stack.spec.key, res.stack.spec.binary
        main_rows = res.bon + res.thr + [r for rows in res.sweeps.values()
                                         for r in rows if abs(r.param - C_DEFAULT) < 1e-12]
        blocks[f"{key}.main"] = main_table(main_rows, binary)
        blocks[f"{key}.sweep"] = sweep_table(res.sweeps, res.bon, binary)
        blocks[f"{key}.matched"] = matched_summary(res.matched)
        blocks[f"{key}.matched_detail"] = matched_md(res.matched, binary)
        frontier_plot(img / f"bench_frontier_{key}.png", res.stack.spec.title, res.bon,
                      res.thr, res.sweeps, binary)
        summary["datasets"][key] = {
            "horizon": res.stack.horizon,
            "n_prompts": res.stack.n_prompts,
            "bon": [r.to_dict(binary) for r in res.bon],
            "threshold": [r.to_dict(binary) for r in res.thr],
            "sweeps": {k: [r.to_dict(binary) for r in v] for k, v in res.sweeps.items()},
            "matched": [vars(m) for m in res.matched],
        }
    blocks["votes"] = vote_md(votes)
    vote_plot(img / "bench_votes_synthetic.png", votes)
    hist_plot(img / "bench_reward_hist.png", [r.stack for r in results])
    wall = time.perf_counter() - t0
    blocks["meta"] = (
        f"Generated by `python -m bench.quality{' --quick' if quick else ''}` "
        f"({s.n_perm} permutations, {len(s.costs)} costs per BEACON sweep, "
        f"{_numba_threads()} numba thread(s), {os.cpu_count()} CPU(s)): wall time {wall:.1f} s, "
        f"CPU time {time.process_time() - cpu0:.1f} s."
    )
    md = render(template.read_text(encoding="utf-8"), blocks)
    (out_dir / "benchmarks.md").write_text(md, encoding="utf-8")
    summary["wall_s"] = wall
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=1, default=float), encoding="utf-8")
    return summary


def _numba_threads() -> int:
    import numba

    return int(numba.get_num_threads())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced CI run")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default docs/; with --quick build/bench-quick/, so a "
                         "reduced run never overwrites the published page)")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of the JSONL logs")
    ap.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE,
                    help="benchmarks.md whose generated blocks are refreshed")
    ap.add_argument("--json", type=Path, default=None, help="also write all numbers as JSON")
    ap.add_argument("--threads", type=int, default=1,
                    help="numba threads for the replay kernels (default 1: each replay is a few "
                         "thousand rows, where thread start-up costs more than it saves)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    import numba

    limit = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    numba.set_num_threads(min(args.threads, limit))
    out = args.out or (REPO / "build" / "bench-quick" if args.quick else REPO / "docs")
    run(out, args.data, args.quick, args.template, args.json)
    print(f"wrote {out / 'benchmarks.md'} and {out / 'img'}/bench_*.png")
    print(f"bench.quality wall time: {time.perf_counter() - t0:.1f} s", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
