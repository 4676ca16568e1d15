"""Numba kernels for the h-index tables of the Normal–Inverse-Gamma model.

This module holds *all* numba code of the table machinery: Student-t special functions, the
Bellman recursion of the paper's appendix "Computation of the h-index" (eq:compute_h_index, with
the errata in docs/h_index.md, "The recursion"), and the scalar lookup :func:`h_lookup` shared
by the Python table object and the numba replay.

Mathematics (standardized coordinates, mu = 0, sigma = 1, after k rewards)
--------------------------------------------------------------------------
The next standardized reward ``u`` is Student-t with ``d = 2 alpha0 + k`` degrees of freedom
(erratum: the paper writes ``2 alpha0``). After observing ``u`` the sufficient statistics of
eq. parameter_update become ``z' = max(zhat, u)``, ``mu' = u / (nu0 + k + 1)`` and
``sigma' = lam sqrt(d + u^2)`` with ``lam = sqrt((1 - 1/(nu0+k+1)^2) / (d + 1))`` (erratum: the
paper's ``Lambda_{k+1}``), so ``zhat' = (z' - mu') / sigma'``. By location-scale invariance the
marginal gain of one more sample is

    H_k(zhat; c) = G_d(zhat) + E[max(0, sigma' H_{k+1}(zhat'; c/sigma') - c)]  (eq:compute_h_index)

(erratum: continuing at stage k+1 costs ``c/sigma'``, so the term inside ``g(u)`` is
``max(0, H_{k+1} - c/sigma')``), where ``G_d(z) = E[(u - z)^+] = (d + z^2)/(d - 1) f_d(z) -
z (1 - F_d(z))`` is the closed-form myopic gain and ``H_{n-1} = G_{d}``. The index
``h_k(zhat)`` is the unique ``c > 0`` with ``H_k(zhat; c) = c``.

Representation carried by the recursion
---------------------------------------
Stage ``k + 1`` is represented by ``log h_{k+1}`` on a grid ``z_i = a sinh(x_i)`` (uniform in
``x``; cubic spline in ``x``) and by the normalized continuation excess

    phi_{k+1}(z, s) = (H_{k+1}(z; s h_{k+1}(z)) - s h_{k+1}(z)) / h_{k+1}(z),   0 <= s <= 1,

``phi(z, 1) = 0``, so the kink of ``max(0, H - c)`` sits exactly on the edge ``s = 1`` and the
smooth ``phi`` (never the kinked ``W``) is interpolated. ``phi(z, .)`` is singular (a
``(s - b)^(3/2)`` term) where a stop region of stage k+2 is born as the cost grows: at the local
minima of ``psi`` on each branch ``u < z`` / ``u > z`` and (``C^{1,1}``) at the kink ``u = z``.
Each node stores these three levels ``b_1 <= b_2 <= b_3`` (divided by ``h``, smoothly capped above
1.1) and four ``s``-segments split there, each mapped by ``s = b_j + (b_{j+1} - b_j) t^2`` (which
turns the singularity into a smooth ``t^3``) and held as Chebyshev coefficients in ``t``; every
stored column is interpolated in ``x`` by a cubic spline (C^2, so that the next quadrature sees a
smooth integrand). With
``psi(u) = sigma'(u) h_{k+1}(zhat'(u))`` the integrand of eq:compute_h_index is
``psi phi_{k+1}(zhat', c/psi)`` where ``psi > c`` and 0 elsewhere; its derivative in ``c`` is
``phi_s`` (the boundary term vanishes because ``phi(., 1) = 0``), which drives a safeguarded
Newton iteration on the convex decreasing ``H_k(z; c) - c``. The row ``k = n-2`` uses the closed
form ``phi_{n-1}(z, s) = 1 - s`` and ``psi = sigma' G_{d+1}(zhat')`` (no interpolation at all).

Quadrature over ``u``: ``u = su tan(theta)`` (``su = max(1.5, |zhat|/2)``) maps the real line
onto ``(-pi/2, pi/2)`` (no truncation of the heavy Student-t tails), composite Gauss-Legendre
panels with geometrically graded end panels, a breakpoint at ``u = zhat`` (kink of
``max(zhat, u)``) and, for every cost ``c``, breakpoints at the roots of ``psi(u) = c`` (where
stage k+1 switches between stop and continue), located by an Illinois iteration.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from beacon._kernels._jit import cached_njit

# Fused multiply-add in the recursion's inner loops (Clenshaw, spline stencils): builds about 4%
# faster, no precision lost. Only contraction: the code relies on inf and NaN (panel-edge
# sentinels, isfinite checks), which the other fast-math flags would assume away. The public
# lookup (_row_h) keeps strict IEEE arithmetic so that every caller rounds it the same way.
_CONTRACT = {"contract"}


# --------------------------------------------------------------------------- special functions
@cached_njit()
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    fpmin = 1e-300
    qab = a + b
    qap = a + 1.0
    qam = a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    if abs(d) < fpmin:
        d = fpmin
    d = 1.0 / d
    h = d
    for m in range(1, 1000):
        m2 = 2.0 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        if abs(d) < fpmin:
            d = fpmin
        c = 1.0 + aa / c
        if abs(c) < fpmin:
            c = fpmin
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        if abs(d) < fpmin:
            d = fpmin
        c = 1.0 + aa / c
        if abs(c) < fpmin:
            c = fpmin
        d = 1.0 / d
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-16:
            break
    return h


@cached_njit()
def t_sf(z: float, d: float) -> float:
    """Survival function ``1 - F_d(z)`` of the standard Student-t with ``d`` dof."""
    z2 = z * z
    x = d / (d + z2)
    y = z2 / (d + z2)
    a = 0.5 * d
    b = 0.5
    if x <= 0.0:
        ib = 0.0
    elif y <= 0.0:
        ib = 1.0
    else:
        lbt = (
            math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
        )
        if x < (a + 1.0) / (a + b + 2.0):
            ib = math.exp(lbt) * _betacf(a, b, x) / a
        else:
            ib = 1.0 - math.exp(lbt) * _betacf(b, a, y) / b
    if z >= 0.0:
        return 0.5 * ib
    return 1.0 - 0.5 * ib


@cached_njit()
def t_logpdf_const(d: float) -> float:
    """``log`` of the normalizing constant of the Student-t density with ``d`` dof."""
    return math.lgamma(0.5 * (d + 1.0)) - math.lgamma(0.5 * d) - 0.5 * math.log(d * math.pi)


_HUGE_Z = 1e9


@cached_njit()
def _gain_far_right(z: float, d: float) -> float:
    """``G_d(z) = z^2 f_d(z) / (d (d - 1)) (1 + O(d / z^2))`` for ``z > 1e9``, in logs.

    The closed form of :func:`myopic_gain` underflows there at large ``d`` (``f_d ~ z^-(d+1)``) and
    overflows (``z^2``) beyond 1e154.
    """
    lg = 0.5 * (d + 1.0) * math.log(d) - (d - 1.0) * math.log(z) - math.log(d * (d - 1.0))
    return max(math.exp(t_logpdf_const(d) + lg), 1e-300)


@cached_njit()
def myopic_gain(z: float, d: float) -> float:
    """``G_d(z) = E[(u - z)^+]`` for ``u ~ t_d`` (``d > 1``); equals ``h_{n,n-1}(z)``.

    Beyond ``|z| = 1e9``: :func:`_gain_far_right` on the right and ``G_d(z) = -z + G_d(-z)``
    (``E[u] = 0``) on the left, so ``G_d(-inf) = inf`` and ``G_d(inf)`` is the floor.
    """
    if z > _HUGE_Z:
        return _gain_far_right(z, d)
    if z < -_HUGE_Z:
        return -z + _gain_far_right(-z, d)
    f = math.exp(t_logpdf_const(d) - 0.5 * (d + 1.0) * math.log1p(z * z / d))
    g = (d + z * z) / (d - 1.0) * f - z * t_sf(z, d)
    if g < 1e-300:
        g = 1e-300
    return g


# --------------------------------------------------------------------------- lookup
@cached_njit()
def _row_h(
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh: np.ndarray,
    m2: np.ndarray,
    r: int,
    dof: float,
    z: float,
) -> float:
    """h on row ``r``: cubic spline of ``log h`` in ``x = asinh(z/scale)``, asymptotic tails.

    Right of the grid ``h(z) = h(zhi) (z/zhi)^(1-d)`` (the exact power tail, ``d`` = row dof).
    Left of it ``h(z) = G_d(z) + (h(zlo) - G_d(zlo)) exp(kappa (z - zlo))``: above the myopic
    bound ``G_d`` (= h_{k+1,k}), ``h(z) + z -> 0+`` as ``z -> -inf``, decreasing and convex by
    construction, slope-matched at ``zlo`` when possible (``kappa`` >= 1/4).
    """
    npts = logh.shape[1]
    if z < zlo:
        h0 = math.exp(logh[r, 0])
        g0 = myopic_gain(zlo, dof)
        ex = h0 - g0
        if ex <= 0.0:
            return myopic_gain(z, dof)
        # spline slope of h at zlo versus the myopic slope -(1 - F(zlo))
        dydx = (logh[r, 1] - logh[r, 0]) / dx - dx * (2.0 * m2[r, 0] + m2[r, 1]) / 6.0
        dhdz = h0 * dydx / math.sqrt(scale * scale + zlo * zlo)
        kappa = (dhdz + t_sf(zlo, dof)) / ex
        if kappa < 0.25:
            kappa = 0.25
        return myopic_gain(z, dof) + ex * math.exp(kappa * (z - zlo))
    if z > zhi:
        return math.exp(logh[r, npts - 1] + (1.0 - dof) * math.log(z / zhi))
    t = (math.asinh(z / scale) - x_lo) / dx
    j = math.floor(t)
    if j < 0:
        j = 0
    elif j > npts - 2:
        j = npts - 2
    bb = t - j
    aa = 1.0 - bb
    y = aa * logh[r, j] + bb * logh[r, j + 1]
    y += ((aa * aa * aa - aa) * m2[r, j] + (bb * bb * bb - bb) * m2[r, j + 1]) * (dx * dx / 6.0)
    return math.exp(y)


@cached_njit()
def h_lookup(
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh: np.ndarray,
    m2: np.ndarray,
    dof: np.ndarray,
    k_min: int,
    k: int,
    z: float,
) -> float:
    """``h_{n,k}(z)`` from a table (arguments: ``HTable.lookup_arrays()``, then ``k``, ``z``).

    Returns NaN when ``k`` has no row or ``z`` is NaN (the Python layer raises instead).
    """
    r = k - k_min
    if r < 0 or r >= logh.shape[0] or z != z:
        return math.nan
    return _row_h(x_lo, dx, scale, zlo, zhi, logh, m2, r, dof[r], z)


@cached_njit()
def h_lookup_array(
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh: np.ndarray,
    m2: np.ndarray,
    dof: np.ndarray,
    k_min: int,
    k: int,
    z: np.ndarray,
) -> np.ndarray:
    """Elementwise :func:`h_lookup` over a flat float64 array ``z``."""
    out = np.empty(z.shape[0])
    for i in range(z.shape[0]):
        out[i] = h_lookup(x_lo, dx, scale, zlo, zhi, logh, m2, dof, k_min, k, z[i])
    return out


# --------------------------------------------------------------------------- spline set-up
@cached_njit()
def spline_m2(y: np.ndarray, dx: float) -> np.ndarray:
    """Second derivatives of the cubic spline through ``y`` on a uniform grid of step ``dx``.

    End values are the fourth-order one-sided second differences; the interior solves the
    usual tridiagonal system (Thomas algorithm).
    """
    n = y.shape[0]
    m = np.zeros(n)
    h2 = dx * dx
    m[0] = (35.0 * y[0] - 104.0 * y[1] + 114.0 * y[2] - 56.0 * y[3] + 11.0 * y[4]) / (12.0 * h2)
    m[n - 1] = (
        35.0 * y[n - 1] - 104.0 * y[n - 2] + 114.0 * y[n - 3] - 56.0 * y[n - 4] + 11.0 * y[n - 5]
    ) / (12.0 * h2)
    nint = n - 2
    cp = np.empty(nint)
    dp = np.empty(nint)
    for i in range(nint):
        rhs = 6.0 * (y[i] - 2.0 * y[i + 1] + y[i + 2]) / h2
        if i == 0:
            rhs -= m[0]
        if i == nint - 1:
            rhs -= m[n - 1]
        if i == 0:
            cp[i] = 1.0 / 4.0
            dp[i] = rhs / 4.0
        else:
            den = 4.0 - cp[i - 1]
            cp[i] = 1.0 / den
            dp[i] = (rhs - dp[i - 1]) / den
    for i in range(nint - 1, -1, -1):
        if i == nint - 1:
            m[i + 1] = dp[i]
        else:
            m[i + 1] = dp[i] - cp[i] * m[i + 2]
    return m


# --------------------------------------------------------------------------- recursion
@cached_njit()
def _lagrange4(p: float) -> tuple[float, float, float, float]:
    """Cubic Lagrange weights for nodes 0, 1, 2, 3 at position ``p``."""
    w0 = -(p - 1.0) * (p - 2.0) * (p - 3.0) / 6.0
    w1 = p * (p - 2.0) * (p - 3.0) / 2.0
    w2 = -p * (p - 1.0) * (p - 3.0) / 2.0
    w3 = p * (p - 1.0) * (p - 2.0) / 6.0
    return w0, w1, w2, w3


@cached_njit()
def _lagrange4_d(p: float) -> tuple[float, float, float, float]:
    """Derivatives in ``p`` of :func:`_lagrange4`."""
    d0 = -((p - 2.0) * (p - 3.0) + (p - 1.0) * (p - 3.0) + (p - 1.0) * (p - 2.0)) / 6.0
    d1 = ((p - 2.0) * (p - 3.0) + p * (p - 3.0) + p * (p - 2.0)) / 2.0
    d2 = -((p - 1.0) * (p - 3.0) + p * (p - 3.0) + p * (p - 1.0)) / 2.0
    d3 = ((p - 1.0) * (p - 2.0) + p * (p - 2.0) + p * (p - 1.0)) / 6.0
    return d0, d1, d2, d3


@cached_njit(fastmath=_CONTRACT)
def _zstencil(
    x_lo: float, dx: float, scale: float, npts: int, z: float
) -> tuple[int, float, float, float, float]:
    """Cubic-spline weights in ``x`` at ``z``: ``(j, A, B, C, D)`` for
    ``A y_j + B y_{j+1} + C M_j + D M_{j+1}`` (``M`` = second derivatives; clamped to the grid).
    """
    t = (math.asinh(z / scale) - x_lo) / dx
    if t < 0.0:
        t = 0.0
    elif t > npts - 1.0:
        t = npts - 1.0
    j = math.floor(t)
    if j > npts - 2:
        j = npts - 2
    bb = t - j
    aa = 1.0 - bb
    h6 = dx * dx / 6.0
    return j, aa, bb, (aa * aa * aa - aa) * h6, (bb * bb * bb - bb) * h6


@cached_njit()
def _cheb_t(q: int, nseg: int) -> float:
    """Chebyshev-Lobatto node ``q`` of ``nseg`` on [0, 1]."""
    return 0.5 * (1.0 - math.cos(math.pi * q / (nseg - 1.0)))


@cached_njit(fastmath=_CONTRACT)
def _seg_lagrange(
    row: np.ndarray, off: int, tq: np.ndarray, t: float, deriv: bool
) -> tuple[float, float]:
    """Value and ``t``-derivative (0 unless ``deriv``) of one segment of Chebyshev coefficients.

    ``row[off:off+nseg]`` are the coefficients ``a_j`` of ``sum_j a_j T_j(2t - 1)`` (from the
    values at the Chebyshev-Lobatto points ``tq``, see :func:`_values_to_cheb`).
    """
    nseg = tq.shape[0]
    x = 2.0 * t - 1.0
    if not deriv:
        # Clenshaw recurrence for sum_j a_j T_j(x)
        b1 = 0.0
        b2 = 0.0
        for j in range(nseg - 1, 0, -1):
            b0 = row[off + j] + 2.0 * x * b1 - b2
            b2 = b1
            b1 = b0
        return row[off] + x * b1 - b2, 0.0
    t_prev = 1.0
    t_cur = x
    u_prev = 1.0
    u_cur = 2.0 * x
    v = row[off] + row[off + 1] * x
    dv = row[off + 1]
    for j in range(2, nseg):
        t_next = 2.0 * x * t_cur - t_prev
        v += row[off + j] * t_next
        dv += row[off + j] * j * u_cur
        t_prev = t_cur
        t_cur = t_next
        u_next = 2.0 * x * u_cur - u_prev
        u_prev = u_cur
        u_cur = u_next
    return v, 2.0 * dv


@cached_njit()
def _values_to_cheb(vals: np.ndarray, off: int, nseg: int) -> None:
    """In place: values at ``t_q = (1 - cos(pi q/(N-1)))/2`` -> Chebyshev coefficients in x=2t-1."""
    nm1 = nseg - 1.0
    f = np.empty(nseg)
    for q in range(nseg):
        f[q] = vals[off + q]
    for j in range(nseg):
        acc = 0.0
        for q in range(nseg):
            # x_q = 2 t_q - 1 = -cos(pi q / (N-1)) = cos(pi (N-1-q) / (N-1))
            w = 0.5 if (q == 0 or q == nseg - 1) else 1.0
            acc += w * f[q] * math.cos(math.pi * j * (nseg - 1 - q) / nm1)
        a = 2.0 * acc / nm1
        if j == 0 or j == nseg - 1:
            a *= 0.5
        vals[off + j] = a


#: Number of ``s``-segments of a stored ``phi`` row (breakpoints: ``_NSEG - 1``).
_NSEG = 4


@cached_njit()
def _segment_of(row: np.ndarray, nseg: int, s: float) -> tuple[int, float, float]:
    """Segment index and its ends ``[lo, hi]`` containing ``s`` (``s < 1``)."""
    base = _NSEG * nseg
    lo = 0.0
    for j in range(_NSEG - 1):
        b = row[base + j]
        if b < lo:
            b = lo
        if s < b:
            return j, lo, b
        lo = b
    return _NSEG - 1, lo, 1.0


@cached_njit(fastmath=_CONTRACT)
def _sinterp(row: np.ndarray, s: float, tq: np.ndarray, deriv: bool) -> tuple[float, float]:
    """``phi(s)`` and ``dphi/ds`` (for ``0 <= s < 1``) from a (z-interpolated) stored row.

    ``row`` holds ``_NSEG`` segments of ``nseg`` Chebyshev coefficients, then the sorted
    breakpoints ``b_1 <= b_2 <= b_3``. Segment 0 is ``s = b_1 t`` on ``[0, b_1]``; segment j
    is ``s = b_j + (b_{j+1} - b_j) t^2`` (``b_4 = 1``): the square map absorbs the
    ``(s - b_j)^(3/2)`` singularity where a stop region is born at the next stage.
    """
    nseg = tq.shape[0]
    seg, lo, hi = _segment_of(row, nseg, s)
    w = hi - lo
    if w <= 0.0:
        return 0.0, 0.0
    if seg == 0:
        v, dv = _seg_lagrange(row, 0, tq, s / w, deriv)
        return v, dv / w
    t = math.sqrt((s - lo) / w)
    if t > 1.0:
        t = 1.0
    v, dv = _seg_lagrange(row, seg * nseg, tq, t, deriv)
    tf = t if t > 1e-3 else 1e-3
    return v, dv / (2.0 * tf * w)


@cached_njit(fastmath=_CONTRACT)
def _phi_point(
    phi1: np.ndarray,
    j0: int,
    w0: float,
    w1: float,
    w2: float,
    w3: float,
    s: float,
    tq: np.ndarray,
    buf: np.ndarray,
    deriv: bool,
) -> tuple[float, float]:
    """``phi`` at one point: z-interpolate only the breakpoints and the segment that is used."""
    nseg = tq.shape[0]
    nb = _NSEG * nseg
    ncol = nb + _NSEG - 1
    for col in range(nb, ncol):
        buf[col] = (
            w0 * phi1[j0, col]
            + w1 * phi1[j0 + 1, col]
            + w2 * phi1[j0, ncol + col]
            + w3 * phi1[j0 + 1, ncol + col]
        )
    seg, _, _ = _segment_of(buf, nseg, s)
    off = seg * nseg
    for q in range(nseg):
        col = off + q
        buf[col] = (
            w0 * phi1[j0, col]
            + w1 * phi1[j0 + 1, col]
            + w2 * phi1[j0, ncol + col]
            + w3 * phi1[j0 + 1, ncol + col]
        )
    return _sinterp(buf, s, tq, deriv)


#: Breakpoints above ``_CAP_START`` are capped smoothly below ``_CAP_START + _CAP_WIDTH``.
_CAP_START = 1.1
_CAP_WIDTH = 0.3


@cached_njit()
def _cap(b: float) -> float:
    """Smooth (C^2) cap of a breakpoint: identity up to 1.1, then saturating below 1.4.

    A breakpoint above 1 lies outside the evaluated range ``s < 1``; capping it smoothly keeps
    the segment map a smooth function of ``z`` (a hard clip at 1 would put a kink in ``z``).
    """
    if b <= _CAP_START:
        return b
    return _CAP_START + _CAP_WIDTH * math.tanh((b - _CAP_START) / _CAP_WIDTH)


@cached_njit()
def _seg_s(m: int, nseg: int, bps: np.ndarray) -> float:
    """``s`` of storage column ``m`` for sorted breakpoints ``bps`` (see :func:`_sinterp`)."""
    seg = m // nseg
    t = _cheb_t(m - seg * nseg, nseg)
    lo = 0.0 if seg == 0 else bps[seg - 1]
    hi = 1.0 if seg == _NSEG - 1 else bps[seg]
    if seg == 0:
        return hi * t
    return lo + (hi - lo) * t * t


@cached_njit(fastmath=_CONTRACT)
def _next_psi(
    theta: float,
    z: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    myopic: bool,
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    r1: int,
) -> tuple[float, float, float]:
    """For ``u = su tan(theta)``: ``(u, zhat'(u), psi(u) = sigma'(u) h_{k+1}(zhat'(u)))``."""
    u = su * math.tan(theta)
    sig = lam * math.sqrt(d + u * u)
    zp = z if z > u else u
    zh = (zp - u / nup) / sig
    if myopic:
        hn = myopic_gain(zh, d + 1.0)
    else:
        hn = _row_h(x_lo, dx, scale, zlo, zhi, logh1, m21, r1, d + 1.0, zh)
    return u, zh, sig * hn


@cached_njit()
def _illinois(
    ta: float,
    fa: float,
    tb: float,
    fb: float,
    c: float,
    z: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    myopic: bool,
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    r1: int,
) -> float:
    """Root of ``log(psi(theta)/c)`` in ``[ta, tb]`` (``fa``, ``fb`` of opposite signs)."""
    side = 0
    for _ in range(100):
        if tb - ta <= 1e-14 * (1.0 + abs(ta)):
            break
        if math.isfinite(fa) and math.isfinite(fb) and fa != fb:
            t = (ta * fb - tb * fa) / (fb - fa)
            if not (ta < t < tb):
                t = 0.5 * (ta + tb)
        else:
            t = 0.5 * (ta + tb)
        _, _, ps = _next_psi(
            t, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
        )
        ft = math.log(ps / c) if ps > 0.0 else -math.inf
        if abs(ft) < 1e-10:
            return t
        if (ft > 0.0) == (fa > 0.0):
            ta = t
            fa = ft
            if side == -1:
                fb *= 0.5
            side = -1
        else:
            tb = t
            fb = ft
            if side == 1:
                fa *= 0.5
            side = 1
    return 0.5 * (ta + tb)


@cached_njit(fastmath=_CONTRACT)
def _eval_h(
    c: float,
    g0: float,
    edges: np.ndarray,
    epsi: np.ndarray,
    nw: np.ndarray,
    npsi: np.ndarray,
    pskip: np.ndarray,
    rows: np.ndarray,
    glx: np.ndarray,
    glw: np.ndarray,
    tq: np.ndarray,
    z: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    lcd: float,
    logc: float,
    myopic: bool,
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    phi1: np.ndarray,
    r1: int,
    deriv: bool,
) -> tuple[float, float]:
    """``(H_k(z; c), dH_k/dc)`` by panel quadrature with breakpoints at ``psi(u) = c``."""
    m = glx.shape[0]
    npan = edges.shape[0] - 1
    ns = phi1.shape[1]
    npts = phi1.shape[0]
    tot = g0
    der = 0.0
    tpts = np.empty(m + 2)
    ppts = np.empty(m + 2)
    cross = np.empty(m + 2)
    rowbuf = np.empty(ns)
    for p in range(npan):
        if pskip[p]:
            continue
        base = p * m
        allpos = epsi[p] > c and epsi[p + 1] > c
        anypos = epsi[p] > c or epsi[p + 1] > c
        for q in range(m):
            pos = npsi[base + q] > c
            allpos = allpos and pos
            anypos = anypos or pos
        if allpos:
            for q in range(m):
                ps = npsi[base + q]
                s = c / ps
                if myopic:
                    v = 1.0 - s
                    dv = -1.0
                else:
                    v, dv = _sinterp(rows[base + q], s, tq, deriv)
                tot += nw[base + q] * ps * v
                der += nw[base + q] * dv
            continue
        if not anypos:
            continue
        # panel with stop/continue switches: split it at the roots of psi = c
        ta = edges[p]
        tb = edges[p + 1]
        tpts[0] = ta
        ppts[0] = epsi[p]
        for q in range(m):
            tpts[q + 1] = 0.5 * (ta + tb) + 0.5 * (tb - ta) * glx[q]
            ppts[q + 1] = npsi[base + q]
        tpts[m + 1] = tb
        ppts[m + 1] = epsi[p + 1]
        ncross = 0
        for q in range(m + 1):
            pa = ppts[q] > c
            pb = ppts[q + 1] > c
            if pa != pb:
                fa = math.log(ppts[q]) - logc if ppts[q] > 0.0 else -math.inf
                fb = math.log(ppts[q + 1]) - logc if ppts[q + 1] > 0.0 else -math.inf
                cross[ncross] = _illinois(
                    tpts[q],
                    fa,
                    tpts[q + 1],
                    fb,
                    c,
                    z,
                    d,
                    lam,
                    nup,
                    su,
                    myopic,
                    x_lo,
                    dx,
                    scale,
                    zlo,
                    zhi,
                    logh1,
                    m21,
                    r1,
                )
                ncross += 1
        inside = ppts[0] > c
        start = ta
        for q in range(ncross + 1):
            end = cross[q] if q < ncross else tb
            if inside and end > start:
                half = 0.5 * (end - start)
                mid = 0.5 * (end + start)
                for qq in range(m):
                    th = mid + half * glx[qq]
                    u, zh, ps = _next_psi(
                        th,
                        z,
                        d,
                        lam,
                        nup,
                        su,
                        myopic,
                        x_lo,
                        dx,
                        scale,
                        zlo,
                        zhi,
                        logh1,
                        m21,
                        r1,
                    )
                    if ps <= c:
                        continue
                    cs = math.cos(th)
                    w = glw[qq] * half * su / (cs * cs)
                    w *= math.exp(lcd - 0.5 * (d + 1.0) * math.log1p(u * u / d))
                    s = c / ps
                    if myopic:
                        v = 1.0 - s
                        dv = -1.0
                    else:
                        j0, w0, w1, w2, w3 = _zstencil(x_lo, dx, scale, npts, zh)
                        v, dv = _phi_point(phi1, j0, w0, w1, w2, w3, s, tq, rowbuf, deriv)
                    tot += w * ps * v
                    der += w * dv
            inside = not inside
            start = end
    return tot, der


@cached_njit()
def logdens(u: float, d: float) -> float:
    """``log f_d(u)`` of the standard Student-t density."""
    return t_logpdf_const(d) - 0.5 * (d + 1.0) * math.log1p(u * u / d)


@cached_njit()
def _branch_min(
    left: bool,
    thz: float,
    psi_kink: float,
    nth: np.ndarray,
    npsi: np.ndarray,
    z: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    myopic: bool,
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    r1: int,
) -> float:
    """Minimum of ``psi`` over ``u <= z`` (``left``) or ``u >= z``: golden-section refined."""
    best = psi_kink
    ib = -1
    nn = nth.shape[0]
    for i in range(nn):
        if (nth[i] < thz) == left and nth[i] != thz and npsi[i] < best:
            best = npsi[i]
            ib = i
    if ib < 0:
        return psi_kink
    lo = nth[ib - 1] if ib > 0 else -0.5 * math.pi
    hi = nth[ib + 1] if ib < nn - 1 else 0.5 * math.pi
    if left:
        hi = min(hi, thz)
    else:
        lo = max(lo, thz)
    gr = 0.5 * (math.sqrt(5.0) - 1.0)
    a = lo
    b = hi
    x1 = b - gr * (b - a)
    x2 = a + gr * (b - a)
    _, _, f1 = _next_psi(x1, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1)
    _, _, f2 = _next_psi(x2, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1)
    for _ in range(60):
        if b - a < 1e-13:
            break
        if f1 < f2:
            b = x2
            x2 = x1
            f2 = f1
            x1 = b - gr * (b - a)
            _, _, f1 = _next_psi(
                x1, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
            )
        else:
            a = x1
            x1 = x2
            f1 = f2
            x2 = a + gr * (b - a)
            _, _, f2 = _next_psi(
                x2, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
            )
    return min(best, f1, f2)


@cached_njit()
def _stage_point(
    z: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    myopic: bool,
    base_edges: np.ndarray,
    glx: np.ndarray,
    glw: np.ndarray,
    tq: np.ndarray,
    x_lo: float,
    dx: float,
    scale: float,
    zlo: float,
    zhi: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    phi1: np.ndarray,
    r1: int,
    phi_out: np.ndarray,
) -> float:
    """Solve ``H_k(z; c) = c`` for ``h_k(z)`` and fill ``phi_k(z, s_m)`` into ``phi_out``."""
    m = glx.shape[0]
    phi_out.shape[0]
    npts = phi1.shape[0]
    # the substitution scale grows with |z| so that the kink u = z and the outliers that matter
    # for a large incumbent (|u| of the order of z) stay away from the ends of (-pi/2, pi/2)
    su = max(su, 0.5 * abs(z))
    # panel edges with the breakpoint u = z inserted
    thz = math.atan(z / su)
    nb = base_edges.shape[0]
    edges = np.empty(nb + 1)
    ne = 0
    inserted = False
    for e in range(nb):
        if not inserted and thz < base_edges[e]:
            if e > 0 and thz - base_edges[e - 1] > 1e-12 and base_edges[e] - thz > 1e-12:
                edges[ne] = thz
                ne += 1
            inserted = True
        edges[ne] = base_edges[e]
        ne += 1
    edges = edges[:ne]
    npan = ne - 1
    epsi = np.empty(ne)
    for e in range(ne):
        if e == 0 or e == ne - 1:
            epsi[e] = math.inf
        else:
            _, _, epsi[e] = _next_psi(
                edges[e], z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
            )
    lcd = t_logpdf_const(d)
    nn = npan * m
    nw = np.empty(nn)
    npsi = np.empty(nn)
    nth = np.empty(nn)
    ncol = phi1.shape[1] // 2
    rows = np.empty((nn, ncol))
    for p in range(npan):
        half = 0.5 * (edges[p + 1] - edges[p])
        mid = 0.5 * (edges[p + 1] + edges[p])
        for q in range(m):
            idx = p * m + q
            th = mid + half * glx[q]
            u, zh, ps = _next_psi(
                th, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
            )
            nth[idx] = th
            cs = math.cos(th)
            nw[idx] = (
                glw[q]
                * half
                * su
                / (cs * cs)
                * math.exp(lcd - 0.5 * (d + 1.0) * math.log1p(u * u / d))
            )
            npsi[idx] = ps
            if not myopic:
                j0, w0, w1, w2, w3 = _zstencil(x_lo, dx, scale, npts, zh)
                for mm in range(ncol):
                    rows[idx, mm] = (
                        w0 * phi1[j0, mm]
                        + w1 * phi1[j0 + 1, mm]
                        + w2 * phi1[j0, ncol + mm]
                        + w3 * phi1[j0 + 1, ncol + mm]
                    )
    g0 = myopic_gain(z, d)
    # panels whose largest possible contribution is below 1e-17 G_d(z) (far Student-t tails at
    # large dof) are skipped: phi(z', s) <= phi(z', 0) there
    pskip = np.zeros(npan, dtype=np.bool_)
    for p in range(npan):
        bound = 0.0
        for q in range(m):
            idx = p * m + q
            phi0 = 1.0
            if not myopic:
                phi0, _ = _sinterp(rows[idx], 0.0, tq, False)
                phi0 = max(phi0, 1.0)
            bound += nw[idx] * npsi[idx] * phi0
        pskip[p] = bound < 1e-17 * g0
    # safeguarded Newton on the convex decreasing g(c) = H(z; c) - c, started left of the root
    lo = g0
    hi = math.inf
    c = g0
    for _ in range(200):
        hv, dh = _eval_h(
            c,
            g0,
            edges,
            epsi,
            nw,
            npsi,
            pskip,
            rows,
            glx,
            glw,
            tq,
            z,
            d,
            lam,
            nup,
            su,
            lcd,
            math.log(c),
            myopic,
            x_lo,
            dx,
            scale,
            zlo,
            zhi,
            logh1,
            m21,
            phi1,
            r1,
            True,
        )
        g = hv - c
        if g > 0.0:
            lo = c
        elif g < 0.0:
            hi = c
        else:
            break
        dg = dh - 1.0
        if dg > -1.0:
            dg = -1.0
        cn = c - g / dg
        if not (lo < cn < hi):
            cn = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * lo
        if abs(cn - c) <= 1e-14 * c:
            c = cn
            break
        c = cn
    h = c
    # breakpoints: minima of psi on each branch (u <= z and u >= z), where stop regions of
    # stage k+1 appear as c grows; H_k has (c - c*)^(3/2) singularities there
    _, _, psi_kink = _next_psi(
        thz, z, d, lam, nup, su, myopic, x_lo, dx, scale, zlo, zhi, logh1, m21, r1
    )
    c_left = _branch_min(
        True,
        thz,
        psi_kink,
        nth,
        npsi,
        z,
        d,
        lam,
        nup,
        su,
        myopic,
        x_lo,
        dx,
        scale,
        zlo,
        zhi,
        logh1,
        m21,
        r1,
    )
    c_right = _branch_min(
        False,
        thz,
        psi_kink,
        nth,
        npsi,
        z,
        d,
        lam,
        nup,
        su,
        myopic,
        x_lo,
        dx,
        scale,
        zlo,
        zhi,
        logh1,
        m21,
        r1,
    )
    bps = np.empty(_NSEG - 1)
    bps[0] = _cap(c_left / h)
    bps[1] = _cap(c_right / h)
    bps[2] = _cap(psi_kink / h)
    bps.sort()
    nseg = tq.shape[0]
    s_prev = -1.0
    v_prev = 0.0
    for mm in range(_NSEG * nseg):
        sm = _seg_s(mm, nseg, bps)
        if sm == s_prev:
            v = v_prev
        else:
            cm = sm * h
            lc = math.log(cm) if cm > 0.0 else -math.inf
            hv, _ = _eval_h(
                cm,
                g0,
                edges,
                epsi,
                nw,
                npsi,
                pskip,
                rows,
                glx,
                glw,
                tq,
                z,
                d,
                lam,
                nup,
                su,
                lcd,
                lc,
                myopic,
                x_lo,
                dx,
                scale,
                zlo,
                zhi,
                logh1,
                m21,
                phi1,
                r1,
                False,
            )
            v = (hv - cm) / h
        phi_out[mm] = v
        s_prev = sm
        v_prev = v
    for seg in range(_NSEG):
        _values_to_cheb(phi_out, seg * nseg, nseg)
    for j in range(_NSEG - 1):
        phi_out[_NSEG * nseg + j] = bps[j]
    return h


@cached_njit(parallel=True)
def _stage(
    zs: np.ndarray,
    zlo: float,
    zhi: float,
    d: float,
    lam: float,
    nup: float,
    su: float,
    myopic: bool,
    base_edges: np.ndarray,
    glx: np.ndarray,
    glw: np.ndarray,
    tq: np.ndarray,
    x_lo: float,
    dx: float,
    scale: float,
    logh1: np.ndarray,
    m21: np.ndarray,
    phi1: np.ndarray,
    r1: int,
    logh_out: np.ndarray,
    phi_out: np.ndarray,
) -> None:
    """One step of the recursion: row ``k`` (dof ``d``) from row ``k+1`` at every point ``zs``.

    ``zlo``, ``zhi`` are the ends of the grid that carries row ``k+1``.
    """
    npts = zs.shape[0]
    for i in prange(npts):
        h = _stage_point(
            zs[i],
            d,
            lam,
            nup,
            su,
            myopic,
            base_edges,
            glx,
            glw,
            tq,
            x_lo,
            dx,
            scale,
            zlo,
            zhi,
            logh1,
            m21,
            phi1,
            r1,
            phi_out[i],
        )
        logh_out[i] = math.log(h)


@cached_njit()
def _myopic_row(zs: np.ndarray, d: float) -> np.ndarray:
    """``log G_d(z)`` at every point ``zs`` (the last row, ``k = n - 1``)."""
    out = np.empty(zs.shape[0])
    for i in range(zs.shape[0]):
        out[i] = math.log(myopic_gain(zs[i], d))
    return out


@cached_njit()
def _phi_splines(phi: np.ndarray, ns: int, dx: float) -> None:
    """In place: column ``ns + j`` of ``phi`` := the spline second derivatives of column ``j``.

    For ``0 <= j < ns``, in ``x`` with step ``dx`` (see :func:`spline_m2`).
    """
    npts = phi.shape[0]
    for col in range(ns):
        mcol = spline_m2(np.ascontiguousarray(phi[:, col]), dx)
        for i in range(npts):
            phi[i, ns + col] = mcol[i]


def phi_layout(nseg: int) -> tuple[np.ndarray, int]:
    """Chebyshev-Lobatto nodes ``tq`` of a segment and the number ``ns`` of stored phi columns.

    A stored phi row holds ``_NSEG`` segments of ``nseg`` coefficients, then the ``_NSEG - 1``
    breakpoints (see :func:`_sinterp`); the arrays given to :func:`_stage` have ``2 ns``
    columns (the second half: spline second derivatives in ``x``).
    """
    tq = np.array([_cheb_t(q, nseg) for q in range(nseg)], dtype=np.float64)
    return tq, _NSEG * nseg + _NSEG - 1


def build_rows(
    n: int,
    alpha0: float,
    nu0: float,
    k_min: int,
    x_lo: float,
    dx: float,
    scale: float,
    zs: np.ndarray,
    nseg: int,
    su: float,
    base_edges: np.ndarray,
    glx: np.ndarray,
    glw: np.ndarray,
    zx: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All rows ``k_min <= k < n``: ``(log h, spline second derivatives, log h at zx)``.

    The first two have shape (rows, grid); the third holds every row evaluated by the same
    recursion (from the grid's representation of row k+1) at the extra points ``zx`` (may be
    empty) - the builder "evaluated off the grid", used to measure interpolation errors.

    This driver is plain Python on purpose: a cached jitted function that calls the parallel
    :func:`_stage` can be loaded from numba's disk cache without numba's parallel runtime being
    started, and then calls a null pointer (numba issue 8578; it happens once the cache holds
    ``_stage`` compiled in an earlier process than its caller, e.g. after a first compile was
    interrupted). Called from Python, ``_stage``'s own dispatcher starts the runtime. The
    Python overhead is one call per row.
    """
    npts = zs.shape[0]
    nrows = n - k_min
    logh = np.empty((nrows, npts))
    m2 = np.empty((nrows, npts))
    d_last = 2.0 * alpha0 + (n - 1)
    r_last = nrows - 1
    logh[r_last] = _myopic_row(zs, d_last)
    m2[r_last] = spline_m2(logh[r_last], dx)
    # the row n-1 is never interpolated (the row n-2 uses the closed form phi = 1 - s)
    tq, ns = phi_layout(nseg)
    # columns ns .. 2 ns - 1 hold the cubic-spline second derivatives in x of columns 0 .. ns-1
    phi_a = np.zeros((npts, 2 * ns))
    phi_b = np.zeros((npts, 2 * ns))
    loghx = np.empty((nrows, zx.shape[0]))
    phi_x = np.zeros((zx.shape[0], 2 * ns))
    loghx[r_last] = _myopic_row(zx, d_last)
    for k in range(n - 2, k_min - 1, -1):
        r = k - k_min
        d = 2.0 * alpha0 + k
        nup = nu0 + k + 1.0
        lam = math.sqrt((1.0 - 1.0 / (nup * nup)) / (d + 1.0))
        myopic = k == n - 2
        stage_args = (
            d,
            lam,
            nup,
            su,
            myopic,
            base_edges,
            glx,
            glw,
            tq,
            x_lo,
            dx,
            scale,
            logh,
            m2,
            phi_a,
            r + 1,
        )
        if zx.shape[0] > 0:
            rowx = np.empty(zx.shape[0])
            _stage(zx, zs[0], zs[npts - 1], *stage_args, rowx, phi_x)
            loghx[r] = rowx
        row = np.empty(npts)
        _stage(zs, zs[0], zs[npts - 1], *stage_args, row, phi_b)
        logh[r] = row
        m2[r] = spline_m2(row, dx)
        _phi_splines(phi_b, ns, dx)
        phi_a, phi_b = phi_b, phi_a
    return logh, m2, loghx
