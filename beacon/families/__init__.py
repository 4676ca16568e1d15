"""Reward families: how rewards become sufficient statistics and a continue/stop answer.

A family is a :class:`RewardFamily` subclass registered under a name, either with the
:func:`register_family` decorator or through the entry-point group ``beacon.reward_families``
(the entry point names a family class). Built-ins: ``normal`` (Normal–Inverse-Gamma learning with
the Universal Index Policy), ``bernoulli`` (Beta learning with the reservation-cost policy) and
``judge`` (probability-valued judges learnt as win / no-win with the Bernoulli policy).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar, overload

from beacon.errors import ConfigError, UnknownFamilyError
from beacon.families.base import Decision, RewardFamily

__all__ = [
    "Decision",
    "RewardFamily",
    "available_families",
    "get_family",
    "register_family",
]

_FAMILIES: dict[str, RewardFamily] = {}
_BROKEN: dict[str, ConfigError] = {}
_ENTRY_POINTS_LOADED = False
# Held while the plugins load: another thread asking for a family then waits for them instead
# of finding the "loaded" flag set and the plugin not yet registered. Re-entrant, and
# _EP_LOADING set, for a plugin whose import itself asks for a family.
_EP_LOCK = threading.RLock()
_EP_LOADING = False

F = TypeVar("F", bound=type[RewardFamily])


@overload
def register_family(name: F, /) -> F: ...


@overload
def register_family(name: str | None = None, /) -> Callable[[F], F]: ...


def register_family(name: str | type[RewardFamily] | None = None, /) -> Any:
    """Class decorator: register a :class:`RewardFamily` subclass under ``name``.

    ``@register_family("mine")`` registers under ``"mine"``; ``@register_family()`` and the bare
    ``@register_family`` use the class attribute ``name``. A class without a ``name`` takes the
    one it is registered under, and so does a subclass that only inherits its base's ``name``
    (its error messages then say its own name); a class that has its own ``name`` keeps it (it is
    what the family's error messages say), so registering a class under a second name adds an
    alias without renaming it. Registering a name twice replaces the earlier family (so a plugin
    can override a built-in on purpose). A name that is not a non-empty string, a decorated
    object that is not a concrete :class:`RewardFamily` subclass, or a class that cannot be
    instantiated without arguments raises :class:`beacon.ConfigError` naming it.
    """
    if isinstance(name, type):
        return _register(name, None)
    if name is not None and not (isinstance(name, str) and name.strip()):
        raise ConfigError("name", name, "a reward family name must be a non-empty string")

    def deco(cls: F) -> F:
        return _register(cls, name)

    return deco


def _instantiate(obj: object, what: str) -> RewardFamily:
    if not (isinstance(obj, type) and issubclass(obj, RewardFamily)):
        raise ConfigError(what, obj, "must be a RewardFamily subclass")
    try:
        return obj()
    except TypeError as exc:  # abstract methods left, or required constructor arguments
        raise ConfigError(what, obj, f"cannot be instantiated without arguments: {exc}") from exc


def _register(cls: F, name: str | None) -> F:
    fam = _instantiate(cls, "family class")
    key = name or cls.name
    if not (isinstance(key, str) and key.strip()):
        raise ConfigError("name", key, f"family class {cls.__name__} has no name; pass one")
    if not cls.__dict__.get("name"):  # its own, not one inherited from a registered base
        cls.name = key
    _FAMILIES[key] = fam
    return cls


def _load_entry_points() -> None:
    """Load the ``beacon.reward_families`` plugins once, each on its own.

    A plugin that fails to load (import error, not a family) does not stop the others: it is
    reported with a warning now and its :class:`beacon.ConfigError` is raised when that name is
    asked for.
    """
    global _ENTRY_POINTS_LOADED, _EP_LOADING
    if _ENTRY_POINTS_LOADED:
        return
    with _EP_LOCK:
        if _ENTRY_POINTS_LOADED or _EP_LOADING:  # loaded meanwhile, or asked by a plugin's import
            return
        _EP_LOADING = True
        try:
            _load_each_entry_point()
        finally:
            _EP_LOADING = False
            _ENTRY_POINTS_LOADED = True


def _load_each_entry_point() -> None:
    """The body of :func:`_load_entry_points` (run once, under ``_EP_LOCK``)."""
    for ep in entry_points(group="beacon.reward_families"):
        if ep.name in _FAMILIES:
            continue
        what = f"entry point beacon.reward_families:{ep.name}"
        try:
            obj = ep.load()
            fam = obj if isinstance(obj, RewardFamily) else _instantiate(obj, what)
        except ConfigError as exc:
            _BROKEN[ep.name] = exc
        except Exception as exc:  # a plugin's import may raise anything
            _BROKEN[ep.name] = ConfigError(what, ep.value, f"failed to load: {exc!r}")
            _BROKEN[ep.name].__cause__ = exc
        else:
            if not type(fam).__dict__.get("name"):
                type(fam).name = ep.name
            _FAMILIES[ep.name] = fam
            continue
        warnings.warn(str(_BROKEN[ep.name]), RuntimeWarning, stacklevel=4)


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
    if fam is None and isinstance(name, str) and name in _BROKEN:
        raise _BROKEN[name]
    if fam is None:
        raise UnknownFamilyError(name, available_families())
    return fam


# Built-ins register themselves on import.
from beacon.families import bernoulli as _bernoulli  # noqa: E402,F401
from beacon.families import judge as _judge  # noqa: E402,F401
from beacon.families import normal as _normal  # noqa: E402,F401
