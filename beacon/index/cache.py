"""Where tables come from: in-process memo, disk cache, shipped package data, else a build.

Lookup order (:func:`table_sources`): a precise table in the disk cache, the shipped table
(precise recipe, Jeffreys prior), a standard table in the disk cache; otherwise a build with the
standard recipe (or the precise one when asked), written to the cache.

Disk cache: ``$BEACON_CACHE_DIR`` if set, else ``~/.cache/beacon``; one ``.npz`` per
``(format version, n, alpha0, nu0, recipe)``. Writes go to a temporary file in the same directory
and are published with :func:`os.replace`, which is atomic, so two processes building the same
table at once both end with a complete file (the last rename wins; both contents are equal).
Files are read with ``allow_pickle=False``; an unreadable or stale file is rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from beacon.index.build import (
    FORMAT_VERSION,
    PRECISE,
    STANDARD,
    Recipe,
    build_table,
    validate_table_args,
)
from beacon.index.table import HTable

__all__ = [
    "TableFound",
    "cache_dir",
    "clear_memory_cache",
    "find_table",
    "get_table",
    "shipped_path",
    "table_filename",
    "table_sources",
]

_MEMO: dict[tuple[int, float, float], TableFound] = {}
_LOCK = threading.Lock()
_DATA_DIR = Path(__file__).resolve().parent / "data"


def cache_dir() -> Path:
    """The disk cache directory (``$BEACON_CACHE_DIR`` or ``~/.cache/beacon``)."""
    env = os.environ.get("BEACON_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "beacon"


def table_filename(n: int, alpha0: float, nu0: float, *, precise: bool = False) -> str:
    """File name of a table: format version, horizon, the prior (exact float repr), recipe."""
    tag = "-precise" if precise else ""
    # + 0.0 turns -0.0 into 0.0: the same prior (it compares equal) must name the same file
    a, nu = float(alpha0) + 0.0, float(nu0) + 0.0
    return f"htable-v{FORMAT_VERSION}-n{n}-alpha0_{a!r}-nu0_{nu!r}{tag}.npz"


def shipped_path(n: int, alpha0: float, nu0: float) -> Path:
    """Path the shipped table for ``(n, alpha0, nu0)`` would have (shipped tables are precise)."""
    return _DATA_DIR / table_filename(n, alpha0, nu0, precise=True)


def table_sources(
    n: int, alpha0: float, nu0: float, *, precise: bool = False
) -> list[tuple[str, Path, Recipe]]:
    """Where :func:`get_table` looks, in order: ``(description, path, recipe it must hold)``.

    With ``precise=True`` only precise tables qualify (the standard cache file is skipped).
    """
    here = cache_dir()
    sources = [
        (
            "precise, from the disk cache",
            here / table_filename(n, alpha0, nu0, precise=True),
            PRECISE,
        ),
        ("precise, shipped with the package", shipped_path(n, alpha0, nu0), PRECISE),
    ]
    if not precise:
        sources.append(
            ("standard, from the disk cache", here / table_filename(n, alpha0, nu0), STANDARD)
        )
    return sources


def _try_load(path: Path, n: int, alpha0: float, nu0: float, recipe: Recipe) -> HTable | None:
    """The table in ``path`` if it is readable, for ``(n, alpha0, nu0)`` and built by ``recipe``.

    A cache directory that cannot be searched (no permission, a name too long) is no table
    here, as an unwritable one is: the table is then built, and only writing it warns.
    """
    try:
        if not path.is_file():  # raises for EACCES or ENAMETOOLONG, not for a missing file
            return None
        t = HTable.from_npz(path)
    except (OSError, ValueError, KeyError):
        return None
    if (t.n, t.alpha0, t.nu0, t.recipe) != (n, alpha0, nu0, recipe):
        return None
    return t


def save_atomic(table: HTable, path: Path) -> None:
    """Write ``table`` to ``path`` through a temporary file and :func:`os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            table.to_npz(fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True, slots=True)
class TableFound:
    """A table and where :func:`find_table` got it: ``source`` as in :func:`table_sources`
    (or ``"<recipe>, built and cached"``) and the file it lives in (after a build, the cache file
    it was written to, which is missing if the cache was not writable)."""

    table: HTable
    source: str
    path: Path


def _serves(found: TableFound, precise: bool) -> bool:
    """Whether a memoised table answers a request (a precise request needs a precise table)."""
    return found.table.recipe == PRECISE or not precise


def find_table(
    n: int, alpha0: float = -0.5, nu0: float = 0.0, *, precise: bool = False
) -> TableFound:
    """The table ``h_{n,k}`` for prior ``(alpha0, nu0)`` and where it came from.

    Memo, then the files of :func:`table_sources` in order (any precise table is preferred);
    when none is found, the table is built with the standard recipe (under 1 s for n = 32 on 2
    cores), or with the precise one if ``precise`` (about 4 minutes; docs/h_index.md), and
    written to the disk cache; an unwritable cache only warns.
    """
    n, alpha0, nu0 = validate_table_args(n, alpha0, nu0)
    # nu0 = -0.0 (a prior read from JSON, a product with a negative zero) is the prior nu0 = 0:
    # without this it missed the shipped file, and which table a process used for both (the
    # memo's key treats them as one) depended on which was asked for first
    alpha0, nu0 = alpha0 + 0.0, nu0 + 0.0
    key = (n, alpha0, nu0)
    found = _MEMO.get(key)
    if found is not None and _serves(found, precise):
        return found
    with _LOCK:
        found = _MEMO.get(key)
        if found is not None and _serves(found, precise):
            return found  # another thread got it while this one waited for the lock
        found = None
        for source, path, recipe in table_sources(n, alpha0, nu0, precise=precise):
            t = _try_load(path, n, alpha0, nu0, recipe)
            if t is not None:
                found = TableFound(t, source, path)
                break
        if found is None:
            recipe = PRECISE if precise else STANDARD
            t = build_table(n, alpha0, nu0, recipe=recipe)
            cached = cache_dir() / table_filename(n, alpha0, nu0, precise=precise)
            try:
                save_atomic(t, cached)
            except OSError as exc:
                warnings.warn(
                    f"could not write h-index table cache {cached}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            found = TableFound(t, f"{recipe.name}, built and cached", cached)
        _MEMO[key] = found
        return found


def get_table(n: int, alpha0: float = -0.5, nu0: float = 0.0, *, precise: bool = False) -> HTable:
    """The table ``h_{n,k}`` for prior ``(alpha0, nu0)``: memo, disk cache, shipped, else build
    (:func:`find_table`)."""
    return find_table(n, alpha0, nu0, precise=precise).table


def clear_memory_cache() -> None:
    """Forget the in-process memo (the disk cache is untouched)."""
    with _LOCK:
        _MEMO.clear()
