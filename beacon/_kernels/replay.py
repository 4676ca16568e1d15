"""Numba kernels replaying the Stopper over logged rewards, one prompt per row.

They mirror :class:`beacon.stopper.Stopper` step for step (same update order, same floating-point
operations, the same ``h_lookup`` as the Python path), so a replay decides exactly as the Stopper
does prompt by prompt. Codes of the stop reason: 0 index, 1 horizon, 2 absorbed.

The normal kernel also returns, per prompt, the column of the reward whose update overflowed the
model's statistics (beta_k or the predictive scale sigma_k infinite; -1 where none did), the
reward on which :class:`beacon.Stopper` raises its :class:`beacon.RewardError`; that prompt's
other outputs are left where the overflow stopped it, and the caller raises.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import prange

from beacon._kernels._jit import cached_njit
from beacon._kernels.tables import h_lookup

# Thread start-up costs tens of milliseconds on a busy machine: small replays (a CLI sweep, a
# benchmark fold) run serially, large ones in parallel over prompts.
PARALLEL_MIN_ROWS = 20_000

REASON_INDEX = 0
REASON_HORIZON = 1
REASON_ABSORBED = 2
_SIGMA_FLOOR = 1e-6


@cached_njit()
def _next_logged(x: np.ndarray, i: int, col: int) -> int:
    """First column >= ``col`` of row ``i`` holding a logged (non-NaN) sample; n_cols if none."""
    n_cols = x.shape[1]
    while col < n_cols and math.isnan(x[i, col]):
        col += 1
    return col


def _replay_normal(
    x: np.ndarray,
    raw: np.ndarray,
    horizon: int,
    k_first: int,
    prior_k0: int,
    batch: int,
    robust: bool,
    tq: np.ndarray,
    mu0: float,
    nu0: float,
    alpha0: float,
    beta0: float,
    cost: float,
    table: tuple,  # type: ignore[type-arg]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """NIG learning + UIP (eq. UIP) with the robust update; see beacon.families.normal.

    Returns (used, chosen, reason code, truncated, overflow column) per prompt."""
    n_rows, n_cols = x.shape
    used = np.zeros(n_rows, dtype=np.int64)
    chosen = np.full(n_rows, -1, dtype=np.int64)
    reason = np.zeros(n_rows, dtype=np.int64)
    truncated = np.zeros(n_rows, dtype=np.bool_)
    overflow = np.full(n_rows, -1, dtype=np.int64)
    for i in prange(n_rows):
        k = 0
        mu = mu0
        nu = nu0
        alpha = alpha0
        beta = beta0
        z = -np.inf
        best = -np.inf
        best_col = -1
        col = 0
        pending = k_first
        while True:
            ran_out = False
            while pending > 0:
                col = _next_logged(x, i, col)
                if col >= n_cols:
                    ran_out = True
                    break
                r = x[i, col]
                rm = r
                if robust and k >= prior_k0 and alpha > 0.0 and nu > 0.0:
                    s = max(_SIGMA_FLOOR, math.sqrt((nu + 1.0) * beta / (nu * alpha)))
                    if r < mu + s * tq[k]:
                        rm = mu
                d = rm - mu
                nu1 = nu + 1.0
                mu = mu + d / nu1
                beta = beta + nu * d * d / (2.0 * nu1)
                nu = nu1
                alpha = alpha + 0.5
                # the Stopper's check (beacon.families.normal): beta_{k+1} or, once defined,
                # sigma_{k+1} infinite (sqrt and the 1e-6 floor keep inf as inf)
                if beta == np.inf or (
                    k + 1 >= prior_k0
                    and nu > 0.0
                    and alpha > 0.0
                    and (nu + 1.0) * beta / (nu * alpha) == np.inf
                ):
                    overflow[i] = col
                    break
                z = max(z, r)
                if raw[i, col] > best:
                    best = raw[i, col]
                    best_col = col
                k += 1
                col += 1
                pending -= 1
            if overflow[i] >= 0:
                break
            if ran_out:
                truncated[i] = True
                reason[i] = REASON_HORIZON
                break
            if k >= horizon:
                reason[i] = REASON_HORIZON
                break
            sigma = max(_SIGMA_FLOOR, math.sqrt((nu + 1.0) * beta / (nu * alpha)))
            zhat = (z - mu) / sigma
            h = h_lookup(*table, k, zhat)  # type: ignore[call-arg]
            if h > cost / sigma:
                pending = min(batch, horizon - k)
            else:
                reason[i] = REASON_INDEX
                break
        used[i] = k
        chosen[i] = best_col
    return used, chosen, reason, truncated, overflow


def _replay_bernoulli(
    x: np.ndarray,
    horizon: int,
    k_first: int,
    batch: int,
    h_b: np.ndarray,
    cost: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Beta learning + reservation-cost policy; ``h_b[k]`` = h^B_{n,k}(a0, b_k), b_k = b0 plus k
    failures added one at a time (the Stopper's sum; b0 + k can differ in the last bit)."""
    n_rows, n_cols = x.shape
    used = np.zeros(n_rows, dtype=np.int64)
    chosen = np.full(n_rows, -1, dtype=np.int64)
    reason = np.zeros(n_rows, dtype=np.int64)
    truncated = np.zeros(n_rows, dtype=np.bool_)
    for i in prange(n_rows):
        k = 0
        z = -np.inf
        best_col = -1
        col = 0
        pending = k_first
        while True:
            ran_out = False
            while pending > 0:
                col = _next_logged(x, i, col)
                if col >= n_cols:
                    ran_out = True
                    break
                r = x[i, col]
                if r > z:
                    z = r
                    best_col = col
                k += 1
                col += 1
                pending -= 1
            if ran_out:
                truncated[i] = True
                reason[i] = REASON_HORIZON
                break
            if k >= horizon:
                reason[i] = REASON_HORIZON
                break
            if z >= 1.0:
                reason[i] = REASON_ABSORBED
                break
            if cost < h_b[k]:
                pending = min(batch, horizon - k)
            else:
                reason[i] = REASON_INDEX
                break
        used[i] = k
        chosen[i] = best_col
    return used, chosen, reason, truncated


_normal_serial = cached_njit()(_replay_normal)
_normal_parallel = cached_njit(parallel=True)(_replay_normal)
_bernoulli_serial = cached_njit()(_replay_bernoulli)
_bernoulli_parallel = cached_njit(parallel=True)(_replay_bernoulli)


def replay_normal(x: np.ndarray, *args: Any) -> Any:
    """Dispatch :func:`_replay_normal` serially or in parallel by the number of prompts."""
    kernel: Any = _normal_parallel if x.shape[0] >= PARALLEL_MIN_ROWS else _normal_serial
    return kernel(x, *args)


def replay_bernoulli(x: np.ndarray, *args: Any) -> Any:
    """Dispatch :func:`_replay_bernoulli` serially or in parallel by the number of prompts."""
    kernel: Any = _bernoulli_parallel if x.shape[0] >= PARALLEL_MIN_ROWS else _bernoulli_serial
    return kernel(x, *args)
