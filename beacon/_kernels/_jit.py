"""``cached_njit``: numba's ``njit(cache=True)`` with the compiled code kept in the user's cache.

numba's default writes ``__pycache__/*.nbi`` and ``*.nbc`` next to the source, i.e. into the
installed package. pip does not record those files, so ``pip uninstall`` (and the uninstall
step of ``pip install -e .`` over a regular install) leaves ``site-packages/beacon/`` behind as a
directory without ``__init__.py``: a namespace package that shadows the editable install, and
``import beacon`` fails outside the checkout. BEACON's kernels are therefore cached in
``~/.cache/beacon/numba`` (not under ``$BEACON_CACHE_DIR``, which holds the h-index tables and is
often pointed at scratch directories that should not cost a recompile).

``NUMBA_CACHE_DIR``, when set, keeps numba's own meaning; an unwritable directory makes numba fall
back to its default locations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from numba import njit
from numba.core import config

__all__ = ["cached_njit", "kernel_cache_dir"]

F = TypeVar("F", bound=Callable[..., Any])


def kernel_cache_dir() -> Path:
    """Where BEACON's compiled kernels are cached unless ``NUMBA_CACHE_DIR`` is set."""
    return Path.home() / ".cache" / "beacon" / "numba"


def cached_njit(**options: Any) -> Callable[[F], F]:
    """``njit(cache=True, **options)`` whose cache lives in :func:`kernel_cache_dir`.

    numba picks a function's cache location when it is decorated, so ``config.CACHE_DIR`` is set
    only for that moment: other numba code in the process keeps numba's defaults.
    """

    def decorate(fn: F) -> F:
        user_dir = config.CACHE_DIR  # type: ignore[attr-defined]
        try:
            ours = user_dir or str(kernel_cache_dir())
        except RuntimeError:  # no home directory: numba's default locations
            ours = ""
        config.CACHE_DIR = ours  # type: ignore[attr-defined]
        try:
            return njit(cache=True, **options)(fn)  # type: ignore[no-any-return]
        finally:
            config.CACHE_DIR = user_dir  # type: ignore[attr-defined]

    return decorate
