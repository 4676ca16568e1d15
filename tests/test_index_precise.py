"""The precise recipe of the shipped tables: the shipped files are what the code builds.

The shipped Jeffreys tables are built with :data:`beacon.index.build.PRECISE` (grid step a
quarter of the standard one, 48 panels of order 14, 64 Chebyshev cost levels per segment).
Here a fresh precise build of n = 8 must reproduce the shipped file to 1e-12 and interpolate
between its nodes to 2e-5. Their accuracy is checked against independent references in
tests/test_index_reference.py (scipy, rows n-1 .. n-3) and tests/test_index_allrows.py (every
row, 1e-6); the self-convergence study of the recipe (minutes per horizon, so not in CI) is
``python -m bench.table_convergence`` (docs/h_index.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from beacon.index import cache as cache_mod
from beacon.index.build import PRECISE, build_table_with_points, choose_grid
from beacon.index.table import HTable

N = 8


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
