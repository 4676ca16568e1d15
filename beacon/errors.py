"""Typed errors raised by BEACON.

Every error names the offending field (or reward position) and its value so that a user can
fix the input without reading a traceback from deep inside numpy.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = [
    "BeaconError",
    "ConfigError",
    "ConfigTypeError",
    "RewardError",
    "StopperStateError",
    "UnknownFamilyError",
]


class _Shown:
    """Stands in for a value that does not pickle, printing as that value did."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _portable(value: Any) -> Any:
    """``value`` if it pickles, else a stand-in with its ``repr``: an error carrying, say, a
    generator or a local class as the offending value must still cross a process boundary (a
    multiprocessing pool, a Celery result) with the same message rather than be lost there."""
    try:
        pickle.dumps(value)
    except Exception:
        return _Shown(repr(value))
    return value


def _rebuild(cls: type[BeaconError], args: tuple[Any, ...], state: dict[str, Any]) -> BeaconError:
    """The unpickled error: its message and attributes set directly, without calling the
    class's ``__init__`` (whose signature varies from class to class)."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


def _reduce(err: BeaconError) -> tuple[Any, ...]:
    """Pickle support of the errors whose ``__init__`` takes ``(field | position, value,
    reason)``: Python's default rebuilds an exception as ``cls(*args)``, and their ``args``
    holds the message alone, so without this a worker process or a Celery task could not send
    one back (it failed to unpickle, and copy.copy failed the same way)."""
    state = {k: _portable(v) for k, v in vars(err).items()}
    return (_rebuild, (type(err), tuple(_portable(a) for a in err.args), state))


class BeaconError(Exception):
    """Base class of every error raised on purpose by BEACON."""


class ConfigError(BeaconError, ValueError):
    """An invalid configuration value; ``field`` and ``value`` say which one."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={value!r}: {reason}")

    __reduce__ = _reduce


class ConfigTypeError(ConfigError, TypeError):
    """An argument of the wrong type (a ``Stopper`` or ``replay`` config that is not a
    ``BeaconConfig``, a sampler argument of the wrong kind): a :class:`ConfigError` (``field``,
    ``value``, ``reason``) that is also a ``TypeError``, so ``except TypeError`` and ``except
    ConfigError`` (or ``ValueError``) both catch it."""


class UnknownFamilyError(ConfigError):
    """A reward family name that is not registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            "family", name, f"unknown reward family; registered families: {', '.join(known)}"
        )
        self.known = known


class RewardError(BeaconError, ValueError):
    """A reward that cannot be used (NaN, infinite, or outside the family's support).

    ``position`` is the 0-based index of the reward in the query's sequence of samples
    (or ``(row, column)`` in a replay array).
    """

    def __init__(self, position: Any, value: Any, reason: str) -> None:
        self.position = position
        self.value = value
        self.reason = reason
        # a position already in words (a prompt id and sample, from the CLI) reads as a place
        where = position if isinstance(position, str) else f"position {position}"
        super().__init__(f"invalid reward at {where}: {value!r} ({reason})")

    __reduce__ = _reduce


class StopperStateError(BeaconError, RuntimeError):
    """The Stopper was driven out of order (observe after Stop, or without a pending Draw)."""
