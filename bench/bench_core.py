"""Core speed: one Stopper step and the vectorised replay, each beside its baseline.

Run: ``python -m bench.bench_core [--prompts 100000] [--samples 32]``

Figures printed:
* ``observe + next_decision``: microseconds per step of :class:`beacon.Stopper` (normal family,
  Jeffreys, n = 32), against the baseline of the same step computing the predictive quantile
  with ``scipy.stats.t.ppf`` uncached and the posterior in closed form from the whole history
  (what a straightforward implementation does).
* ``replay``: seconds for ``beacon.replay`` of P prompts x S logged samples, against a plain
  Python loop over the Stopper on a subsample (extrapolated per prompt); the ratio is the speed-up.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.stats import t as student_t

import beacon
from beacon.index import get_table


def _time(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_step(n_steps: int = 20000) -> tuple[float, float]:
    cfg = beacon.BeaconConfig(cost=1e-12, horizon=32)
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=n_steps)
    table = get_table(32)

    def beacon_steps() -> None:
        i = 0
        while i < n_steps:
            s = beacon.Stopper(cfg)
            while isinstance(d := s.next_decision(), beacon.Draw) and i < n_steps:
                s.observe(rewards[i : i + d.count])
                i += d.count

    def naive_steps() -> None:
        i = 0
        while i < n_steps:
            hist: list[float] = []
            for _ in range(32):
                if i >= n_steps:
                    break
                hist.append(float(rewards[i]))
                i += 1
                k = len(hist)
                if k < 3 or k >= 32:
                    continue
                r = np.asarray(hist)
                mu, s2 = r.mean(), r.var(ddof=1)
                sigma = math.sqrt(s2 * (1 + 1 / k))
                student_t.ppf(0.01, k - 1)
                table.h(k, (r.max() - mu) / sigma)

    beacon_steps()  # warm-up (numba lookup compile, caches)
    t_b = _time(beacon_steps) / n_steps
    t_n = _time(naive_steps) / n_steps
    return t_b, t_n


def bench_replay(prompts: int, samples: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(prompts, samples)) * rng.uniform(0.2, 2.0, size=(prompts, 1))
    cfg = beacon.BeaconConfig(cost=0.1, horizon=samples)
    t0 = time.perf_counter()
    beacon.replay(x[:10], cfg)  # compile or load the numba cache
    t_first = time.perf_counter() - t0
    t_vec = _time(lambda: beacon.replay(x, cfg), repeat=3)
    sub = x[: max(200, prompts // 200)]
    from beacon.replay import _replay_with_stopper

    t_loop = _time(lambda: _replay_with_stopper(sub, cfg), repeat=1) * (prompts / sub.shape[0])
    return t_vec, t_loop, t_first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=32)
    args = ap.parse_args()
    t0 = time.perf_counter()
    get_table(32)
    print(f"table n=32 ready in {time.perf_counter() - t0:.3f} s (shipped/cached/built)")
    t_b, t_n = bench_step()
    print(
        f"observe+next_decision: {t_b * 1e6:.2f} us/step   baseline (closed form + scipy ppf): "
        f"{t_n * 1e6:.2f} us/step   speed-up x{t_n / t_b:.1f}"
    )
    t_vec, t_loop, t_first = bench_replay(args.prompts, args.samples)
    print(
        f"replay {args.prompts} x {args.samples}: {t_vec:.3f} s   "
        f"baseline Python loop over Stopper: "
        f"{t_loop:.1f} s (extrapolated)   speed-up x{t_loop / t_vec:.0f}   "
        f"(first call incl. compile/cache load {t_first:.2f} s)"
    )


if __name__ == "__main__":
    main()
