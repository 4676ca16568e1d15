"""Benchmark of the h-index tables: compile, build (n = 32, 128) and lookup, with baselines.

Run: ``python -m bench.bench_tables`` (add ``--quick`` to skip n = 128, ``--precise`` to also
time the precise recipe of the shipped tables, about 2 minutes). Every figure is printed beside a
baseline measured in the same run:

* build: the slow reference of the tests (scipy ``quad`` + ``brentq`` per grid point) timed on
  a few points of the row ``n - 2`` (the cheapest row for it: the next stage is closed form) and
  scaled to the whole table (grid points x rows); deeper rows need nested quadrature and cost
  that reference far more, so the ratio is a lower bound;
* lookup: ``scipy.interpolate.CubicSpline`` on the same ``log h`` grid values, per scalar call.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

COMPILE_SNIPPET = """
import time
t0 = time.perf_counter()
from beacon.index.build import build_table
build_table(5)
t1 = time.perf_counter()
build_table(5)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _compile_times() -> tuple[float, float]:
    """(cold: fresh numba cache dir, compile + tiny build; warm process: cache load + build)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp)
        out = subprocess.run(
            [sys.executable, "-c", COMPILE_SNIPPET],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        cold = float(out[0]) - float(out[1])
        out = subprocess.run(
            [sys.executable, "-c", COMPILE_SNIPPET],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        cached = float(out[0]) - float(out[1])
    return cold, cached


def _scipy_point_seconds(n: int, points: int = 3) -> float:
    """Seconds per grid point of row n-2 with the scipy quad/brentq reference."""
    from scipy import integrate, optimize, special

    alpha0, nu0 = -0.5, 0.0
    k = n - 2
    d = 2 * alpha0 + k
    nup = nu0 + k + 1
    lam = math.sqrt((1 - 1 / nup**2) / (d + 1))

    def pdf(u: float, dd: float) -> float:
        return math.exp(
            special.gammaln((dd + 1) / 2)
            - special.gammaln(dd / 2)
            - 0.5 * math.log(dd * math.pi)
            - (dd + 1) / 2 * math.log1p(u * u / dd)
        )

    def myo(z: float, dd: float) -> float:
        return (dd + z * z) / (dd - 1) * pdf(z, dd) - z * special.stdtr(dd, -z)

    def big_h(z: float, c: float) -> float:
        def g(u: float) -> float:
            sig = lam * math.sqrt(d + u * u)
            zh = (max(z, u) - u / nup) / sig
            return max(0.0, sig * myo(zh, d + 1) - c) * pdf(u, d)

        a, _ = integrate.quad(g, -np.inf, z, epsrel=1e-12, epsabs=0, limit=400)
        b, _ = integrate.quad(g, z, np.inf, epsrel=1e-12, epsabs=0, limit=400)
        return myo(z, d) + a + b

    zs = np.linspace(-1.0, 3.0, points)
    t0 = time.perf_counter()
    for z in zs:
        lo = myo(float(z), d)
        optimize.brentq(lambda c, z=float(z): big_h(z, c) - c, lo, big_h(float(z), lo), rtol=1e-12)
    return (time.perf_counter() - t0) / points


def _build_seconds(n: int, repeat: int, precise: bool = False, threads: int = 0) -> float:
    """Best of ``repeat`` builds (standard recipe unless ``precise``; ``threads`` 0 = all)."""
    import numba

    from beacon.index.build import PRECISE, STANDARD, build_table

    before = numba.get_num_threads()
    if threads:
        numba.set_num_threads(threads)
    try:
        best = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            build_table(n, recipe=PRECISE if precise else STANDARD)
            best = min(best, time.perf_counter() - t0)
    finally:
        numba.set_num_threads(before)
    return best


def _lookup(n: int) -> tuple[float, float, float]:
    from scipy.interpolate import CubicSpline

    from beacon._kernels.tables import h_lookup
    from beacon.index import get_table

    t = get_table(n)
    zs = np.random.default_rng(0).uniform(0.0, 4.0, 20_000)
    arrays = t.lookup_arrays()
    h_lookup(*arrays, 5, 0.5)
    t0 = time.perf_counter()
    for z in zs:
        t.h(5, float(z))
    ours = (time.perf_counter() - t0) / zs.size
    t0 = time.perf_counter()
    for z in zs:
        h_lookup(*arrays, 5, float(z))
    njit_py = (time.perf_counter() - t0) / zs.size
    spline = CubicSpline(np.arcsinh(t.z / t.scale), t.logh[5 - t.k_min])
    t0 = time.perf_counter()
    for z in zs:
        math.exp(float(spline(math.asinh(float(z) / t.scale))))
    base = (time.perf_counter() - t0) / zs.size
    return ours, njit_py, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="skip n = 128")
    ap.add_argument("--precise", action="store_true", help="also time the precise recipe")
    args = ap.parse_args()
    import numba

    from beacon.index.build import choose_grid, k_min_for

    print(f"numba {numba.__version__}, threads {numba.get_num_threads()}, cpus {os.cpu_count()}")
    cold, cached = _compile_times()
    print(f"compile (fresh numba cache, first call)   {cold:8.2f} s")
    print(f"load compiled kernels (numba disk cache)  {cached:8.2f} s")
    for n, repeat in ((32, 3), (128, 1)):
        if args.quick and n == 128:
            continue
        ours = _build_seconds(n, repeat)
        per_point = _scipy_point_seconds(n)
        g = choose_grid(n, -0.5, 0.0)
        rows = n - k_min_for(-0.5, 0.0) - 1
        base = per_point * g.npts * rows
        print(
            f"build n={n:<4d} ours {ours:8.3f} s | scipy quad reference (row n-2 rate x "
            f"{g.npts} points x {rows} rows) {base:9.0f} s | ratio {base / ours:9.0f}x"
        )
    if numba.get_num_threads() > 1:
        one = _build_seconds(32, 2, threads=1)
        alln = _build_seconds(32, 2)
        print(
            f"build n=32   1 thread {one:8.3f} s | {numba.get_num_threads()} threads {alln:8.3f} s"
            f" | parallel speed-up {one / alln:5.2f}x"
        )
    if args.precise:
        prec = _build_seconds(32, 1, precise=True)
        std = _build_seconds(32, 1)
        print(
            f"build n=32   precise recipe {prec:8.1f} s | standard recipe {std:8.3f} s | "
            f"ratio {prec / std:5.1f}x"
        )
    ours, njit_py, base = _lookup(32)
    print(
        f"lookup HTable.h scalar {ours * 1e6:6.2f} us | h_lookup from Python "
        f"{njit_py * 1e6:6.2f} us | scipy CubicSpline {base * 1e6:6.2f} us | ratio "
        f"{base / ours:5.1f}x"
    )


if __name__ == "__main__":
    main()
