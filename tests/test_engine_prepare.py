"""The engine loads a config's decision data (the h-table) in a worker thread, not on its loop.

Before, the first decision of a sampler's first query read (or built) the h-table and loaded the
numba kernels on the event loop: ~0.3-1 s for a shipped table, seconds for a horizon that has to
be built, tens of seconds on a fresh machine that compiles the kernels; every query in flight
stalled meanwhile. These tests observe *where* the table is read, never how long it takes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import beacon
import beacon.index
from beacon.engine import BeaconSampler
from beacon.families.normal import NormalFamily


async def _model(prompt: Any) -> str:
    await asyncio.sleep(0)
    return "answer"


def _score() -> Any:
    n = [0]

    def score(prompt: Any, text: str) -> float:
        n[0] += 1
        return float((n[0] * 7) % 5)

    return score


def _cfg(cost: float) -> beacon.BeaconConfig:
    # a cost of its own: the family's per-config kernel (memoised) is new, so its table is read
    return beacon.BeaconConfig(cost=cost, horizon=8)


def _record_table_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Patch ``beacon.index.get_table`` to record (thread name, whether a loop runs there)."""
    calls: list[tuple[str, bool]] = []
    real = beacon.index.get_table

    def get_table(*args: Any, **kw: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        calls.append((threading.current_thread().name, on_loop))
        return real(*args, **kw)

    monkeypatch.setattr(beacon.index, "get_table", get_table)
    return calls


def test_the_table_is_read_in_a_worker_thread_not_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _record_table_reads(monkeypatch)
    sampler = BeaconSampler(_model, _score(), _cfg(0.0123457))

    async def main() -> beacon.BeaconResult:
        return await sampler.arun("q")

    res = asyncio.run(main())
    assert res.stop_reason in ("index", "horizon"), res.error
    assert res.n_samples >= 3
    assert calls, "the table was never read"
    assert all(not on_loop for _, on_loop in calls), calls
    assert all(name != threading.current_thread().name for name, _ in calls), calls


def test_the_sync_entry_point_inside_a_running_loop_reads_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _record_table_reads(monkeypatch)
    sampler = BeaconSampler(_model, _score(), _cfg(0.0234567))

    async def notebook_cell() -> beacon.BeaconResult:
        return sampler.run("q")  # Jupyter: run() called while a loop runs

    res = asyncio.run(notebook_cell())
    assert res.stop_reason in ("index", "horizon"), res.error
    assert calls and all(not on_loop for _, on_loop in calls), calls


def test_prepare_runs_once_per_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    real = NormalFamily.prepare

    def prepare(self: NormalFamily, cfg: beacon.BeaconConfig) -> None:
        seen.append(cfg.cost)
        real(self, cfg)

    monkeypatch.setattr(NormalFamily, "prepare", prepare)
    sampler = BeaconSampler(_model, _score(), _cfg(0.0345678))
    results = sampler.run_many(["a", "b", "c"])
    results.append(sampler.run("d"))
    assert all(r.error is None for r in results), [r.error for r in results]
    # queries started while the first prepares each wait in a thread of their own
    n = len(seen)
    assert 1 <= n <= 3 and set(seen) == {0.0345678}
    sampler.run("e")
    sampler.run_many(["f", "g"])
    assert len(seen) == n  # a prepared sampler never goes to a thread again


def test_a_table_that_cannot_be_read_ends_the_query_with_error_before_any_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def get_table(*args: Any, **kw: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(beacon.index, "get_table", get_table)
    generated: list[str] = []

    async def model(prompt: Any) -> str:
        generated.append(prompt)
        return "x"

    sampler = BeaconSampler(model, _score(), _cfg(0.0456789))
    res = sampler.run("q")  # never raises: the failure is the result's
    assert res.stop_reason == "error"
    assert "disk gone" in (res.error or "")
    assert generated == []  # nothing paid for a query that could never decide
    # the next query tries again (nothing was marked prepared)
    monkeypatch.undo()
    res = sampler.run("q")
    assert res.error is None, res.error


def test_a_plugin_family_without_prepare_samples_as_before() -> None:
    sampler = BeaconSampler(
        _model, lambda p, t: 0.0, beacon.BeaconConfig(cost=0.05, horizon=6, family="bernoulli")
    )
    res = sampler.run("q")
    assert res.error is None and res.stop_reason in ("index", "horizon"), res.error
