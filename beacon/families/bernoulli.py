"""The ``bernoulli`` family: Beta learning for binary verifiers (reward 0 or 1).

State (k, z, a_k, b_k) with a_k = a0 + successes, b_k = b0 + failures (paper, appendix
"Binary-Reward Variant", eq. ``bernoulli-update``). A success is absorbing: stop with reason
``absorbed``. Otherwise continue iff c < h^B_{n,k}(a_k, b_k), the reservation cost of Theorem
``thm:bernoulli_policy``: the unique root in [0, 1] of

    phi_t(c) = q(a, b) + (1 - q(a, b)) R_{t-1}(a, b + 1; c) - c,   t = n - k,

with R_0 = 0 and R_t(a, b; c) = max{0, q(a, b) + (1 - q(a, b)) R_{t-1}(a, b + 1; c) - c}
(eq. ``R-recursion``), q(a, b) = a / (a + b). phi_t is continuous and strictly decreasing
(Lemma ``lem:strict``), so bisection converges to the exact root; results are memoised.

Speed: :meth:`BernoulliFamily.bind` gives the Stopper closures with the horizon and cost bound
(no config look-ups per reward), the same functions :meth:`update` and :meth:`decide` use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from beacon._checks import is_integer, is_real, real_as_float
from beacon.errors import ConfigError, RewardError
from beacon.families import register_family
from beacon.families.base import BoundFamily, Decision, DecisionTuple, RewardFamily
from beacon.priors import BetaPrior

if TYPE_CHECKING:
    from beacon.config import BeaconConfig

__all__ = [
    "BernoulliFamily",
    "BernoulliState",
    "as_state",
    "beta_update",
    "decider",
    "reservation_cost",
]

_new_tuple = tuple.__new__  # builds a NamedTuple without the Python-level __new__ frame


class BernoulliState(NamedTuple):
    """Sufficient statistics (k, z, a_k, b_k)."""

    k: int
    z: float
    a: float
    b: float

    @property
    def mu(self) -> float:
        """Posterior-predictive success probability q_k = a_k / (a_k + b_k)."""
        return self.a / (self.a + self.b)

    @property
    def sigma(self) -> float:
        return math.nan


def _phi(t: int, a: float, b: float, c: float) -> float:
    """phi_t(c) of Lemma ``lem:strict``, computing R_{t-1}(a, b + 1; c) bottom-up in O(t)."""
    r = 0.0  # R_0(a, b + t; c)
    for s in range(1, t):
        bs = b + (t - s)
        q = a / (a + bs)
        r = max(0.0, q + (1.0 - q) * r - c)
    q0 = a / (a + b)
    return q0 + (1.0 - q0) * r - c


@lru_cache(maxsize=65536)
def _reservation(t: int, a: float, b: float) -> float:
    lo, hi = 0.0, 1.0
    if _phi(t, a, b, hi) >= 0.0:  # only when q(a, b) = 1, impossible for b > 0
        return 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _phi(t, a, b, mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def reservation_cost(n: int, k: int, a: float, b: float) -> float:
    """h^B_{n,k}(a, b): continue (with no success yet) iff c < h^B_{n,k}(a, b).

    Exact to floating-point resolution (bisection on the strictly decreasing phi_{n-k}).
    """
    for field, v in (("n", n), ("k", k)):
        if not is_integer(v):
            raise ConfigError(field, v, "must be an integer")
    n, k = int(n), int(k)
    if not 0 <= k < n:
        raise ConfigError("k", k, f"must satisfy 0 <= k < n = {n}")
    ab: list[float] = []
    for name, val in (("a", a), ("b", b)):
        # text, booleans, None and containers are mistakes, not numbers to convert
        v_f = real_as_float(val) if is_real(val) else math.nan
        if not is_real(val) or not (math.isfinite(v_f) and v_f > 0):
            raise ConfigError(name, val, "must be a finite real number > 0")
        ab.append(v_f)
    return _reservation(n - k, ab[0], ab[1])


@register_family("bernoulli")
class BernoulliFamily(RewardFamily):
    """Binary rewards (0 = fail, 1 = success) with a Beta prior."""

    def default_prior(self) -> BetaPrior:
        return BetaPrior()

    def check_prior(self, prior: Any) -> None:
        if not isinstance(prior, BetaPrior):
            raise ConfigError("prior", prior, f"the {self.name} family needs a BetaPrior")

    def check_config(self, cfg: BeaconConfig) -> None:
        if cfg.transform is not None:
            raise ConfigError(
                "transform", cfg.transform, f"the {self.name} family takes raw rewards"
            )
        if cfg.cost >= 1.0:
            # h^B <= 1, so c >= 1 would never sample past the first reward: almost surely a mistake.
            raise ConfigError(
                "cost", cfg.cost, f"must be < 1 for the {self.name} family (a success is worth 1)"
            )

    def initial_state(self, cfg: BeaconConfig) -> BernoulliState:
        p = cfg.resolved_prior
        assert isinstance(p, BetaPrior)
        return BernoulliState(0, -math.inf, p.a0, p.b0)

    def validate_reward(self, reward: float, position: int) -> float:
        if reward not in (0.0, 1.0):
            raise RewardError(position, reward, "the bernoulli family needs rewards 0 or 1")
        return float(reward)

    def update(self, state: BernoulliState, reward: float, cfg: BeaconConfig) -> BernoulliState:
        return as_state(beta_update(state, reward))

    def decide(self, state: BernoulliState, cfg: BeaconConfig) -> Decision:
        return Decision(*decider(1.0, False, cfg.horizon, cfg.cost)(state))

    def bind(self, cfg: BeaconConfig) -> BoundFamily:
        if self._overrides(BernoulliFamily, "update", "decide"):
            return super().bind(cfg)
        decide = decider(1.0, False, cfg.horizon, cfg.cost)
        return BoundFamily(self.validate_reward, beta_update, decide, view=as_state)


def as_state(t: tuple[Any, ...]) -> BernoulliState:
    """The :class:`BernoulliState` of a plain tuple of its fields."""
    return _new_tuple(BernoulliState, t)


def beta_update(s: BernoulliState, reward: float) -> tuple[Any, ...]:
    """Beta update of eq. ``bernoulli-update``: a_{k+1} = a_k + r, b_{k+1} = b_k + 1 - r.

    Returns the new state's fields as a plain tuple (:func:`as_state` makes the state).
    """
    k, z, a, b = s
    z1 = reward if reward > z else z  # == max(z, reward)
    return (k + 1, z1, a + reward, b + 1.0 - reward)


@lru_cache(maxsize=1024)
def decider(
    win: float, strict: bool, horizon: int, cost: float
) -> Callable[[BernoulliState], DecisionTuple]:
    """The reservation-cost policy (Theorem ``thm:bernoulli_policy``) for horizon n and cost c.

    A success is absorbing: stop with ``absorbed`` once z_k >= ``win`` (z_k > ``win`` when
    ``strict``); otherwise continue iff c < h^B_{n,k}(a_k, b_k). For states of a Stopper
    (0 <= k < n, a_k, b_k > 0 finite), so :func:`reservation_cost`'s checks are skipped.
    """
    nan = math.nan
    absorbed: DecisionTuple = (False, "absorbed", nan, 0.0, cost)

    def decide(s: BernoulliState) -> DecisionTuple:
        k, z, a, b = s
        if (z > win) if strict else (z >= win):
            return absorbed
        h = _reservation(horizon - k, a, b)
        if cost < h:
            return (True, None, nan, h, cost)
        return (False, "index", nan, h, cost)

    return decide
