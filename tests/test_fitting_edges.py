"""Fitting and loading priors on awkward logs and hand-edited files: typed errors, no garbage."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import beacon
from beacon.cli import app
from beacon.errors import ConfigError, RewardError
from beacon.fitting import FitResult, GaussianizeTransform, fit_reward_model, load_fit

runner = CliRunner()


def _pooled_within_sd(x: np.ndarray) -> float:
    dev = x - np.nanmean(x, axis=1, keepdims=True)
    dof = float(np.sum(np.sum(~np.isnan(x), axis=1) - 1))
    return math.sqrt(float(np.nansum(dev * dev)) / dof)


def _small_log_with_a_constant_prompt() -> np.ndarray:
    # judge scores in steps of 0.2; a judge that gives one prompt the same score every time
    rng = np.random.default_rng(7)
    x = np.round(rng.normal(rng.normal(6.0, 1.5, (5, 1)), 1.2, (5, 10)) * 5) / 5
    x[0] = x[0, 0]
    return x


def test_a_constant_prompt_in_a_small_log_does_not_collapse_the_fitted_scale() -> None:
    # Was: the marginal likelihood is unbounded at mu0 = the constant prompt's score as
    # beta0 -> 0, and the fit returned that spike: beta0 ~ 1e-10, within_scale ~ 1e-5 of a
    # log whose rewards spread by ~1.
    x = _small_log_with_a_constant_prompt()
    fit = fit_reward_model(x)
    sd = _pooled_within_sd(x)
    assert 0.2 * sd < fit.within_scale < 5.0 * sd
    assert fit.fitted_on["method"] == "moments" and "identical" in fit.fitted_on["note"]
    assert fit.prior == fit_reward_model(x, method="moments").prior
    # the same through the gaussianize transform, and with the identical rewards off by
    # float noise only
    g = fit_reward_model(x, transform="gaussianize")
    gx = g.transform.apply(x) if g.transform is not None else x
    assert 0.2 * _pooled_within_sd(gx) < g.within_scale
    y = x.copy()
    y[0] += np.arange(10) * 1e-15
    assert 0.2 * sd < fit_reward_model(y).within_scale < 5.0 * sd
    # a log where the marginal fit is well defined keeps it
    z = x[1:]
    assert fit_reward_model(z).fitted_on["method"] == "marginal"
    assert "identical" not in fit_reward_model(z).fitted_on.get("note", "")  # no fallback note


def test_fit_prior_cli_says_when_it_fell_back_to_moments(tmp_path: Path) -> None:
    x = _small_log_with_a_constant_prompt()
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"id": str(i), "rewards": [float(v) for v in row]}) + "\n"
                           for i, row in enumerate(x)))
    out = tmp_path / "prior.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "note:" in res.output and "moments" in res.output
    assert load_fit(out).fitted_on["method"] == "moments"


def test_a_transformed_reward_beyond_the_model_range_names_the_raw_reward() -> None:
    # Was: ConfigError "max |reward| 9.19e+199 ... divide the rewards" about the transform's
    # output, and "outside the domain" with the value -inf/inf instead of the reward.
    g = GaussianizeTransform.fit([1.0, 2.0, 3.0, 4.0, 5.0])
    x = [[1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 1e200, 5.0]]
    with pytest.raises(RewardError) as ei:
        fit_reward_model(x, transform=g)
    assert ei.value.position == (1, 2) and ei.value.value == 1e200
    assert "gaussianize" in ei.value.reason
    steep = GaussianizeTransform([0.0, 1.0], [0.0, 1.0], 1e300, 1e300)
    with pytest.raises(RewardError) as ei:
        fit_reward_model([[0.5, 0.2, 0.1], [0.3, 1e10, 0.4]], transform=steep)
    assert ei.value.position == (1, 1) and ei.value.value == 1e10


@pytest.mark.parametrize("family", ["bernoulli", "judge"])
def test_a_huge_reward_for_a_beta_family_is_a_reward_error_without_numpy_warnings(
    family: str,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: RuntimeWarning overflow encountered in square
        with pytest.raises(RewardError) as ei:
            fit_reward_model([[0.0, 1.0, 0.0, 1e200], [1.0, 0.0, 0.0, 1.0]], family)
    assert ei.value.position == (0, 3) and ei.value.value == 1e200


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "prior.json"
    p.write_text(json.dumps(doc))
    return p


NIG = {"family": "normal", "mu0": 0.0, "nu0": 1.0, "alpha0": 2.0, "beta0": 1.0}


def test_a_misspelt_top_level_key_is_not_silently_dropped(tmp_path: Path) -> None:
    # Was: {"prior": ..., "transfrom": {...}} loaded without the transform, a prior fitted on
    # transformed rewards then running on raw ones.
    tr = GaussianizeTransform.fit([1.0, 2.0, 5.0]).to_dict()
    p = _write(tmp_path, {"prior": NIG, "transfrom": tr})
    with pytest.raises(ConfigError) as ei:
        load_fit(p)
    assert ei.value.field == "transfrom"
    for not_an_object in ([], "", 0):
        with pytest.raises(ConfigError) as ei:
            load_fit(_write(tmp_path, {"prior": NIG, "fitted_on": not_an_object}))
        assert ei.value.field == "fitted_on"
    ok = load_fit(_write(tmp_path, {"prior": NIG, "transform": tr, "fitted_on": {"me": 1}}))
    assert ok.transform == GaussianizeTransform.from_dict(tr)
    assert FitResult.from_dict(ok.to_dict()) == ok


@pytest.mark.parametrize("value", [None, [1, 2], "prior.json", 3])
def test_a_prior_entry_that_is_not_an_object_names_the_prior(
    tmp_path: Path, value: object
) -> None:
    # Was (load_prior): "invalid prior.prior=None: unknown field of a normal prior".
    p = _write(tmp_path, {"prior": value})
    for load in (beacon.load_prior, load_fit):
        with pytest.raises(ConfigError) as ei:
            load(p)
        assert ei.value.field == "prior" and ei.value.value == value


@pytest.mark.parametrize("prior", [
    {"mu0": 0.0, "nu0": 0.0, "alpha0": -0.5, "beta0": 0.0},  # Jeffreys: was -0.0
    {"mu0": 0.0, "nu0": 1.0, "alpha0": 0.0, "beta0": 1.0},  # was ZeroDivisionError
    {"mu0": 0.0, "nu0": 1.0, "alpha0": -0.25, "beta0": 1.0},  # was math domain error
])
def test_within_scale_of_a_prior_without_a_scale_is_a_config_error(
    tmp_path: Path, prior: dict[str, float]
) -> None:
    fit = load_fit(_write(tmp_path, {"prior": {"family": "normal", **prior}}))
    with pytest.raises(ConfigError) as ei:
        _ = fit.within_scale
    assert ei.value.field == "prior"


def test_config_refuses_to_replace_what_the_fit_fixes() -> None:
    fit = fit_reward_model([[1.0, 2.0, 3.0], [2.0, 3.0, 5.0], [0.0, 1.0, 1.5]])
    for key, value in (("transform", None), ("family", "normal"), ("prior", None)):
        with pytest.raises(ConfigError) as ei:  # was a bare TypeError (duplicate keyword)
            fit.config(cost=0.1, **{key: value})
        assert ei.value.field == key and isinstance(ei.value, TypeError)
    assert fit.config(cost=0.1, horizon=8).prior == fit.prior


def test_logit_of_one_out_of_range_reward_is_a_reward_error() -> None:
    from beacon.transforms import LogitTransform

    for bad in (2.0, -1.0):  # was IndexError from np.argwhere of a 0-d array
        with pytest.raises(RewardError) as ei:
            LogitTransform().apply(bad)
        assert ei.value.value == bad
        with pytest.raises(RewardError) as ei:
            LogitTransform().apply_scalar(bad, 4)
        assert ei.value.position == 4
    assert float(LogitTransform().apply(0.5)) == 0.0


def test_fit_prior_takes_identity_as_replay_does(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"id": str(i), "rewards": row}) + "\n" for i, row in
                           enumerate([[1.0, 2.0, 4.0], [2.0, 3.0, 3.5], [0.0, 2.5, 1.0]])))
    outs = []
    for spelling in ("identity", "none"):
        out = tmp_path / f"{spelling}.json"
        res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--transform", spelling])
        assert res.exit_code == 0, res.output
        outs.append(load_fit(out))
    assert outs[0].transform is None and outs[0].prior == outs[1].prior


def test_reward_lists_with_a_huge_int_or_strings_are_typed_errors() -> None:
    from beacon.fitting import reward_matrix

    with pytest.raises(RewardError) as ei:  # was OverflowError: int too large to convert
        reward_matrix([[1.0, 2.0], [3.0, 10**400]])
    assert ei.value.position == (1, 1)
    with pytest.raises(ConfigError) as ce:  # was parsed as the numbers 1..4
        reward_matrix([["1", "2"], ["3", "4"]])
    assert ce.value.field == "rewards[0]" and ce.value.value == ["1", "2"]
    assert reward_matrix([[True, 0], [np.int64(1), None]]).tolist()[0] == [1.0, 0.0]


def test_the_robust_fit_drops_a_reward_of_1e200_as_it_drops_one_of_1e6() -> None:
    # Was: ConfigError "max |reward| 1e+200 ... divide the rewards by a constant", the scale
    # check running before the fences that drop broken rewards.
    x = np.random.default_rng(1).normal(5.0, 1.0, (30, 6))
    fits = []
    for wild in (1e6, 1e200, -1e200):
        y = x.copy()
        y[4, 2] = wild
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fit = fit_reward_model(y)
        assert fit.fitted_on["dropped"] == 1
        fits.append(fit.prior)
    assert fits[0] == fits[1] == fits[2]
    y = x.copy()
    y[4, 2] = 1e200
    with pytest.raises(ConfigError, match="too large"):  # without the fences it is refused
        fit_reward_model(y, robust=False)
