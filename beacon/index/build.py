"""Building h-index tables by the Bellman recursion (appendix "Computation of the h-index").

The recursion itself (eq:compute_h_index with the errata in docs/h_index.md, "The recursion":
predictive with ``2 alpha0 + k`` degrees of freedom, continuation term ``max(0, H_{n,k+1} -
c/sigma_u)``, scale factor ``sqrt((1 - 1/(nu0+k+1)^2) / (2 alpha0 + k + 1))`` of eq.
parameter_update) runs in :mod:`beacon._kernels.tables`; this module chooses the grid and the
quadrature, validates the prior and wraps the result in an :class:`~beacon.index.table.HTable`.

Grid (see :func:`choose_grid` and docs/h_index.md): nodes ``z_i = a sinh(x_i)`` with ``x``
uniform, ``a = GRID_SCALE``, step ``Recipe.dx`` in ``x``.

Two recipes (grid step and quadrature, :class:`Recipe`): :data:`STANDARD` for tables built on
demand (any prior; under 1 s for n = 32 on 2 cores, deep rows good to ~3e-4 relative) and
:data:`PRECISE` for the shipped Jeffreys tables and ``beacon table --precise`` (about 300 times
slower, 228 s for n = 32; every row within 1e-6 of independent references, docs/h_index.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from beacon.errors import ConfigError

if TYPE_CHECKING:
    from beacon.index.table import HTable

__all__ = [
    "FORMAT_VERSION",
    "GRID_DX",
    "GRID_SCALE",
    "MAX_ALPHA0",
    "MAX_HORIZON",
    "PRECISE",
    "STANDARD",
    "GridSpec",
    "QuadratureSpec",
    "Recipe",
    "build_table",
    "build_table_with_points",
    "choose_grid",
    "k_min_for",
    "validate_table_args",
]

#: Version of the table format and of the numerical recipe; bumping it invalidates caches.
FORMAT_VERSION = 4
#: Step of the uniform grid in ``x = asinh(z / GRID_SCALE)`` (standard recipe).
GRID_DX = 0.015
#: Scale ``a`` of the map ``z = a sinh(x)``.
GRID_SCALE = 2.0
#: Largest horizon accepted (standard recipe: about 4 s for n = 128 on 2 cores, bench_tables).
MAX_HORIZON = 1024
# Beyond ~1e4 pseudo-observations of the variance the quadrature's Student-t terms underflow; a
# prior that sure of the scale is a known-variance model, so the tables stop at this bound.
MAX_ALPHA0 = 1000.0


@dataclass(frozen=True, slots=True)
class QuadratureSpec:
    """Quadrature of the recursion: ``u = s tan(theta)``, Gauss-Legendre panels in theta.

    ``s = max(su, |zhat| / 2)`` per grid point (the kernels widen the map for a large
    incumbent, whose relevant outliers have ``|u|`` of the order of ``zhat``).

    ``panels`` uniform panels on ``(-pi/2, pi/2)``; each end panel is further split
    ``graded`` times geometrically (ratio ``ratio``) towards the endpoint; ``order`` nodes per
    panel; ``nseg`` Chebyshev nodes per segment of ``s = c / h`` for the carried continuation
    excess ``phi`` (four segments split where stop regions of the next stage are born, see
    :mod:`beacon._kernels.tables`).
    """

    order: int = 12
    panels: int = 32
    graded: int = 3
    ratio: float = 0.2
    su: float = 1.5
    nseg: int = 8

    def edges(self) -> np.ndarray:
        """Base panel edges in theta (without the per-point breakpoint at ``u = zhat``)."""
        half = math.pi / 2.0
        width = math.pi / self.panels
        e = list(np.linspace(-half, half, self.panels + 1))
        for j in range(1, self.graded + 1):
            e.append(-half + width * self.ratio**j)
            e.append(half - width * self.ratio**j)
        return np.array(sorted(e), dtype=np.float64)

    def gauss_legendre(self) -> tuple[np.ndarray, np.ndarray]:
        """Gauss-Legendre nodes and weights on [-1, 1]."""
        x, w = np.polynomial.legendre.leggauss(self.order)
        return np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(w, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Recipe:
    """The numerical recipe of a build: grid step ``dx`` in ``x`` and the quadrature.

    Stored in every table file (``recipe``: ``dx, order, panels, graded, ratio, su, nseg``) so
    that a table says how it was computed; :meth:`as_array` / :meth:`from_array` convert.
    """

    name: str
    dx: float
    quad: QuadratureSpec

    def as_array(self) -> np.ndarray:
        """``[dx, order, panels, graded, ratio, su, nseg]`` as float64."""
        q = self.quad
        return np.array(
            [self.dx, q.order, q.panels, q.graded, q.ratio, q.su, q.nseg], dtype=np.float64
        )

    @classmethod
    def from_array(cls, a: npt.ArrayLike) -> Recipe:
        """Inverse of :meth:`as_array`; the name is that of a preset with these numbers, if any."""
        v = [float(x) for x in np.asarray(a, dtype=np.float64).reshape(-1)]
        if len(v) != 7:
            raise ConfigError("recipe", v, "expected dx, order, panels, graded, ratio, su, nseg")
        quad = QuadratureSpec(
            order=int(v[1]),
            panels=int(v[2]),
            graded=int(v[3]),
            ratio=v[4],
            su=v[5],
            nseg=int(v[6]),
        )
        for preset in (STANDARD, PRECISE):
            if preset.dx == v[0] and preset.quad == quad:
                return preset
        return cls("custom", v[0], quad)


#: Tables built on demand: ``nseg = 8`` cost levels per segment, 20 panels of order 8 with one
#: graded panel per end. The cost representation limits these tables to ~3e-4 on deep rows; the
#: quadrature's own share is ~1e-5. The earlier 16 panels of order 12 with three graded panels
#: per end took 1.3 times as long and were no closer to the precise tables on deep rows
#: (docs/h_index.md, "Quadrature of the standard recipe").
STANDARD = Recipe("standard", GRID_DX, QuadratureSpec(order=8, panels=20, graded=1))
#: Shipped tables and ``beacon table --precise``: grid step / 4, 48 panels of order 14 and
#: ``nseg = 64``; every row within 1e-6 of the independent references (docs/h_index.md,
#: tests/test_index_allrows.py, tests/test_index_precise.py).
PRECISE = Recipe("precise", GRID_DX / 4.0, QuadratureSpec(order=14, panels=48, nseg=64))


@dataclass(frozen=True, slots=True)
class GridSpec:
    """Grid ``z_i = scale * sinh(x_lo + i dx)``, ``i = 0 .. npts - 1``."""

    x_lo: float
    dx: float
    scale: float
    npts: int

    def nodes(self) -> np.ndarray:
        """The grid nodes ``z_i``."""
        return self.scale * np.sinh(self.x_lo + self.dx * np.arange(self.npts, dtype=np.float64))


def validate_table_args(n: object, alpha0: object, nu0: object) -> tuple[int, float, float]:
    """Check ``(n, alpha0, nu0)``; return them normalized or raise :class:`ConfigError`."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise ConfigError("n", n, "the horizon must be an integer")
    for name, v in (("alpha0", alpha0), ("nu0", nu0)):
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            raise ConfigError(name, v, "must be a real number")
        if not math.isfinite(float(v)):
            raise ConfigError(name, v, "must be finite")
    a = float(alpha0)  # type: ignore[arg-type]
    nu = float(nu0)  # type: ignore[arg-type]
    if nu < 0.0:
        raise ConfigError("nu0", nu0, "must be >= 0")
    if a < -0.5:
        raise ConfigError("alpha0", alpha0, "must be >= -1/2 (Jeffreys)")
    if a > MAX_ALPHA0:
        raise ConfigError("alpha0", alpha0, f"must be <= {MAX_ALPHA0:g} (h-index tables' range)")
    n_int = int(n)
    kmin = k_min_for(a, nu)
    if n_int < kmin + 1:
        raise ConfigError("n", n, f"the horizon must be >= k_min + 1 = {kmin + 1} for this prior")
    if n_int > MAX_HORIZON:
        raise ConfigError("n", n, f"the horizon must be <= {MAX_HORIZON}")
    return n_int, a, nu


def k_min_for(alpha0: float, nu0: float) -> int:
    """First tabulated row: the least ``k >= 1`` whose predictive dof ``2 alpha0 + k`` is > 1.

    This is ``max(k0, 1)`` of the paper's Table table_k0 (Jeffreys: 3), or one row earlier for
    the configurations whose ``k0`` is set by ``beta0`` (the table does not depend on
    ``beta0``); every tabulated row has a finite predictive mean (``d_k > 1``).
    """
    k = 1
    while 2.0 * alpha0 + k <= 1.0:
        k += 1
    return k


def choose_grid(n: int, alpha0: float, nu0: float, dx: float = GRID_DX) -> GridSpec:
    """Grid for horizon ``n`` (see module docstring and docs/h_index.md).

    ``z_lo``: for ``nu0 = 0`` every reachable state has ``zhat >= 0`` (the best reward is at
    least the posterior mean, which is the sample mean) and ``[z_lo, inf)`` is closed under the
    update for any ``z_lo <= 0``, so ``z_lo = -1``; for ``nu0 > 0`` one update from any state
    lands above ``-sqrt(d + 1)``, so ``z_lo = -(sqrt(d_max + 1) + 1)``. ``z_hi = sqrt(n) + 6``
    (the Jeffreys reachable bound is ``(k - 1)/sqrt(k + 1) < sqrt(n)``), lowered where the
    Student-t density of the largest dof would come near underflow.
    """
    d_max = 2.0 * alpha0 + n - 1
    z_lo = -1.0 if nu0 == 0.0 else -(math.sqrt(d_max + 1.0) + 1.0)
    z_hi = math.sqrt(n) + 6.0
    # keep f_d(z_hi) far from underflow: (d+1)/2 log1p(z^2/d) <= 600 for the largest d
    lim = math.sqrt(d_max * math.expm1(1200.0 / (d_max + 1.0)))
    z_hi = min(z_hi, lim)
    x_lo = math.asinh(z_lo / GRID_SCALE)
    x_hi = math.asinh(z_hi / GRID_SCALE)
    npts = math.ceil((x_hi - x_lo) / dx) + 1
    return GridSpec(x_lo, (x_hi - x_lo) / (npts - 1), GRID_SCALE, npts)


def build_table(
    n: int,
    alpha0: float = -0.5,
    nu0: float = 0.0,
    *,
    recipe: Recipe = STANDARD,
    grid: GridSpec | None = None,
    quad: QuadratureSpec | None = None,
) -> HTable:
    """Build ``h_{n,k}`` for ``k_min <= k < n`` by the recursion (no caching).

    ``recipe`` sets the grid step and the quadrature; ``grid`` / ``quad`` override either part
    (the table then records a ``custom`` recipe).
    """
    table, _ = build_table_with_points(
        n, alpha0, nu0, np.empty(0), recipe=recipe, grid=grid, quad=quad
    )
    return table


def build_table_with_points(
    n: int,
    alpha0: float,
    nu0: float,
    points: npt.ArrayLike,
    *,
    recipe: Recipe = STANDARD,
    grid: GridSpec | None = None,
    quad: QuadratureSpec | None = None,
) -> tuple[HTable, npt.NDArray[np.float64]]:
    """Build the table and also ``h_{n,k}(points)`` computed by the recursion itself.

    Row ``k`` at the extra points is solved from the grid representation of row ``k+1``, exactly
    as at the grid nodes, so comparing it with the table's spline measures the interpolation
    error alone. Returns ``(table, h)`` with ``h`` of shape ``(n - k_min, len(points))``.
    """
    from beacon._kernels import load_tables
    from beacon.index.table import HTable

    n, alpha0, nu0 = validate_table_args(n, alpha0, nu0)
    kmin = k_min_for(alpha0, nu0)
    g = grid or choose_grid(n, alpha0, nu0, dx=recipe.dx)
    q = quad or recipe.quad
    used = recipe if grid is None and quad is None else Recipe("custom", g.dx, q)
    kern = load_tables()
    zs = g.nodes()
    zx = np.ascontiguousarray(np.asarray(points, dtype=np.float64).reshape(-1))
    glx, glw = q.gauss_legendre()
    logh, m2, loghx = kern.build_rows(
        n, alpha0, nu0, kmin, g.x_lo, g.dx, g.scale, zs, q.nseg, q.su, q.edges(), glx, glw, zx
    )
    dof = 2.0 * alpha0 + np.arange(kmin, n, dtype=np.float64)
    table = HTable(
        n=n,
        alpha0=alpha0,
        nu0=nu0,
        k_min=kmin,
        x_lo=g.x_lo,
        dx=g.dx,
        scale=g.scale,
        z=zs,
        logh=np.ascontiguousarray(logh),
        m2=np.ascontiguousarray(m2),
        dof=dof,
        recipe=used,
    )
    return table, np.exp(loghx)
