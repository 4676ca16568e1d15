"""Fitted priors and reward transforms against Jeffreys' default and fixed best-of-N.

``python -m bench.priors [--perms 20] [--folds 5] [--quick] [--write-docs]``

Protocol (nothing is tuned to the prompts that are scored)
---------------------------------------------------------
* Data: every continuous data set in ``../shared/data`` (rewards not all 0/1). Horizon ``n`` =
  the samples logged per prompt (11 and 10).
* Orders: each prompt's samples in ``--perms`` random orders (fixed seed; order 0 is the logged
  order). Every number is a mean over orders and prompts.
* Cross-fitting: :func:`beacon.evaluation.cross_fit` splits the prompts into ``--folds`` folds
  (:func:`beacon.evaluation.fold_assignment`, seed ``SEED``); for each fold the transform
  (``gaussianize``), the prior (``fit_reward_model``) and the scale ``s`` are fitted on the
  other folds and BEACON replays the held-out fold. Every prompt is scored exactly once.
* Units of c: the Stopper's ``c`` is in model units (transformed reward). We sweep
  ``c = c_std * s`` with ``s`` the typical within-prompt sd in model units, fitted on the
  training folds (``FitResult.within_scale`` for a fitted prior; the pooled within-prompt sd
  for Jeffreys), so ``c_std`` is a cost per sample in units of a prompt's reward spread.
* Quality: mean raw reward of the chosen sample (``quality``) and its per-prompt z-score over
  all logged samples of the prompt (:func:`beacon.evaluation.standardize`).
* Matched samples: BEACON's (avg K, quality) points over the c sweep, sorted by avg K and
  linearly interpolated at each integer N, minus best-of-N's quality at N (paired per prompt
  for the standard error). Reverse: the avg K at which BEACON's curve first reaches
  best-of-N's quality, and the samples saved ``N - K``.
* Value ``E[z_K - K c]`` at ``c = 0.1`` in per-prompt standardized units: BEACON at
  ``c_std = 0.1`` (no tuning), BEACON at the ``c_std`` that maximises the value on the training
  folds, and fixed best-of-N at the N that maximises it on the scored prompts themselves (an
  oracle choice: the bar is deliberately the hardest one).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import beacon
from beacon.evaluation import CrossFit, LoggedRewards, cross_fit, load_logged, standardize
from beacon.replay import replay
from bench._common import (
    DATA_DIR,
    REPO,
    FloatArray,
    IntArray,
    judge_replay,
    md_table,
    unfitted_fitter,
)

DOC = REPO / "docs" / "priors.md"
SEED = 8
C_VALUE = 0.1
C_GRID = np.unique(np.concatenate([np.geomspace(0.002, 4.0, 26), [C_VALUE]]))


@dataclass(frozen=True)
class Variant:
    label: str
    fitted: bool  # fitted prior (else Jeffreys)
    transform: str | None  # None | "logit" | "gaussianize"
    robust: bool = True
    batch: int = 1
    family: str = "normal"


def variants(probability: bool, quick: bool) -> list[Variant]:
    vs = [
        Variant("Jeffreys (paper default)", False, None),
        Variant("Jeffreys, robust off", False, None, robust=False),
        Variant("fitted", True, None),
        Variant("fitted, robust off", True, None, robust=False),
    ]
    if probability:
        vs += [Variant("Jeffreys + logit", False, "logit"),
               Variant("fitted + logit", True, "logit")]
        vs += [Variant("judge family, Beta(1,1)", False, None, family="judge"),
               Variant("judge family, fitted Beta", True, None, family="judge")]
    vs += [
        Variant("Jeffreys + gaussianize", False, "gaussianize"),
        Variant("fitted + gaussianize", True, "gaussianize"),
        Variant("fitted + gaussianize, robust off", True, "gaussianize", robust=False),
    ]
    if not quick:
        vs += [
            Variant("fitted + gaussianize, batch 2", True, "gaussianize", batch=2),
            Variant("fitted + gaussianize, batch 4", True, "gaussianize", batch=4),
            Variant("Jeffreys, batch 4", False, None, batch=4),
        ]
    return vs


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
@dataclass
class Data:
    name: str
    log: LoggedRewards
    raw: FloatArray  # prompts x n
    z: FloatArray  # per-prompt standardized
    probability: bool


def load(path: Path) -> Data:
    log = load_logged(path)
    raw = log.rewards
    prob = bool(np.nanmin(raw) >= 0.0 and np.nanmax(raw) <= 1.0)
    return Data(path.stem, log, raw, standardize(raw), prob)


def continuous_sets() -> list[Data]:
    out = []
    for p in sorted(DATA_DIR.glob("*.jsonl")):
        d = load(p)
        if not np.isin(d.raw[~np.isnan(d.raw)], (0.0, 1.0)).all():
            out.append(d)
    return out


@dataclass
class Stack:
    """All orders of all prompts stacked: row = order * P + prompt."""

    raw: FloatArray
    z: FloatArray
    prompt: IntArray
    n_orders: int


def stack_orders(d: Data, n_orders: int, seed: int) -> Stack:
    rng = np.random.default_rng(seed)
    p, n = d.raw.shape
    raws, zs = [d.raw], [d.z]
    for _ in range(n_orders - 1):
        perm = np.argsort(rng.random((p, n)), axis=1)
        raws.append(np.take_along_axis(d.raw, perm, axis=1))
        zs.append(np.take_along_axis(d.z, perm, axis=1))
    return Stack(np.vstack(raws), np.vstack(zs), np.tile(np.arange(p), n_orders), n_orders)


# ---------------------------------------------------------------------------------------------
# fitting per fold
# ---------------------------------------------------------------------------------------------
def crossfit_variant(d: Data, v: Variant, folds: int) -> CrossFit:
    """Per fold (seed ``SEED``): the variant's transform, prior and scale ``s`` of ``c_std``.

    Fitted variants use :func:`beacon.fitting.fit_reward_model` (``s`` its ``within_scale``);
    Jeffreys variants keep the default prior with ``s`` the pooled within-prompt sd (ddof 1)
    of the training prompts in model units; the judge family's ``c`` is in wins (``s = 1``).
    """
    transform = v.transform if v.family == "normal" else None
    fitter = None if v.fitted else unfitted_fitter()
    return cross_fit(d.log, v.family, transform, folds, SEED, fitter=fitter)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------
@dataclass
class Sweep:
    """Per prompt (mean over orders) and per c_std: samples, raw quality, z quality."""

    k: FloatArray  # costs x prompts
    q: FloatArray
    zq: FloatArray
    train_value: FloatArray  # costs x folds: value at C_VALUE on the training folds


def run_rows(st: Stack, rows: IntArray, cfg: beacon.BeaconConfig) -> tuple[FloatArray, ...]:
    raw = st.raw[rows]
    if cfg.family == "judge":
        k, ch = judge_replay(raw, cfg)
        r = np.arange(raw.shape[0])
        return k.astype(float), raw[r, ch], st.z[rows, ch]
    res = replay(raw, cfg)
    ch = res.chosen
    zsel = st.z[rows, ch]
    return res.n_samples.astype(float), res.best_reward, zsel


def per_prompt(values: FloatArray, prompts: IntArray, n_prompts: int) -> FloatArray:
    s = np.bincount(prompts, weights=values, minlength=n_prompts)
    c = np.bincount(prompts, minlength=n_prompts)
    return np.asarray(s / np.maximum(c, 1), dtype=np.float64)


def sweep(d: Data, st: Stack, cf: CrossFit, v: Variant) -> Sweep:
    p, n = d.raw.shape
    nf = cf.n_folds
    k = np.zeros((C_GRID.size, p))
    q = np.zeros((C_GRID.size, p))
    zq = np.zeros((C_GRID.size, p))
    tv = np.zeros((C_GRID.size, nf))
    row_fold = cf.folds[st.prompt]
    for f, m in enumerate(cf.fits):
        test_rows = np.flatnonzero(row_fold == f)
        train_rows = np.flatnonzero(row_fold != f)
        base = beacon.BeaconConfig(cost=0.5, horizon=n, prior=m.prior, transform=m.transform,
                                   robust=v.robust, batch_size=v.batch, family=v.family)
        for i, c_std in enumerate(C_GRID):
            cost = float(c_std * m.within_scale)
            if v.family == "judge":
                cost = min(cost, 0.999)  # h^B <= 1: every c >= 1 stops after the first sample
            cfg = base.replace(cost=cost)
            kk, qq, zz = run_rows(st, test_rows, cfg)
            pr = st.prompt[test_rows]
            sel = np.unique(pr)
            k[i, sel] = per_prompt(kk, pr, p)[sel]
            q[i, sel] = per_prompt(qq, pr, p)[sel]
            zq[i, sel] = per_prompt(zz, pr, p)[sel]
            kt, _, zt = run_rows(st, train_rows, cfg)
            tv[i, f] = float(np.mean(zt) - C_VALUE * np.mean(kt))
    return Sweep(k, q, zq, tv)


def best_of_n(st: Stack, n_prompts: int) -> tuple[FloatArray, FloatArray]:
    """Per N (rows) and prompt (cols): best raw reward and its z among the first N samples."""
    n = st.raw.shape[1]
    q = np.zeros((n, n_prompts))
    zq = np.zeros((n, n_prompts))
    for nn in range(1, n + 1):
        head = np.where(np.isnan(st.raw[:, :nn]), -np.inf, st.raw[:, :nn])
        ch = np.argmax(head, axis=1)
        r = np.arange(st.raw.shape[0])
        q[nn - 1] = per_prompt(st.raw[r, ch], st.prompt, n_prompts)
        zq[nn - 1] = per_prompt(st.z[r, ch], st.prompt, n_prompts)
    return q, zq


# ---------------------------------------------------------------------------------------------
# matched samples
# ---------------------------------------------------------------------------------------------
def curve_at(kbar: FloatArray, per_c: FloatArray, target: float) -> FloatArray | None:
    """Per-prompt quality of the sweep interpolated (in avg K) at ``target`` avg samples."""
    order = np.argsort(kbar, kind="stable")
    ks = kbar[order]
    if target < ks[0] - 1e-9 or target > ks[-1] + 1e-9:
        return None
    j = int(np.searchsorted(ks, target))
    if j < ks.size and abs(ks[j] - target) < 1e-9:
        return np.asarray(per_c[order[j]], dtype=np.float64)
    j = min(max(j, 1), ks.size - 1)
    lo, hi = order[j - 1], order[j]
    w = (target - kbar[lo]) / (kbar[hi] - kbar[lo])
    return np.asarray((1 - w) * per_c[lo] + w * per_c[hi], dtype=np.float64)


def samples_to_reach(kbar: FloatArray, qbar: FloatArray, goal: float) -> float:
    order = np.argsort(kbar, kind="stable")
    ks, qs = kbar[order], qbar[order]
    if qs[0] >= goal:
        return float(ks[0])
    for j in range(1, ks.size):
        if qs[j] >= goal > qs[j - 1]:
            return float(ks[j - 1] + (goal - qs[j - 1]) / (qs[j] - qs[j - 1]) * (ks[j] - ks[j - 1]))
    return math.nan


@dataclass
class Summary:
    label: str
    k01: float
    q01: float
    value01: float
    value_tuned: float
    c_tuned: float
    matched: list[tuple[int, float, float, float, float]]  # N, diff, se, K needed, z diff

    @property
    def worst(self) -> tuple[float, int]:
        ok = [(m[1], m[0]) for m in self.matched if not math.isnan(m[1])]
        return min(ok) if ok else (math.nan, 0)


def summarize(label: str, sw: Sweep, bq: FloatArray, bz: FloatArray) -> Summary:
    kbar = sw.k.mean(axis=1)
    qbar = sw.q.mean(axis=1)
    i01 = int(np.argmin(np.abs(C_GRID - C_VALUE)))
    val = sw.zq.mean(axis=1) - C_VALUE * kbar
    # c chosen per fold on the training folds; the scored value uses each fold's own choice,
    # approximated by the majority choice across folds (folds agree up to grid neighbours).
    pick = np.argmax(sw.train_value, axis=0)
    i_t = int(np.bincount(pick).argmax())
    matched = []
    n = bq.shape[0]
    for nn in range(1, n + 1):
        at = curve_at(kbar, sw.q, float(nn))
        atz = curve_at(kbar, sw.zq, float(nn))
        if at is None or atz is None:
            matched.append((nn, math.nan, math.nan, samples_to_reach(kbar, qbar, bq[nn - 1].mean()),
                            math.nan))
            continue
        d = at - bq[nn - 1]
        matched.append((nn, float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)),
                        samples_to_reach(kbar, qbar, float(bq[nn - 1].mean())),
                        float((atz - bz[nn - 1]).mean())))
    return Summary(label, float(kbar[i01]), float(qbar[i01]), float(val[i01]), float(val[i_t]),
                   float(C_GRID[i_t]), matched)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def f3(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:+.3f}" if abs(x) < 1e3 else f"{x:.3g}"


def report(d: Data, sums: list[Summary], bq: FloatArray, bz: FloatArray, n_orders: int,
           folds: int, models: dict[str, CrossFit]) -> str:
    n = bq.shape[0]
    bon_val = bz.mean(axis=1) - C_VALUE * np.arange(1, n + 1)
    nb = int(np.argmax(bon_val)) + 1
    out = [f"### {d.name} ({d.raw.shape[0]} prompts x {n} samples; {folds}-fold cross-fitting, "
           f"{n_orders} orders)\n"]
    out.append(
        f"Fixed best-of-N: quality (mean chosen raw reward) at N = 1..{n}: "
        + ", ".join(f"{x:.3f}" for x in bq.mean(axis=1))
        + f". Best fixed N for the value at c = {C_VALUE}: N = {nb}, value {bon_val[nb - 1]:.3f}"
        " (oracle choice on the scored prompts).\n"
    )
    rows = []
    for s in sums:
        worst, wn = s.worst
        rows.append([
            s.label, f"{s.k01:.2f}", f"{s.q01:.3f}", f"{s.value01:.3f}",
            f"{s.value01 - bon_val[nb - 1]:+.3f}", f"{s.value_tuned:.3f} (c_std={s.c_tuned:.2g})",
            f"{s.value_tuned - bon_val[nb - 1]:+.3f}", f"{worst:+.4f} (N={wn})",
        ])
    out.append(md_table(["variant", "avg K @c_std=0.1", "quality @0.1", "value @0.1",
                   "vs best N", "value, c from train folds", "vs best N",
                   "worst matched quality diff"], rows))
    out.append("\nMatched average samples: BEACON quality minus best-of-N quality at the same "
               "average samples (raw reward units; ± one paired standard error over prompts; "
               "– where the c sweep does not reach N); in brackets the avg samples BEACON needs to "
               "reach best-of-N's quality.\n")
    hdr = ["variant"] + [f"N={nn}" for nn in range(1, n + 1)]
    mrows = []
    for s in sums:
        cells = [s.label]
        for _nn, diff, se, kneed, _ in s.matched:
            kn = "–" if math.isnan(kneed) else f"{kneed:.1f}"
            cells.append("– [" + kn + "]" if math.isnan(diff) else f"{diff:+.4f}±{se:.4f} [{kn}]")
        mrows.append(cells)
    out.append(md_table(hdr, mrows))
    out.append("\nSame, in per-prompt standardized units (z):\n")
    zrows = [[s.label] + [f3(m[4]) for m in s.matched] for s in sums]
    out.append(md_table(hdr, zrows))
    out.append("\nFitted priors (fold 0; model units):\n")
    prow = []
    for label, cf in models.items():
        p = cf.fits[0].prior
        if not isinstance(p, beacon.NIGPrior):
            continue
        prow.append([label, f"{p.mu0:.4g}", f"{p.nu0:.4g}", f"{p.alpha0:.4g}", f"{p.beta0:.4g}",
                     f"{cf.fits[0].within_scale:.4g}"])
    out.append(md_table(["variant", "mu0", "nu0", "alpha0", "beta0", "within scale s"], prow))
    return "\n".join(out) + "\n"


def write_docs(block: str, text: str) -> None:
    doc = DOC.read_text()
    start, end = f"<!-- priors:{block} -->", f"<!-- /priors:{block} -->"
    pat = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pat.search(doc):
        raise SystemExit(f"{DOC}: no block {start} ... {end}")
    DOC.write_text(pat.sub(lambda _: f"{start}\n{text}\n{end}", doc))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--perms", type=int, default=20, help="orders per prompt (0 = logged)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer variants and orders")
    ap.add_argument("--only", default=None, help="substring of a data set name")
    ap.add_argument("--write-docs", action="store_true", help=f"rewrite the blocks of {DOC}")
    ap.add_argument("--json", type=Path, default=None, help="also dump the summaries as JSON")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    n_orders = 4 if a.quick else a.perms
    dump: dict[str, Any] = {}
    for d in continuous_sets():
        if a.only and a.only not in d.name:
            continue
        st = stack_orders(d, n_orders, SEED)
        bq, bz = best_of_n(st, d.raw.shape[0])
        sums, models = [], {}
        for v in variants(d.probability, a.quick):
            t1 = time.perf_counter()
            cf = crossfit_variant(d, v, a.folds)
            sw = sweep(d, st, cf, v)
            models[v.label] = cf
            sums.append(summarize(v.label, sw, bq, bz))
            print(f"  {d.name}: {v.label}: {time.perf_counter() - t1:.1f}s", file=sys.stderr)
        text = report(d, sums, bq, bz, n_orders, a.folds, models)
        print(text)
        dump[d.name] = [s.__dict__ for s in sums]
        if a.write_docs:
            write_docs(d.name, text)
    if a.json:
        a.json.write_text(json.dumps(dump, indent=1, default=float))
    print(f"wall time {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
