"""Every row of the h-index tables against an independent, slow numpy Bellman recursion.

The reference below shares no code with the builder (``beacon._kernels.tables``) and
discretises the recursion of the paper's appendix "Computation of the h-index"
(eq:compute_h_index with the errata in docs/h_index.md, "The recursion") differently:

* the continuation excess of stage ``j``, ``E_j(z, s) = (H_j(z; s h_j(z)) - s h_j(z)) /
  h_j(z)``, lives on a tensor grid: ``y = asinh(z)`` uniform (scipy cubic spline in ``y``)
  times ``s`` uniform on ``[0, S_MAX]`` (local cubic Lagrange in ``s``); ``S_MAX > 1`` keeps the
  (negative) continuation past the index. No breakpoints, no ``s``-segments, no Chebyshev;
* the expectation over the next reward ``u ~ t_d`` uses ``u = a tan(theta)``, ``a = 1 + |z|/2``,
  and composite Gauss-Legendre panels of order 8, uniform on each side of the kink ``u = z``.
  A panel where ``psi(u) - c`` changes sign (a stop/continue switch of the next stage) is
  integrated as ``max(0, interpolant)`` on a fine subgrid (kink-exact trapezoid, Richardson);
* ``h_j(z) = c`` solving ``H_j(z; c) = c`` by a vectorised Illinois iteration.

The test runs the reference at two resolutions per horizon (``RESOLUTIONS``; the finer pair
for n = 32, about 2 minutes and 0.8 GB): their difference is the reference's own convergence,
and the shipped tables (precise recipe) must agree with the finer one to 1e-6 relative on every
row at every compared node (docs/h_index.md, "Recipes and accuracy", has the measured figures;
the reference converges onto the table as it is refined). Rows n-1 .. n-3 are also certified
by scipy in tests/test_index_reference.py; tests/test_index_precise.py checks that the shipped
files are what the precise recipe builds, and ``python -m bench.table_convergence`` measures its
self-convergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import special
from scipy.interpolate import CubicSpline

from beacon.index import get_table

ALPHA0 = -0.5
NU0 = 0.0
S_MAX = 1.25


@dataclass(frozen=True)
class Resolution:
    hy: float  # grid step in y = asinh(z)
    panels: int  # Gauss-Legendre panels on each side of the kink u = z
    ns: int  # points of the uniform s-grid on [0, S_MAX]


GL_X, GL_W = np.polynomial.legendre.leggauss(8)
# values on a uniform subgrid of [-1, 1] of the degree-7 interpolant at the Gauss nodes
_SUB_X = np.linspace(-1.0, 1.0, 129)
SUB = np.polynomial.legendre.legvander(_SUB_X, 7) @ (
    (np.arange(8)[:, None] + 0.5) * GL_W[None, :] * np.polynomial.legendre.legvander(GL_X, 7).T
)
SUB_DX = 2.0 / 128

FINE = Resolution(hy=0.04, panels=24, ns=61)
EXTRA = Resolution(hy=0.025, panels=40, ns=121)
EXTRA2 = Resolution(hy=0.0175, panels=56, ns=181)
#: (coarser, finer) reference resolutions per horizon.
RESOLUTIONS = {8: (FINE, EXTRA), 16: (FINE, EXTRA), 32: (EXTRA, EXTRA2)}


def t_logpdf(u: np.ndarray, d: float) -> np.ndarray:
    return (
        special.gammaln((d + 1) / 2)
        - special.gammaln(d / 2)
        - 0.5 * math.log(d * math.pi)
        - (d + 1) / 2 * np.log1p(u * u / d)
    )


def myopic(z: np.ndarray, d: float) -> np.ndarray:
    """G_d(z) = E[(U - z)^+], U ~ t_d (closed form)."""
    z = np.asarray(z, dtype=float)
    return (d + z * z) / (d - 1) * np.exp(t_logpdf(z, d)) - z * special.stdtr(d, -z)


class Stage:
    """Representation of stage j: ``h_j`` and ``E_j`` on the (y, s) grid (or closed form)."""

    def __init__(self, d: float, y: np.ndarray | None, logh=None, excess=None) -> None:
        self.d = d
        self.closed = y is None
        if not self.closed:
            self.y = y
            self.zhi = float(np.sinh(y[-1]))
            self.logh = CubicSpline(y, logh)
            self.excess = CubicSpline(y, excess, axis=0)

    def h(self, z: np.ndarray) -> np.ndarray:
        if self.closed:
            return myopic(z, self.d)
        y = np.clip(np.arcsinh(z), self.y[0], self.y[-1])
        out = np.exp(self.logh(y))
        right = z > self.zhi
        # beyond the grid: the exact power decay z^(1 - d) of h
        out[right] *= (z[right] / self.zhi) ** (1 - self.d)
        return out

    def excess_rows(self, z: np.ndarray, ns: int) -> np.ndarray:
        """E_j(z, s_m) for every node z (shape z.shape + (ns,))."""
        if self.closed:
            s = np.linspace(0.0, S_MAX, ns)
            return np.broadcast_to(1.0 - s, (*z.shape, ns))
        y = np.clip(np.arcsinh(z), self.y[0], self.y[-1])
        return self.excess(y)


def interp_s(rows: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Cubic Lagrange interpolation in s (uniform grid on [0, S_MAX]) of ``rows[i, q, :]`` at
    ``s[i, q, l]`` (states i, quadrature nodes q, cost levels l)."""
    ns = rows.shape[-1]
    ds = S_MAX / (ns - 1)
    t = s / ds
    j = np.clip(np.floor(t).astype(int) - 1, 0, ns - 4)
    p = t - j
    w = (
        -(p - 1) * (p - 2) * (p - 3) / 6,
        p * (p - 2) * (p - 3) / 2,
        -p * (p - 1) * (p - 3) / 2,
        p * (p - 1) * (p - 2) / 6,
    )
    flat = rows.reshape(-1)  # a view: rows is C-contiguous, (states, nodes, ns)
    at = (np.arange(rows.shape[0] * rows.shape[1]) * ns).reshape(rows.shape[:2])[..., None] + j
    return sum(w[i] * flat[at + i] for i in range(4))


def positive_part(g: np.ndarray, dx: float) -> np.ndarray:
    """Trapezoid rule for ``int max(0, g)`` along the last axis, exact in the cell where the
    linear interpolant of ``g`` changes sign."""
    a, b = g[:, :-1], g[:, 1:]
    ap, bp = np.maximum(a, 0.0), np.maximum(b, 0.0)
    cross = a * b < 0.0
    cell = np.where(
        cross,
        (ap * ap + bp * bp) / (2.0 * np.where(cross, np.abs(a - b), 1.0)),
        0.5 * (ap + bp),
    )
    return dx * np.sum(cell, axis=1)


class Quadrature:
    """Nodes in u and weights (density included) for the states ``z`` at stage ``k``."""

    def __init__(self, z: np.ndarray, k: int, res: Resolution) -> None:
        d = 2 * ALPHA0 + k
        nup = NU0 + k + 1
        lam = math.sqrt((1 - 1 / nup**2) / (d + 1))
        x, w = GL_X, GL_W
        a = 1.0 + np.abs(z) / 2
        thz = np.arctan(z / a)
        th_parts, w_parts = [], []
        for lo, hi in ((-math.pi / 2 + 0 * thz, thz), (thz, math.pi / 2 + 0 * thz)):
            width = (hi - lo) / res.panels
            for p in range(res.panels):
                left = lo + p * width
                th_parts.append(left[:, None] + width[:, None] * (x[None, :] + 1) / 2)
                w_parts.append(width[:, None] / 2 * w[None, :])
        th = np.concatenate(th_parts, axis=1)
        wt = np.concatenate(w_parts, axis=1)
        u = a[:, None] * np.tan(th)
        wt = wt * a[:, None] / np.cos(th) ** 2 * np.exp(t_logpdf(u, d))
        sig = lam * np.sqrt(d + u * u)
        self.zeta = (np.maximum(z[:, None], u) - u / nup) / sig
        self.sig = sig
        self.w = wt
        self.g0 = myopic(z, d)


def stage_values(
    z: np.ndarray, k: int, nxt: Stage, res: Resolution, with_excess: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """``h_k(z)`` (and ``E_k(z, s_m)``) from the representation of stage ``k + 1``."""
    q = Quadrature(z, k, res)
    psi = q.sig * nxt.h(q.zeta)
    rows = np.ascontiguousarray(nxt.excess_rows(q.zeta, res.ns))

    npan = psi.shape[1] // 8
    wpan = q.w.reshape(z.size, npan, 8)
    dens = wpan / GL_W  # integrand per unit of the panel coordinate x in [-1, 1]

    def big_h(c: np.ndarray) -> np.ndarray:
        """H_k(z; c) for costs ``c`` of shape (states, levels)."""
        nl = c.shape[1]
        s = c[:, None, :] / psi[:, :, None]
        f = (psi[:, :, None] * interp_s(rows, np.minimum(s, S_MAX))).reshape(z.size, npan, 8, nl)
        tot = np.einsum("ipq,ipql->il", wpan, np.maximum(f, 0.0))
        # panels with a stop/continue switch (a sign change between two nodes marks the panels
        # of both): integrate max(0, interpolant) exactly on a fine subgrid instead
        pos = (f > 0.0).reshape(z.size, -1, nl)
        chg = pos[:, 1:] != pos[:, :-1]
        node = np.zeros(pos.shape, dtype=bool)
        node[:, 1:] |= chg
        node[:, :-1] |= chg
        iz, ip, il = np.nonzero(np.any(node.reshape(z.size, npan, 8, nl), axis=2))
        if iz.size:
            fs = f[iz, ip, :, il]
            g = (dens[iz, ip] * fs) @ SUB.T
            # Richardson on the kink-exact trapezoid rule of the subgrid (spacing h and 2h)
            part = (4.0 * positive_part(g, SUB_DX) - positive_part(g[:, ::2], 2 * SUB_DX)) / 3.0
            gl = np.sum(wpan[iz, ip] * np.maximum(fs, 0.0), axis=1)
            np.add.at(tot, (iz, il), part - gl)
        return q.g0[:, None] + tot

    # Illinois on the decreasing g(c) = H(z; c) - c, bracket [G_d(z), H(z; G_d(z))]
    def big_h1(c: np.ndarray) -> np.ndarray:
        return big_h(c[:, None])[:, 0]

    lo = q.g0.copy()
    hi = big_h1(lo)
    glo = hi - lo
    ghi = big_h1(hi) - hi
    side = np.zeros(z.size, dtype=int)  # which end moved last: +1 lo, -1 hi
    for _ in range(60):
        c = np.where(glo - ghi > 0, (lo * ghi - hi * glo) / (ghi - glo), 0.5 * (lo + hi))
        c = np.where((c > lo) & (c < hi), c, 0.5 * (lo + hi))
        gc = big_h1(c) - c
        pos = gc > 0
        # Illinois: halve the value at the end that stays twice in a row
        ghi = np.where(pos & (side == 1), 0.5 * ghi, ghi)
        glo = np.where(~pos & (side == -1), 0.5 * glo, glo)
        lo = np.where(pos, c, lo)
        glo = np.where(pos, gc, glo)
        hi = np.where(pos, hi, c)
        ghi = np.where(pos, ghi, gc)
        side = np.where(pos, 1, -1)
        if np.all((hi - lo <= 1e-9 * hi) | (np.abs(gc) <= 1e-12 * c)):
            break
    h = c
    if not with_excess:
        return h, None
    s = np.linspace(0.0, S_MAX, res.ns)
    excess = np.empty((z.size, res.ns))
    for m0 in range(0, res.ns, 16):
        c = s[None, m0 : m0 + 16] * h[:, None]
        excess[:, m0 : m0 + 16] = (big_h(c) - c) / h[:, None]
    return h, excess


def reference_rows(n: int, zq: np.ndarray, res: Resolution) -> dict[int, np.ndarray]:
    """``h_{n,k}(zq)`` for every row ``k = n-1 .. k_min`` by the reference recursion."""
    kmin = 3  # Jeffreys prior
    y = np.arange(math.asinh(-1.0), math.asinh(math.sqrt(n) + 8.0) + res.hy, res.hy)
    zg = np.sinh(y)
    out = {n - 1: myopic(zq, 2 * ALPHA0 + n - 1)}
    nxt = Stage(2 * ALPHA0 + n - 1, None)
    for k in range(n - 2, kmin - 1, -1):
        out[k], _ = stage_values(zq, k, nxt, res, with_excess=False)
        if k > kmin:
            h, excess = stage_values(zg, k, nxt, res, with_excess=True)
            nxt = Stage(2 * ALPHA0 + k, y, np.log(h), excess)
    return out


def row_groups(n: int) -> dict[str, range]:
    return {"n-1": range(n - 1, n), "n-2..n-3": range(n - 3, n - 1), "deep": range(3, n - 3)}


#: Largest |coarser / finer - 1| of the reference itself (its convergence; measured <= 6.4e-6).
REFERENCE_SPREAD = 2e-5
#: Largest |table / finer reference - 1| on every row: the issue's target.
TABLE_TOLERANCE = 1e-6


# About 2 minutes for n = 32 on 2 idle cores; the suite's 300 s per-test limit is a hang guard,
# which a loaded machine (a CI runner shared with other jobs) could trip on this reference.
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("n", sorted(RESOLUTIONS))
def test_all_rows_against_reference(n: int) -> None:
    t = get_table(n)
    assert t.k_min == 3
    # every 9th grid node up to zhat = 4 (the reachable bulk: a state with zhat > 4 stops for
    # any c / sigma above ~1e-3; there the reference's fixed panels resolve the narrow
    # continuation windows of the next stage only to ~1e-5)
    idx = np.arange(0, np.searchsorted(t.z, 4.0), 9)
    zq = t.z[idx]
    coarser, finer = (reference_rows(n, zq, res) for res in RESOLUTIONS[n])
    for name, ks in row_groups(n).items():
        spread = max(float(np.max(np.abs(coarser[k] / finer[k] - 1))) for k in ks)
        err = max(float(np.max(np.abs(t.grid_values(k)[idx] / finer[k] - 1))) for k in ks)
        print(f"n={n} rows {name}: reference spread {spread:.1e}, table/reference {err:.1e}")
        assert spread <= REFERENCE_SPREAD, (name, spread)
        assert err <= TABLE_TOLERANCE, (name, err)
