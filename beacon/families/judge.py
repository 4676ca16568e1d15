"""The ``judge`` family: probability-valued pairwise judges, learnt as win / no-win.

For a judge whose reward is the probability that a sample beats a reference answer (AlpacaEval
style), the rewards of one prompt are strongly bimodal — most near 0, the wins near 1 — and no
monotone transform makes them normal. What matters for the chosen sample is whether a *win*
(r > 1/2: the judge prefers the sample to the reference) has been found. This family learns the
prompt's win probability theta with the Beta–Bernoulli model of the paper's appendix
"Binary-Reward Variant" (eq. ``bernoulli-update``, with w_i = 1{r_i > 1/2}) and uses its exact
reservation-cost policy (Theorem ``thm:bernoulli_policy``): a win is absorbing (stop with reason
``absorbed``); otherwise continue iff c < h^B_{n,k}(a_k, b_k). The chosen sample is still the
best *raw* reward, and ``state.z`` is that raw maximum.

Units: c is in wins (one win is worth 1), as for ``bernoulli``; the prior is a
:class:`beacon.BetaPrior` on theta, fitted by ``beacon.fitting.fit_reward_model(rewards,
"judge")`` (beta-binomial marginal likelihood on the win indicators).

The 1/2 is the judge's own decision boundary, not a tuned constant.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from beacon.errors import RewardError
from beacon.families import register_family
from beacon.families.base import BoundFamily, Decision, RewardFamily
from beacon.families.bernoulli import (
    BernoulliFamily,
    BernoulliState,
    as_state,
    decider,
    reservation_cost,
)

if TYPE_CHECKING:
    from beacon.config import BeaconConfig

__all__ = ["WIN_THRESHOLD", "JudgeFamily"]

WIN_THRESHOLD = 0.5


@register_family("judge")
class JudgeFamily(BernoulliFamily):
    """Rewards in [0, 1]; a reward above 1/2 is a win (absorbing)."""

    def validate_reward(self, reward: float, position: int) -> float:
        if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise RewardError(position, reward, "the judge family needs probabilities in [0, 1]")
        return float(reward)

    def update(self, state: BernoulliState, reward: float, cfg: BeaconConfig) -> BernoulliState:
        return as_state(_win_update(state, reward))

    def decide(self, state: BernoulliState, cfg: BeaconConfig) -> Decision:
        if state.z > WIN_THRESHOLD:
            return Decision(False, "absorbed", math.nan, 0.0, cfg.cost)
        h = reservation_cost(cfg.horizon, state.k, state.a, state.b)
        if cfg.cost < h:
            return Decision(True, None, math.nan, h, cfg.cost)
        return Decision(False, "index", math.nan, h, cfg.cost)

    def bind(self, cfg: BeaconConfig) -> BoundFamily:
        """Stopper kernels: the win update and the Bernoulli policy with a strict 1/2 boundary.

        Same values as :meth:`update` and :meth:`decide` (the Stopper's states always satisfy
        :func:`reservation_cost`'s checks, so the decision calls the memoised root directly).
        """
        if self._overrides(JudgeFamily, "update", "decide"):
            return RewardFamily.bind(self, cfg)
        decide = decider(WIN_THRESHOLD, True, cfg.horizon, cfg.cost)
        return BoundFamily(self.validate_reward, _win_update, decide, view=as_state)


def _win_update(s: BernoulliState, reward: float) -> tuple[Any, ...]:
    """Beta update with the win indicator w = 1{r > 1/2}; z keeps the raw maximum.

    Returns the new state's fields as a plain tuple (``as_state`` makes the state).
    """
    k, z, a, b = s
    win = 1.0 if reward > WIN_THRESHOLD else 0.0
    z1 = reward if reward > z else z  # == max(z, reward)
    return (k + 1, z1, a + win, b + 1.0 - win)
