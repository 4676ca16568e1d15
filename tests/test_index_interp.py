"""Between grid points: the cubic spline of log h must stay within 1e-4 relative.

The reference is the builder evaluated off the grid: at the midpoints of the grid (where the
spline error is largest) every row is solved by the same recursion from the grid's
representation of the next row, so the difference is the interpolation error alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from beacon.index.build import build_table_with_points, choose_grid


@pytest.mark.parametrize("n", [8, 16, 32])
def test_midpoints_against_builder(n: int) -> None:
    g = choose_grid(n, -0.5, 0.0)
    mids = g.scale * np.sinh(g.x_lo + g.dx * (np.arange(g.npts - 1) + 0.5))
    t, exact = build_table_with_points(n, -0.5, 0.0, mids)
    worst = 0.0
    for k in range(t.k_min, n):
        approx = t.h(k, mids)
        worst = max(worst, float(np.max(np.abs(approx / exact[k - t.k_min] - 1))))
    assert worst < 1e-4
