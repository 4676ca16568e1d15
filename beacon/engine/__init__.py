"""The async sampling engine: the only part of ``beacon`` that performs I/O.

* :mod:`beacon.engine.protocol` -- the model/scorer protocol (``Generation``, ``BatchScorer``).
* :mod:`beacon.engine.calls` -- one guarded call (slot, rate limiter, timeout, retries).
* :mod:`beacon.engine.query` -- the driver of one query around the Stopper.
* :mod:`beacon.engine.sampler` -- :class:`BeaconSampler`, the public entry point.
"""

from __future__ import annotations

from beacon.engine.protocol import BatchScorer, Generation, Score, coerce_generation
from beacon.engine.sampler import BeaconSampler
from beacon.errors import ConfigTypeError

__all__ = [
    "BatchScorer", "BeaconSampler", "ConfigTypeError", "Generation", "Score", "coerce_generation",
]
