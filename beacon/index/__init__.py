"""h-index tables ``h_{n,k}(zhat)`` of the Normal–Inverse-Gamma model.

``get_table(n, alpha0, nu0)`` returns an :class:`HTable` (memoised, disk-cached, shipped for
the Jeffreys prior and n in {4, 8, 12, 16, 24, 32, 48, 64} with the precise recipe, otherwise
built by the Bellman recursion of the paper's eq:compute_h_index with the errata in
docs/h_index.md ("The recursion"), with the standard recipe unless ``precise=True``; see
:class:`Recipe`).
Importing this package does not import numba; the first lookup or build does.
"""

from __future__ import annotations

from typing import Any

from beacon.index.build import PRECISE, STANDARD, Recipe
from beacon.index.cache import get_table
from beacon.index.table import HTable

__all__ = ["PRECISE", "STANDARD", "HTable", "Recipe", "get_table", "h_index"]


def h_index(n: int, k: int, z: Any, alpha0: float = -0.5, nu0: float = 0.0) -> Any:
    """``h_{n,k}(z)`` for the prior ``(alpha0, nu0)``; ``z`` a float or an array."""
    return get_table(n, alpha0, nu0).h(k, z)
