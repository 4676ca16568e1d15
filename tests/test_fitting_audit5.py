"""Fitting, transforms and evaluation as a notebook user calls them on their own logs.

Each test names the behaviour it replaces ("Was: ...").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from beacon import ConfigError
from beacon.evaluation import (
    LoggedRewards,
    evaluate_fixed,
    interpolate_fixed,
    logged_from_records,
    matched_difference,
    standardize,
)
from beacon.fitting import GaussianizeTransform, fit_prior, fit_reward_model, reward_matrix
from beacon.priors import BetaPrior, NIGPrior
from beacon.transforms import LogitTransform


# ---------------------------------------------------------------------------------------------
# the overflow-safe mean of the evaluation metrics
# ---------------------------------------------------------------------------------------------
def test_a_mean_of_finite_rewards_whose_partial_sums_are_inf_minus_inf_is_finite() -> None:
    # Was: numpy's pairwise sum of [1e308, 1e308, -1e308, -1e308, 0, 0, 0, 0] adds inf and
    # -inf, so mean_best_reward was NaN (only an inf mean was retaken in scaled units).
    best = np.array([1e308, 1e308, -1e308, -1e308, 0.0, 0.0, 0.0, 0.0])
    data = LoggedRewards(tuple("abcdefgh"), best[:, None])
    m = evaluate_fixed(data, 1, 0.1)[0]
    assert m.mean_best_reward == 0.0


def test_ordinary_means_are_numpys_own_and_near_limit_ones_stay_finite() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6))
    data = LoggedRewards(tuple(str(i) for i in range(40)), x)
    fixed = evaluate_fixed(data, 6, 0.1)
    for m in fixed:
        assert m.outcomes is not None
        assert m.mean_best_reward == float(np.mean(m.outcomes.best_reward))  # bit for bit
        assert m.mean_standardized_reward == float(np.mean(m.outcomes.standardized))
    md = matched_difference(fixed[2], fixed)
    assert md.per_prompt is not None and md.se is not None
    assert md.se == float(np.std(md.per_prompt, ddof=1)) / math.sqrt(40)
    assert interpolate_fixed(fixed, 2.5, "reward") == float(
        np.interp(2.5, [1.0 * n for n in range(1, 7)], [m.mean_best_reward for m in fixed])
    )
    big = LoggedRewards(tuple(str(i) for i in range(40)), x * 1.5e307)
    bfixed = evaluate_fixed(big, 6, 0.1)
    assert all(math.isfinite(m.mean_best_reward) for m in bfixed)
    assert math.isfinite(interpolate_fixed(bfixed, 3.3, "reward"))
    bmd = matched_difference(bfixed[0], bfixed, "reward")
    assert bmd.se is not None and math.isfinite(bmd.se)


# ---------------------------------------------------------------------------------------------
# small logs: the prior is capped at the information in the log
# ---------------------------------------------------------------------------------------------
def test_a_prior_fitted_on_two_prompts_is_not_worth_a_thousand_rewards() -> None:
    # Was: 2 prompts x 2 rewards gave nu0 = 1000 and alpha0 = 100 (the optimiser's bounds): a
    # prompt's mean known to sigma/31 and its scale to 5% from four numbers.
    x = np.array([[0.3, -0.4], [1.1, 0.2]])
    fit = fit_reward_model(x)
    p = fit.prior
    assert isinstance(p, NIGPrior)
    assert p.nu0 <= 4.0 and p.alpha0 <= 1.0  # the log's 4 rewards, 2 within-prompt dof
    assert fit.fitted_on["capped"] == {"nu0": 4.0, "alpha0": 1.0}
    assert "2 prompts (4 rewards)" in fit.fitted_on["note"]
    assert fit_prior(x) == p
    # the typical within-prompt scale stays of the order of the log's own
    pooled = math.sqrt(((x - x.mean(axis=1, keepdims=True)) ** 2).sum() / 2.0)
    assert 0.2 * pooled < fit.within_scale < 5.0 * pooled


def test_the_moments_fit_of_a_small_log_is_capped_too() -> None:
    x = np.array([[0.3, -0.4, 0.1], [1.1, 0.2, 0.6], [0.5, 0.4, 0.45]])
    p = fit_prior(x, method="moments")
    assert isinstance(p, NIGPrior)
    assert p.nu0 <= 9.0 and p.alpha0 <= 3.0


def test_a_beta_prior_fitted_on_four_outcomes_is_not_worth_thirteen_thousand() -> None:
    # Was: Beta(10000, 3334) from [[0, 1], [1, 1]], every prompt's success rate 0.75 +- 0.004.
    fit = fit_reward_model([[0, 1], [1, 1]], "bernoulli")
    p = fit.prior
    assert isinstance(p, BetaPrior)
    assert p.a0 + p.b0 <= 4.0 + 1e-9
    assert p.a0 / (p.a0 + p.b0) == pytest.approx(0.75, abs=0.01)  # the fitted mean is kept
    assert fit.fitted_on["capped"] == {"a0 + b0": 4.0}
    judge = fit_reward_model([[0.2, 0.7, 0.4], [0.9, 0.1, 0.3], [0.6, 0.6, 0.2]], "judge")
    assert isinstance(judge.prior, BetaPrior) and judge.prior.a0 + judge.prior.b0 <= 9.0 + 1e-9


def test_a_large_log_keeps_the_fixed_bounds_and_no_cap_note() -> None:
    rng = np.random.default_rng(2)
    fit = fit_reward_model(rng.normal(0.0, 1.0, (200, 8)))  # identical prompts: at the bounds
    p = fit.prior
    assert isinstance(p, NIGPrior) and p.nu0 == 1000.0 and p.alpha0 == 100.0
    assert "capped" not in fit.fitted_on and "note" not in fit.fitted_on


def test_prompts_with_identical_rewards_are_refused_not_fitted_on_float_noise() -> None:
    # Was: the mean of six equal rewards is rounded, so the within sum of squares was ~1e-32
    # instead of 0 and the fit returned beta0 ~ 1e-22 (a within-prompt scale of ~1e-11).
    rng = np.random.default_rng(1)
    x = np.repeat(rng.normal(size=(30, 1)), 6, axis=1)
    with pytest.raises(ConfigError, match="identical"):
        fit_reward_model(x)
    with pytest.raises(ConfigError, match="identical"):
        fit_reward_model(np.array([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7]]))


# ---------------------------------------------------------------------------------------------
# pandas-shaped inputs (duck-typed stand-ins: pandas is no dependency)
# ---------------------------------------------------------------------------------------------
class _NA:
    """pandas' ``pd.NA``: not a number, ``float()`` refuses it."""

    def __float__(self) -> float:
        raise TypeError("float() argument must be a string or a real number, not 'NAType'")


class _Frame:
    """A nullable-dtype DataFrame: ``np.asarray`` gives objects with NA; ``to_numpy`` maps NA."""

    def __init__(self, values: Any) -> None:
        self._v = np.asarray(values, dtype=np.float64)
        self.shape = self._v.shape
        self.dtypes = self._v.dtype  # a nullable Float64 column's kind, "f" (a Series' dtypes)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        out = self._v.astype(object)
        out[np.isnan(self._v)] = _NA()
        return out if dtype is None else out.astype(dtype)

    def to_numpy(self, dtype: Any = None, na_value: Any = None) -> Any:
        return np.where(np.isnan(self._v), na_value, self._v).astype(dtype)


class _ListColumn:
    """A Series whose cells are per-prompt lists of different lengths."""

    def __init__(self, rows: list[list[float]]) -> None:
        self._rows = rows

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        out = np.empty(len(self._rows), dtype=object)
        for i, r in enumerate(self._rows):
            out[i] = r
        return out

    def to_numpy(self, dtype: Any = None, na_value: Any = None) -> Any:
        raise ValueError("setting an array element with a sequence.")


def _log_with_gaps() -> np.ndarray:
    rng = np.random.default_rng(5)
    x = rng.normal(rng.normal(0.0, 1.0, (40, 1)), 0.7, (40, 6))
    x[rng.random(x.shape) < 0.15] = np.nan
    x[:, 0] = np.abs(x[:, 0])  # every prompt keeps a reward
    return x


def test_a_dataframe_with_missing_values_fits_like_its_nan_array() -> None:
    # Was: a DataFrame is neither an ndarray nor a Sequence: ConfigError "must be a 2-D array"
    # carrying the repr of every reward; GaussianizeTransform.fit and the transforms' apply
    # refused its pd.NA.
    x = _log_with_gaps()
    frame = _Frame(x)
    assert fit_reward_model(frame).prior == fit_reward_model(x).prior
    g = fit_reward_model(frame, transform="gaussianize")
    assert g.transform == GaussianizeTransform.fit(x)
    assert GaussianizeTransform.fit(frame) == GaussianizeTransform.fit(x)
    probs = 1.0 / (1.0 + np.exp(-x))
    np.testing.assert_array_equal(
        LogitTransform().apply(_Frame(probs)), LogitTransform().apply(probs)
    )
    np.testing.assert_array_equal(standardize(frame), standardize(x))
    np.testing.assert_array_equal(
        LoggedRewards(tuple(str(i) for i in range(40)), frame).rewards,
        LoggedRewards(tuple(str(i) for i in range(40)), x).rewards,
    )


def test_a_column_of_per_prompt_lists_is_a_ragged_log() -> None:
    rows = [[1.0, 2.0, 3.0], [2.5, 1.0], [0.3, 0.1, 0.9, 1.7], [4.0, 3.5, 3.0]]
    np.testing.assert_array_equal(reward_matrix(_ListColumn(rows)), reward_matrix(rows))
    assert fit_prior(_ListColumn(rows)) == fit_prior(rows)


class _Opaque:
    """Something that is no log, with a repr as long as a big DataFrame's."""

    def __repr__(self) -> str:
        return "0.123 0.456\n" * 2000


def test_an_unknown_object_is_named_by_its_type_not_its_repr() -> None:
    # Was: the error message carried the object's whole repr.
    with pytest.raises(ConfigError, match="_Opaque object") as err:
        reward_matrix(_Opaque())
    assert "0.456" not in str(err.value)


def test_ragged_lists_given_to_logged_rewards_are_a_config_error() -> None:
    # Was: numpy's bare ValueError "setting an array element with a sequence".
    with pytest.raises(ConfigError, match="rewards"):
        LoggedRewards(("a", "b"), [[1.0], [2.0, 3.0]])


def test_records_built_from_a_dataframe_are_read() -> None:
    # Was: a numpy integer id (a pandas id column) was "must be a string or an integer", and a
    # Series of rewards (a DataFrame row) "must be a JSON list".
    data = logged_from_records(
        [
            {"id": np.int64(7), "rewards": [1.0, 2.0]},
            {
                "id": "b",
                "rewards": _Frame([3.0, np.nan, 1.0]),
                "correct": _Frame([1.0, np.nan, 0.0]),
            },
        ]
    )
    assert data.ids == ("7", "b")
    np.testing.assert_array_equal(data.rewards, [[1.0, 2.0], [3.0, 1.0]])
    assert data.correct is not None
    np.testing.assert_array_equal(data.correct, [[np.nan, np.nan], [1.0, 0.0]])
    with pytest.raises(ConfigError, match="id"):
        logged_from_records([{"id": np.bool_(True), "rewards": [1.0]}])


def test_real_pandas_frames_when_pandas_is_installed() -> None:
    pd = pytest.importorskip("pandas")
    x = _log_with_gaps()
    df = pd.DataFrame(x).astype("Float64")
    assert fit_reward_model(df).prior == fit_reward_model(x).prior
    col = pd.Series([[1.0, 2.0, 3.0], [2.5, 1.0], [0.3, 0.1, 0.9]])
    np.testing.assert_array_equal(reward_matrix(col), reward_matrix(list(col)))


def test_a_masked_reward_is_missing_in_a_transform_too() -> None:
    # Was: apply() read a masked entry's hidden value: the logit transform raised a
    # RewardError about it, gaussianize returned a number for it (fitting treats it as missing).
    m = np.ma.masked_array([[0.2, 5.0, 0.7]], mask=[[0, 1, 0]])
    filled = np.array([[0.2, np.nan, 0.7]])
    np.testing.assert_array_equal(LogitTransform().apply(m), LogitTransform().apply(filled))
    g = GaussianizeTransform.fit([0.1, 0.5, 0.9])
    np.testing.assert_array_equal(g.apply(m), g.apply(filled))
