"""Where numba caches BEACON's compiled kernels (beacon._kernels._jit).

Not next to the source: files pip did not install outlive ``pip uninstall`` and turn
``site-packages/beacon`` into a namespace package that shadows a later editable install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CALL_A_KERNEL = (
    "from beacon._kernels.tables import myopic_gain\n"
    "import numba.core.config as c\n"
    "assert myopic_gain(1.0, 3.0) > 0\n"
    "print(repr(c.CACHE_DIR))\n"
)


def _run(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CALL_A_KERNEL], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _index_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.nbi"))


def test_kernels_are_cached_in_the_user_cache_not_the_package(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["HOME"] = str(tmp_path)
    # numba's own setting is back to unset once the kernels are defined (other code unaffected)
    assert _run(env) == "''"
    cached = _index_files(tmp_path / ".cache" / "beacon" / "numba")
    assert any(name.startswith("tables.myopic_gain-") for name in cached), cached


def test_numba_cache_dir_keeps_its_meaning(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path / "home"), NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    assert _run(env) == repr(str(tmp_path / "numba"))
    assert any(n.startswith("tables.myopic_gain-") for n in _index_files(tmp_path / "numba"))
    assert not (tmp_path / "home" / ".cache" / "beacon" / "numba").exists()
