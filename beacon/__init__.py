"""BEACON: Bayesian optimal stopping for best-of-N LLM sampling.

The core is pure and deterministic: reward families, h-index tables, the :class:`Stopper` state
machine and the vectorised :func:`replay`. The async :class:`BeaconSampler` engine is the only
part that performs I/O. Framework adapters live in ``beacon_integrations`` (never imported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from beacon.config import BeaconConfig
from beacon.errors import (
    BeaconError,
    ConfigError,
    ConfigTypeError,
    RewardError,
    StopperStateError,
    UnknownFamilyError,
)
from beacon.families import RewardFamily, available_families, get_family, register_family
from beacon.families.bernoulli import reservation_cost
from beacon.priors import BetaPrior, NIGPrior, load_prior
from beacon.replay import ReplayResult, replay
from beacon.stopper import STOP_REASONS, Draw, Stop, Stopper, TraceRecord
from beacon.transforms import LogitTransform, RewardTransform

if TYPE_CHECKING:
    # The lazily loaded names below, as type checkers should see them (at runtime they come
    # from ``__getattr__``; without these imports a user's ``from beacon import BeaconSampler``
    # would be typed ``Any``).
    import numpy as np
    import numpy.typing as npt

    from beacon.budget import Budget, cost_from_price
    from beacon.engine import BatchScorer, BeaconSampler, Generation, Score
    from beacon.events import BeaconEvent, DecisionEvent, Observer, SampleEvent
    from beacon.fitting import (
        FitNoteWarning,
        FitResult,
        GaussianizeTransform,
        fit_prior,
        fit_reward_model,
        load_fit,
    )
    from beacon.result import BeaconResult, Candidate, Usage
    from beacon.retry import RetryPolicy, TransientError, is_retryable

__version__ = "0.1.0"

# The engine layer (asyncio, I/O) and the fitting code load on first use, so that a pure-core
# user (replay, Stopper) pays nothing for them.
_LAZY = {
    "BatchScorer": "beacon.engine",
    "BeaconSampler": "beacon.engine",
    "Generation": "beacon.engine",
    "Score": "beacon.engine",
    "BeaconEvent": "beacon.events",
    "DecisionEvent": "beacon.events",
    "Observer": "beacon.events",
    "SampleEvent": "beacon.events",
    "BeaconResult": "beacon.result",
    "Candidate": "beacon.result",
    "Usage": "beacon.result",
    "Budget": "beacon.budget",
    "cost_from_price": "beacon.budget",
    "RetryPolicy": "beacon.retry",
    "TransientError": "beacon.retry",
    "is_retryable": "beacon.retry",
    "fit_prior": "beacon.fitting",
    "fit_reward_model": "beacon.fitting",
    "load_fit": "beacon.fitting",
    "FitResult": "beacon.fitting",
    "FitNoteWarning": "beacon.fitting",
    "GaussianizeTransform": "beacon.fitting",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'beacon' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [  # noqa: RUF022 - grouped: core names, then lazily loaded ones
    "STOP_REASONS",
    "BeaconConfig",
    "BeaconError",
    "BetaPrior",
    "ConfigError",
    "ConfigTypeError",
    "Draw",
    "LogitTransform",
    "NIGPrior",
    "ReplayResult",
    "RewardError",
    "RewardFamily",
    "RewardTransform",
    "Stop",
    "Stopper",
    "StopperStateError",
    "TraceRecord",
    "UnknownFamilyError",
    "__version__",
    "available_families",
    "get_family",
    "h_index",
    "load_prior",
    "register_family",
    "replay",
    "reservation_cost",
    "BatchScorer",
    "BeaconEvent",
    "BeaconResult",
    "BeaconSampler",
    "Budget",
    "Candidate",
    "DecisionEvent",
    "GaussianizeTransform",
    "Generation",
    "Observer",
    "RetryPolicy",
    "SampleEvent",
    "Score",
    "TransientError",
    "Usage",
    "cost_from_price",
    "fit_prior",
    "fit_reward_model",
    "FitResult",
    "FitNoteWarning",
    "load_fit",
    "is_retryable",
]


@overload
def h_index(n: int, k: int, z: float, prior: NIGPrior | None = None) -> float: ...


@overload
def h_index(
    n: int, k: int, z: npt.NDArray[Any] | Sequence[Any], prior: NIGPrior | None = None
) -> npt.NDArray[np.float64]: ...


def h_index(
    n: int, k: int, z: float | npt.NDArray[Any] | Sequence[Any], prior: NIGPrior | None = None
) -> float | npt.NDArray[np.float64]:
    """h_{n,k}(z) for the ``normal`` family (Jeffreys' prior unless ``prior`` is given).

    ``z`` may be a float (the result is a float) or an array / nested sequence of them (the
    result is a float64 array of its shape); valid for k_min <= k < n with k_min = max(k0, 1).
    """
    from beacon.index import get_table

    if prior is not None and not isinstance(prior, NIGPrior):
        raise ConfigError("prior", prior, "h_index is the normal family's index: give an NIGPrior")
    p = prior or NIGPrior.jeffreys()
    return get_table(n, p.alpha0, p.nu0).h(k, z)
