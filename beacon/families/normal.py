"""The ``normal`` family: Normal–Inverse-Gamma learning and the Universal Index Policy.

State after k rewards (paper, appendix "Sufficient Statistics", eq. ``parameter_update``): the NIG
posterior hyper-parameters (mu_k, nu_k, alpha_k, beta_k) of eq. ``hyperamareters_update`` plus
z_k = max reward. The predictive of the next reward is Student-t with 2 alpha_k = 2 alpha0 + k
degrees of freedom, location mu_k and scale

    sigma_k = sqrt((nu_k + 1) beta_k / (nu_k alpha_k)),

floored at 1e-6 so identical rewards never divide by zero. The O(1) update

    mu_{k+1}   = mu_k + (r - mu_k) / (nu_k + 1)
    beta_{k+1} = beta_k + nu_k (r - mu_k)^2 / (2 (nu_k + 1))

is algebraically the paper's recursion for sigma_{k+1} (tested against both it and the closed
form on the whole history). Carrying (nu, alpha, beta) rather than sigma keeps the update valid
before k0, where sigma is undefined under Jeffreys' prior.

Decision (Theorem ``thm:optimal_policy``, eq. ``UIP``): continue iff
h_{n,k}((z_k - mu_k) / sigma_k) > c / sigma_k.

Robust update (appendix "Robust Updating Formula"): once the predictive is proper (k >= k0), a
reward below its ``robust_quantile`` quantile mu_k + sigma_k t_{2 alpha_k}^{-1}(q) updates
(mu, beta) as if it were mu_k; z still tracks the true maximum.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from beacon.errors import ConfigError
from beacon.families import register_family
from beacon.families.base import Decision, RewardFamily
from beacon.priors import NIGPrior

if TYPE_CHECKING:
    from beacon.config import BeaconConfig

__all__ = ["SIGMA_FLOOR", "NormalFamily", "NormalState", "predictive_quantile"]

SIGMA_FLOOR = 1e-6


def _scale(k: int, k0: int, nu: float, alpha: float, beta: float) -> float:
    """Predictive scale sqrt((nu_k + 1) beta_k / (nu_k alpha_k)), floored; NaN before k0."""
    if k < k0 or nu <= 0 or alpha <= 0:
        return math.nan
    return max(SIGMA_FLOOR, math.sqrt((nu + 1.0) * beta / (nu * alpha)))


class NormalState(NamedTuple):
    """Sufficient statistics (k, z, mu_k, nu_k, alpha_k, beta_k), k0 of the prior, and sigma_k.

    ``sigma`` is derived from the others (computed once per update, since every decision and
    trace record reads it).
    """

    k: int
    z: float
    mu: float
    nu: float
    alpha: float
    beta: float
    k0: int
    sigma: float

    @property
    def dof(self) -> float:
        """Degrees of freedom 2 alpha_k = 2 alpha0 + k of the predictive Student-t."""
        return 2.0 * self.alpha


@lru_cache(maxsize=256)
def _bound_lookup(n: int, alpha0: float, nu0: float) -> tuple[Any, tuple[Any, ...]]:
    """The numba scalar lookup and the table's arrays for (n, alpha0, nu0), resolved once.

    The same ``h_lookup`` serves :meth:`HTable.h` and the replay kernel, so the Stopper and
    :func:`beacon.replay` see bit-identical h values. Rows k are valid by construction
    (k0 <= k < n is guaranteed by the Stopper).
    """
    from beacon._kernels.tables import h_lookup
    from beacon.index import get_table

    return h_lookup, tuple(get_table(n, alpha0, nu0).lookup_arrays())


@lru_cache(maxsize=4096)
def predictive_quantile(dof: float, q: float) -> float:
    """Standard Student-t quantile t_dof^{-1}(q) (cached: dof takes few values per config)."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, dof))


@register_family("normal")
class NormalFamily(RewardFamily):
    """Normal rewards with unknown mean and variance under a NIG prior."""

    def default_prior(self) -> NIGPrior:
        return NIGPrior.jeffreys()

    def check_prior(self, prior: Any) -> None:
        if not isinstance(prior, NIGPrior):
            raise ConfigError("prior", prior, "the normal family needs an NIGPrior")

    def check_config(self, cfg: BeaconConfig) -> None:
        # The decision needs the h-table of (horizon, alpha0, nu0): reject what it cannot build
        # now, with a ConfigError naming the field, rather than at the first decision.
        from beacon.index.build import validate_table_args

        p = cfg.resolved_prior
        assert isinstance(p, NIGPrior)
        try:
            validate_table_args(cfg.horizon, p.alpha0, p.nu0)
        except ConfigError as exc:
            field = {"n": "horizon"}.get(exc.field, f"prior.{exc.field}")
            raise ConfigError(field, exc.value, exc.reason) from exc

    def initial_state(self, cfg: BeaconConfig) -> NormalState:
        p = cfg.resolved_prior
        assert isinstance(p, NIGPrior)
        sigma = _scale(0, p.k0, p.nu0, p.alpha0, p.beta0)
        return NormalState(0, -math.inf, p.mu0, p.nu0, p.alpha0, p.beta0, p.k0, sigma)

    def update(self, state: NormalState, reward: float, cfg: BeaconConfig) -> NormalState:
        r_model = reward
        if cfg.robust and state.k >= state.k0 and state.alpha > 0 and state.nu > 0:
            q = state.mu + state.sigma * predictive_quantile(state.dof, cfg.robust_quantile)
            if reward < q:
                r_model = state.mu
        d = r_model - state.mu
        nu1 = state.nu + 1.0
        alpha1 = state.alpha + 0.5
        beta1 = state.beta + state.nu * d * d / (2.0 * nu1)
        k1 = state.k + 1
        return NormalState(
            k1,
            max(state.z, reward),
            state.mu + d / nu1,
            nu1,
            alpha1,
            beta1,
            state.k0,
            _scale(k1, state.k0, nu1, alpha1, beta1),
        )

    def decide(self, state: NormalState, cfg: BeaconConfig) -> Decision:
        p = cfg.resolved_prior
        assert isinstance(p, NIGPrior)
        lookup, arrays = _bound_lookup(cfg.horizon, p.alpha0, p.nu0)
        sigma = state.sigma
        zhat = (state.z - state.mu) / sigma
        h = float(lookup(*arrays, state.k, zhat))
        threshold = cfg.cost / sigma
        if h > threshold:
            return Decision(True, None, zhat, h, threshold)
        return Decision(False, "index", zhat, h, threshold)
