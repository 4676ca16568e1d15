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

Speed: :meth:`NormalFamily.bind` resolves everything that depends only on the config once
(:class:`NormalKernel`): the Student-t quantiles per dof, the cost, and :class:`HIndexRows`, a
pure-Python copy of the table's spline lookup that returns the same bits as the numba
``h_lookup`` (checked in tests/test_stopper_fastpath.py) without a numba dispatch per decision.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from beacon.errors import ConfigError
from beacon.families import register_family
from beacon.families.base import BoundFamily, Decision, DecisionTuple, RewardFamily
from beacon.priors import NIGPrior

if TYPE_CHECKING:
    from beacon.config import BeaconConfig
    from beacon.index.table import HTable

__all__ = [
    "SIGMA_FLOOR",
    "HIndexRows",
    "NormalFamily",
    "NormalKernel",
    "NormalState",
    "predictive_quantile",
]

SIGMA_FLOOR = 1e-6

_new_tuple = tuple.__new__  # builds a NamedTuple without the Python-level __new__ frame
_exp, _log, _sqrt, _asinh, _floor = math.exp, math.log, math.sqrt, math.asinh, math.floor
_NAN = math.nan


def _scale(k: int, k0: int, nu: float, alpha: float, beta: float) -> float:
    """Predictive scale sqrt((nu_k + 1) beta_k / (nu_k alpha_k)), floored; NaN before k0."""
    if k < k0 or nu <= 0 or alpha <= 0:
        return _NAN
    s = _sqrt((nu + 1.0) * beta / (nu * alpha))
    return s if s > SIGMA_FLOOR else SIGMA_FLOOR  # == max(SIGMA_FLOOR, s), NaN included


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


class HIndexRows:
    """``h_{n,k}(z)`` of one table in plain Python, bit-identical to the numba ``h_lookup``.

    Inside the grid ``zlo <= z <= zhi`` (docs/h_index.md, :mod:`beacon.index.table`):
    ``x = asinh(z / a)``, ``t = (x - x_lo) / dx``, ``j = clamp(floor(t), 0, N - 2)``,
    ``B = t - j``, ``A = 1 - B`` and the cubic spline of ``log h`` in ``x``

        log h = A y_j + B y_{j+1} + ((A^3 - A) m_j + (B^3 - B) m_{j+1}) dx^2 / 6;

    right of it the power tail ``h = exp(y_{N-1} + (1 - d) log(z / zhi))`` (Theorem
    ``h_properties``, d = row dof). Both are evaluated with the same float operations in the same
    order as ``beacon._kernels.tables._row_h``. Left of the grid (the myopic-gain asymptote,
    which needs the Student-t special functions) and for NaN, the numba kernel itself answers.
    """

    __slots__ = ("_dx", "_dx2_6", "_fallback", "_k_min", "_last", "_n_rows", "_rows", "_scale",
                 "_x_lo", "_zhi", "_zlo")  # fmt: skip

    def __init__(self, table: HTable) -> None:
        from beacon._kernels.tables import h_lookup

        args = tuple(table.lookup_arrays())
        x_lo, dx, scale, zlo, zhi, logh, m2, dof, k_min = args
        self._x_lo, self._dx, self._scale = float(x_lo), float(dx), float(scale)
        self._zlo, self._zhi, self._k_min = float(zlo), float(zhi), int(k_min)
        self._dx2_6 = self._dx * self._dx / 6.0
        self._last = int(logh.shape[1]) - 2
        self._rows = [
            (logh[r].tolist(), m2[r].tolist(), float(logh[r, -1]), 1.0 - float(dof[r]))
            for r in range(logh.shape[0])
        ]
        self._n_rows = len(self._rows)

        def fallback(k: int, z: float) -> float:
            return float(h_lookup(*args, k, z))

        self._fallback = fallback

    def __call__(self, k: int, z: float) -> float:
        """``h_{n,k}(z)``; NaN (from the kernel) when ``k`` has no row or ``z`` is NaN."""
        r = k - self._k_min
        if not 0 <= r < self._n_rows:
            return self._fallback(k, z)
        if self._zlo <= z <= self._zhi:
            y, m, _, _ = self._rows[r]
            t = (_asinh(z / self._scale) - self._x_lo) / self._dx
            j = _floor(t)
            if j < 0:
                j = 0
            elif j > self._last:
                j = self._last
            bb = t - j
            aa = 1.0 - bb
            v = aa * y[j] + bb * y[j + 1]
            v += ((aa * aa * aa - aa) * m[j] + (bb * bb * bb - bb) * m[j + 1]) * self._dx2_6
            return _exp(v)
        if z > self._zhi:
            _, _, y_end, one_minus_d = self._rows[r]
            return _exp(y_end + one_minus_d * _log(z / self._zhi))
        return self._fallback(k, z)


@lru_cache(maxsize=256)
def _h_rows(n: int, alpha0: float, nu0: float) -> HIndexRows:
    """The :class:`HIndexRows` of the table for (n, alpha0, nu0), built once."""
    from beacon.index import get_table

    return HIndexRows(get_table(n, alpha0, nu0))


class NormalKernel:
    """The normal family's update and decision for one config, its constants resolved once.

    ``update`` is the O(1) NIG update of eq. ``parameter_update`` with the robust rule (appendix
    "Robust Updating Formula"); ``decide`` the Universal Index Policy (eq. ``UIP``). Student-t
    quantiles t_{2 alpha}^{-1}(q) are memoised per alpha_k (a handful per config).
    """

    __slots__ = ("_cost", "_h", "_horizon", "_prior", "_q", "_robust", "_tq")

    def __init__(
        self, robust: bool, q: float, horizon: int, alpha0: float, nu0: float, cost: float
    ) -> None:
        self._robust, self._q, self._cost = robust, q, cost
        self._horizon, self._prior = horizon, (alpha0, nu0)
        self._tq: dict[float, float] = {}
        self._h: HIndexRows | None = None  # built at the first decision (not needed before k0)

    def _quantile(self, alpha: float) -> float:
        """t_{2 alpha}^{-1}(q), the standard predictive quantile of the robust rule."""
        tq = self._tq.get(alpha)
        if tq is None:
            tq = self._tq[alpha] = predictive_quantile(2.0 * alpha, self._q)
        return tq

    def update(self, s: NormalState, reward: float) -> NormalState:
        """State after one reward: robust clipping, then the O(1) NIG update (module docstring)."""
        k, z, mu, nu, alpha, beta, k0, sigma = s
        r_model = reward
        if self._robust and k >= k0 and alpha > 0 and nu > 0:
            if reward < mu + sigma * self._quantile(alpha):
                r_model = mu
        d = r_model - mu
        nu1 = nu + 1.0
        alpha1 = alpha + 0.5
        beta1 = beta + nu * d * d / (2.0 * nu1)
        k1 = k + 1
        return _new_tuple(  # type: ignore[no-any-return]
            NormalState,
            (
                k1,
                reward if reward > z else z,  # == max(z, reward)
                mu + d / nu1,
                nu1,
                alpha1,
                beta1,
                k0,
                _scale(k1, k0, nu1, alpha1, beta1),
            ),
        )

    def decide(self, s: NormalState) -> DecisionTuple:
        """Continue iff h_{n,k}(zhat) > c / sigma_k, zhat = (z_k - mu_k) / sigma_k (eq. UIP)."""
        h_index = self._h
        if h_index is None:
            h_index = self._h = _h_rows(self._horizon, *self._prior)
        sigma = s.sigma
        zhat = (s.z - s.mu) / sigma
        h = h_index(s.k, zhat)
        threshold = self._cost / sigma
        if h > threshold:
            return (True, None, zhat, h, threshold)
        return (False, "index", zhat, h, threshold)


@lru_cache(maxsize=1024)
def _kernel(
    robust: bool, q: float, horizon: int, alpha0: float, nu0: float, cost: float
) -> NormalKernel:
    return NormalKernel(robust, q, horizon, alpha0, nu0, cost)


def _kernel_for(cfg: BeaconConfig) -> NormalKernel:
    p = cfg.resolved_prior
    assert isinstance(p, NIGPrior)
    return _kernel(cfg.robust, cfg.robust_quantile, cfg.horizon, p.alpha0, p.nu0, cfg.cost)


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
        return _kernel_for(cfg).update(state, reward)

    def decide(self, state: NormalState, cfg: BeaconConfig) -> Decision:
        return Decision(*_kernel_for(cfg).decide(state))

    def bind(self, cfg: BeaconConfig) -> BoundFamily:
        if self._overrides(NormalFamily, "update", "decide"):
            return super().bind(cfg)
        kern = _kernel_for(cfg)
        return BoundFamily(self.validate_reward, kern.update, kern.decide)
