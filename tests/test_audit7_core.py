"""Audit 7 of the numerical core: plugin families whose state or prior break the contract are
refused when the config or the Stopper is built, not after the samples were drawn."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest

from beacon import BeaconConfig, ConfigError, RewardError, Stopper, families, replay
from beacon.families import Decision, RewardFamily, register_family
from beacon.families.bernoulli import BernoulliFamily
from beacon.families.normal import NormalFamily
from beacon.priors import BetaPrior
from beacon.stopper import Draw

# The plugin families below are registered for each test only (into a copy of the registry): a
# family registered when this module is imported would show in every later test's listing.
_PLUGINS: dict[str, type[RewardFamily]] = {}


@pytest.fixture(autouse=True)
def _audit7_families(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    for name, cls in _PLUGINS.items():
        register_family(name)(cls)


class _BestOnly(NamedTuple):
    """A plugin state with the count and the best reward only (no z, mu, sigma)."""

    k: int
    best: float


class _Full(NamedTuple):
    k: int
    z: float
    mu: float = math.nan
    sigma: float = math.nan


class _TwoDraws(RewardFamily):
    """Continue until two rewards, then stop; subclasses change the state or the prior."""

    def default_prior(self) -> Any:
        return BetaPrior()

    def check_prior(self, prior: Any) -> None:
        return None

    def initial_state(self, cfg: BeaconConfig) -> Any:
        return _Full(0, -math.inf)

    def update(self, state: Any, reward: float, cfg: BeaconConfig) -> Any:
        return _Full(state.k + 1, max(state.z, reward))

    def decide(self, state: Any, cfg: BeaconConfig) -> Decision:
        return Decision(state.k < 2, None, math.nan, math.nan, math.nan)


class _BestOnlyFamily(_TwoDraws):
    def initial_state(self, cfg: BeaconConfig) -> Any:
        return _BestOnly(0, -math.inf)

    def update(self, state: Any, reward: float, cfg: BeaconConfig) -> Any:
        return _BestOnly(state.k + 1, max(state.best, reward))


class _ChangesStateFamily(_TwoDraws):
    """Starts with a full state, then updates to one without z, mu, sigma."""

    def update(self, state: Any, reward: float, cfg: BeaconConfig) -> Any:
        return _BestOnly(state.k + 1, reward)


class _FullFamily(_TwoDraws):
    pass


def test_plugin_state_without_trace_fields_is_refused_before_any_draw() -> None:
    # Was: the Stopper ran to its stop and reading .trace (which the engine does to build every
    # result) raised AttributeError: 'z', after every sample had been drawn and paid for.
    cfg = BeaconConfig(family="audit7-best-only", horizon=5)
    with pytest.raises(ConfigError) as info:
        Stopper(cfg)
    msg = str(info.value)
    assert "audit7-best-only" in msg and "initial_state()" in msg
    assert "z, mu, sigma" in msg


def test_plugin_update_to_a_state_without_trace_fields_is_named() -> None:
    s = Stopper(BeaconConfig(family="audit7-changes-state", horizon=5))
    assert s.next_decision() == Draw(1)
    with pytest.raises(ConfigError, match=r"update\(\).*missing or not a number: z, mu, sigma"):
        s.observe(0.5)


def test_plugin_state_with_trace_fields_runs_and_traces() -> None:
    s = Stopper(BeaconConfig(family="audit7-full", horizon=5))
    while isinstance(d := s.next_decision(), Draw):
        s.observe([0.25] * d.count)
    trace = s.trace
    assert s.k == 2 and trace[-1].decision == "stop" and trace[-1].z == 0.25
    assert [t.k for t in trace] == [0, 1, 2]


class _NoK0:
    """A plugin prior without k0."""


class _NoK0Family(_TwoDraws):
    def default_prior(self) -> Any:
        return _NoK0()


class _NonePriorFamily(_TwoDraws):
    def default_prior(self) -> Any:
        return None


class _FloatK0:
    k0 = 1.5


@pytest.mark.parametrize(
    ("family", "prior", "got"),
    [
        ("audit7-no-k0", None, "None"),
        ("audit7-none-prior", None, "None"),
        ("audit7-full", _FloatK0(), "1.5"),
    ],
)
def test_plugin_prior_without_integer_k0_is_a_config_error(
    family: str, prior: Any, got: str
) -> None:
    # Was: AttributeError: 'NoneType' object has no attribute 'k0' from inside BeaconConfig
    # (and int(1.5) silently drew 1 reward before the first decision).
    with pytest.raises(ConfigError) as info:
        BeaconConfig(family=family, horizon=5, prior=prior)
    assert info.value.field == "prior"
    assert "k0" in str(info.value) and f"got {got}" in str(info.value)


def test_builtin_priors_keep_their_k0() -> None:
    assert BeaconConfig().k0 == 3
    assert BeaconConfig(family="bernoulli", prior=BetaPrior(2.0, 3.0)).k0 == 1
    assert isinstance(BeaconConfig(family="bernoulli").resolved_prior, BetaPrior)
    assert BernoulliFamily().default_prior().k0 == 0


class _TenPoint(NormalFamily):
    """The docs' example plugin: normal learning, rewards 1..10 (replayed through the Stopper)."""

    def validate_reward(self, reward: float, position: int) -> float:
        reward = super().validate_reward(reward, position)
        if not 1 <= reward <= 10:
            raise RewardError(position, reward, "a ten-point judge scores 1..10")
        return reward


class _OwnPosition(_TenPoint):
    def validate_reward(self, reward: float, position: int) -> float:
        if reward > 10:
            raise RewardError("the judge's last score", reward, "above 10")
        return reward


def _ten_point_log() -> np.ndarray:
    x = np.full((5, 8), 5.0) + 0.1 * np.arange(8)
    x[3, 0] = np.nan  # a missing sample before the bad one: the Stopper's count is 3, not 4
    x[3, 4] = 42.0
    return x


def test_plugin_replay_names_the_bad_reward_by_row_and_column() -> None:
    # Was: "invalid reward at position 3" (the Stopper's count of row 3's logged rewards), which
    # reads as column 3, a valid 5.3 of some row; the kernels say (row, column).
    x = _ten_point_log()
    with pytest.raises(RewardError) as info:
        replay(x, BeaconConfig(cost=0.001, horizon=8, family="audit7-ten-point"))
    assert info.value.position == (3, 4)
    assert info.value.value == x[3, 4]
    assert "ten-point judge" in str(info.value)


def test_plugin_replay_keeps_a_plugin_position_with_its_row() -> None:
    with pytest.raises(RewardError) as info:
        replay(_ten_point_log(), BeaconConfig(cost=0.001, horizon=8, family="audit7-own-position"))
    assert info.value.position == 'row 3, position "the judge\'s last score" of its logged rewards'


def test_plugin_replay_still_agrees_with_the_stopper() -> None:
    x = np.random.default_rng(0).uniform(1, 10, size=(6, 8))
    x[1, 2] = np.nan
    cfg = BeaconConfig(cost=0.05, horizon=8, family="audit7-ten-point")
    got = replay(x, cfg)
    for i in range(6):
        row = x[i][~np.isnan(x[i])]
        s = Stopper(cfg)
        j = 0
        while isinstance(d := s.next_decision(), Draw) and j < row.size:
            s.observe(row[j : j + d.count])
            j += d.count
        assert got.n_samples[i] == s.k
        assert got.truncated[i] == (s.stopped is None)


_PLUGINS.update({
    "audit7-best-only": _BestOnlyFamily,
    "audit7-changes-state": _ChangesStateFamily,
    "audit7-full": _FullFamily,
    "audit7-no-k0": _NoK0Family,
    "audit7-none-prior": _NonePriorFamily,
    "audit7-ten-point": _TenPoint,
    "audit7-own-position": _OwnPosition,
})
