"""Shape properties of h_{n,k} (paper Theorem h_properties) and the lookup API."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beacon.errors import ConfigError
from beacon.index import HTable, get_table, h_index
from beacon.index.build import k_min_for

HORIZONS = [4, 8, 16, 32]


@st.composite
def row_and_points(draw: st.DrawFn) -> tuple[HTable, int, float, float]:
    n = draw(st.sampled_from(HORIZONS))
    t = get_table(n)
    k = draw(st.integers(min_value=t.k_min, max_value=n - 1))
    zlo, zhi = t.z_range
    z = draw(st.floats(min_value=zlo, max_value=zhi - 0.2))
    gap = draw(st.floats(min_value=0.05, max_value=min(3.0, zhi - z)))
    return t, k, z, gap


@settings(max_examples=200, deadline=None)
@given(row_and_points())
def test_positive_strictly_decreasing_convex(args: tuple[HTable, int, float, float]) -> None:
    t, k, z, gap = args
    a, b, c = t.h(k, z), t.h(k, z + gap / 2), t.h(k, z + gap)
    assert a > b > c > 0.0
    # midpoint convexity (slack: the table's relative accuracy on the nearly linear left part)
    assert b <= 0.5 * (a + c) + 1e-7 * a


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HORIZONS), st.floats(min_value=-1.0, max_value=6.0))
def test_increasing_in_remaining_budget(n: int, z: float) -> None:
    """h_{n,k}(z) grows with n - k: compare h_{n,k} with h_{2n,k} (same state, more budget).

    Far from the horizon the extra budget is worth little (h_{32,k} and h_{64,k} differ by less
    than 1e-5 for k >= 7 at z = 0), so there the check allows the deep rows' accuracy (a few
    1e-5); near the horizon the gap is large and must show.
    """
    small, big = get_table(n), get_table(2 * n)
    assert z >= small.z_range[0]  # inside the grid (left of it both follow the myopic bound)
    for k in range(small.k_min, n):
        assert big.h(k, z) >= small.h(k, z) * (1 - 5e-5)
        if k >= n - 3:
            assert big.h(k, z) > small.h(k, z)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(HORIZONS),
    st.floats(min_value=-2.0, max_value=5.0),
    st.floats(min_value=1e-4, max_value=10.0),
    st.floats(min_value=1e-4, max_value=10.0),
    st.floats(min_value=1e-3, max_value=10.0),
)
def test_stop_decision_monotone_in_cost(n: int, z: float, c1: float, c2: float, sig: float) -> None:
    t = get_table(n)
    lo, hi = sorted((c1, c2))
    for k in range(t.k_min, n):
        h = t.h(k, z)
        stop_lo = h <= lo / sig
        stop_hi = h <= hi / sig
        assert stop_hi or not stop_lo


def test_tends_to_zero_and_tails() -> None:
    t = get_table(16)
    zlo, zhi = t.z_range
    for k in (3, 9, 15):
        d = 2 * t.alpha0 + k
        far = [t.h(k, zhi * f) for f in (1.0, 2.0, 10.0, 1e3)]
        assert all(x > y > 0 for x, y in itertools.pairwise(far))
        # power tail h ~ C z^(1-d) beyond the grid
        assert far[2] / far[1] == pytest.approx(5.0 ** (1 - d), rel=1e-12)
        # left asymptote: h(z) + z -> 0+ (continuing gains the distance to the mean)
        for z in (zlo * 1.5, zlo * 10, -1e6):
            v = t.h(k, z)
            assert v >= -z
            assert v + z <= t.h(k, zlo) + zlo + 1e-12
        # continuity at both grid ends
        assert t.h(k, zhi * (1 + 1e-12)) == pytest.approx(t.h(k, zhi), rel=1e-9)
        assert t.h(k, zlo * (1 + 1e-12)) == pytest.approx(t.h(k, zlo), rel=1e-9)


def test_far_tails_stay_finite_and_exact() -> None:
    """Beyond |z| = 1e9 the myopic gain switches to its asymptotics; h never turns NaN.

    Reference for the right tail, from scipy's log-gamma and nothing of the kernel:
    ``G_d(z) = z^2 f_d(z) / (d (d - 1)) (1 + O(d / z^2))``, ``f_d`` the Student-t density.
    """
    from scipy.special import gammaln

    from beacon._kernels.tables import myopic_gain

    def far_right(z: float, d: float) -> float:
        logc = gammaln((d + 1) / 2) - gammaln(d / 2) - 0.5 * math.log(d * math.pi)
        logf = logc - (d + 1) / 2 * (2 * math.log(z) - math.log(d))
        return math.exp(logf + 2 * math.log(z) - math.log(d * (d - 1)))

    for d in (1.5, 2.0, 4.0, 15.0):
        for z in (2e9, 1e12, 1e20, 1e60):
            want = far_right(z, d)
            if want > 1e-290:
                assert myopic_gain(z, d) == pytest.approx(want, rel=1e-12)
        # the closed form just inside the switch agrees with the asymptotics just outside it
        inside, outside = myopic_gain(0.999999e9, d), myopic_gain(1.000001e9, d)
        assert outside == pytest.approx(inside * (0.999999 / 1.000001) ** (d - 1), rel=1e-9)
        for z in (-1e12, -1e200, -1.7e308):
            assert myopic_gain(z, d) == -z
        assert myopic_gain(-math.inf, d) == math.inf
        assert myopic_gain(math.inf, d) == 1e-300
    for n in (8, 32):
        t = get_table(n)
        for k in (t.k_min, n - 1):
            # squares of these z overflow; h(z) + z -> 0+ on the left, h -> 0 on the right
            left = t.h(k, np.array([-1e155, -1e300, -math.inf]))
            assert list(left) == [1e155, 1e300, math.inf]
            right = t.h(k, np.array([1e155, 1e300, math.inf]))
            assert np.all(right >= 0) and np.all(np.isfinite(right))
            assert t.h(k, -1e200) == 1e200 and t.h(k, math.inf) == 0.0


def test_scalar_array_and_njit_lookup_agree() -> None:
    from beacon._kernels.tables import h_lookup

    t = get_table(32)
    zs = np.linspace(-8.0, 20.0, 301)
    for k in (3, 10, 31):
        arr = t.h(k, zs)
        assert isinstance(arr, np.ndarray) and arr.shape == zs.shape
        for z, a in zip(zs, arr, strict=True):
            s = t.h(k, float(z))
            assert isinstance(s, float)
            assert s == a == h_lookup(*t.lookup_arrays(), k, float(z))
    assert t.h(5, np.array([[0.1, 0.2], [0.3, 0.4]])).shape == (2, 2)
    assert h_index(32, 5, 0.7) == t.h(5, 0.7)


def test_errors_name_the_field() -> None:
    t = get_table(8)
    for bad in (2, 8, 100, -1):
        with pytest.raises(ValueError, match=rf"k={bad}"):
            t.h(bad, 0.0)
    with pytest.raises(ConfigError, match="z"):
        t.h(3, math.nan)
    with pytest.raises(ConfigError, match="z"):
        t.h(3, np.array([0.0, np.nan]))
    for bad_z in ("0.5", b"1", True, 1 + 2j, None, object()):
        with pytest.raises(ConfigError, match=r"invalid z=.*must be a real number"):
            t.h(3, bad_z)
    for bad_arr, what in (
        ([1 + 2j], "complex128"),
        (["0.5"], "<U3"),
        ([None, 1.0], "object"),
        (np.array([True]), "bool"),
    ):
        with pytest.raises(ConfigError, match=f"invalid z='array of dtype {what}'"):
            t.h(3, bad_arr)
    with pytest.raises(ConfigError, match="invalid z='ragged sequence'"):
        t.h(3, [[0.0], [0.0, 1.0]])
    assert t.h(3, np.array([1, 2], dtype=np.int32)).tolist() == t.h(3, [1.0, 2.0]).tolist()
    with pytest.raises(ConfigError, match="alpha0"):
        get_table(8, alpha0=-1.0)
    with pytest.raises(ConfigError, match="nu0"):
        get_table(8, nu0=-0.5)
    with pytest.raises(ConfigError, match="n=3"):
        get_table(3)
    with pytest.raises(ConfigError, match="n="):
        get_table(8.5)  # type: ignore[arg-type]


def test_top_level_h_index_takes_an_nig_prior_only() -> None:
    import beacon
    from beacon.priors import BetaPrior, NIGPrior

    prior = NIGPrior(mu0=0.3, nu0=1.0, alpha0=2.0, beta0=1.5)
    assert beacon.h_index(8, 1, 0.5, prior) == get_table(8, 2.0, 1.0).h(1, 0.5)
    assert beacon.h_index(8, 3, 0.5) == get_table(8).h(3, 0.5)
    for bad in (BetaPrior(), "jeffreys", {"alpha0": 2.0}):
        with pytest.raises(ConfigError, match=r"invalid prior=.*NIGPrior") as ei:
            beacon.h_index(8, 3, 0.5, bad)  # type: ignore[arg-type]
        assert ei.value.field == "prior"


def test_k_min_matches_prior_table() -> None:
    assert k_min_for(-0.5, 0.0) == 3  # Jeffreys, k0 = 3
    assert k_min_for(0.0, 1.0) == 2  # 2 alpha0 in (-1, 0]: k0 = 2
    assert k_min_for(0.25, 1.0) == 1  # 2 alpha0 in (0, 1]: k0 = 1
    assert k_min_for(2.0, 1.0) == 1  # proper prior: k0 = 0 -> first row k = 1
    t = get_table(8)
    assert (t.n, t.alpha0, t.nu0, t.k_min) == (8, -0.5, 0.0, 3)


def test_proper_prior_table() -> None:
    t = get_table(6, alpha0=1.5, nu0=2.0)
    assert t.k_min == 1
    zs = np.linspace(-3, 6, 50)
    for k in range(1, 6):
        h = t.h(k, zs)
        assert np.all(h > 0) and np.all(np.diff(h) < 0)
        assert np.all(np.diff(h, 2) > -1e-9)


def test_import_does_not_load_numba() -> None:
    code = "import sys, beacon.index; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_int_z_beyond_the_float_range_is_an_infinite_z() -> None:
    # float(10**400) raises OverflowError; as a standardized reward it is +-inf
    t = get_table(8)
    assert t.h(3, 10**400) == t.h(3, math.inf) == 0.0
    assert t.h(3, -(10**400)) == t.h(3, -math.inf) == math.inf
    assert h_index(8, 3, 10**400) == 0.0
