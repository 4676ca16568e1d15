"""Normal–Inverse-Gamma sufficient statistics: O(1) updates equal the closed form."""

import math
from fractions import Fraction

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


# --- every row of the paper's Table table_k0, the robust rule and the floor, by hypothesis ------

# Priors reaching every row of Table table_k0: 2 alpha0 = -1, in (-1, 0], in (0, 1] and > 1;
# nu0 = 0 or > 0; beta0 = 0 or > 0.
any_prior_st = st.builds(
    NIGPrior,
    mu0=st.floats(-5, 5),
    nu0=st.one_of(st.just(0.0), st.floats(0.05, 10)),
    alpha0=st.one_of(st.sampled_from([-0.5, -0.25, 0.0, 0.25, 0.5, 1.0]), st.floats(-0.5, 10)),
    beta0=st.one_of(st.just(0.0), st.floats(0.01, 10)),
)


def _k0_from_first_principles(p: NIGPrior) -> int:
    """Least k with a proper predictive that has a mean: nu_k > 0, 2 alpha_k = 2 alpha0 + k > 1
    and beta_k > 0 (beta_k > 0 needs beta0 > 0, or one reward against a proper prior mean
    (nu0 > 0), or two rewards (a sample variance)). Independent of the table's case analysis."""
    two_a0 = 2 * Fraction(p.alpha0)  # exact: 2 alpha0 + 1 > 1 for a tiny alpha0 > 0
    for k in range(10):
        beta_pos = p.beta0 > 0 or (p.nu0 > 0 and k >= 1) or k >= 2
        if p.nu0 + k > 0 and two_a0 + k > 1 and beta_pos:
            return k
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("prior", "k0"),
    [  # one prior per row of the paper's Table table_k0, in its order
        (NIGPrior(0.0, 1.0, 1.0, 1.0), 0),
        (NIGPrior(0.0, 1.0, 0.5, 0.0), 1),
        (NIGPrior(0.0, 1.0, 2.0, 0.0), 1),
        (NIGPrior(0.0, 0.0, 0.3, 1.0), 1),
        (NIGPrior(0.0, 0.0, 0.3, 0.0), 2),
        (NIGPrior(0.0, 2.0, -0.2, 1.0), 2),
        (NIGPrior(0.0, 2.0, -0.5, 1.0), 3),
        (NIGPrior(), 3),
    ],
)
def test_k0_rows_of_the_papers_table(prior: NIGPrior, k0: int) -> None:
    assert prior.k0 == k0 == _k0_from_first_principles(prior)
    assert BeaconConfig(prior=prior, horizon=8).k0 == max(k0, 1)


@settings(max_examples=200, deadline=None)
@given(prior=any_prior_st)
def test_k0_is_the_first_proper_predictive(prior: NIGPrior) -> None:
    assert prior.k0 == _k0_from_first_principles(prior)


@settings(max_examples=100, deadline=None)
@given(rewards=rewards_st, prior=any_prior_st)
def test_o1_update_equals_closed_form_for_every_k0(rewards: list[float], prior: NIGPrior) -> None:
    """(k, z, mu, nu, alpha, beta) after every reward equal eq. hyperamareters_update on the
    whole history; sigma is that of the closed form (floored) from k0 on, undefined before."""
    cfg = BeaconConfig(prior=prior, robust=False, horizon=64)
    states = _run(rewards, cfg)
    for k, s in enumerate(states, start=1):
        r = np.array(rewards[:k])
        rbar = r.mean()
        mu = (prior.nu0 * prior.mu0 + k * rbar) / (prior.nu0 + k)
        beta = (
            prior.beta0
            + ((r - rbar) ** 2).sum() / 2
            + k * prior.nu0 * (rbar - prior.mu0) ** 2 / (2 * (prior.nu0 + k))
        )
        assert (s.k, s.z, s.k0) == (k, r.max(), prior.k0)
        assert s.mu == pytest.approx(mu, rel=1e-9, abs=1e-9)
        assert s.nu == pytest.approx(prior.nu0 + k, rel=1e-12)
        assert s.alpha == pytest.approx(prior.alpha0 + k / 2, rel=1e-12, abs=1e-12)
        assert s.beta == pytest.approx(beta, rel=1e-8, abs=1e-8)
        if k < prior.k0:
            assert math.isnan(s.sigma)
        else:
            sigma = math.sqrt(
                (prior.nu0 + k + 1) * beta / ((prior.nu0 + k) * (prior.alpha0 + k / 2))
            )
            assert s.sigma == pytest.approx(max(sigma, SIGMA_FLOOR), rel=1e-7, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(
    prior=any_prior_st,
    history=st.lists(st.floats(-10, 10), min_size=0, max_size=12),
    q=st.sampled_from([0.01, 0.05, 0.2, 0.45]),
    where=st.sampled_from(["below", "at", "above"]),
    gap=st.one_of(st.floats(1e-9, 1e-3), st.floats(1e-3, 20)),
)
def test_robust_update_by_hypothesis(
    prior: NIGPrior, history: list[float], q: float, where: str, gap: float
) -> None:
    """One reward after any history: below mu_k + sigma_k t_{2 alpha0 + k}^{-1}(q) (the
    predictive before it) it updates (mu, nu, alpha, beta, sigma) exactly as the reward mu_k
    would, otherwise as itself; before k0 never; z is always the true maximum."""
    robust = BeaconConfig(prior=prior, robust=True, robust_quantile=q, horizon=64)
    plain = BeaconConfig(prior=prior, robust=False, horizon=64)
    fam = get_family("normal")
    s = _run(history, robust)[-1] if history else fam.initial_state(robust)
    if s.k >= prior.k0:
        # dof 2 alpha_k (= 2 alpha0 + k, summed as the update sums it: "at" is a tie to the bit)
        thr = s.mu + s.sigma * float(student_t.ppf(q, 2 * s.alpha))
        r = {"below": thr - gap * s.sigma, "at": thr, "above": thr + gap * s.sigma}[where]
        as_model = s.mu if where == "below" and r < thr else r
    else:
        r = (s.mu if math.isfinite(s.mu) else 0.0) - 1e3 * (1 + gap)  # far below anything
        as_model = r
    got = fam.update(s, r, robust)
    want = fam.update(s, as_model, plain)
    assert got.z == max(s.z, r)  # the true maximum, even when r is winsorized
    for f in ("k", "mu", "nu", "alpha", "beta"):
        assert getattr(got, f) == pytest.approx(getattr(want, f), rel=1e-12, abs=1e-12), f
    if not math.isnan(want.sigma):
        assert got.sigma == pytest.approx(want.sigma, rel=1e-12, abs=1e-15)
    if where == "below" and s.k >= prior.k0 and gap > 1e-6:
        # the winsorized update really differs from the plain one (the test can fail)
        raw = fam.update(s, r, plain)
        assert raw.beta > got.beta or raw.mu < got.mu


@settings(max_examples=100, deadline=None)
@given(
    prior=st.one_of(
        st.just(NIGPrior()),
        st.builds(
            NIGPrior,
            mu0=st.floats(-1, 1),
            nu0=st.just(1.0),
            alpha0=st.just(1.0),
            beta0=st.just(0.0),
        ),
    ),
    base=st.floats(-1e3, 1e3),
    jitter=st.lists(st.integers(-2, 2), min_size=3, max_size=20),
    eps=st.sampled_from([0.0, 1e-300, 1e-12, 1e-9]),
)
def test_sigma_never_below_the_floor(
    prior: NIGPrior, base: float, jitter: list[int], eps: float
) -> None:
    cfg = BeaconConfig(prior=prior, horizon=64)
    for s in _run([base + eps * j for j in jitter], cfg):
        if s.k >= prior.k0:
            assert s.sigma >= SIGMA_FLOOR
            assert math.isfinite((s.z - s.mu) / s.sigma)
