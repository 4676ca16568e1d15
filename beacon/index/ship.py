"""Regenerate the tables shipped in ``beacon/index/data`` (Jeffreys prior, precise recipe).

Run ``python -m beacon.index.ship`` after changing the recipe or the format version (it takes
about 25 minutes on 2 cores, most of it for n = 48 and 64). Old files of other format versions
are removed from the data directory.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from beacon.index.build import FORMAT_VERSION, PRECISE, build_table
from beacon.index.cache import save_atomic, shipped_path

__all__ = ["SHIPPED_HORIZONS", "main"]

#: Horizons of the shipped Jeffreys tables.
SHIPPED_HORIZONS = (4, 8, 12, 16, 24, 32, 48, 64)


def main(argv: list[str] | None = None) -> None:
    """Build and write the shipped tables; print the time each took."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizons", type=int, nargs="*", default=list(SHIPPED_HORIZONS))
    args = parser.parse_args(argv)
    data_dir = shipped_path(4, -0.5, 0.0).parent
    for old in data_dir.glob("htable-v*.npz"):
        if not old.name.startswith(f"htable-v{FORMAT_VERSION}-"):
            old.unlink()
    for n in args.horizons:
        t0 = time.perf_counter()
        table = build_table(n, -0.5, 0.0, recipe=PRECISE)
        path: Path = shipped_path(n, -0.5, 0.0)
        save_atomic(table, path)
        print(f"n={n}: {time.perf_counter() - t0:.1f} s -> {path.name}", flush=True)


if __name__ == "__main__":
    main()
