"""Monte Carlo checks of the deep rows (beyond the reach of the nested-quadrature reference).

At a standardized state (k, zhat, mu=0, sigma=1) with cost c = h_{n,k}(zhat) the decision maker
is indifferent (Definition def_1: H_{n,k}(zhat; c) = c): drawing once more and then following the
table's policy must return zhat in expectation (the Bellman value-iteration identity
V = zhat = E[V_{n,k+1}] - c). The policy must also beat scaled versions of itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from beacon.index import HTable, get_table


def play(t: HTable, k: int, zhat: float, c: float, u: np.ndarray, factor: float) -> np.ndarray:
    """Net payoff z_K - c (K - k) of: draw once, then stop iff factor * h <= c / sigma."""
    paths = u.shape[0]
    z = np.full(paths, zhat)
    mu = np.zeros(paths)
    sig = np.ones(paths)
    paid = np.zeros(paths)
    alive = np.ones(paths, dtype=bool)
    for j in range(k, t.n):
        if j > k:
            zh = (z - mu) / sig
            h = t.h(j, zh)
            alive &= ~(factor * h <= c / sig)
        if not alive.any():
            break
        d = 2 * t.alpha0 + j
        nup = t.nu0 + j + 1
        lam = math.sqrt((1 - 1 / nup**2) / (d + 1))
        r = mu + sig * u[:, j - k]
        dev = r - mu
        z = np.where(alive, np.maximum(z, r), z)
        new_sig = lam * np.sqrt(d * sig**2 + dev**2)
        mu = np.where(alive, mu + dev / nup, mu)
        sig = np.where(alive, new_sig, sig)
        paid += np.where(alive, c, 0.0)
    return z - paid


def draws(t: HTable, k: int, paths: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = [rng.standard_t(2 * t.alpha0 + j, size=paths) for j in range(k, t.n)]
    return np.stack(cols, axis=1)


@pytest.mark.parametrize(
    ("n", "k", "zhat"), [(16, 6, 0.5), (16, 9, 1.2), (32, 8, 0.8), (32, 20, 2.0)]
)
def test_indifference_at_the_index(n: int, k: int, zhat: float) -> None:
    t = get_table(n)
    c = t.h(k, zhat)
    u = draws(t, k, 200_000, seed=n * 100 + k)
    pay = play(t, k, zhat, c, u, 1.0)
    se = pay.std(ddof=1) / math.sqrt(pay.size)
    assert abs(pay.mean() - zhat) < 4.0 * se + 1e-9


@pytest.mark.parametrize(("n", "k", "zhat"), [(16, 5, 0.3), (32, 10, 1.0)])
def test_policy_beats_scaled_thresholds(n: int, k: int, zhat: float) -> None:
    t = get_table(n)
    c = 0.5 * t.h(k, zhat)
    u = draws(t, k, 100_000, seed=7 + n + k)
    best = play(t, k, zhat, c, u, 1.0)
    for factor in (0.5, 2.0):
        other = play(t, k, zhat, c, u, factor)
        diff = best - other
        se = diff.std(ddof=1) / math.sqrt(diff.size)
        assert diff.mean() > -3.0 * se
