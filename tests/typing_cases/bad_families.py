"""Wrong uses of the family registry that a type checker must reject (see bad_core.py)."""

from __future__ import annotations

from beacon import register_family


class NotAFamily:
    pass


register_family(NotAFamily)  # E: type-var
register_family(3)  # E: call-overload


@register_family("not-a-family")
class AlsoNotAFamily:  # E: type-var  (mypy reports a class decorator's error on the class line)
    pass
