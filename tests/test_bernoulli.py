"""Bernoulli–Beta family: exact reservation cost and the absorbing success."""

import itertools
import math
from fractions import Fraction
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beacon
from beacon import BeaconConfig, BetaPrior, Draw, RewardError, Stop, Stopper


def _value_by_backward_induction(t: int, a: float, b: float, c: float) -> float:
    """Independent reference: the Bellman value V with t draws left and no success yet
    (eq. bellman-bernoulli), enumerated over (successes, failures) without the R_t shortcut."""

    @cache
    def v(left: int, s: int, f: int) -> float:
        # value of being free to continue with `left` draws and s successes observed
        if s > 0:
            return 1.0
        if left == 0:
            return 0.0
        q = (a + s) / (a + s + b + f)
        cont = q * v(left - 1, s + 1, f) + (1 - q) * v(left - 1, s, f + 1) - c
        return max(0.0, cont)

    return v(t, 0, 0)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 40),
    k_frac=st.floats(0, 0.99),
    a=st.floats(0.05, 5),
    b=st.floats(0.05, 20),
)
def test_reservation_cost_is_the_indifference_cost(
    n: int, k_frac: float, a: float, b: float
) -> None:
    k = min(n - 1, int(k_frac * n))
    h = beacon.reservation_cost(n, k, a, b)
    assert 0.0 < h < 1.0
    t = n - k
    # continuing has positive value just below h and none just above (Theorem thm:bernoulli_policy)
    assert _value_by_backward_induction(t, a, b, h * (1 - 1e-9)) > 0.0
    assert _value_by_backward_induction(t, a, b, h * (1 + 1e-9) + 1e-15) == 0.0


def test_last_step_reservation_is_the_success_probability() -> None:
    # one draw left: continue iff c < q = a / (a + b)
    assert beacon.reservation_cost(5, 4, 2.0, 3.0) == pytest.approx(0.4, abs=1e-15)


@given(a=st.floats(0.1, 5), b=st.floats(0.1, 10), n=st.integers(3, 30))
def test_reservation_cost_increases_with_remaining_budget(a: float, b: float, n: int) -> None:
    hs = [beacon.reservation_cost(n, k, a, b) for k in range(n)]
    assert all(x >= y - 1e-15 for x, y in itertools.pairwise(hs))


def test_reservation_cost_bad_input() -> None:
    with pytest.raises(beacon.ConfigError, match="k"):
        beacon.reservation_cost(5, 5, 1, 1)
    with pytest.raises(beacon.ConfigError, match="b"):
        beacon.reservation_cost(5, 1, 1, 0)


def test_success_absorbs() -> None:
    s = Stopper(BeaconConfig(family="bernoulli", cost=0.01, horizon=10))
    assert s.next_decision() == Draw(1)
    s.observe(0)
    assert s.next_decision() == Draw(1)
    s.observe(1)
    assert s.next_decision() == Stop("absorbed")
    assert s.best_index == 1
    assert s.state.a == 2.0 and s.state.b == 2.0


def test_failures_until_the_reservation_cost_drops_below_c() -> None:
    cfg = BeaconConfig(family="bernoulli", cost=0.2, horizon=50, prior=BetaPrior(1, 1))
    s = Stopper(cfg)
    k = 0
    while isinstance(s.next_decision(), Draw):
        s.observe(0)
        k += 1
    # it stops at the first k where c >= h^B_{n,k}(1, 1 + k)
    expected = next(j for j in range(1, 50) if beacon.reservation_cost(50, j, 1.0, 1.0 + j) <= 0.2)
    assert k == expected
    assert s.stopped == Stop("index")


@pytest.mark.parametrize("bad", [0.5, 2, -1, math.nan])
def test_rewards_must_be_binary(bad: float) -> None:
    s = Stopper(BeaconConfig(family="bernoulli"))
    s.next_decision()
    with pytest.raises(RewardError) as exc:
        s.observe(bad)
    assert exc.value.position == 0


@pytest.mark.parametrize(
    ("a", "b", "field"),
    [
        (None, 1, "a"),
        ("1", 1, "a"),
        (True, 1, "a"),
        (1, [1], "b"),
        (10**400, 1, "a"),
        (1, 1 + 0j, "b"),
        (1, -(10**400), "b"),
    ],
)
def test_reservation_cost_refuses_non_numbers_with_a_config_error(
    a: object, b: object, field: str
) -> None:
    with pytest.raises(beacon.ConfigError) as exc:
        beacon.reservation_cost(8, 0, a, b)  # type: ignore[arg-type]
    assert exc.value.field == field


# --- exact reference: brute-force dynamic programming with rationals ----------------------------


def _exact_reservation_cost(t: int, a: Fraction, b: Fraction) -> Fraction:
    """h^B with t draws left from Beta(a, b) and no success yet, in exact rationals.

    Brute force over the whole Beta-Bernoulli tree of (successes, failures), no R_t recursion
    and no bisection: V(left, s, f; c) = max(z, q V(left-1, s+1, f) + (1-q) V(left-1, s, f+1)
    - c) with z = 1 after a success, else 0. Each node also returns dV/dc of the policy it
    picks, so g(c) = (value of drawing now) - (value of stopping, 0) is handled as the convex,
    decreasing, piecewise-linear function it is: Newton's steps from c = 0 are the roots of its
    supporting lines and reach the root exactly after finitely many steps.
    """

    def solve(c: Fraction) -> tuple[Fraction, Fraction]:
        @cache
        def v(left: int, s: int, f: int) -> tuple[Fraction, Fraction]:
            z = Fraction(1 if s > 0 else 0)
            if left == 0:
                return z, Fraction(0)
            q = (a + s) / (a + s + b + f)
            v1, d1 = v(left - 1, s + 1, f)
            v0, d0 = v(left - 1, s, f + 1)
            cont, dcont = q * v1 + (1 - q) * v0 - c, q * d1 + (1 - q) * d0 - 1
            return (cont, dcont) if cont > z else (z, Fraction(0))

        q = a / (a + b)
        v1, d1 = v(t - 1, 1, 0)
        v0, d0 = v(t - 1, 0, 1)
        return q * v1 + (1 - q) * v0 - c, q * d1 + (1 - q) * d0 - 1

    c = Fraction(0)
    for _ in range(4 * t + 10):
        g, dg = solve(c)
        if g == 0:
            return c
        assert g > 0 and dg < 0
        c -= g / dg
    raise AssertionError("Newton on a piecewise-linear convex function must terminate")


def test_exact_reference_on_a_hand_case() -> None:
    # t = 1: q = a / (a + b). t = 2, Beta(1, 1): "draw once" is worth 1/2 - c, "draw up to
    # twice" 1/2 + 1/2 (1/3 - c) - c = 2/3 - 3c/2; their larger root is 1/2
    assert _exact_reservation_cost(1, Fraction(2), Fraction(3)) == Fraction(2, 5)
    assert _exact_reservation_cost(2, Fraction(1), Fraction(1)) == Fraction(1, 2)
    # t = 3, Beta(1, 3): q = 1/4, 1/5, 1/6; the lines P_m - c E_m of "draw up to m times" are
    # 1/4 - c, 2/5 - 7c/4, 1/2 - 23c/10; the largest root is 1/4
    assert _exact_reservation_cost(3, Fraction(1), Fraction(3)) == Fraction(1, 4)
    # Beta(3, 1), t = 3: q = 3/4, 3/5; lines 3/4 - c, 9/10 - 5c/4; roots 3/4 and 18/25
    assert _exact_reservation_cost(3, Fraction(3), Fraction(1)) == Fraction(3, 4)
    assert beacon.reservation_cost(2, 0, 1.0, 1.0) == pytest.approx(0.5, rel=1e-14)


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(1, 10),
    k_frac=st.floats(0, 0.99),
    a=st.fractions(Fraction(1, 16), 5, max_denominator=16),
    b=st.fractions(Fraction(1, 16), 20, max_denominator=16),
)
def test_reservation_cost_equals_exact_rational_dp(
    n: int, k_frac: float, a: Fraction, b: Fraction
) -> None:
    k = min(n - 1, int(k_frac * n))
    af, bf = float(a), float(b)
    exact = _exact_reservation_cost(n - k, Fraction(af), Fraction(bf))  # exactly the floats
    got = beacon.reservation_cost(n, k, af, bf)
    assert got == pytest.approx(float(exact), rel=1e-13, abs=1e-16)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(2, 9),
    a0=st.fractions(Fraction(1, 4), 3, max_denominator=8),
    b0=st.fractions(Fraction(1, 4), 6, max_denominator=8),
    frac=st.floats(0.02, 1.2),
    rewards=st.lists(st.sampled_from([0, 0, 0, 1]), min_size=9, max_size=9),
    batch=st.integers(1, 3),
)
def test_stopper_follows_the_exact_policy(
    n: int, a0: Fraction, b0: Fraction, frac: float, rewards: list[int], batch: int
) -> None:
    """Beta(a0, b0) update; a success absorbs; otherwise draw iff c < h^B_{n,k} (exact)."""
    af, bf = float(a0), float(b0)
    cost = frac * float(_exact_reservation_cost(n - 1, Fraction(af), Fraction(bf) + 1))
    cfg = BeaconConfig(
        family="bernoulli", horizon=n, cost=cost, batch_size=batch, prior=BetaPrior(af, bf)
    )
    s = Stopper(cfg)
    assert s.next_decision() == Draw(1)
    s.observe(rewards[0])
    k = 1
    while True:
        d = s.next_decision()
        succ = sum(rewards[:k])
        a, b = s.state.a, s.state.b
        # both summed one reward at a time: equal to the closed form up to rounding
        assert (a, b) == (pytest.approx(af + succ, rel=1e-14),
                          pytest.approx(bf + (k - succ), rel=1e-14))
        if k == n:  # the horizon comes first, even after a success on the last draw
            assert d == Stop("horizon")
            break
        if succ:
            assert d == Stop("absorbed")
            break
        h = _exact_reservation_cost(n - k, Fraction(a), Fraction(b))  # exact on the state
        if abs(cost / float(h) - 1) < 1e-12:
            break  # the indifference cost itself: decided on the last bits of h
        if Fraction(cost) < h:
            assert d == Draw(min(batch, n - k))
        else:
            assert d == Stop("index")
            break
        s.observe(rewards[k : k + d.count])
        k += d.count
    assert s.k == k
    assert s.best_index == (rewards[:k].index(1) if 1 in rewards[:k] else 0)
