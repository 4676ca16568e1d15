"""h-index tables ``h_{n,k}(zhat)`` of the Normal–Inverse-Gamma model.

``get_table(n, alpha0, nu0)`` returns an :class:`HTable` (memoised, disk-cached, shipped for
the Jeffreys prior and n in {4, 8, 12, 16, 24, 32, 48, 64} with the precise recipe, otherwise
built by the Bellman recursion of the paper's eq:compute_h_index with the errata in
docs/h_index.md ("The recursion"), with the standard recipe unless ``precise=True``; see
:class:`Recipe`).
Importing this package does not import numba; the first lookup or build does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from beacon.index.build import PRECISE, STANDARD, Recipe
from beacon.index.cache import get_table
from beacon.index.table import HTable

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["PRECISE", "STANDARD", "HTable", "Recipe", "get_table", "h_index"]


@overload
def h_index(n: int, k: int, z: float, alpha0: float = -0.5, nu0: float = 0.0) -> float: ...


@overload
def h_index(
    n: int, k: int, z: npt.NDArray[Any] | Sequence[Any], alpha0: float = -0.5, nu0: float = 0.0
) -> npt.NDArray[np.float64]: ...


def h_index(
    n: int,
    k: int,
    z: float | npt.NDArray[Any] | Sequence[Any],
    alpha0: float = -0.5,
    nu0: float = 0.0,
) -> float | npt.NDArray[np.float64]:
    """``h_{n,k}(z)`` for the prior ``(alpha0, nu0)``; ``z`` a float gives a float, an array (or
    a nested sequence) gives a float64 array of its shape."""
    return get_table(n, alpha0, nu0).h(k, z)
