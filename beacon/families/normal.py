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

Range: rewards (after the config's transform) must satisfy |r| <= MAX_ABS_REWARD = 1e140, in
the units of the rewards. Beyond it (r - mu)^2 and beta overflow and the decision would be taken
on NaN; such a reward is a :class:`beacon.RewardError` asking to rescale (``fit_prior`` has the
same limit). The prior's ``mu0`` is held to the same range, and a prior whose predictive scale
already overflows at the first decision (a ``beta0`` near the float limit, or ``nu0 * beta0``
beyond it) is a :class:`beacon.ConfigError` when the config is built. A prior that overflows
only with large rewards (``nu0`` ~ 1e28 with rewards near 1e140: ``nu (r - mu)^2``) makes the
reward whose update leaves beta_k or sigma_k infinite a :class:`beacon.RewardError`
(:data:`OVERFLOW_MESSAGE`): with sigma_k = inf, c / sigma_k = 0 and the rule would sample to the
horizon whatever the rewards (the vectorised replay refuses the same reward).

Speed: the update and the decision are closures built once per config (:meth:`NormalFamily.bind`),
holding the Student-t quantiles per dof, the cost and (:func:`uip_decider`) a pure-Python copy
of the table's spline lookup that returns the same bits as the numba ``h_lookup`` (checked in
tests/test_stopper_fastpath.py) without a numba dispatch per decision.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from beacon.errors import ConfigError, RewardError
from beacon.families import register_family
from beacon.families.base import BoundFamily, Decision, DecisionTuple, RewardFamily
from beacon.priors import NIGPrior

if TYPE_CHECKING:
    from beacon.config import BeaconConfig
    from beacon.index.table import HTable

__all__ = [
    "MAX_ABS_REWARD",
    "OVERFLOW_MESSAGE",
    "SIGMA_FLOOR",
    "TOO_LARGE_MESSAGE",
    "NormalFamily",
    "NormalState",
    "h_index_function",
    "predictive_quantile",
    "uip_decider",
]

SIGMA_FLOOR = 1e-6
MAX_ABS_REWARD = 1e140
TOO_LARGE_MESSAGE = (  # shared with the vectorised replay's check
    f"|reward| above {MAX_ABS_REWARD:g} overflows the normal model's statistics; rescale the"
    " rewards"
)
OVERFLOW_MESSAGE = (  # shared with the vectorised replay's check
    "the normal model's statistics overflow under this prior (beta_k or the predictive scale"
    " sigma_k = sqrt((nu_k + 1) beta_k / (nu_k alpha_k)) is infinite): rescale the rewards and"
    " the prior (mu0 by the factor, beta0 by its square), or use a smaller nu0"
)

_new_tuple = tuple.__new__  # builds a NamedTuple without the Python-level __new__ frame
_exp, _log, _sqrt, _asinh, _floor = math.exp, math.log, math.sqrt, math.asinh, math.floor
_NAN = math.nan
_INF = math.inf


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


@lru_cache(maxsize=4096)
def predictive_quantile(dof: float, q: float) -> float:
    """Standard Student-t quantile t_dof^{-1}(q) (cached: dof takes few values per config)."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, dof))


def uip_decider(table: HTable, cost: float) -> Callable[[NormalState], DecisionTuple]:
    """The Universal Index Policy (eq. ``UIP``) on ``table``: continue iff h_{n,k}(zhat) > c/sigma.

    ``decide(state)`` returns ``(continue, reason, zhat, h, c / sigma_k)`` with
    zhat = (z_k - mu_k) / sigma_k. The index h is computed in plain Python, bit-identical to the
    numba ``h_lookup`` (tests/test_stopper_fastpath.py checks the bits). Inside the grid
    ``zlo <= zhat <= zhi`` (docs/h_index.md, :mod:`beacon.index.table`): ``x = asinh(zhat / a)``,
    ``t = (x - x_lo) / dx``, ``j = clamp(floor(t), 0, N - 2)``, ``B = t - j``, ``A = 1 - B`` and
    the cubic spline of ``log h`` in ``x``

        log h = A y_j + B y_{j+1} + ((A^3 - A) m_j + (B^3 - B) m_{j+1}) dx^2 / 6;

    right of it the power tail ``h = exp(y_{N-1} + (1 - d) log(zhat / zhi))`` (Theorem
    ``h_properties``, d = row dof), with the float operations of
    ``beacon._kernels.tables._row_h`` in the same order. Left of the grid (the myopic-gain
    asymptote, which needs the Student-t special functions), for NaN and for a ``k`` without a
    row (NaN), the numba kernel itself answers.
    """
    from beacon._kernels import load_tables

    h_lookup: Any = load_tables().h_lookup
    args = table.lookup_arrays()
    # numba compiles (or loads from its cache) at the first call: here, once per decider, not
    # at the first off-grid decision of some query (on the engine's event loop)
    h_lookup(*args, int(args[-1]), math.nan)
    x_lo, dx, scale, zlo, zhi, logh, m2, dof, k_min = args
    x_lo, dx, scale, zlo, zhi = float(x_lo), float(dx), float(scale), float(zlo), float(zhi)
    k_min, n_rows = int(k_min), int(logh.shape[0])
    dx2_6 = dx * dx / 6.0
    last = int(logh.shape[1]) - 2  # the last spline interval starts at node N - 2
    # per row r = k - k_min: per interval j the tuple (y_j, y_{j+1}, m_j, m_{j+1})
    segments: list[list[tuple[float, float, float, float]]] = []
    tails: list[tuple[float, float]] = []  # per row: (y_{N-1}, 1 - d)
    for y, m, d in zip(logh.tolist(), m2.tolist(), dof.tolist(), strict=True):
        segments.append([(y[j], y[j + 1], m[j], m[j + 1]) for j in range(last + 1)])
        tails.append((y[-1], 1.0 - d))

    def decide(s: NormalState) -> DecisionTuple:
        k, z, mu, _, _, _, _, sigma = s
        zhat = (z - mu) / sigma
        r = k - k_min
        if 0 <= r < n_rows and zlo <= zhat <= zhi:  # the spline
            t = (_asinh(zhat / scale) - x_lo) / dx
            j = _floor(t)
            if j < 0:
                j = 0
            elif j > last:
                j = last
            y0, y1, m0, m1 = segments[r][j]
            bb = t - j
            aa = 1.0 - bb
            v = aa * y0 + bb * y1
            v += ((aa * aa * aa - aa) * m0 + (bb * bb * bb - bb) * m1) * dx2_6
            h = _exp(v)
        elif 0 <= r < n_rows and zhat > zhi:  # the power tail
            y_end, one_minus_d = tails[r]
            h = _exp(y_end + one_minus_d * _log(zhat / zhi))
        else:
            h = float(h_lookup(*args, k, zhat))
        threshold = cost / sigma
        if h > threshold:
            return (True, None, zhat, h, threshold)
        return (False, "index", zhat, h, threshold)

    return decide


def h_index_function(table: HTable) -> Callable[[int, float], float]:
    """``h(k, z) = h_{n,k}(z)``: the index of :func:`uip_decider` at mu = 0, sigma = 1 (so that
    zhat = z exactly)."""
    decide = uip_decider(table, 1.0)

    def h(k: int, z: float) -> float:
        return decide(NormalState(k, z, 0.0, 0.0, 0.0, 0.0, 0, 1.0))[3]

    return h


def _as_state(t: tuple[Any, ...]) -> NormalState:
    """The :class:`NormalState` of a plain tuple of its fields."""
    return _new_tuple(NormalState, t)


def _make_update(robust: bool, q: float) -> Callable[[NormalState, float], tuple[Any, ...]]:
    """The O(1) NIG update (module docstring) with the robust rule at quantile ``q``.

    A reward below mu_k + sigma_k t_{2 alpha_k}^{-1}(q) updates as if it were mu_k once the
    predictive is proper (k >= k0, alpha_k > 0, nu_k > 0); the Student-t quantiles are memoised
    per alpha_k (a handful per config). The new state is returned as a plain tuple of the
    :class:`NormalState` fields (see :attr:`BoundFamily.view`).
    """
    t_quantile: dict[float, float] = {}

    def update(s: NormalState, reward: float) -> tuple[Any, ...]:
        k, z, mu, nu, alpha, beta, k0, sigma = s
        if not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:
            raise RewardError(k, reward, TOO_LARGE_MESSAGE)
        r_model = reward
        if robust and k >= k0 and alpha > 0 and nu > 0:
            tq = t_quantile.get(alpha)
            if tq is None:
                tq = t_quantile[alpha] = predictive_quantile(2.0 * alpha, q)
            if reward < mu + sigma * tq:
                r_model = mu
        d = r_model - mu
        nu1 = nu + 1.0
        alpha1 = alpha + 0.5
        beta1 = beta + nu * d * d / (2.0 * nu1)
        k1 = k + 1
        sigma1 = _scale(k1, k0, nu1, alpha1, beta1)
        if sigma1 == _INF or beta1 == _INF:
            # an overflowed scale makes c / sigma = 0: every later decision would "continue"
            raise RewardError(k, reward, OVERFLOW_MESSAGE)
        z1 = reward if reward > z else z  # == max(z, reward)
        return (k1, z1, mu + d / nu1, nu1, alpha1, beta1, k0, sigma1)

    return update


class _Kernel:
    """The normal family's update and decision for one config.

    The h-table is loaded by :meth:`prepare` (the engine runs it in a worker thread before a
    sampler's first query) or else at the first decision; ``decide`` then becomes the decider
    itself, so later binds of the config call it directly.
    """

    __slots__ = ("_decider", "_lock", "_quantile_key", "_table_key", "cost", "decide", "ready",
                 "update")

    def __init__(
        self, robust: bool, q: float, horizon: int, alpha0: float, nu0: float, cost: float
    ) -> None:
        self.update = _make_update(robust, q)
        self.cost = cost
        self._table_key = (horizon, alpha0, nu0)
        # the robust update's Student-t quantiles: (q, alpha0, horizon), None when not robust
        self._quantile_key = (q, alpha0, horizon) if robust else None
        self._decider: Callable[[NormalState], DecisionTuple] | None = None
        self._lock = threading.Lock()
        self.ready = False  # :meth:`prepare` has run to its end
        self.decide: Callable[[NormalState], DecisionTuple] = self._first_decide

    def decider(self) -> Callable[[NormalState], DecisionTuple]:
        """The decider, built once (the h-table read or built, the lookup kernel loaded) under
        a lock: :meth:`prepare` may run in a worker thread while another thread decides (taken
        only until the decider exists, never per decision)."""
        decider = self._decider
        if decider is None:
            with self._lock:
                decider = self._decider
                if decider is None:
                    from beacon.index import get_table

                    decider = uip_decider(get_table(*self._table_key), self.cost)
                    self._decider = decider
                    self.decide = decider
        return decider

    def prepare(self) -> None:
        """Everything a query of this config would load on its way (what the engine runs in a
        worker thread): the decider (:meth:`decider`) and, for the robust update, scipy's
        Student-t and the quantile of every ``alpha_k = alpha0 + k/2`` below the horizon,
        summed as the update sums them (memoised by :func:`predictive_quantile`)."""
        self.decider()
        if self._quantile_key is not None:
            q, alpha, horizon = self._quantile_key
            for _ in range(horizon):
                if alpha > 0:
                    predictive_quantile(2.0 * alpha, q)
                alpha = alpha + 0.5
        self.ready = True

    def _first_decide(self, s: NormalState) -> DecisionTuple:
        """Build the decider once, then delegate (for binds made before the first decision)."""
        return (self._decider or self.decider())(s)


@lru_cache(maxsize=1024)
def _kernel(
    robust: bool, q: float, horizon: int, alpha0: float, nu0: float, cost: float
) -> _Kernel:
    """The (cached) :class:`_Kernel` of one config."""
    return _Kernel(robust, q, horizon, alpha0, nu0, cost)


def _kernel_for(cfg: BeaconConfig) -> _Kernel:
    p = cfg.resolved_prior
    assert isinstance(p, NIGPrior)
    return _kernel(cfg.robust, cfg.robust_quantile, cfg.horizon, p.alpha0, p.nu0, cfg.cost)


def _check_prior_range(p: NIGPrior, k_first: int) -> None:
    """Refuse a prior the normal model cannot run in floating point, whatever the rewards.

    ``mu0`` is in reward units and held to the rewards' range (+-:data:`MAX_ABS_REWARD`). The
    predictive scale at the first decision (``k_first`` rewards, each adding 1 to nu and 1/2 to
    alpha as the update does) is computed with beta_k at its least, beta0: if it overflows
    there, the first decision would be taken on sigma = inf (c / sigma = 0, "continue") and
    every later one too, since beta_k never decreases.
    """
    if not -MAX_ABS_REWARD <= p.mu0 <= MAX_ABS_REWARD:
        raise ConfigError(
            "prior.mu0", p.mu0,
            f"must be within +-{MAX_ABS_REWARD:g}, the normal model's reward range (in reward"
            " units); rescale the rewards and the prior",
        )  # fmt: skip
    nu, alpha = p.nu0, p.alpha0
    for _ in range(k_first):
        nu, alpha = nu + 1.0, alpha + 0.5
    if _scale(k_first, k_first, nu, alpha, p.beta0) == _INF:  # NaN where nu or alpha <= 0
        raise ConfigError(
            "prior.beta0", p.beta0,
            f"with nu0={p.nu0:g} and alpha0={p.alpha0:g} the predictive scale"
            f" sqrt((nu + 1) beta / (nu alpha)) overflows at the first decision (after {k_first}"
            f" reward{'' if k_first == 1 else 's'}): rescale the rewards and the prior (beta0 by"
            " the factor squared)",
        )  # fmt: skip


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
        _check_prior_range(p, cfg.k0)

    def prepare(self, cfg: BeaconConfig) -> None:
        """Read (or build) the h-table of ``cfg``, load the lookup kernel and, with the robust
        update, scipy's Student-t quantiles (see the base class)."""
        _kernel_for(cfg).prepare()

    def needs_prepare(self, cfg: BeaconConfig) -> bool:
        return not _kernel_for(cfg).ready

    def initial_state(self, cfg: BeaconConfig) -> NormalState:
        p = cfg.resolved_prior
        assert isinstance(p, NIGPrior)
        sigma = _scale(0, p.k0, p.nu0, p.alpha0, p.beta0)
        return NormalState(0, -math.inf, p.mu0, p.nu0, p.alpha0, p.beta0, p.k0, sigma)

    def update(self, state: NormalState, reward: float, cfg: BeaconConfig) -> NormalState:
        return _as_state(_kernel_for(cfg).update(state, reward))

    def decide(self, state: NormalState, cfg: BeaconConfig) -> Decision:
        return Decision(*_kernel_for(cfg).decide(state))

    def bind(self, cfg: BeaconConfig) -> BoundFamily:
        if self._overrides(NormalFamily, "update", "decide"):
            return super().bind(cfg)
        kern = _kernel_for(cfg)
        return BoundFamily(
            self.validate_reward, kern.update, kern.decide, self._finite_only(), _as_state
        )
