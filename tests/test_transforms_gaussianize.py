"""The fitted Gaussianizing transform (kind "gaussianize")."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import beacon
from beacon.errors import ConfigError, RewardError
from beacon.fitting import _TIE_FLOOR, GaussianizeTransform
from beacon.transforms import make_transform, transform_from_dict


def _grid(g: GaussianizeTransform) -> np.ndarray:
    lo, hi = g.x[0], g.x[-1]
    span = hi - lo
    inner = np.unique(np.concatenate([g.x, np.linspace(lo, hi, 5001)]))
    xs = np.concatenate([np.linspace(lo - 100 * span, lo, 200, endpoint=False), inner,
                         np.linspace(hi, hi + 100 * span, 201)[1:]])
    # Drop points closer than float resolution can separate after the affine pieces.
    keep = np.concatenate([[True], np.diff(xs) > 1e-9 * span])
    return xs[keep]


def _strictly_increasing(g: GaussianizeTransform) -> None:
    xs = _grid(g)
    ys = g.apply(xs)
    assert np.all(np.isfinite(ys))
    assert np.all(np.diff(ys) > 0)


def test_logged_values_map_to_normal_quantiles_of_mid_ranks() -> None:
    from scipy.stats import norm

    data = np.array([3.0, 1.0, 2.0, 2.0, 2.0, 5.0, 4.0, 4.0])
    g = GaussianizeTransform.fit(data)
    n = data.size
    # mid-rank CDF: value 2 occupies ranks 2..4 of 8 -> (1 + 3/2) / 8
    want = {1.0: 0.5 / n, 2.0: (1 + 1.5) / n, 3.0: 4.5 / n, 4.0: (5 + 1) / n, 5.0: 7.5 / n}
    for v, p in want.items():
        assert g.apply_scalar(v) == pytest.approx(norm.ppf(p), rel=1e-12)


def test_strictly_increasing_with_ties_plateaus_and_beyond_the_range() -> None:
    rng = np.random.default_rng(0)
    plateau = np.concatenate([np.zeros(500), np.ones(300), rng.uniform(0, 1, 20)])
    discrete = np.round(rng.normal(6, 2, 2000) * 5) / 5  # scores in steps of 0.2
    bimodal = np.concatenate([rng.beta(0.2, 8, 900), rng.beta(8, 0.2, 300)])
    for data in (plateau, discrete, bimodal, np.array([1.0, 2.0])):
        _strictly_increasing(GaussianizeTransform.fit(data))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=60),
       st.integers(2, 40))
def test_strictly_increasing_for_any_log(values: list[float], max_knots: int) -> None:
    if len(set(values)) < 2 or max(values) - min(values) <= _TIE_FLOOR:
        with pytest.raises(ConfigError, match="rewards"):
            GaussianizeTransform.fit(values, max_knots=max_knots)
        return
    g = GaussianizeTransform.fit(values, max_knots=max_knots)
    assert len(g.x) <= max(max_knots, 2) + 2
    _strictly_increasing(g)


def test_gaussianizes_a_skewed_pool() -> None:
    rng = np.random.default_rng(1)
    data = rng.lognormal(0.0, 1.5, 20000)
    g = GaussianizeTransform.fit(data)
    z = g.apply(rng.lognormal(0.0, 1.5, 20000))  # fresh draws from the same law
    assert abs(z.mean()) < 0.05 and z.std() == pytest.approx(1.0, abs=0.05)
    from scipy.stats import skew

    assert abs(skew(z)) < 0.1 < abs(skew(data))


def test_knot_thinning_keeps_the_ends_and_exact_values_at_kept_knots() -> None:
    rng = np.random.default_rng(2)
    data = rng.normal(size=5000)
    full = GaussianizeTransform.fit(data, max_knots=100000)
    thin = GaussianizeTransform.fit(data, max_knots=64)
    assert len(thin.x) <= 66 and thin.x[0] == data.min() and thin.x[-1] == data.max()
    np.testing.assert_allclose(thin.apply(thin.x), full.apply(thin.x), rtol=1e-12)
    probe = rng.normal(size=1000)
    assert np.max(np.abs(thin.apply(probe) - full.apply(probe))) < 0.1


def test_nan_stays_nan_and_infinite_rewards_are_errors() -> None:
    g = GaussianizeTransform.fit([0.0, 1.0, 2.0])
    out = g.apply(np.array([[np.nan, 1.0]]))
    assert np.isnan(out[0, 0]) and out[0, 1] == 0.0
    with pytest.raises(RewardError) as ei:
        g.apply_scalar(float("inf"), position=4)
    assert ei.value.position == 4
    with pytest.raises(RewardError):
        GaussianizeTransform.fit([0.0, float("inf")])


def test_json_round_trip_through_the_registry() -> None:
    rng = np.random.default_rng(3)
    g = GaussianizeTransform.fit(rng.gamma(2.0, size=300))
    d = json.loads(json.dumps(g.to_dict()))
    assert d["kind"] == "gaussianize"
    for back in (transform_from_dict(d), make_transform(d)):
        assert isinstance(back, GaussianizeTransform) and back == g
        probe = rng.normal(2, 3, 100)
        np.testing.assert_array_equal(back.apply(probe), g.apply(probe))


def test_registered_at_import_of_beacon_fitting_in_a_fresh_interpreter() -> None:
    g = GaussianizeTransform.fit([0.0, 1.0, 3.0])
    code = (
        "import json, sys, beacon\n"
        "from beacon.transforms import transform_from_dict\n"
        "t = transform_from_dict(json.loads(sys.argv[1]))\n"
        "print(type(t).__name__, t.apply_scalar(1.0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(g.to_dict())],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["GaussianizeTransform", "0.0"]


def test_invalid_construction_names_the_field() -> None:
    with pytest.raises(ConfigError) as e1:
        GaussianizeTransform([0.0, 0.0, 1.0], [-1.0, 0.0, 1.0], 1.0, 1.0)
    assert e1.value.field == "transform.x"
    with pytest.raises(ConfigError) as e2:
        GaussianizeTransform([0.0, 1.0], [1.0, 0.0], 1.0, 1.0)
    assert e2.value.field == "transform.q"
    with pytest.raises(ConfigError) as e3:
        GaussianizeTransform([0.0, 1.0], [0.0, 1.0], 0.0, 1.0)
    assert e3.value.field == "transform.slope_left"
    with pytest.raises(ConfigError) as e4:
        transform_from_dict({"kind": "gaussianize", "x": [0.0, 1.0], "q": [0.0, 1.0]})
    assert e4.value.field == "transform.slope_left"
    with pytest.raises(ConfigError):
        GaussianizeTransform.fit([1.0, 1.0, 1.0])
    with pytest.raises(ConfigError) as e5:
        GaussianizeTransform.fit([1.0, 2.0], max_knots=1)
    assert e5.value.field == "max_knots"


def test_nested_knots_and_a_kind_that_is_not_a_string_are_config_errors() -> None:
    # [[0, 1]] used to be flattened into knots silently; an unhashable kind (a JSON list or
    # object) escaped as "TypeError: unhashable type" through `beacon replay --transform`.
    with pytest.raises(ConfigError) as e1:
        transform_from_dict(
            {"kind": "gaussianize", "x": [[0.0, 1.0]], "q": [[0.0, 1.0]],
             "slope_left": 1.0, "slope_right": 1.0}
        )
    assert e1.value.field == "transform.x" and "flat list" in str(e1.value)
    with pytest.raises(ConfigError) as e2:
        GaussianizeTransform([0.0, 1.0], [[0.0], [1.0]], 1.0, 1.0)
    assert e2.value.field == "transform.q"
    for kind in (["gaussianize"], {"a": 1}, 3):
        with pytest.raises(ConfigError) as e3:
            transform_from_dict({"kind": kind})
        assert e3.value.field == "transform.kind" and e3.value.value == kind


def test_config_round_trip_and_stopper_picks_best_raw_reward() -> None:
    g = GaussianizeTransform.fit(np.linspace(0.0, 1.0, 50) ** 3)
    cfg = beacon.BeaconConfig(cost=0.01, horizon=6, family="normal",
                              transform=g)
    back = beacon.BeaconConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.transform == g
    s = beacon.Stopper(cfg.replace(prior=beacon.NIGPrior(0.0, 1.0, 2.0, 1.0)))
    rewards = iter([0.2, 0.9, 0.1, 0.5, 0.3, 0.05])
    while isinstance(d := s.next_decision(), beacon.Draw):
        s.observe([next(rewards) for _ in range(d.count)])
    assert s.best_reward == 0.9 and s.best_index == 1


def test_values_a_few_ulps_apart_are_one_knot() -> None:
    # Found by hypothesis: knots 0 and 2.2e-308 gave a left slope of 4e307 and -inf a hundred
    # ranges below the log. Values within 1e-12 of the range are ties.
    g = GaussianizeTransform.fit([0.0, 1.0, 2.2250738585072014e-308])
    assert g.x.tolist() == [0.0, 1.0]
    ref = GaussianizeTransform.fit([0.0, 1.0, 0.0])
    assert g.to_dict() == ref.to_dict()
    _strictly_increasing(g)
    # gaps just above the resolution stay separate knots, and the tails stay finite
    g2 = GaussianizeTransform.fit([0.0, 1e-11, 1.0])
    assert g2.x.size == 3
    _strictly_increasing(g2)
    # a subnormal range is one value: a typed error naming the rewards, not an infinite slope
    with pytest.raises(ConfigError, match="rewards"):
        GaussianizeTransform.fit([0.0, 2.225073858507e-311])


def test_a_reward_that_overflows_the_tail_is_a_reward_error() -> None:
    import warnings

    g = GaussianizeTransform.fit([0.0, 0.001, 0.002, 0.005])  # tail slopes of several hundred
    s = beacon.Stopper(beacon.BeaconConfig(cost=0.1, horizon=8, transform=g))
    s.next_decision()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning on the way
        with pytest.raises(RewardError, match="position 2"):
            s.observe([0.001, 0.002, 1e308])


def test_a_chain_of_near_ties_longer_than_the_resolution_keeps_two_knots() -> None:
    step = 0.8 * _TIE_FLOOR  # each gap is a tie, the whole range is not
    g = GaussianizeTransform.fit([0.0, step, 2 * step])
    assert g.x.tolist() == [0.0, 2 * step]
    _strictly_increasing(g)


def test_one_wild_reward_does_not_merge_the_ordinary_scores_into_one_knot() -> None:
    # Was: the tie tolerance was 1e-12 of the range, so a broken reward of 1e13 among scores
    # 0.1 apart (range 1e13, tolerance 10) merged every score into one knot and the prior was
    # fitted on a handful of values.
    rng = np.random.default_rng(5)
    scores = np.round(rng.normal(6.0, 2.0, (40, 8)), 1)
    for wild in (1e13, 1e200, -1e13):
        x = scores.copy()
        x[3, 2] = wild
        g = GaussianizeTransform.fit(x)
        assert g.x.tolist() == np.unique(x).tolist()  # every distinct score is a knot
        # rank-based: the ordinary scores map as if the wild one were any value above (below)
        y = scores.copy()
        y[3, 2] = np.sign(wild) * 1e3
        ref = GaussianizeTransform.fit(y)
        inner = np.unique(scores)
        inner = inner[inner != scores[3, 2]]
        np.testing.assert_allclose(g.apply(inner), ref.apply(inner), rtol=0, atol=1e-12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=30),
       st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=30),
       st.integers(2, 40))
def test_monotone_in_floating_point_for_any_log_and_any_reward(
    values: list[float], probes: list[float], max_knots: int
) -> None:
    try:
        g = GaussianizeTransform.fit(values, max_knots=max_knots)
    except ConfigError as exc:  # too few distinct values, or a range beyond the floats
        assert exc.field == "rewards"
        return
    with np.errstate(over="ignore"):  # the float next to +-1.8e308 is +-inf
        near = np.concatenate([np.nextafter(g.x, np.inf), np.nextafter(g.x, -np.inf)])
    xs = np.sort(np.concatenate([np.asarray(probes), g.x, near]))
    ys = g.apply(xs)
    assert not np.isnan(ys).any()
    finite = ys[np.isfinite(ys)]
    assert np.all(np.diff(finite) >= 0)  # never decreasing, across knots and tails
    assert np.array_equal(g.apply(g.x), g.q)  # the knots map exactly to their quantiles
    assert np.all(np.diff(g.x) > 0) and np.all(np.diff(g.q) > 0)


def test_a_reward_just_below_a_knot_never_maps_above_it() -> None:
    # Found by hypothesis: np.interp's affine piece from -7.7e15 to 0 rounded t(-1) an ulp
    # above t(0), so a lower reward had a higher transformed value.
    g = GaussianizeTransform.fit([0.0, 0.0, -7712251069598887.0])
    xs = np.array([-1.0, -1e-300, 0.0, -7712251069598887.0 / 2])
    assert g.apply(xs[0]) <= g.apply(0.0) and g.apply(xs[1]) <= g.apply(0.0)
    assert g.apply_scalar(-1.0) <= g.apply_scalar(0.0)


def test_a_range_beyond_the_floats_is_a_config_error_naming_the_rewards() -> None:
    import warnings

    for values in ([-1e308, 1e308], [-1e308, 0.0, 1.0, 1e308]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no overflow warning on the way
            with pytest.raises(ConfigError, match="too wide") as ei:
                GaussianizeTransform.fit(values)
        assert ei.value.field == "rewards"


def test_fit_on_non_numbers_is_a_config_error() -> None:
    for bad in (["a", "b"], [[1.0, 2.0], [3.0]]):
        with pytest.raises(ConfigError) as ei:
            GaussianizeTransform.fit(bad)
        assert ei.value.field == "rewards"


def test_hand_edited_transforms_name_the_bad_field() -> None:
    good = {"kind": "gaussianize", "x": [0.0, 1.0, 2.0], "q": [-1.0, 0.0, 1.0],
            "slope_left": 1.0, "slope_right": 1.0}
    cases = [
        ({**good, "x": [True, 2, 3]}, "transform.x", [True, 2, 3]),  # a boolean is no knot
        ({**good, "x": None}, "transform.x", None),
        ({**good, "q": [-1, None, 1]}, "transform.q", [-1, None, 1]),
        ({**good, "slope_left": 10**400}, "transform.slope_left", 10**400),  # JSON big int
        ({**good, "x": [0, 10**400, 10**401]}, "transform.x", None),
        ({**good, "slopeleft": 1.0}, "transform.slopeleft", 1.0),  # misspelt: not ignored
        ({"kind": "logit", "eps": 10**400}, "transform.eps", 10**400),
        ({"kind": "logit", "epsilon": 0.01}, "transform.epsilon", 0.01),  # default not used
        ({"kind": "identity", "eps": 0.01}, "transform.eps", 0.01),
    ]
    for data, field, value in cases:
        with pytest.raises(ConfigError) as ei:
            transform_from_dict(data)
        assert ei.value.field == field, data
        if value is not None or field != "transform.x":
            assert ei.value.value == value, data
    # what to_dict writes still loads
    for tr in (GaussianizeTransform.fit([1.0, 2.0, 5.0]), make_transform("logit")):
        assert tr is not None and transform_from_dict(tr.to_dict()) == tr


def test_a_reward_whose_transform_leaves_the_model_range_is_named_by_its_raw_value() -> None:
    # Was: "invalid reward at position 0: 9.19e+199 (|reward| above 1e+140 ...)", the
    # transformed value, which the user never sent.
    g = GaussianizeTransform.fit([1.0, 2.0, 3.0, 4.0, 5.0])
    s = beacon.Stopper(beacon.BeaconConfig(cost=0.1, horizon=8, transform=g))
    d = s.next_decision()
    assert isinstance(d, beacon.Draw)
    with pytest.raises(RewardError) as ei:
        s.observe([2.0] * (d.count - 1) + [1e200])
    assert ei.value.value == 1e200 and ei.value.position == d.count - 1
    assert "gaussianize" in str(ei.value)
    # the Stopper is unchanged and goes on
    s.observe([2.0] * d.count)
