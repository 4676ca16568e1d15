"""The reward-family registry: the decorator, entry-point plugins and their errors."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest

import beacon.families as families
from beacon import BeaconConfig, ConfigError, RewardError, Stopper, UnknownFamilyError
from beacon.families import RewardFamily, available_families, get_family, register_family
from beacon.families.bernoulli import BernoulliFamily
from beacon.families.normal import NormalFamily
from beacon.priors import NIGPrior


@pytest.fixture(autouse=True)
def _clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test registers into a copy of the registry, so none leaks into another."""
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    monkeypatch.setattr(families, "_BROKEN", {})


def _plugins(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Make ``entry_points(group=...)`` find these (real, loadable or not) entry points."""
    eps = [EntryPoint(name=n, value=v, group="beacon.reward_families") for n, v in targets.items()]

    def entry_points(group: str) -> list[EntryPoint]:
        return eps if group == "beacon.reward_families" else []

    monkeypatch.setattr(families, "entry_points", entry_points)
    monkeypatch.setattr(families, "_ENTRY_POINTS_LOADED", False)


def test_bare_decorator_registers_under_the_class_name() -> None:
    @register_family
    class Shifted(NormalFamily):
        name = "shifted-normal"

    assert isinstance(get_family("shifted-normal"), Shifted)
    assert "shifted-normal" in available_families()
    stopper = Stopper(BeaconConfig(cost=0.1, horizon=8, family="shifted-normal"))
    assert stopper.next_decision().count == 3


def test_a_nameless_class_takes_the_registered_name() -> None:
    class Unnamed(NormalFamily):
        name = ""

    register_family("mine")(Unnamed)
    assert Unnamed.name == "mine"
    with pytest.raises(ConfigError) as exc:
        register_family()(type("AlsoUnnamed", (NormalFamily,), {"name": ""}))
    assert exc.value.field == "name"


def test_an_alias_does_not_rename_the_family() -> None:
    register_family("coin")(BernoulliFamily)
    assert get_family("coin") is not get_family("bernoulli")
    assert BernoulliFamily.name == "bernoulli"
    with pytest.raises(ConfigError, match="bernoulli family"):
        BeaconConfig(cost=2.0, horizon=8, family="coin")


def test_a_subclass_registered_under_its_own_name_is_called_by_it() -> None:
    """The built-in judge family is a BernoulliFamily subclass: its messages say "judge"."""
    with pytest.raises(ConfigError, match="for the judge family"):
        BeaconConfig(cost=1.0, horizon=8, family="judge")

    class Coin(BernoulliFamily):  # inherits name = "bernoulli"
        pass

    register_family("coin2")(Coin)
    assert Coin.name == "coin2" and BernoulliFamily.name == "bernoulli"
    with pytest.raises(ConfigError, match="the coin2 family needs a BetaPrior"):
        BeaconConfig(cost=0.1, horizon=8, family="coin2", prior=NIGPrior.jeffreys())


def test_a_reward_error_at_a_named_place_reads_as_one() -> None:
    assert str(RewardError(2, 42.0, "x")) == "invalid reward at position 2: 42.0 (x)"
    named = RewardError("prompt 'q1' (record 1), sample 1", 1e300, "too large")
    assert str(named).startswith("invalid reward at prompt 'q1' (record 1), sample 1: ")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: register_family("x")(42), "family class"),
        (lambda: register_family("x")(dict), "family class"),
        (lambda: register_family(42), "name"),
        (lambda: register_family(""), "name"),
        (lambda: register_family("  "), "name"),
    ],
)
def test_bad_registrations_are_config_errors(call: Any, field: str) -> None:
    before = dict(families._FAMILIES)
    with pytest.raises(ConfigError) as exc:
        call()
    assert exc.value.field == field
    assert before == families._FAMILIES


def test_an_abstract_family_is_a_config_error_naming_what_is_missing() -> None:
    class Half(RewardFamily):
        name = "half"

    with pytest.raises(ConfigError, match="decide") as exc:
        register_family()(Half)
    assert exc.value.value is Half
    assert "half" not in families._FAMILIES


def test_entry_point_plugin_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    _plugins(monkeypatch, gauss="beacon.families.normal:NormalFamily")
    fam = get_family("gauss")
    assert isinstance(fam, NormalFamily)
    assert NormalFamily.name == "normal"
    assert "gauss" in available_families()


def test_a_broken_plugin_does_not_hide_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    _plugins(
        monkeypatch,
        missing="beacon_no_such_module_42:Family",
        notfamily="beacon.errors:ConfigError",
        good="beacon.families.normal:NormalFamily",
    )
    with pytest.warns(RuntimeWarning) as warned:
        names = available_families()
    assert "good" in names
    assert "missing" not in names
    assert "notfamily" not in names
    assert len(warned) == 2
    assert isinstance(get_family("good"), NormalFamily)

    with pytest.raises(ConfigError, match="failed to load") as exc:
        get_family("missing")
    assert exc.value.field == "entry point beacon.reward_families:missing"
    assert isinstance(exc.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ConfigError, match="RewardFamily subclass") as exc:
        BeaconConfig(cost=0.1, horizon=8, family="notfamily")
    assert exc.value.field == "entry point beacon.reward_families:notfamily"
    with pytest.raises(UnknownFamilyError) as unknown:
        get_family("neither")
    assert "good" in unknown.value.known
