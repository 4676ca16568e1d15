"""BEACON's Celery worker tier: ``worker.app`` (the app), ``worker.tasks`` (one task per prompt),
``worker.state`` (job state and fan-in in Redis), ``worker.config`` (settings from ``BEACON_*``).

Start a worker with ``beacon worker`` or ``celery -A worker.app worker``. Importing this package
imports nothing heavy; ``worker.app`` reads the environment when imported.

The modules that need Celery or redis (``app``, ``tasks``, ``state``, ``recovery``) come with the
``worker`` extra; importing one without it raises a ``ModuleNotFoundError`` that says so
(``pip install "beacon-sampling[worker]"``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# Modules of this package that need the 'worker' extra, and what they import from it.
# ``worker.config`` and ``worker.local_redis`` need nothing beyond the core.
_NEEDS: dict[str, tuple[str, ...]] = {
    "worker.app": ("celery", "redis"),
    "worker.tasks": ("celery", "redis"),
    "worker.state": ("redis",),
    "worker.recovery": ("redis",),
}


def _absent(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is None  # None: the import is blocked
    try:
        return importlib.util.find_spec(name) is None
    except ImportError:
        return True
    except ValueError:  # in sys.modules without a spec: present
        return False


class _ExtraHintFinder:
    """A ``sys.meta_path`` finder that only looks at the modules of :data:`_NEEDS`: when celery
    or redis is not installed it raises a ``ModuleNotFoundError`` naming the ``worker`` extra
    (``name`` is the missing module, as Python's own error has it); otherwise it steps aside."""

    _beacon_extra_hints = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        for m in _NEEDS.get(fullname, ()):
            if _absent(m):
                raise ModuleNotFoundError(
                    f"No module named {m!r} ({fullname} needs the 'worker' extra: "
                    'pip install "beacon-sampling[worker]")',
                    name=m,
                )
        return None


if not any(getattr(f, "_beacon_extra_hints", False) and type(f).__module__ == __name__
           for f in sys.meta_path):
    sys.meta_path.insert(0, _ExtraHintFinder())
