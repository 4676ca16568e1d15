"""Reward families: how rewards become sufficient statistics and a continue/stop answer.

A family is a :class:`RewardFamily` subclass registered under a name, either with the
:func:`register_family` decorator or through the entry-point group ``beacon.reward_families``
(the entry point names a family class). Built-ins: ``normal`` (Normal–Inverse-Gamma learning with
the Universal Index Policy), ``bernoulli`` (Beta learning with the reservation-cost policy) and
``judge`` (probability-valued judges learnt as win / no-win with the Bernoulli policy).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TypeVar

from beacon.errors import UnknownFamilyError
from beacon.families.base import Decision, RewardFamily

__all__ = [
    "Decision",
    "RewardFamily",
    "available_families",
    "get_family",
    "register_family",
]

_FAMILIES: dict[str, RewardFamily] = {}
_ENTRY_POINTS_LOADED = False

F = TypeVar("F", bound=type[RewardFamily])


def register_family(name: str | None = None) -> Callable[[F], F]:
    """Class decorator: register a :class:`RewardFamily` subclass under ``name``.

    ``name`` defaults to the class attribute ``name``. Registering a name twice replaces the
    earlier family (so a plugin can override a built-in on purpose).
    """

    def deco(cls: F) -> F:
        key = name or cls.name
        if not key:
            raise ValueError(f"family class {cls.__name__} has no name")
        cls.name = key
        _FAMILIES[key] = cls()
        return cls

    return deco


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group="beacon.reward_families"):
        if ep.name in _FAMILIES:
            continue
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, RewardFamily):
            obj.name = ep.name
            _FAMILIES[ep.name] = obj()
        elif isinstance(obj, RewardFamily):
            _FAMILIES[ep.name] = obj
        else:
            raise TypeError(
                f"entry point beacon.reward_families:{ep.name} must name a RewardFamily "
                f"subclass, got {obj!r}"
            )


def available_families() -> list[str]:
    """Names of every registered family (built-ins, decorated classes and entry points)."""
    _load_entry_points()
    return sorted(_FAMILIES)


def get_family(name: str) -> RewardFamily:
    """The family registered as ``name``; :class:`UnknownFamilyError` lists the known ones."""
    fam = _FAMILIES.get(name) if isinstance(name, str) else None
    if fam is None:
        _load_entry_points()
        fam = _FAMILIES.get(name) if isinstance(name, str) else None
    if fam is None:
        raise UnknownFamilyError(name, available_families())
    return fam


# Built-ins register themselves on import.
from beacon.families import bernoulli as _bernoulli  # noqa: E402,F401
from beacon.families import judge as _judge  # noqa: E402,F401
from beacon.families import normal as _normal  # noqa: E402,F401
