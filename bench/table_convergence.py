"""Self-convergence of the precise recipe of the shipped tables (a study, not a CI test).

Run: ``python -m bench.table_convergence [--horizons 8 16]`` (about 5 minutes for n = 8 on 2
cores, tens of minutes for n = 32). For each horizon the shipped Jeffreys table (precise recipe)
is compared, at every grid node with ``zhat <= 4`` and on every row, with builds that refine one
part of the recipe at a time - the cost representation and the quadrature together (``nseg``
96, 64 panels of order 16), then the grid step (halved) - each evaluated by the recursion itself
at the shipped nodes, so the comparison carries no interpolation error. The baseline of each
figure is the shipped table, read in the same run. Independent references (scipy, and a numpy
recursion over every row) are in tests/test_index_reference.py and tests/test_index_allrows.py;
docs/h_index.md reports the figures.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from beacon.index import cache as cache_mod
from beacon.index.build import PRECISE, QuadratureSpec, Recipe, build_table_with_points
from beacon.index.table import HTable

#: The refinements of the study, one knob group at a time.
REFINED = {
    "cost levels and quadrature": Recipe(
        "refined-quad", PRECISE.dx, QuadratureSpec(order=16, panels=64, nseg=96)
    ),
    "grid step": Recipe("refined-grid", PRECISE.dx / 2.0, PRECISE.quad),
}


def largest_change(n: int, recipe: Recipe) -> float:
    """Largest ``|shipped / refined - 1|`` over every row at the shipped nodes ``zhat <= 4``."""
    shipped = HTable.from_npz(cache_mod.shipped_path(n, -0.5, 0.0))
    nodes = shipped.z[shipped.z <= 4.0]
    _, refined = build_table_with_points(n, -0.5, 0.0, nodes, recipe=recipe)
    worst = 0.0
    for k in range(shipped.k_min, n):
        ours = shipped.grid_values(k)[: nodes.size]
        worst = max(worst, float(np.max(np.abs(ours / refined[k - shipped.k_min] - 1.0))))
    return worst


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--horizons", type=int, nargs="*", default=[8])
    args = ap.parse_args(argv)
    for n in args.horizons:
        for knob, recipe in REFINED.items():
            t0 = time.perf_counter()
            worst = largest_change(n, recipe)
            print(
                f"n={n:<3d} refined {knob:28s}: shipped table moves by at most {worst:.1e} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
