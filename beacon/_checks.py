"""Type tests and checks shared by the validators: numpy scalars count as numbers, booleans do not.

Validators convert what passes to ``int`` / ``float`` before storing it, so configurations stay
JSON-ready and compare equal whatever scalar type they were built from.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from beacon.errors import ConfigError

__all__ = ["boolean", "is_integer", "is_real", "positive_int", "real_as_float"]


def is_real(v: object) -> bool:
    """A real number (``int``, ``float``, numpy integer or floating scalar), not a boolean."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_integer(v: object) -> bool:
    """An integer (``int`` or numpy integer scalar), not a boolean."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def real_as_float(v: numbers.Real | np.bool_ | float) -> float:
    """A real number (Python or numpy) as a ``float``; an integer beyond the float range (a JSON
    or Python ``int`` of hundreds of digits) is infinite with its sign instead of an
    ``OverflowError``, so the caller's finiteness check reports it."""
    try:
        return float(v)
    except OverflowError:
        return -math.inf if isinstance(v, int) and v < 0 else math.inf  # only ints overflow


def positive_int(name: str, v: object, error: type[ConfigError] = ConfigError) -> int:
    """``v`` as a plain ``int`` >= 1, or ``error(name, v, ...)`` (a :class:`ConfigError`)."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1:
        return int(v)
    raise error(name, v, "must be an integer >= 1")


def boolean(name: str, v: object, error: type[ConfigError] = ConfigError) -> bool:
    """``v`` (``bool`` or numpy boolean) as a plain ``bool``, or ``error(name, v, ...)``."""
    if not isinstance(v, bool | np.bool_):
        raise error(name, v, "must be True or False")
    return bool(v)
