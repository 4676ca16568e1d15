"""Fitting audit 4: inputs a user fitting a prior on their own logs hands the library."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import beacon
from beacon.errors import ConfigError
from beacon.evaluation import LoggedRewards, cross_fit
from beacon.fitting import (
    GaussianizeTransform,
    _merge_near_ties,
    _tie_tolerance,
    fit_reward_model,
    reward_matrix,
)
from beacon.transforms import IdentityTransform, LogitTransform, make_transform


def _log(seed: int = 0, prompts: int = 40, samples: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.0, size=(prompts, 1))
    return means + rng.normal(0.0, 0.7, size=(prompts, samples))


def test_a_masked_reward_is_missing_not_fitted() -> None:
    # numpy's idiom for "no sample here" is a mask; np.asarray dropped it and the hidden
    # values (here a broken 1e6 under every mask) were fitted as rewards
    x = _log()
    hidden = np.zeros_like(x, dtype=bool)
    hidden[::3, -2:] = True
    masked = np.ma.array(np.where(hidden, 1e6, x), mask=hidden)
    with_nan = np.where(hidden, np.nan, x)

    np.testing.assert_array_equal(reward_matrix(masked), with_nan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "converting a masked element to nan"
        np.testing.assert_array_equal(reward_matrix(list(masked)), with_nan)
    for kw in ({"robust": False}, {"transform": "gaussianize"}):
        got = fit_reward_model(masked, **kw)
        want = fit_reward_model(with_nan, **kw)
        assert got.prior == want.prior and got.transform == want.transform
        assert got.fitted_on["rewards"] == int((~hidden).sum())
    assert GaussianizeTransform.fit(masked) == GaussianizeTransform.fit(with_nan)


@pytest.mark.parametrize(
    "arr",
    [
        np.array([[1 + 2j, 2.0], [3.0, 4.0], [1.0, 5.0]]),  # the imaginary part was dropped
        np.array([[1, 2], [3, 4], [5, 7]], dtype="m8[s]"),  # durations read as numbers
        np.ma.array(np.array([["a", "b"], ["c", "d"]]), mask=[[0, 1], [0, 0]]),
    ],
)
def test_arrays_of_non_real_numbers_are_config_errors(arr: np.ndarray) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not a ComplexWarning and a fit of the real parts
        with pytest.raises(ConfigError) as ei:
            fit_reward_model(arr)
        assert ei.value.field == "rewards" and str(arr.dtype) in str(ei.value)
        with pytest.raises(ConfigError) as ei:
            GaussianizeTransform.fit(arr)
        assert ei.value.field == "rewards"
        with pytest.raises(ConfigError) as ei:  # per-prompt arrays in a list
            fit_reward_model(list(arr))
        assert ei.value.field == "rewards[0]" and str(arr.dtype) in str(ei.value)


def test_gaussianize_on_ragged_lists_says_how_to_pad_them() -> None:
    # fit_reward_model takes per-prompt lists of any lengths (docs/priors.md); the transform
    # alone needs them padded, and its error said only "must be numbers"
    x = _log(1, prompts=12, samples=5)
    ragged = [list(row[: 2 + i % 4]) for i, row in enumerate(x)]
    with pytest.raises(ConfigError) as ei:
        GaussianizeTransform.fit(ragged)
    assert ei.value.field == "rewards" and "reward_matrix" in str(ei.value)
    padded = GaussianizeTransform.fit(reward_matrix(ragged))
    assert padded == fit_reward_model(ragged, transform="gaussianize").transform


def test_the_gaussianize_kind_name_alone_says_it_must_be_fitted() -> None:
    # was "invalid transform.x=None: missing from gaussianize transform", a field never written
    for build in (
        lambda: beacon.BeaconConfig(cost=0.1, transform="gaussianize"),
        lambda: make_transform("gaussianize"),
        lambda: make_transform({"kind": "gaussianize"}),
    ):
        with pytest.raises(ConfigError) as ei:
            build()
        assert ei.value.field == "transform" and ei.value.value == "gaussianize"
        assert "fit_reward_model" in str(ei.value)
    # a dict missing only some knots still names the missing field
    with pytest.raises(ConfigError) as ei:
        make_transform({"kind": "gaussianize", "x": [0.0, 1.0]})
    assert ei.value.field == "transform.q"


def test_a_cross_fit_failure_names_the_fold() -> None:
    # the whole log has two prompts with two rewards (fit_reward_model fits it), but a fold's
    # training prompts may not: the error said only "0 prompt(s) with >= 2 rewards"
    rewards = np.full((4, 3), np.nan)
    rewards[:, 0] = [1.0, 2.0, 3.0, 4.0]
    rewards[0, 1], rewards[1, 1] = 2.5, 1.0
    fit_reward_model(rewards)
    data = LoggedRewards(("a", "b", "c", "d"), rewards)
    with pytest.raises(ConfigError) as ei:
        cross_fit(data, transform=None, folds=2)
    assert ei.value.field == "rewards"
    assert "fold" in str(ei.value) and "prompts outside it" in str(ei.value)


@pytest.mark.parametrize(
    "transform",
    [IdentityTransform(), LogitTransform(), GaussianizeTransform([0.0, 1.0], [-1.0, 1.0], 1, 1)],
    ids=lambda t: t.kind,
)
@pytest.mark.parametrize("bad", ["high", [[0.5], [0.2, 0.3]]], ids=["string", "ragged"])
def test_applying_a_transform_to_non_numbers_is_a_config_error(
    transform: beacon.transforms.RewardTransform, bad: object
) -> None:
    # was numpy's bare ValueError ("could not convert string to float")
    with pytest.raises(ConfigError) as ei:
        transform.apply(bad)
    assert ei.value.field == "rewards"


@pytest.mark.parametrize("level", [0.2, 0.8], ids=["all losses", "all wins"])
def test_a_judge_log_without_a_win_or_a_loss_says_so_in_wins(level: float) -> None:
    # the judge family fits on r > 1/2; "0 successes in 6 rewards" did not say that a
    # probability of 0.4 counts as a loss
    rng = np.random.default_rng(2)
    probs = np.clip(level + rng.uniform(-0.1, 0.1, size=(3, 2)), 0.0, 1.0)
    with pytest.raises(ConfigError) as ei:
        fit_reward_model(probs, "judge")
    assert ei.value.field == "rewards" and "wins (r > 0.5)" in str(ei.value)
    assert "losses" in str(ei.value)


def _reference_groups(xs: np.ndarray) -> np.ndarray:
    """The greedy tie grouping of _merge_near_ties, one numpy tolerance call per value."""
    span = float(xs[-1] - xs[0])
    starts = np.zeros(xs.size, dtype=bool)
    starts[0] = True
    first = xs[0]
    for i in range(1, xs.size):
        if xs[i] - first > float(_tie_tolerance(first, xs[i], span)):
            starts[i] = True
            first = xs[i]
    return xs[starts]


def test_merging_near_ties_groups_as_the_tolerance_says() -> None:
    # the merge loop runs in plain floats (8 s -> ~1 s on 1.6M rewards); it must make the
    # same groups as the numpy tolerance, around zero, for negatives and at tiny magnitudes
    rng = np.random.default_rng(5)
    base = np.concatenate([rng.normal(0, 1, 300), [0.0, 1e-300, -1e-300, 5e-324, -3.0]])
    near = base * (1 + rng.choice([0.0, 3e-13, 2e-12, -5e-13], size=base.size))
    xs = np.unique(np.concatenate([base, near, base + 1e-291]))
    counts = np.ones(xs.size, dtype=np.int64)
    got, got_counts = _merge_near_ties(xs, counts)
    ref = _reference_groups(xs)
    assert got.size < xs.size  # the case exercises the merge
    np.testing.assert_array_equal(got, ref)
    assert int(got_counts.sum()) == xs.size


def test_fit_config_with_an_unknown_field_is_a_typed_error_naming_it() -> None:
    from beacon.errors import ConfigTypeError
    from beacon.fitting import fit_reward_model

    rng = np.random.default_rng(4)
    fit = fit_reward_model(rng.normal(size=(30, 6)) + rng.normal(size=(30, 1)))
    # before: Python's TypeError "unexpected keyword argument 'k0'"
    with pytest.raises(ConfigTypeError) as ei:
        fit.config(cost=0.1, k0=3)
    assert ei.value.field == "k0" and ei.value.value == 3 and "cost" in str(ei.value)
    assert fit.config(cost=0.1, horizon=8).horizon == 8


def test_gaussianize_apply_scalar_is_bit_for_bit_apply() -> None:
    from beacon.fitting import GaussianizeTransform

    rng = np.random.default_rng(9)
    t = GaussianizeTransform.fit(np.round(rng.gamma(2.0, 2.0, size=(60, 8)), 1))
    knots = t.x
    probes = np.concatenate([
        knots, np.nextafter(knots, -np.inf), np.nextafter(knots, np.inf),
        rng.uniform(knots[0] - 5, knots[-1] + 5, size=2000), [-1e6, 1e6, -0.0],
    ])
    whole = t.apply(probes)
    one = np.array([t.apply_scalar(float(v)) for v in probes])
    assert np.array_equal(whole.view(np.uint64), one.view(np.uint64))
