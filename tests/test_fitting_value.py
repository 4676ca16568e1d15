"""Fitted priors in use: expected value against Jeffreys, and the ``judge`` family."""

from __future__ import annotations

import math

import numpy as np
import pytest

import beacon
from beacon.errors import ConfigError, RewardError
from beacon.families.judge import WIN_THRESHOLD
from beacon.fitting import fit_prior, fit_reward_model


def simulate_nig(rng: np.random.Generator, prompts: int, samples: int,
                 truth: tuple[float, float, float, float]) -> np.ndarray:
    mu0, nu0, alpha0, beta0 = truth
    sigma = 1.0 / np.sqrt(rng.gamma(alpha0, 1.0 / beta0, prompts))
    mu = rng.normal(mu0, sigma / math.sqrt(nu0))
    return rng.normal(mu[:, None], sigma[:, None], (prompts, samples))


@pytest.mark.parametrize("cost", [0.1, 0.3])
def test_fitted_prior_beats_jeffreys_in_expected_value_on_a_simulated_hierarchy(
    cost: float,
) -> None:
    """E[z_K - K c] on fresh prompts of the population the prior was fitted on (raw units)."""
    rng = np.random.default_rng(5)
    truth = (0.0, 0.5, 3.0, 2.0)
    prior = fit_prior(simulate_nig(rng, 1000, 10, truth))
    test = simulate_nig(rng, 3000, 10, truth)
    fitted = beacon.replay(test, beacon.BeaconConfig(cost=cost, horizon=10, prior=prior))
    jeffreys = beacon.replay(test, beacon.BeaconConfig(cost=cost, horizon=10))
    diff = (fitted.best_reward - cost * fitted.n_samples) - (
        jeffreys.best_reward - cost * jeffreys.n_samples
    )
    se = diff.std(ddof=1) / math.sqrt(diff.size)
    assert diff.mean() > 3 * se
    assert fitted.n_samples.min() >= 1  # never fewer than one sample before answering


def test_fitted_prior_replay_matches_the_stopper() -> None:
    rng = np.random.default_rng(6)
    x = simulate_nig(rng, 200, 8, (1.0, 1.0, 2.5, 1.5))
    cfg = fit_reward_model(x[:150]).config(cost=0.15, horizon=8)
    res = beacon.replay(x[150:], cfg)
    for i, row in enumerate(x[150:]):
        s = beacon.Stopper(cfg)
        pos = 0
        while isinstance(d := s.next_decision(), beacon.Draw):
            s.observe(row[pos:pos + d.count])
            pos += d.count
        assert res.n_samples[i] == s.k
        assert res.chosen[i] == s.best_index


# --- the judge family -------------------------------------------------------------------------
def test_judge_family_is_registered_and_takes_a_beta_prior() -> None:
    assert "judge" in beacon.available_families()
    cfg = beacon.BeaconConfig(family="judge", prior=beacon.BetaPrior(0.3, 0.6), cost=0.05,
                              horizon=11)
    assert cfg.k0 == 1
    with pytest.raises(ConfigError):
        beacon.BeaconConfig(family="judge", prior=beacon.NIGPrior(0, 1, 2, 1), horizon=11)


def test_judge_stops_at_the_first_win_and_returns_the_best_raw_reward() -> None:
    cfg = beacon.BeaconConfig(family="judge", cost=0.01, horizon=10)
    s = beacon.Stopper(cfg)
    rewards = iter([0.01, 0.3, 0.2, 0.97, 0.99])
    while isinstance(d := s.next_decision(), beacon.Draw):
        s.observe([next(rewards) for _ in range(d.count)])
    assert s.next_decision() == beacon.Stop("absorbed")
    assert s.k == 4 and s.best_reward == 0.97 and s.best_index == 3
    s2 = beacon.Stopper(cfg)
    s2.next_decision()
    with pytest.raises(RewardError) as ei:
        s2.observe(1.5)
    assert ei.value.position == 0


def test_judge_decisions_equal_bernoulli_on_win_indicators() -> None:
    rng = np.random.default_rng(7)
    theta = rng.beta(0.3, 0.6, 300)
    wins = rng.random((300, 11)) < theta[:, None]
    r = np.where(wins, rng.uniform(0.6, 1.0, wins.shape), rng.uniform(0.0, 0.4, wins.shape))
    prior = fit_prior(r, "judge")
    assert isinstance(prior, beacon.BetaPrior)
    assert prior == fit_prior((r > WIN_THRESHOLD).astype(float), "bernoulli")
    for c in (0.02, 0.1, 0.3):
        j = beacon.replay(r, beacon.BeaconConfig(family="judge", prior=prior, cost=c, horizon=11))
        b = beacon.replay((r > WIN_THRESHOLD).astype(float),
                          beacon.BeaconConfig(family="bernoulli", prior=prior, cost=c, horizon=11))
        np.testing.assert_array_equal(j.n_samples, b.n_samples)
        used = np.arange(11)[None, :] < j.n_samples[:, None]
        np.testing.assert_array_equal(j.best_reward, np.where(used, r, -np.inf).max(axis=1))


def test_judge_fit_needs_probabilities_and_the_fit_result_keeps_the_family() -> None:
    rng = np.random.default_rng(8)
    r = rng.beta(0.3, 0.3, (50, 6))
    res = fit_reward_model(r, "judge")
    assert res.family == "judge" and res.config(cost=0.05, horizon=6).family == "judge"
    bad = r.copy()
    bad[3, 2] = 1.2
    with pytest.raises(RewardError) as ei:
        fit_prior(bad, "judge")
    assert ei.value.position == (3, 2)
    with pytest.raises(ConfigError) as e2:
        fit_prior(r, "judge", transform="logit")
    assert e2.value.field == "transform"
