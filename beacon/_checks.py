"""Type tests shared by the validators: numpy scalars count as numbers, booleans do not.

Validators convert what passes to ``int`` / ``float`` before storing it, so configurations stay
JSON-ready and compare equal whatever scalar type they were built from.
"""

from __future__ import annotations

import numbers

__all__ = ["is_integer", "is_real"]


def is_real(v: object) -> bool:
    """A real number (``int``, ``float``, numpy integer or floating scalar), not a boolean."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_integer(v: object) -> bool:
    """An integer (``int`` or numpy integer scalar), not a boolean."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
