"""A user reward family registered with the decorator (docs/concepts.md)."""

from __future__ import annotations

from typing import assert_type

from beacon import BeaconConfig, RewardError, Stopper, register_family
from beacon.families import register_family as register_family2
from beacon.families.normal import NormalFamily


@register_family
class TenPointJudge(NormalFamily):
    """Normal learning for a judge that scores 1..10."""

    name = "ten-point"

    def validate_reward(self, reward: float, position: int) -> float:
        reward = super().validate_reward(reward, position)
        if not 1 <= reward <= 10:
            raise RewardError(position, reward, "a ten-point judge scores 1..10")
        return reward


@register_family2("five-point")
class FivePointJudge(NormalFamily):
    def extra(self) -> int:
        return 5


@register_family()
class Unnamed(NormalFamily):
    name = "unnamed-typing-case"


# the decorators keep the class type (its own methods stay visible)
assert_type(TenPointJudge, type[TenPointJudge])
assert_type(FivePointJudge().extra(), int)
j = TenPointJudge()
assert_type(j.validate_reward(3.0, 0), float)

stopper = Stopper(BeaconConfig(cost=0.2, horizon=16, family="ten-point"))
stopper.next_decision()
try:
    stopper.observe([7.0, 8.5, 42.0])
except RewardError as err:
    print(err)


# a family written from scratch on the abstract base
from typing import Any, NamedTuple  # noqa: E402

from beacon import BetaPrior, RewardFamily  # noqa: E402
from beacon.families import Decision  # noqa: E402
from beacon.priors import Prior  # noqa: E402


class CountState(NamedTuple):
    k: int
    z: float
    mu: float
    sigma: float


@register_family("count-typing-case")
class CountFamily(RewardFamily):
    def default_prior(self) -> Prior:
        return BetaPrior()

    def check_prior(self, prior: Any) -> None:
        pass

    def initial_state(self, cfg: BeaconConfig) -> CountState:
        return CountState(0, float("-inf"), float("nan"), float("nan"))

    def update(self, state: CountState, reward: float, cfg: BeaconConfig) -> CountState:
        return CountState(state.k + 1, max(state.z, reward), state.mu, state.sigma)

    def decide(self, state: CountState, cfg: BeaconConfig) -> Decision:
        nan = float("nan")
        return Decision(state.k < 2, None if state.k < 2 else "index", nan, nan, nan)


assert_type(CountFamily, type[CountFamily])
