"""The precise recipe of the shipped tables: every row self-converged to 1e-6 relative.

The shipped Jeffreys tables are built with :data:`beacon.index.build.PRECISE` (grid step a
quarter of the standard one, 48 panels of order 14, 64 Chebyshev cost levels per segment).
Here the shipped n = 8 table is compared, at every grid node with ``zhat <= 4`` and on every
row, with builds that refine each knob of the recipe separately - the cost representation and
the quadrature together, then the grid step - evaluated by the recursion itself at the shipped
nodes (so the comparison carries no interpolation error). Independent references are in
tests/test_index_reference.py (scipy, rows n-1 .. n-3) and tests/test_index_allrows.py (every
row, 1e-6); docs/h_index.md gives the same study for n = 16, 32.
"""

from __future__ import annotations

import numpy as np
import pytest

from beacon.index import cache as cache_mod
from beacon.index.build import (
    PRECISE,
    QuadratureSpec,
    Recipe,
    build_table_with_points,
    choose_grid,
)
from beacon.index.table import HTable

N = 8
REFINED = {
    "cost levels and quadrature": Recipe(
        "refined-quad", PRECISE.dx, QuadratureSpec(order=16, panels=64, nseg=96)
    ),
    "grid step": Recipe("refined-grid", PRECISE.dx / 2.0, PRECISE.quad),
}


@pytest.mark.slow
def test_precise_build_reproduces_the_shipped_file_and_interpolates() -> None:
    shipped = HTable.from_npz(cache_mod.shipped_path(N, -0.5, 0.0))
    g = choose_grid(N, -0.5, 0.0, dx=PRECISE.dx)
    mids = g.scale * np.sinh(g.x_lo + g.dx * (np.arange(g.npts - 1) + 0.5))
    fresh, exact = build_table_with_points(N, -0.5, 0.0, mids, recipe=PRECISE)
    assert fresh.recipe == PRECISE
    np.testing.assert_allclose(fresh.logh, shipped.logh, rtol=0, atol=1e-12)
    # between the nodes: the cubic spline of log h against the recursion evaluated there
    worst = 0.0
    for k in range(shipped.k_min, N):
        worst = max(worst, float(np.max(np.abs(shipped.h(k, mids) / exact[k - 3] - 1.0))))
    print(f"n={N} precise: interpolation error {worst:.1e}")
    assert worst < 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("knob", sorted(REFINED))
def test_shipped_table_is_self_converged(knob: str) -> None:
    shipped = HTable.from_npz(cache_mod.shipped_path(N, -0.5, 0.0))
    assert shipped.recipe == PRECISE
    nodes = shipped.z[shipped.z <= 4.0]
    _, refined = build_table_with_points(N, -0.5, 0.0, nodes, recipe=REFINED[knob])
    worst = 0.0
    for k in range(shipped.k_min, N):
        ours = shipped.grid_values(k)[: nodes.size]
        worst = max(worst, float(np.max(np.abs(ours / refined[k - shipped.k_min] - 1.0))))
    print(f"n={N} {knob}: max relative change {worst:.1e}")
    assert worst <= 1e-6, (knob, worst)
