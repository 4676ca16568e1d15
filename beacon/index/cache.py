"""Where tables come from: in-process memo, disk cache, shipped package data, else a build.

Disk cache: ``$BEACON_CACHE_DIR`` if set, else ``~/.cache/beacon``; one ``.npz`` per
``(format version, n, alpha0, nu0)``. Writes go to a temporary file in the same directory and
are published with :func:`os.replace`, which is atomic, so two processes building the same
table at once both end with a complete file (the last rename wins; both contents are equal).
Files are read with ``allow_pickle=False``; an unreadable or stale file is rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import warnings
from pathlib import Path

from beacon.index.build import FORMAT_VERSION, build_table, validate_table_args
from beacon.index.table import HTable

__all__ = ["cache_dir", "clear_memory_cache", "get_table", "shipped_path", "table_filename"]

_MEMO: dict[tuple[int, float, float], HTable] = {}
_LOCK = threading.Lock()
_DATA_DIR = Path(__file__).resolve().parent / "data"


def cache_dir() -> Path:
    """The disk cache directory (``$BEACON_CACHE_DIR`` or ``~/.cache/beacon``)."""
    env = os.environ.get("BEACON_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "beacon"


def table_filename(n: int, alpha0: float, nu0: float) -> str:
    """File name of a table: format version, horizon and the prior (exact float repr)."""
    return f"htable-v{FORMAT_VERSION}-n{n}-alpha0_{float(alpha0)!r}-nu0_{float(nu0)!r}.npz"


def shipped_path(n: int, alpha0: float, nu0: float) -> Path:
    """Path the shipped table for ``(n, alpha0, nu0)`` would have in the package data."""
    return _DATA_DIR / table_filename(n, alpha0, nu0)


def _try_load(path: Path, n: int, alpha0: float, nu0: float) -> HTable | None:
    if not path.is_file():
        return None
    try:
        t = HTable.from_npz(path)
    except (OSError, ValueError, KeyError):
        return None
    if (t.n, t.alpha0, t.nu0) != (n, alpha0, nu0):
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


def get_table(n: int, alpha0: float = -0.5, nu0: float = 0.0) -> HTable:
    """The table ``h_{n,k}`` for prior ``(alpha0, nu0)``: memo, disk cache, shipped, else build.

    A freshly built table is written to the disk cache; an unwritable cache only warns.
    """
    n, alpha0, nu0 = validate_table_args(n, alpha0, nu0)
    key = (n, alpha0, nu0)
    t = _MEMO.get(key)
    if t is not None:
        return t
    with _LOCK:
        t = _MEMO.get(key)
        if t is not None:
            return t
        cached = cache_dir() / table_filename(n, alpha0, nu0)
        t = _try_load(cached, n, alpha0, nu0)
        if t is None:
            t = _try_load(shipped_path(n, alpha0, nu0), n, alpha0, nu0)
        if t is None:
            t = build_table(n, alpha0, nu0)
            try:
                save_atomic(t, cached)
            except OSError as exc:
                warnings.warn(
                    f"could not write h-index table cache {cached}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _MEMO[key] = t
        return t


def clear_memory_cache() -> None:
    """Forget the in-process memo (the disk cache is untouched)."""
    with _LOCK:
        _MEMO.clear()
