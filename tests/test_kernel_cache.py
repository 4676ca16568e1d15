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


def _run(env: dict[str, str], code: str = CALL_A_KERNEL) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (the exit code must be 0)."""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
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


# Compile and cache only the parallel recursion step ``_stage``, as a first build does before it
# is interrupted (Ctrl-C during the first compile): the cache then holds ``_stage`` from an
# earlier process than anything that calls it.
CACHE_STAGE_ONLY = """
import numpy as np
from beacon._kernels import load_tables
from beacon.index.build import STANDARD, choose_grid
kern = load_tables()
q = STANDARD.quad
g = choose_grid(8, -0.5, 0.0, dx=STANDARD.dx)
zs = g.nodes()
npts = zs.shape[0]
tq, ns = kern.phi_layout(q.nseg)
glx, glw = q.gauss_legendre()
logh = np.zeros((5, npts))
m2 = np.zeros((5, npts))
row = np.empty(npts)
kern._stage(zs, zs[0], zs[-1], 5.0, 0.3, 7.0, q.su, True, q.edges(), glx, glw, tq, g.x_lo,
            g.dx, g.scale, logh, m2, np.zeros((npts, 2 * ns)), 4, row, np.zeros((npts, 2 * ns)))
assert np.isfinite(row).all()
"""

BUILD_A_TABLE = """
from beacon.index.build import build_table
t = build_table(8)
print(float(t.logh.sum()).hex())
"""


def test_a_build_loads_kernels_cached_piecemeal(tmp_path: Path) -> None:
    # numba issue 8578: a cached jitted caller of a parallel function, compiled while that
    # function came from the disk cache, is later loaded without numba's parallel runtime and
    # calls a null pointer (the process dies with SIGSEGV). The table driver is plain Python.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    _run(env, CACHE_STAGE_ONLY)
    assert any(n.startswith("tables._stage-") for n in _index_files(tmp_path / "numba"))
    first = _run(env, BUILD_A_TABLE)  # compiles the rest against the cached _stage
    assert _run(env, BUILD_A_TABLE) == first  # everything from the cache
