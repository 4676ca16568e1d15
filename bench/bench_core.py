"""Core speed: one Stopper step and the vectorised replay, each beside its baseline.

Run: ``python -m bench.bench_core [--prompts 100000] [--samples 32]``

Figures printed:
* ``observe + next_decision``: microseconds per step of :class:`beacon.Stopper` (one reward
  observed as a float, then the next decision, trace recorded; normal family, Jeffreys, robust
  update, n = 32), against the baseline of the same step computing the predictive quantile
  with ``scipy.stats.t.ppf`` uncached and the posterior in closed form from the whole history
  (what a straightforward implementation does); the same in batch mode (b = 4: a list of 4
  rewards, then the next decision; per step and per reward) and for the ``bernoulli`` family
  (rewards 0/1 with success rate 3%, Beta(1, 1)).
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


def _drive(cfg: beacon.BeaconConfig, rewards: list[float]) -> int:
    """Stoppers under ``cfg`` fed ``rewards`` in order (one float when a draw asks for one, else a
    list); a new Stopper when one stops. Returns the number of observe + next_decision steps."""
    i, n, steps = 0, len(rewards), 0
    while i < n:
        s = beacon.Stopper(cfg)
        while isinstance(d := s.next_decision(), beacon.Draw) and i < n:
            c = d.count
            s.observe(rewards[i] if c == 1 else rewards[i : i + c])
            i += c
            steps += 1
    return steps


def bench_stopper(cfg: beacon.BeaconConfig, rewards: list[float], repeat: int = 7) -> float:
    """Microseconds per step (observe the requested reward(s) + next_decision), trace on."""
    steps = _drive(cfg, rewards)  # warm-up: table load, caches
    return _time(lambda: _drive(cfg, rewards), repeat) / steps * 1e6


def bench_naive(rewards: list[float], n: int = 32) -> float:
    """Microseconds per reward of the naive baseline step (see the module docstring)."""
    table = get_table(n)

    def naive_steps() -> None:
        i = 0
        while i < len(rewards):
            hist: list[float] = []
            for _ in range(n):
                if i >= len(rewards):
                    break
                hist.append(rewards[i])
                i += 1
                k = len(hist)
                if k < 3 or k >= n:
                    continue
                r = np.asarray(hist)
                mu, s2 = r.mean(), r.var(ddof=1)
                sigma = math.sqrt(s2 * (1 + 1 / k))
                student_t.ppf(0.01, k - 1)
                table.h(k, (r.max() - mu) / sigma)

    return _time(naive_steps) / len(rewards) * 1e6


def bench_step(n_steps: int = 20000) -> dict[str, float]:
    """Stopper step times (us): normal sequential and batch, bernoulli; and the naive baseline."""
    rng = np.random.default_rng(0)
    normal = [float(v) for v in rng.normal(size=n_steps)]
    binary = [float(v) for v in (rng.random(n_steps) < 0.03)]
    normal_cfg = beacon.BeaconConfig(cost=1e-12, horizon=32)  # never stops before n
    bern_cfg = beacon.BeaconConfig(family="bernoulli", cost=1e-6, horizon=32)
    batch = 4
    out = {
        "normal": bench_stopper(normal_cfg, normal),
        "normal_batch": bench_stopper(normal_cfg.replace(batch_size=batch), normal),
        "bernoulli": bench_stopper(bern_cfg, binary),
        "naive": bench_naive(normal),
    }
    out["normal_batch_per_reward"] = (
        out["normal_batch"] * _drive(normal_cfg.replace(batch_size=batch), normal) / n_steps
    )
    return out


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

    _replay_with_stopper(sub[:5], cfg)  # warm: a one-off cost must not be extrapolated
    t_loop = _time(lambda: _replay_with_stopper(sub, cfg), repeat=2) * (prompts / sub.shape[0])
    return t_vec, t_loop, t_first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=32)
    args = ap.parse_args()
    t0 = time.perf_counter()
    get_table(32)
    print(f"table n=32 ready in {time.perf_counter() - t0:.3f} s (shipped/cached/built)")
    t = bench_step()
    print(
        f"Stopper observe+next_decision (normal, Jeffreys, robust, n=32, trace on): "
        f"{t['normal']:.2f} us/step   baseline (closed form + scipy ppf): {t['naive']:.2f} us/step"
        f"   speed-up x{t['naive'] / t['normal']:.1f}"
    )
    print(
        f"Stopper batch b=4 (observe 4 + next_decision): {t['normal_batch']:.2f} us/step "
        f"({t['normal_batch_per_reward']:.2f} us/reward)"
    )
    print(f"Stopper bernoulli observe+next_decision (n=32): {t['bernoulli']:.2f} us/step")
    t_vec, t_loop, t_first = bench_replay(args.prompts, args.samples)
    print(
        f"replay {args.prompts} x {args.samples}: {t_vec:.3f} s   "
        f"baseline Python loop over Stopper: "
        f"{t_loop:.1f} s (extrapolated)   speed-up x{t_loop / t_vec:.0f}   "
        f"(first call incl. compile/cache load {t_first:.2f} s)"
    )


if __name__ == "__main__":
    main()
