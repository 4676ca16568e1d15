"""Numba kernels of BEACON.

Only the modules of this package import :mod:`numba`; ``import beacon`` never does. Import a
kernel module through :func:`load_tables` (or directly, ``import beacon._kernels.tables``) at
the point of use so that the JIT compiler is loaded only when a table is built or looked up.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["load_tables"]


def load_tables() -> ModuleType:
    """Import and return :mod:`beacon._kernels.tables` (this imports numba)."""
    return importlib.import_module("beacon._kernels.tables")
