"""Online warm start on real logged rewards: Jeffreys vs a prior refitted as the job runs.

``python -m bench.warm_start [--orders 8] [--min-prompts 20]``

Protocol (what ``beacon run --warm-start`` does with one prompt in flight)
--------------------------------------------------------------------------
* Data: every continuous data set in ``../shared/data``; horizon = samples logged per prompt.
* A job is a stream of the data set's prompts: order 0 is the logged prompt order, the others
  are seeded shuffles of it (samples stay in their logged order).
* Warm start: the first ``m`` prompts run with Jeffreys' prior; after ``m, 2m, 4m, ...``
  finished prompts the job's :class:`beacon.jobs.WarmStarter` (the code ``beacon run
  --warm-start`` uses) refits the NIG prior (marginal likelihood), and with ``gaussianize`` the
  transform and the cost in model units, on the rewards BEACON actually drew from the finished
  prompts; the following prompts use it. Nothing is fitted on a prompt before it is scored, nor
  on samples that were not drawn.
* Sweep: ``c = c_std * s`` with ``s`` the pooled within-prompt sd of the data set (only a
  parametrisation of the sweep: the comparison below is at matched samples, free of c's units).
* Matched samples: each variant's (avg K, quality) points over the sweep, interpolated at each
  integer N, minus fixed best-of-N's quality at N on the same prompts (paired per prompt for the
  standard error). Quality: the per-prompt z-score of the chosen sample over all its logged
  samples, and its raw reward.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

import beacon
from beacon.jobs.warm_start import WarmStart, WarmStarter
from beacon.replay import replay
from bench._common import md_table
from bench.priors import Data, Stack, best_of_n, continuous_sets, curve_at

C_STD = np.geomspace(0.01, 2.0, 14)


def _pooled_sd(raw: np.ndarray) -> float:
    dev = raw - np.nanmean(raw, axis=1, keepdims=True)
    cnt = np.sum(~np.isnan(raw), axis=1)
    return float(np.sqrt(np.nansum(dev**2) / max(1, int(np.sum(cnt - 1)))))


def stream(raw: np.ndarray, cfg: beacon.BeaconConfig, warm: WarmStart | None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Samples used and chosen column per prompt of one job run as a stream (one prompt in
    flight): the job's own :class:`WarmStarter` refits between blocks of prompts."""
    p = raw.shape[0]
    used = np.zeros(p, dtype=np.int64)
    chosen = np.zeros(p, dtype=np.int64)
    starter = WarmStarter(warm, cfg) if warm is not None else None
    a = 0
    while a < p:
        b = p
        if starter is not None:
            # The next refit point: after min_prompts * growth**j finished prompts.
            b = p if starter.due() else max(a + 1, min(p, starter.next_refit_at))
        cur = starter.config if starter is not None else cfg
        res = replay(raw[a:b], cur)
        used[a:b], chosen[a:b] = res.n_samples, res.chosen
        if starter is not None:
            for i in range(a, b):
                starter.add(raw[i, : used[i]].tolist())
            if starter.due():
                starter.refit()
        a = b
    return used, chosen


def run(d: Data, n_orders: int, m: int, seed: int = 5) -> dict[str, np.ndarray]:
    p, n = d.raw.shape
    rng = np.random.default_rng(seed)
    orders = [np.arange(p)] + [rng.permutation(p) for _ in range(n_orders - 1)]
    s = _pooled_sd(d.raw)
    out: dict[str, np.ndarray] = {}
    variants = (("Jeffreys", None), (f"warm start (m={m})", WarmStart(min_prompts=m)),
                (f"warm start + gaussianize (m={m})", WarmStart(min_prompts=m,
                                                               transform="gaussianize")))
    for name, warm in variants:
        k = np.zeros((C_STD.size, p))
        zq = np.zeros((C_STD.size, p))
        q = np.zeros((C_STD.size, p))
        for i, c in enumerate(C_STD):
            cfg = beacon.BeaconConfig(cost=float(c * s), horizon=n)
            for order in orders:
                used, ch = stream(d.raw[order], cfg, warm)
                k[i, order] += used / n_orders
                zq[i, order] += d.z[order, ch] / n_orders
                q[i, order] += d.raw[order, ch] / n_orders
        out[name + ":k"], out[name + ":z"], out[name + ":q"] = k, zq, q
    return out


def report(d: Data, res: dict[str, np.ndarray]) -> str:
    p, n = d.raw.shape
    st = Stack(d.raw, d.z, np.arange(p), 1)
    bq, bz = best_of_n(st, p)
    names = sorted({k.split(":")[0] for k in res})
    rows = []
    for name in names:
        kbar = res[name + ":k"].mean(axis=1)
        for qual, key, base in (("z", ":z", bz), ("raw", ":q", bq)):
            cells = []
            for nn in range(2, n):
                cur = curve_at(kbar, res[name + key], float(nn))
                if cur is None:
                    cells.append("–")
                    continue
                diff = cur - base[nn - 1]
                se = float(np.std(diff, ddof=1) / np.sqrt(p))
                cells.append(f"{np.mean(diff):+.3f}±{se:.3f}")
            rows.append([name, qual, *cells])
    header = ["variant", "quality", *[f"N={nn}" for nn in range(2, n)]]
    return f"### {d.name} ({p} prompts, horizon {n})\n\n" + md_table(header, rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=8)
    ap.add_argument("--min-prompts", type=int, default=20)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    for d in continuous_sets():
        print(report(d, run(d, a.orders, a.min_prompts)))
    print(f"wall {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
