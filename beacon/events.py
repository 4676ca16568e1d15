"""Observer events emitted by :class:`~beacon.engine.BeaconSampler`.

An observer is any callable taking one event, sync or async (``def obs(ev)`` or
``async def obs(ev)``). The engine calls observers in order, awaiting async ones inline (so a slow
observer slows its query: that is back-pressure, not a bug). An exception raised by an observer
ends that query with ``stop_reason="error"`` (the result keeps what it had); raised on the
final stop decision, it is reported in ``result.error`` and the Stopper's stop reason is kept.

Two events exist:

* :class:`SampleEvent` -- one per sample, when its reward is fed to the Stopper (in draw order)
  or when it is recorded as failed.
* :class:`DecisionEvent` -- one per Stopper decision, mirroring its
  :class:`~beacon.stopper.TraceRecord`; the final ``stop`` is delivered also when the query
  ends with ``error`` (an observer that raised is called for it too; a second error of it is
  not reported).

``query_id`` tells queries apart inside ``arun_many`` (the prompt's position); it is ``None``
for a single ``arun``. Events never carry credentials.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from beacon._sync import callable_name
from beacon.stopper import TraceRecord

__all__ = [
    "BeaconEvent", "DecisionEvent", "Observer", "ObserverCancelledError", "SampleEvent", "emit",
]


def _jf(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v


@dataclass(frozen=True, slots=True)
class SampleEvent:
    """A sample was scored (``reward`` set) or failed (``failed`` True, ``error`` set).

    ``k`` is the number of rewards the Stopper has observed after this sample; ``index`` the
    sample's draw order in the query; ``latency`` its seconds from generation start to score.
    """

    k: int
    index: int
    reward: float | None
    text: str
    failed: bool
    error: str | None = None
    latency: float = 0.0
    query_id: int | None = None

    kind = "sample"

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.kind,
            "k": self.k,
            "index": self.index,
            "reward": _jf(self.reward),
            "text": self.text,
            "failed": self.failed,
            "error": self.error,
            "latency": self.latency,
            "query_id": self.query_id,
        }


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """A Stopper decision: the fields of its :class:`~beacon.stopper.TraceRecord`.

    ``decision`` is ``draw`` (``count`` more samples) or ``stop`` (``reason`` set). ``zhat`` =
    (z - mu) / sigma, ``h`` = h_{n,k}(zhat) (h^B for ``bernoulli``) compared with ``threshold``
    (c / sigma, or c); NaN where undefined.
    """

    k: int
    z: float
    mu: float
    sigma: float
    zhat: float
    h: float
    threshold: float
    decision: str
    count: int = 0
    reason: str | None = None
    query_id: int | None = None

    kind = "decision"

    @classmethod
    def from_record(cls, rec: TraceRecord, query_id: int | None = None) -> DecisionEvent:
        return cls(rec.k, rec.z, rec.mu, rec.sigma, rec.zhat, rec.h, rec.threshold,
                   rec.decision, rec.count, rec.reason, query_id)

    def to_record(self) -> TraceRecord:
        return TraceRecord(self.k, self.z, self.mu, self.sigma, self.zhat, self.h,
                           self.threshold, self.decision, self.count, self.reason)

    def to_dict(self) -> dict[str, Any]:
        d = self.to_record().to_dict()
        d["event"] = self.kind
        d["query_id"] = self.query_id
        return d


BeaconEvent: TypeAlias = SampleEvent | DecisionEvent
Observer: TypeAlias = Callable[[BeaconEvent], object]
"""A callable taking one event. Its result is awaited when awaitable and otherwise ignored, so
any return type is accepted (``log.write`` returning an int, ``list.append``, ``async def``)."""


class ObserverCancelledError(RuntimeError):
    """An observer raised ``asyncio.CancelledError`` without its query being cancelled.

    An observer's error ends its query (``stop_reason="error"``); passed on as it is, this one
    would look like the caller cancelling, ending ``arun`` or a whole ``arun_many`` instead.
    """


async def emit(observers: Sequence[Observer], event: BeaconEvent) -> None:
    """Deliver ``event`` to each observer in order, awaiting async observers.

    A ``CancelledError`` raised by an observer while the calling task is not being cancelled
    is an :class:`ObserverCancelledError`.
    """
    for obs in observers:
        try:
            out: Any = obs(event)
            if inspect.isawaitable(out):
                await out
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling() > 0:
                raise  # the query is being cancelled
            raise ObserverCancelledError(
                f"observer {callable_name(obs)} raised CancelledError without the query "
                "being cancelled"
            ) from exc

