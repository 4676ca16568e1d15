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


# -- review: what prepare loads, the hop it skips, the budget it keeps -------------------------
def test_the_robust_updates_quantiles_are_computed_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``prepare`` read the table only: the robust update's first Student-t quantile (importing
    scipy.stats, ~1 s) still ran on the loop at the k0+1-th reward of the first query."""
    from beacon.families import normal

    real = normal.predictive_quantile
    misses_on_loop: list[float] = []

    def recording(dof: float, q: float) -> float:
        before = real.cache_info().misses
        out = real(dof, q)
        if real.cache_info().misses > before:
            try:
                asyncio.get_running_loop()
                misses_on_loop.append(dof)
            except RuntimeError:
                pass
        return out

    monkeypatch.setattr(normal, "predictive_quantile", recording)
    q = 0.0137  # a quantile of its own: nothing memoised for it yet
    cfg = beacon.BeaconConfig(cost=0.01, horizon=12, robust_quantile=q)
    res = BeaconSampler(_model, _score(), cfg).run("q")
    assert res.error is None and res.n_samples > 4, (res.error, res.n_samples)
    assert misses_on_loop == []


def test_the_decider_loads_its_lookup_kernel_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's ``h_lookup`` compiles (or loads) at its first call, which came at the first
    off-grid decision of some query, on the loop."""
    import beacon._kernels as kernels
    from beacon.families.normal import uip_decider
    from beacon.index import get_table

    real = kernels.load_tables()
    calls: list[tuple[int, float]] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def h_lookup(self, *args: Any) -> float:
            calls.append((int(args[-2]), float(args[-1])))
            return float(real.h_lookup(*args))

    monkeypatch.setattr(kernels, "load_tables", lambda: Recording())
    uip_decider(get_table(8), 0.1)
    assert len(calls) == 1 and calls[0][0] == 3 and calls[0][1] != calls[0][1]  # NaN


def test_a_fresh_sampler_of_a_loaded_config_does_not_go_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job runner builds a sampler per prompt: each paid a thread hop (~0.1 ms) for a
    config already loaded."""
    hops: list[Any] = []
    real = asyncio.to_thread

    async def counting(fn: Any, *args: Any, **kw: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args, **kw)

    cfg = _cfg(0.0567891)
    assert BeaconSampler(_model, _score(), cfg).run("a").error is None
    monkeypatch.setattr(asyncio, "to_thread", counting)
    for _ in range(3):
        assert BeaconSampler(_model, _score(), cfg).run("b").error is None
    assert hops == []


def test_the_load_counts_in_wall_seconds_but_not_against_max_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline ran from before the load: a first query whose load outlasted max_seconds
    stopped with ``budget`` before its first sample."""
    import time

    from beacon.budget import Budget

    real = NormalFamily.prepare

    def slow(self: NormalFamily, cfg: beacon.BeaconConfig) -> None:
        time.sleep(0.6)  # a table built for this horizon, or kernels compiled
        real(self, cfg)

    monkeypatch.setattr(NormalFamily, "prepare", slow)
    monkeypatch.setattr(NormalFamily, "needs_prepare", lambda self, cfg: True)
    sampler = BeaconSampler(_model, _score(), _cfg(0.0678912), budget=Budget(max_seconds=0.5))
    res = sampler.run("q")
    assert res.n_samples >= 1, (res.stop_reason, res.error)
    assert res.usage.wall_seconds >= 0.6


def test_a_semaphore_held_by_a_closed_loop_fails_the_call_rather_than_hang() -> None:
    """Handing an asyncio Semaphore over to the running loop is right when it is free; one held
    by a task of a loop closed without releasing it has lost that permit, and adopting it made
    the next run() wait for ever (the wait for a limiter is outside the per-call timeout)."""
    sem = asyncio.Semaphore(1)

    async def hold() -> None:
        await sem.acquire()  # never released
        await asyncio.sleep(3600)

    old = asyncio.new_event_loop()
    task = old.create_task(hold())
    old.run_until_complete(asyncio.sleep(0.01))

    async def bind() -> None:  # a second waiter binds the semaphore to the old loop
        await sem.acquire()

    waiter = old.create_task(bind())
    old.run_until_complete(asyncio.sleep(0.01))
    old.close()  # tasks dropped: the permit is gone
    assert task is not None and waiter is not None
    sampler = BeaconSampler(_model, _score(), _cfg(0.0789123), rate_limiter=sem, timeout=1.0)

    async def main() -> beacon.BeaconResult:
        return await asyncio.wait_for(sampler.arun("q"), 10)

    res = asyncio.run(main())  # a TimeoutError here is the hang
    assert res.stop_reason == "error"
