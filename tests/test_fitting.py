"""Empirical-Bayes prior fitting: recovery on simulated hierarchies, errors, I/O."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import beacon
from beacon.errors import ConfigError, RewardError
from beacon.fitting import (
    FitResult,
    GaussianizeTransform,
    fit_prior,
    fit_reward_model,
    load_fit,
    nig_log_evidence,
    reward_matrix,
)
from beacon.priors import BetaPrior, NIGPrior, TransformNotLoadedWarning
from beacon.transforms import LogitTransform


def simulate_nig(
    rng: np.random.Generator, prompts: int, samples: int, mu0: float, nu0: float,
    alpha0: float, beta0: float,
) -> np.ndarray:
    """Rewards from the NIG hierarchy of beacon.fitting's docstring (prompts x samples)."""
    sigma = 1.0 / np.sqrt(rng.gamma(alpha0, 1.0 / beta0, prompts))
    mu = rng.normal(mu0, sigma / math.sqrt(nu0))
    return rng.normal(mu[:, None], sigma[:, None], (prompts, samples))


TRUTHS = [(1.0, 0.5, 4.0, 3.0), (-2.0, 2.0, 2.5, 0.5), (5.0, 0.1, 10.0, 20.0)]


def _close(fit: NIGPrior, truth: tuple[float, float, float, float], rel: float) -> None:
    mu0, nu0, alpha0, beta0 = truth
    sd_within = math.sqrt(beta0 / alpha0)
    assert abs(fit.mu0 - mu0) < 0.1 * sd_within / math.sqrt(nu0) + 0.05
    assert fit.nu0 == pytest.approx(nu0, rel=rel)
    assert fit.alpha0 == pytest.approx(alpha0, rel=rel)
    # beta0 and alpha0 are strongly correlated; the scale beta0/alpha0 is what is well identified.
    assert fit.beta0 / fit.alpha0 == pytest.approx(beta0 / alpha0, rel=rel / 2)


@pytest.mark.parametrize("truth", TRUTHS)
def test_marginal_likelihood_recovers_known_hyperparameters(truth: tuple[float, ...]) -> None:
    rng = np.random.default_rng(11)
    x = simulate_nig(rng, 3000, 8, *truth)
    fit = fit_prior(x)
    assert isinstance(fit, NIGPrior)
    _close(fit, truth, rel=0.15)  # type: ignore[arg-type]


def test_moments_recovers_when_fourth_moment_exists() -> None:
    rng = np.random.default_rng(12)
    truth = (1.0, 0.5, 6.0, 5.0)
    fit = fit_prior(simulate_nig(rng, 4000, 8, *truth), method="moments")
    assert isinstance(fit, NIGPrior)
    _close(fit, truth, rel=0.3)


def test_fit_is_a_maximum_of_the_marginal_likelihood() -> None:
    rng = np.random.default_rng(13)
    x = simulate_nig(rng, 500, 6, 0.0, 1.0, 3.0, 2.0)
    p = fit_prior(x, robust=False)
    assert isinstance(p, NIGPrior)
    best = nig_log_evidence(x, p.mu0, p.nu0, p.alpha0, p.beta0).sum()
    for d_mu, f_nu, f_a, f_b in [(0.05, 1, 1, 1), (0, 1.1, 1, 1), (0, 0.9, 1, 1),
                                 (0, 1, 1.1, 1.1), (0, 1, 0.9, 0.9), (0, 1, 1, 1.05)]:
        other = nig_log_evidence(x, p.mu0 + d_mu, p.nu0 * f_nu, p.alpha0 * f_a, p.beta0 * f_b)
        assert best >= other.sum() - 1e-6


def test_log_evidence_matches_multivariate_t() -> None:
    from scipy.stats import multivariate_t

    r = np.array([[0.3, -1.2, 2.0, 0.7]])
    mu0, nu0, alpha0, beta0 = 0.5, 0.7, 2.2, 1.3
    k = r.shape[1]
    shape = beta0 / alpha0 * (np.eye(k) + np.ones((k, k)) / nu0)
    want = multivariate_t(loc=np.full(k, mu0), shape=shape, df=2 * alpha0).logpdf(r[0])
    got = nig_log_evidence(r, mu0, nu0, alpha0, beta0)[0]
    assert got == pytest.approx(want, rel=1e-10)
    # NaN entries are missing samples, not rewards.
    padded = np.array([[0.3, np.nan, -1.2, 2.0, np.nan, 0.7]])
    assert nig_log_evidence(padded, mu0, nu0, alpha0, beta0)[0] == pytest.approx(got, rel=1e-12)


def test_missing_samples_and_single_sample_prompts() -> None:
    rng = np.random.default_rng(14)
    truth = (1.0, 0.5, 4.0, 3.0)
    x = simulate_nig(rng, 3000, 8, *truth)
    x[rng.random(x.shape) < 0.4] = np.nan
    x[:500, 1:] = np.nan  # 500 prompts with at most one reward
    fit = fit_prior(x)
    assert isinstance(fit, NIGPrior)
    _close(fit, truth, rel=0.2)


def test_outliers_robust_fit_stays_close_and_plain_fit_does_not() -> None:
    rng = np.random.default_rng(15)
    truth = (1.0, 0.5, 4.0, 3.0)
    x = simulate_nig(rng, 2000, 8, *truth)
    bad = rng.random(x.shape) < 0.01
    x[bad] = np.where(rng.random(int(bad.sum())) < 0.5, 1000.0, -1000.0)
    robust = fit_reward_model(x)
    plain = fit_reward_model(x, robust=False)
    assert isinstance(robust.prior, NIGPrior) and isinstance(plain.prior, NIGPrior)
    assert robust.fitted_on["dropped"] >= 0.9 * bad.sum()
    assert robust.prior.alpha0 == pytest.approx(4.0, rel=0.25)
    assert plain.prior.alpha0 < 2.0


def test_clean_log_loses_almost_nothing_to_the_robust_fences() -> None:
    rng = np.random.default_rng(16)
    x = simulate_nig(rng, 2000, 8, 0.0, 1.0, 1.0, 1.0)  # very unequal per-prompt scales
    res = fit_reward_model(x)
    assert res.fitted_on["dropped"] <= 0.002 * x.size


def test_beta_binomial_recovers_known_hyperparameters() -> None:
    rng = np.random.default_rng(17)
    p = rng.beta(0.5, 3.0, 4000)
    x = (rng.random((4000, 6)) < p[:, None]).astype(float)
    x[rng.random(x.shape) < 0.2] = np.nan
    for method in ("marginal", "moments"):
        fit = fit_prior(x, "bernoulli", method=method)
        assert isinstance(fit, BetaPrior)
        assert fit.a0 == pytest.approx(0.5, rel=0.2)
        assert fit.b0 == pytest.approx(3.0, rel=0.2)
    assert beacon.BeaconConfig(family="bernoulli", prior=fit, cost=0.05).k0 == 1


def test_fitted_prior_goes_into_config_with_k0_one() -> None:
    rng = np.random.default_rng(18)
    x = simulate_nig(rng, 300, 6, 0.0, 1.0, 3.0, 2.0)
    prior = fit_prior(x)
    cfg = beacon.BeaconConfig(prior=prior, horizon=8)
    assert prior.k0 == 0 and cfg.k0 == 1
    res = fit_reward_model(x)
    cfg2 = res.config(cost=0.2, horizon=8)
    assert cfg2.prior == res.prior and cfg2.transform is None and cfg2.cost == 0.2


def test_transforms_fit_the_prior_on_transformed_rewards() -> None:
    rng = np.random.default_rng(19)
    p = rng.beta(0.7, 0.7, (300, 6))
    res = fit_reward_model(p, transform="logit")
    assert isinstance(res.transform, LogitTransform)
    direct = fit_prior(LogitTransform().apply(p))
    assert res.prior == direct
    g = fit_reward_model(p, transform="gaussianize")
    assert isinstance(g.transform, GaussianizeTransform)
    assert g.prior == fit_prior(g.transform.apply(p))
    # The pooled gaussianized log is ~N(0, 1): the prior's total variance is ~1.
    gp = g.prior
    assert isinstance(gp, NIGPrior)
    total_var = gp.beta0 / (gp.alpha0 - 1) * (1 + 1 / gp.nu0)
    assert total_var == pytest.approx(1.0, rel=0.25)


def test_within_scale_is_the_typical_within_prompt_sd() -> None:
    rng = np.random.default_rng(20)
    x = simulate_nig(rng, 3000, 8, 0.0, 1.0, 5.0, 4.0)
    res = fit_reward_model(x * 10.0)
    assert res.within_scale == pytest.approx(10.0 * math.sqrt(4.0 / 5.0), rel=0.1)


def test_json_round_trip_and_load(tmp_path: object) -> None:
    from pathlib import Path

    rng = np.random.default_rng(21)
    x = rng.beta(0.5, 0.5, (100, 5))
    res = fit_reward_model(x, transform="gaussianize")
    text = json.dumps(res.to_dict())
    back = FitResult.from_dict(json.loads(text))
    assert back.prior == res.prior and back.transform == res.transform
    path = Path(str(tmp_path)) / "prior.json"
    res.save(path)
    loaded = load_fit(path)
    assert loaded.prior == res.prior and loaded.transform == res.transform
    assert loaded.fitted_on["prompts"] == 100
    with pytest.warns(TransformNotLoadedWarning, match="load_fit"):
        assert beacon.load_prior(path) == res.prior  # the prior alone, in transformed units
    np.testing.assert_array_equal(loaded.transform.apply(x), res.transform.apply(x))  # type: ignore[union-attr]
    bare = Path(str(tmp_path)) / "bare.json"
    bare.write_text(json.dumps(res.prior.to_dict()))
    assert load_fit(bare).prior == res.prior and load_fit(bare).transform is None
    # saved by a Windows editor: UTF-8 with a byte order mark
    bom = Path(str(tmp_path)) / "bom.json"
    bom.write_text(path.read_text(encoding="utf-8"), encoding="utf-8-sig")
    with pytest.warns(TransformNotLoadedWarning):
        assert load_fit(bom).prior == res.prior and beacon.load_prior(bom) == res.prior
    # a prior fitted without a transform loads without a word
    plain = Path(str(tmp_path)) / "plain.json"
    plain.write_text(json.dumps({"prior": res.prior.to_dict(), "transform": None}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert beacon.load_prior(plain) == res.prior


def test_unreadable_prior_files_are_config_errors(tmp_path: object) -> None:
    # A directory or a file that is not UTF-8 used to escape as IsADirectoryError /
    # UnicodeDecodeError (the latter without naming the file).
    from pathlib import Path

    folder = Path(str(tmp_path))
    binary = folder / "prior.json"
    binary.write_bytes(b'\xff\xfe{"mu0": 0}')
    for load in (load_fit, beacon.load_prior):
        with pytest.raises(ConfigError) as ei:
            load(folder)
        assert ei.value.field == "prior" and ei.value.value == str(folder)
        assert "cannot read it" in str(ei.value)
        with pytest.raises(ConfigError) as ei:
            load(binary)
        assert ei.value.value == str(binary) and "not a UTF-8 text file" in str(ei.value)


def test_ragged_rows_are_padded() -> None:
    rows = [[1.0, 2.0, 3.5], [0.5, 1.5], [2.0, None, 4.0, 3.0], [1.0]]
    m = reward_matrix(rows)
    assert m.shape == (4, 4)
    assert np.isnan(m[1, 2:]).all() and np.isnan(m[2, 1]) and m[2, 3] == 3.0
    assert isinstance(fit_prior(rows), NIGPrior)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (np.ones(5), "rewards"),
        (np.ones((2, 2, 2)), "rewards"),
        (np.full((3, 4), np.nan), "rewards"),
        (np.array([[1.0, 2.0], [3.0, np.nan], [1.0, np.nan]]), "rewards"),
        (np.ones((4, 3)), "rewards"),
        ("not an array", "rewards"),
    ],
)
def test_bad_input_raises_config_error_naming_the_field(bad: object, field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        fit_prior(bad)
    assert ei.value.field == field
    assert field in str(ei.value)


def test_fit_is_scale_equivariant_and_unrepresentable_scales_are_config_errors() -> None:
    """NIG hyper-parameters map as (m mu0, nu0, alpha0, m^2 beta0) under rewards x m."""
    x = simulate_nig(np.random.default_rng(3), 60, 6, 0.5, 1.0, 3.0, 2.0)
    base = fit_prior(x)
    assert isinstance(base, NIGPrior)
    for m in (1e-130, 1e-20, 1e20, 1e130):
        p = fit_prior(x * m)
        assert isinstance(p, NIGPrior)
        assert p.mu0 == pytest.approx(base.mu0 * m, rel=1e-6)
        assert p.beta0 == pytest.approx(base.beta0 * m * m, rel=1e-6)
        assert (p.nu0, p.alpha0) == pytest.approx((base.nu0, base.alpha0), rel=1e-6)
    for m, what in ((1e145, "too large"), (1e300, "too large"), (1e-145, "too small"),
                    (1e-300, "too small")):
        with pytest.raises(ConfigError, match=what) as ei:
            fit_prior(x * m)
        assert ei.value.field == "rewards"
    # an all-missing prompt changes nothing
    y = x.copy()
    y[0] = np.nan
    assert fit_prior(y) == fit_prior(np.vstack([y, np.full(6, np.nan)]))


def test_infinite_reward_is_a_reward_error_at_its_position() -> None:
    x = np.array([[1.0, 2.0, 3.0], [1.0, np.inf, 0.0]])
    with pytest.raises(RewardError) as ei:
        fit_prior(x)
    assert ei.value.position == (1, 1)


def test_bernoulli_needs_binary_rewards_and_both_outcomes() -> None:
    with pytest.raises(RewardError) as ei:
        fit_prior(np.array([[0.0, 1.0], [0.5, 0.0], [1.0, 1.0]]), "bernoulli")
    assert ei.value.position == (1, 0)
    with pytest.raises(ConfigError):
        fit_prior(np.zeros((5, 4)), "bernoulli")
    with pytest.raises(ConfigError) as e2:
        fit_prior(np.zeros((5, 4)), "bernoulli", transform="logit")
    assert e2.value.field == "transform"


def test_bad_options() -> None:
    x = np.random.default_rng(0).normal(size=(10, 4))
    with pytest.raises(ConfigError) as e1:
        fit_prior(x, method="bogus")
    assert e1.value.field == "method"
    with pytest.raises(ConfigError) as e2:
        fit_prior(x, family="poisson")
    assert e2.value.field == "family"
    with pytest.raises(ConfigError) as e3:
        fit_prior(x, transform="gaussianize")  # the fitted transform would be lost
    assert e3.value.field == "transform"
    with pytest.raises(ConfigError) as e4:
        fit_prior(x, robust="yes")  # type: ignore[arg-type]
    assert e4.value.field == "robust"
    with pytest.raises(RewardError):
        fit_prior(x, transform="logit")  # outside [0, 1]
