"""beacon.replay decides exactly as the Stopper does, prompt by prompt."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import beacon
from beacon import BeaconConfig, BetaPrior, Draw, NIGPrior, RewardError, Stopper
from beacon.replay import _replay_with_stopper

CONFIGS = [
    BeaconConfig(cost=0.1, horizon=8),
    BeaconConfig(cost=0.02, horizon=16, robust=False),
    BeaconConfig(cost=0.05, horizon=16, batch_size=4),
    BeaconConfig(cost=0.3, horizon=12, batch_size=3, robust_quantile=0.2),
    BeaconConfig(cost=0.05, horizon=8, prior=NIGPrior(0.3, 2.0, 3.0, 0.1)),
    BeaconConfig(cost=0.05, horizon=8, prior=NIGPrior(0.5, 1.0, 0.4, 0.0), transform="logit"),
]


def _rewards(seed: int, rows: int, cols: int, missing: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.beta(0.7, 0.7, size=(rows, cols)) * rng.uniform(0.2, 1.0, size=(rows, 1))
    # some heavy outliers and ties
    x[rng.random(x.shape) < 0.05] = 0.0
    x[rng.random(x.shape) < missing] = np.nan
    return x


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"n{c.horizon}-b{c.batch_size}-{c.cost}")
def test_replay_equals_stopper(cfg: BeaconConfig) -> None:
    x = _rewards(7, 300, cfg.horizon + 2, missing=0.1)
    fast = beacon.replay(x, cfg)
    slow = _replay_with_stopper(x, cfg)
    np.testing.assert_array_equal(fast.n_samples, slow.n_samples)
    np.testing.assert_array_equal(fast.chosen, slow.chosen)
    np.testing.assert_array_equal(fast.truncated, slow.truncated)
    assert list(fast.stop_reason) == list(slow.stop_reason)
    # the index actually decided something and stopping times vary (the test can fail)
    assert "index" in set(fast.stop_reason)
    assert len(set(fast.n_samples.tolist())) > 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    cost=st.floats(0.001, 0.5),
    batch=st.integers(1, 4),
    robust=st.booleans(),
)
def test_replay_equals_stopper_property(seed: int, cost: float, batch: int, robust: bool) -> None:
    cfg = BeaconConfig(cost=cost, horizon=8, batch_size=batch, robust=robust)
    x = _rewards(seed, 40, 8)
    fast, slow = beacon.replay(x, cfg), _replay_with_stopper(x, cfg)
    np.testing.assert_array_equal(fast.n_samples, slow.n_samples)
    np.testing.assert_array_equal(fast.chosen, slow.chosen)


def test_bernoulli_replay_equals_stopper() -> None:
    rng = np.random.default_rng(3)
    x = (rng.random((400, 30)) < rng.uniform(0, 0.3, size=(400, 1))).astype(float)
    for cfg in (
        BeaconConfig(family="bernoulli", cost=0.05, horizon=30),
        BeaconConfig(
            family="bernoulli", cost=0.01, horizon=20, batch_size=4, prior=BetaPrior(0.5, 3)
        ),
    ):
        fast, slow = beacon.replay(x, cfg), _replay_with_stopper(x, cfg)
        np.testing.assert_array_equal(fast.n_samples, slow.n_samples)
        np.testing.assert_array_equal(fast.chosen, slow.chosen)
        assert list(fast.stop_reason) == list(slow.stop_reason)
        assert "absorbed" in set(fast.stop_reason)


def test_chosen_is_best_raw_reward_among_used() -> None:
    x = _rewards(11, 200, 16)
    r = beacon.replay(x, BeaconConfig(cost=0.05, horizon=16))
    for i in range(x.shape[0]):
        used = x[i, : r.n_samples[i]]
        assert r.chosen[i] == int(np.argmax(used))
        assert r.best_reward[i] == used.max()


def test_short_rows_are_truncated() -> None:
    x = np.full((2, 10), np.nan)
    x[0, :4] = [0.1, 0.9, 0.2, 0.3]
    r = beacon.replay(x, BeaconConfig(cost=1e-9, horizon=10))
    assert r.n_samples[0] == 4 and r.truncated[0] and r.stop_reason[0] == "horizon"
    assert r.n_samples[1] == 0 and r.chosen[1] == -1 and np.isnan(r.best_reward[1])


def test_monotone_in_cost() -> None:
    x = _rewards(5, 500, 16)
    prev = None
    for c in (0.001, 0.01, 0.05, 0.2, 1.0):
        k = beacon.replay(x, BeaconConfig(cost=c, horizon=16)).n_samples
        if prev is not None:
            assert np.all(k <= prev)
        prev = k


def test_bad_arrays() -> None:
    cfg = BeaconConfig(horizon=8)
    with pytest.raises(RewardError, match="2-D"):
        beacon.replay([0.1, 0.2], cfg)
    with pytest.raises(TypeError, match=r"cfg=.*must be a beacon\.BeaconConfig, got dict") as te:
        beacon.replay(np.zeros((2, 8)), {"horizon": 8})  # type: ignore[arg-type]
    assert isinstance(te.value, beacon.ConfigError) and te.value.field == "cfg"
    x = np.zeros((3, 8))
    x[2, 5] = np.inf
    with pytest.raises(RewardError) as exc:
        beacon.replay(x, cfg)
    assert exc.value.position == (2, 5)
    with pytest.raises(RewardError, match="0 or 1"):
        beacon.replay(np.full((2, 8), 0.5), BeaconConfig(family="bernoulli", horizon=8))
    with pytest.raises(RewardError, match=r"\[0, 1\]"):
        beacon.replay(np.full((2, 8), 2.0), BeaconConfig(horizon=8, transform="logit"))
    x = np.ones((3, 8))
    x[1, 4] = -1e300  # finite, but its square overflows the normal statistics
    with pytest.raises(RewardError, match="rescale") as exc:
        beacon.replay(x, cfg)
    assert exc.value.position == (1, 4)


def test_replay_at_the_largest_reward_scale_equals_the_stopper() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 8)) * 1e139 / 5
    cfg = BeaconConfig(cost=1e137, horizon=8)
    res = beacon.replay(x, cfg)
    for i, row in enumerate(x):
        s = Stopper(cfg)
        while isinstance(d := s.next_decision(), Draw):
            s.observe(row[s.k : s.k + d.count])
        assert (res.n_samples[i], res.chosen[i]) == (s.k, s.best_index)


def test_judge_replay_equals_stopper() -> None:
    rng = np.random.default_rng(8)
    wins = rng.random((300, 11)) < rng.uniform(0, 0.5, size=(300, 1))
    x = np.where(wins, rng.uniform(0.5, 1.0, (300, 11)), rng.uniform(0, 0.5, (300, 11)))
    x[rng.random(x.shape) < 0.05] = np.nan
    for cfg in (
        BeaconConfig(family="judge", cost=0.05, horizon=11),
        BeaconConfig(family="judge", cost=0.01, horizon=11, batch_size=3, prior=BetaPrior(0.4, 2)),
    ):
        fast, slow = beacon.replay(x, cfg), _replay_with_stopper(x, cfg)
        np.testing.assert_array_equal(fast.n_samples, slow.n_samples)
        np.testing.assert_array_equal(fast.chosen, slow.chosen)
        np.testing.assert_array_equal(fast.truncated, slow.truncated)
        assert list(fast.stop_reason) == list(slow.stop_reason)
        assert "absorbed" in set(fast.stop_reason) and len(set(fast.stop_reason)) >= 2


@pytest.mark.parametrize(
    "bad",
    [
        np.ones((2, 8), dtype=complex),
        [["0.5"] * 8],
        np.array([[0.5] * 7 + ["0.5"]], dtype=object),
        np.array([[0.5] * 7 + [1 + 0j]], dtype=object),
        np.zeros((2, 8), dtype="datetime64[s]"),
    ],
)
@pytest.mark.parametrize("family", ["normal", "bernoulli"])
def test_non_real_rewards_are_refused_like_the_stopper(bad: object, family: str) -> None:
    # numpy would silently parse strings and drop imaginary parts; the Stopper refuses both
    with pytest.raises(RewardError, match="numeric 2-D array"):
        beacon.replay(bad, BeaconConfig(horizon=8, family=family))  # type: ignore[arg-type]


@pytest.mark.parametrize("family", ["normal", "bernoulli"])
def test_prompts_with_no_logged_samples(family: str) -> None:
    cfg = BeaconConfig(cost=0.1, horizon=8, family=family)
    none = beacon.replay(np.zeros((3, 0)), cfg)
    missing = beacon.replay(np.full((3, 8), np.nan), cfg)
    assert none.n_samples.tolist() == missing.n_samples.tolist() == [0, 0, 0]
    assert none.chosen.tolist() == [-1, -1, -1]
    assert none.truncated.all() and np.isnan(none.best_reward).all()
    assert list(none.stop_reason) == list(missing.stop_reason)


def test_an_int_beyond_the_float_range_is_a_reward_error_naming_its_cell() -> None:
    x = np.array([[0.5] * 8, [0.5] * 7 + [10**400]], dtype=object)
    with pytest.raises(RewardError, match="finite") as exc:
        beacon.replay(x, BeaconConfig(horizon=8))
    assert exc.value.position == (1, 7)


def test_a_family_registered_over_a_builtin_is_replayed_as_its_stopper_decides() -> None:
    # a plugin may replace a built-in on purpose; the numba kernels only know the built-ins
    from beacon.families import _FAMILIES, Decision, register_family
    from beacon.families.bernoulli import BernoulliFamily
    from beacon.families.normal import NormalFamily

    class StopAtOnce(NormalFamily):
        def decide(self, state: object, cfg: BeaconConfig) -> Decision:
            return Decision(False, "index", 0.0, 0.0, 0.0)

    class NeverAbsorb(BernoulliFamily):
        def decide(self, state: object, cfg: BeaconConfig) -> Decision:
            return Decision(True, None, 0.0, 1.0, cfg.cost)

    saved = dict(_FAMILIES)
    try:
        register_family("normal")(StopAtOnce)
        register_family("bernoulli")(NeverAbsorb)
        for cfg, x in (
            (BeaconConfig(horizon=8, cost=1e-3), _rewards(3, 6, 8)),
            (BeaconConfig(family="bernoulli", horizon=8, cost=0.05), np.ones((4, 8))),
        ):
            res = beacon.replay(x, cfg)
            for i in range(x.shape[0]):
                s = Stopper(cfg)
                d = _drive_row(s, x[i])
                assert res.n_samples[i] == s.k and res.stop_reason[i] == d.reason
            assert res.n_samples.tolist() == [3 if cfg.family == "normal" else 8] * x.shape[0]
    finally:
        _FAMILIES.clear()
        _FAMILIES.update(saved)


def _drive_row(s: Stopper, row: np.ndarray) -> beacon.Stop:
    it = iter(row[~np.isnan(row)].tolist())
    while isinstance(d := s.next_decision(), Draw):
        s.observe([next(it) for _ in range(d.count)])
    return d


@pytest.mark.parametrize("family", ["bernoulli", "judge"])
def test_bernoulli_replay_equals_stopper_at_the_indifference_cost(family: str) -> None:
    # b0 = 1/3: the Stopper's b after k failures (1/3 + 1 + 1 ...) is not b0 + k to the last
    # bit, nor is h^B; a cost on the Stopper's h^B must give the same decision in the replay
    from beacon.families.bernoulli import BernoulliState, beta_update

    n, b0 = 8, 1 / 3
    st = BernoulliState(0, -np.inf, 1.0, b0)
    differ = 0
    for k in range(n):
        costs = {beacon.reservation_cost(n, k, st.a, b) for b in (st.b, b0 + k)}
        differ += len(costs) - 1
        for cost in costs:  # continue iff cost < h: the Stopper's h or the naive one
            cfg = BeaconConfig(family=family, horizon=n, cost=cost, prior=BetaPrior(1.0, b0))
            res = beacon.replay(np.zeros((1, n)), cfg)
            s = Stopper(cfg)
            d = _drive_row(s, np.zeros(n))
            assert (res.n_samples[0], res.stop_reason[0]) == (s.k, d.reason)
        st = BernoulliState(*beta_update(st, 0.0))
    assert differ  # the case this test is about occurs


def test_robust_replay_equals_stopper_on_the_robust_threshold() -> None:
    # alpha0 = 0.9029: 2 alpha_15 summed half by half by the Stopper is not 2 alpha0 + 15 to the
    # last bit, nor is the Student-t quantile of the robust rule; a reward on the Stopper's
    # threshold, and a cost on the index it gives, must decide the same in the replay
    import copy
    import math

    from beacon.families.normal import predictive_quantile

    prior, n, k = NIGPrior(0.0, 1.0, 0.9029, 1.0), 17, 15
    rs = np.random.default_rng(0).normal(size=k).tolist()
    s = Stopper(BeaconConfig(horizon=n, prior=prior, cost=1e-12))
    while s.k < k:
        assert isinstance(s.next_decision(), Draw)
        s.observe(rs[s.k])
    st = s.state
    q = s.config.robust_quantile
    thresholds = {
        st.mu + st.sigma * predictive_quantile(dof, q) for dof in (2.0 * st.alpha, 1.8058 + k)
    }
    assert len(thresholds) == 2  # the case this test is about occurs
    for r in thresholds:
        probe = copy.deepcopy(s)
        probe.next_decision()
        probe.observe(r)
        probe.next_decision()
        index_cost = probe.trace[-1].h * probe.state.sigma
        row = np.array([[*rs, r, 0.0]])
        for cost in (index_cost, math.nextafter(index_cost, 0.0)):
            cfg = BeaconConfig(horizon=n, prior=prior, cost=cost)
            res = beacon.replay(row, cfg)
            ref = Stopper(cfg)
            d = _drive_row(ref, row[0])
            assert (res.n_samples[0], res.stop_reason[0]) == (ref.k, d.reason)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(
        st.lists(
            st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1.0, np.nan])),
            min_size=10,
            max_size=10,
        ),
        min_size=1,
        max_size=12,
    ),
    prior=st.sampled_from([NIGPrior(), NIGPrior(0.2, 2.0, 1.5, 0.5), NIGPrior(0.0, 2.0, 1.5, 0.0)]),
    cost=st.floats(1e-3, 0.5),
    batch=st.integers(1, 4),
    robust=st.booleans(),
)
def test_replay_equals_a_stopper_prompt_by_prompt_by_hypothesis(
    data: list[list[float]], prior: NIGPrior, cost: float, batch: int, robust: bool
) -> None:
    """Arbitrary logged matrices (ties, NaN gaps, short rows) and priors with k0 = 3, 0, 1:
    each prompt's samples used, chosen column and reason are those of a Stopper fed its logged
    rewards in order (driven here, not by beacon.replay's own slow path)."""
    x = np.array(data, dtype=float)
    cfg = BeaconConfig(prior=prior, cost=cost, horizon=8, batch_size=batch, robust=robust)
    res = beacon.replay(x, cfg)
    for i, row in enumerate(x):
        cols = np.flatnonzero(~np.isnan(row))
        s = Stopper(cfg)
        pos, reason, trunc = 0, None, False
        while isinstance(d := s.next_decision(), Draw):
            take = cols[pos : pos + d.count]
            s.observe(row[take].tolist())
            pos += take.size
            if take.size < d.count:
                trunc, reason = True, "horizon"
                break
        else:
            reason = d.reason
        assert res.n_samples[i] == s.k
        assert res.truncated[i] == trunc
        assert res.stop_reason[i] == reason
        assert res.chosen[i] == (cols[s.best_index] if s.best_index >= 0 else -1)


def test_a_masked_cell_of_a_masked_array_is_missing_not_replayed() -> None:
    # np.asarray dropped the mask, so the hidden (e.g. invalid) rewards were replayed as drawn
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, 8))
    mask = rng.random(x.shape) < 0.25
    cfg = BeaconConfig(cost=0.05, horizon=8)
    got = beacon.replay(np.ma.masked_array(x, mask=mask), cfg)
    want = beacon.replay(np.where(mask, np.nan, x), cfg)
    for name in ("n_samples", "chosen", "best_reward", "stop_reason", "truncated"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert (beacon.replay(x, cfg).n_samples != want.n_samples).any()  # the mask matters here
    with pytest.raises(RewardError, match="not real numbers"):
        beacon.replay(np.ma.masked_array([["a", "b"]], mask=[[0, 1]]), cfg)


def test_a_reward_whose_transform_is_too_large_is_named_by_its_raw_value_as_the_stopper_does(
) -> None:
    # replay said "(0, 2): 3.96e+199 (|reward| above 1e+140 ...; rescale the rewards)": the
    # transformed value, which the user never logged, and advice about the raw scale
    from beacon.fitting import fit_reward_model

    logs = np.array([[1, 2, 3, 4.0], [2, 3, 4, 5], [1, 3, 5, 7], [0, 1, 2, 3]])
    cfg = fit_reward_model(logs, "normal", transform="gaussianize").config(cost=0.1, horizon=6)
    with pytest.raises(RewardError) as got:
        beacon.replay(np.array([[1.0, 2.0, 1e200, 3.0]]), cfg)
    assert got.value.position == (0, 2) and got.value.value == 1e200
    assert "gaussianize transform" in got.value.reason
    s = Stopper(cfg)
    assert isinstance(s.next_decision(), Draw)
    s.observe(1.0)
    s.next_decision()
    s.observe(2.0)
    s.next_decision()
    with pytest.raises(RewardError) as want:
        s.observe(1e200)
    assert want.value.value == got.value.value and want.value.reason == got.value.reason
