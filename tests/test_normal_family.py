"""Normal–Inverse-Gamma sufficient statistics: O(1) updates equal the closed form."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as student_t

from beacon import BeaconConfig, NIGPrior
from beacon.families import get_family
from beacon.families.normal import SIGMA_FLOOR, NormalState

rewards_st = st.lists(
    st.floats(-50, 50, allow_nan=False, allow_infinity=False), min_size=3, max_size=40
)
priors_st = st.one_of(
    st.just(NIGPrior()),
    st.builds(
        NIGPrior,
        mu0=st.floats(-5, 5),
        nu0=st.floats(0.1, 10),
        alpha0=st.floats(0.6, 10),
        beta0=st.floats(0.01, 10),
    ),
)


def _closed_form(r: np.ndarray, p: NIGPrior) -> tuple[float, float, float, float]:
    """Posterior of eq. hyperamareters_update on the whole history, and sigma_k."""
    k = r.size
    rbar = r.mean()
    alpha = p.alpha0 + k / 2
    nu = p.nu0 + k
    mu = (p.nu0 * p.mu0 + k * rbar) / (p.nu0 + k)
    beta = (
        p.beta0 + ((r - rbar) ** 2).sum() / 2 + k * p.nu0 * (rbar - p.mu0) ** 2 / (2 * (p.nu0 + k))
    )
    sigma = math.sqrt((nu + 1) * beta / (nu * alpha))
    return mu, nu, alpha, sigma


def _run(rewards: list[float], cfg: BeaconConfig) -> list[NormalState]:
    fam = get_family("normal")
    st_ = fam.initial_state(cfg)
    out = []
    for r in rewards:
        st_ = fam.update(st_, r, cfg)
        out.append(st_)
    return out


@settings(max_examples=80, deadline=None)
@given(rewards=rewards_st, prior=priors_st)
def test_recursive_update_equals_closed_form(rewards: list[float], prior: NIGPrior) -> None:
    cfg = BeaconConfig(prior=prior, robust=False, horizon=64)
    states = _run(rewards, cfg)
    for k, s in enumerate(states, start=1):
        if k < max(prior.k0, 1):
            continue
        mu, nu, alpha, sigma = _closed_form(np.array(rewards[:k]), prior)
        assert s.k == k
        assert s.z == max(rewards[:k])
        assert s.mu == pytest.approx(mu, rel=1e-9, abs=1e-9)
        assert s.nu == pytest.approx(nu) and s.alpha == pytest.approx(alpha)
        assert s.sigma == pytest.approx(max(sigma, SIGMA_FLOOR), rel=1e-7, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(rewards=rewards_st, prior=priors_st)
def test_sigma_matches_the_papers_recursion(rewards: list[float], prior: NIGPrior) -> None:
    """eq. parameter_update: sigma_{k+1} = sqrt((1 - 1/(nu0+k+1)^2)/(2a0+k+1)) *
    sqrt((2a0+k) sigma_k^2 + (r - mu_k)^2)."""
    cfg = BeaconConfig(prior=prior, robust=False, horizon=64)
    states = _run(rewards, cfg)
    k_start = max(prior.k0, 1)
    for k in range(k_start, len(rewards)):
        s, nxt = states[k - 1], states[k]
        if s.sigma <= SIGMA_FLOOR * 10:
            continue
        r = rewards[k]
        lam = math.sqrt((1 - 1 / (prior.nu0 + k + 1) ** 2) / (2 * prior.alpha0 + k + 1))
        expected = lam * math.sqrt((2 * prior.alpha0 + k) * s.sigma**2 + (r - s.mu) ** 2)
        assert nxt.sigma == pytest.approx(max(expected, SIGMA_FLOOR), rel=1e-7)
        assert nxt.mu == pytest.approx(s.mu + (r - s.mu) / (prior.nu0 + k + 1), rel=1e-9, abs=1e-9)


def test_identical_rewards_floor_sigma() -> None:
    cfg = BeaconConfig(horizon=8)
    s = _run([1.0, 1.0, 1.0, 1.0], cfg)[-1]
    assert s.sigma == SIGMA_FLOOR
    assert math.isfinite((s.z - s.mu) / s.sigma)


def test_robust_update_winsorizes_low_outliers_only() -> None:
    cfg = BeaconConfig(horizon=16, robust=True, robust_quantile=0.01)
    base = [0.0, 1.0, 2.0, 1.5]
    before = _run(base, cfg)[-1]
    q = before.mu + before.sigma * student_t.ppf(0.01, before.dof)
    outlier = q - 1.0
    after = _run([*base, outlier], cfg)[-1]
    as_mean = _run([*base, before.mu], BeaconConfig(horizon=16, robust=False))[-1]
    # updated as if the reward were mu_k; z keeps the true maximum
    assert after.mu == pytest.approx(as_mean.mu) and after.sigma == pytest.approx(as_mean.sigma)
    assert after.z == 2.0
    # a reward just above the quantile is used as is
    kept = _run([*base, q + 1e-9], cfg)[-1]
    plain = _run([*base, q + 1e-9], BeaconConfig(horizon=16, robust=False))[-1]
    assert kept.mu == pytest.approx(plain.mu)
    # high rewards are never touched
    hi = _run([*base, 100.0], cfg)[-1]
    assert hi.z == 100.0 and hi.mu == pytest.approx(
        _run([*base, 100.0], BeaconConfig(robust=False))[-1].mu
    )


def test_robust_update_waits_for_a_proper_predictive() -> None:
    # under Jeffreys the predictive is undefined before k0 = 3: no winsorization there
    cfg = BeaconConfig(horizon=8)
    a = _run([0.0, 1.0, -1e6], cfg)[-1]
    b = _run([0.0, 1.0, -1e6], BeaconConfig(horizon=8, robust=False))[-1]
    assert a.mu == b.mu and a.beta == b.beta
