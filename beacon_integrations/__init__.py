"""Optional integrations of BEACON with other libraries.

Sub-modules import their framework on use only: ``beacon_integrations.scorers`` (reward scorers:
an aiohttp client for reward-model HTTP endpoints, a math-verify answer checker and the paper's
correctness-adjusted reward), and the LangChain / LlamaIndex adapters. Importing this package
imports nothing heavy.

Each adapter needs an extra of the ``beacon-sampling`` distribution: ``langchain`` for
``beacon_integrations.langchain``, ``llamaindex`` for ``beacon_integrations.llama_index``.
Importing an adapter whose framework is not installed raises a ``ModuleNotFoundError`` that names
the extra to install (``pip install "beacon-sampling[langchain]"``), instead of failing deep inside
the adapter on its first framework import; ``importlib.util.find_spec`` still returns the
adapter's spec (it does not raise), as for any module whose dependency is missing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# adapter module -> (extra, the modules it needs from that extra)
_EXTRA_OF_MODULE: dict[str, tuple[str, tuple[str, ...]]] = {
    "beacon_integrations.langchain": ("langchain", ("langchain_core",)),
    "beacon_integrations.llama_index": ("llamaindex", ("llama_index.core",)),
}


def _absent(name: str) -> bool:
    """Whether module ``name`` cannot be imported (without importing it)."""
    if name in sys.modules:
        return sys.modules[name] is None  # None: the import is blocked
    try:
        return importlib.util.find_spec(name) is None
    except ImportError:  # a parent package is missing (or blocked)
        return True
    except ValueError:  # in sys.modules without a spec: present
        return False


def missing_extra_error(fullname: str, extra: str, missing: str) -> ModuleNotFoundError:
    """The error for ``fullname`` needing ``extra``, whose module ``missing`` is not installed."""
    return ModuleNotFoundError(
        f"No module named {missing!r} ({fullname} needs the {extra!r} extra: "
        f'pip install "beacon-sampling[{extra}]")',
        name=missing,
    )


def import_extra(module: str, fullname: str, extra: str) -> ModuleType:
    """``module``, imported on first use by ``fullname``; when it is not installed, the error
    names ``extra`` (:func:`missing_extra_error`). A module missing *inside* it is not hidden."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise missing_extra_error(fullname, extra, module) from exc


class _MissingExtraLoader(importlib.abc.Loader):
    """Loader of an adapter whose framework is missing: executing it raises
    :func:`missing_extra_error` (checked again then, in case the framework appeared since)."""

    def __init__(self, loader: importlib.abc.Loader | None, extra: str,
                 modules: tuple[str, ...]) -> None:
        self.loader = loader
        self.extra = extra
        self.modules = modules

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        for m in self.modules:
            if _absent(m):
                raise missing_extra_error(spec.name, self.extra, m)
        return self.loader.create_module(spec) if self.loader is not None else None

    def exec_module(self, module: ModuleType) -> None:
        if self.loader is None:  # pragma: no cover - a spec found without a loader
            raise ImportError(f"no loader for {module.__name__}", name=module.__name__)
        self.loader.exec_module(module)


class _ExtraHintFinder:
    """A ``sys.meta_path`` finder that only looks at the adapters of :data:`_EXTRA_OF_MODULE`.

    When one's framework is missing it returns the adapter's normal spec with a loader that
    raises :func:`missing_extra_error` on import, so ``importlib.util.find_spec`` behaves as for
    any module with a missing dependency (a spec, no exception) and ``import`` names the extra;
    otherwise it steps aside (returns ``None``) and the adapter is imported normally.
    """

    _beacon_extra_hints = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        need = _EXTRA_OF_MODULE.get(fullname)
        if need is None:
            return None
        extra, modules = need
        if not any(_absent(m) for m in modules):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None:
            return None
        spec.loader = _MissingExtraLoader(spec.loader, extra, modules)
        return spec


if not any(getattr(f, "_beacon_extra_hints", False) and type(f).__module__ == __name__
           for f in sys.meta_path):
    sys.meta_path.insert(0, _ExtraHintFinder())
