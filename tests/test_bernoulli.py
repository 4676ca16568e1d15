"""Bernoulli–Beta family: exact reservation cost and the absorbing success."""

import itertools
import math
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
