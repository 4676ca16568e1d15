"""Audit 3 of the synchronous entry points: an abandoned call does not hold up ``run()``
(bounded loop shutdown in :mod:`beacon._sync`), and ``BeaconRunnable(offload_sync=True)``."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from typing import Any

import numpy as np
import pytest
from langchain_core.load import dumpd
from pydantic import ValidationError

import beacon
from beacon import Budget, _sync
from beacon._sync import run_sync
from beacon.engine import BeaconSampler
from beacon.engine import calls as engine_calls
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon_integrations.langchain import BeaconRunnable

NOISE = ("was destroyed but it is pending", "was never awaited", "Exception ignored",
         "Traceback")


class _StuckModel:
    """A model whose calls after the first ``fast`` swallow their cancellation for ``cap``
    seconds (a client's own retry loop), recording every loop it ran on and how its stuck
    calls ended. ``bare``: it swallows everything (a bare ``except:``), GeneratorExit too."""

    def __init__(self, fast: int = 3, cap: float = 3.0, bare: bool = False) -> None:
        self.fast, self.cap, self.bare = fast, cap, bare
        self.calls = self.swallowed = self.stuck = self.ended = 0
        self.released = False
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def generate(self, prompt: Any) -> str:
        self.calls += 1
        self.loops.append(asyncio.get_running_loop())
        if self.calls > self.fast:
            self.stuck += 1
            try:
                await self._hang()
            finally:
                self.ended += 1
        return f"answer {self.calls}"

    async def _hang(self) -> None:
        end = time.monotonic() + self.cap
        while time.monotonic() < end and not self.released:
            if self.bare:
                try:
                    await asyncio.sleep(end - time.monotonic())
                except:  # noqa: E722 -- the client under test swallows everything
                    self.swallowed += 1
            else:
                try:
                    await asyncio.sleep(end - time.monotonic())
                except asyncio.CancelledError:
                    self.swallowed += 1


def _score(prompt: Any, text: str) -> float:
    return float(int(text.split()[-1]) % 5)


def _sampler(model: _StuckModel) -> BeaconSampler:
    # cost ~0: BEACON would sample to the horizon; the 0.5 s deadline ends the query (room
    # for the 3 fast samples on a loaded machine)
    cfg = beacon.BeaconConfig(cost=1e-9, horizon=8, max_failures=0)
    return BeaconSampler(model.generate, _score, cfg, timeout=30.0,
                         budget=Budget(max_seconds=0.5), retry=RetryPolicy.none())


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("beacon-")}


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("bare", [False, True], ids=["swallows-cancel", "bare-except"])
@pytest.mark.parametrize("inside_loop", [False, True], ids=["plain", "in-running-loop"])
def test_sync_run_is_not_held_up_by_an_abandoned_call(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, bare: bool,
    inside_loop: bool,
) -> None:
    # Before: the sync run() shut its loop down with asyncio.Runner.close(), which waits for
    # every task left on it: the sample the engine abandoned at the 0.5 s deadline (its
    # client swallows the cancellation) held run() for the client's full 3 s.
    model = _StuckModel(bare=bare)
    s = _sampler(model)
    before = _threads()
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        if inside_loop:  # a notebook cell: sync code under a running loop
            async def cell() -> beacon.BeaconResult:
                return s.run("p")

            outer = asyncio.new_event_loop()
            try:
                res = outer.run_until_complete(cell())
            finally:
                outer.close()
        else:
            res = s.run("p")
    elapsed = time.monotonic() - t0
    assert elapsed < 2.5, elapsed
    assert model.stuck == 1 and model.swallowed >= 1
    assert res.stop_reason == "budget"
    assert res.n_samples == 3 and len(res.candidates) == 3  # the samples observed are kept
    assert res.best is not None
    # the stuck call was closed with its loop, not left running or referenced
    assert model.loops and all(loop.is_closed() for loop in model.loops)
    if bare:
        # it ignores GeneratorExit too: closing it failed; it is leaked, never resumed (the
        # garbage collector would run its retry loop again, outside any loop)
        stuck = [c for c in (r() for r in _sync._kept) if getattr(c, "__name__", "") == "_hang"
                 and c.cr_frame is not None]
        assert len(stuck) == 1
        model.released = True  # let it end now, for the test's own teardown
        stuck[0].close()
    else:
        assert model.ended == 1
    assert not any(t.get_loop() in model.loops for t in engine_calls._abandoned)
    assert _threads() <= before
    assert "dropped with their event loop" in caplog.text
    gc.collect()
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("error")
def test_run_sync_waits_for_the_callers_own_leftover_tasks_as_asyncio_run_does(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Only the samples the engine abandoned are dropped: a task of the caller's own is waited
    # for however long its cleanup takes (a graceful close), and one that swallows its
    # cancellation for a while too; neither is cut short.
    state = {"swallowed": 0, "closed": False, "slow_cleanup_done": False}

    async def stubborn() -> None:
        end = time.monotonic() + 0.6
        try:
            while time.monotonic() < end:
                try:
                    await asyncio.sleep(end - time.monotonic())
                except asyncio.CancelledError:
                    state["swallowed"] += 1
        finally:
            state["closed"] = True

    async def graceful() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.6)  # longer than CANCEL_GRACE
            state["slow_cleanup_done"] = True

    keep: list[asyncio.Task[None]] = []

    async def main() -> str:
        loop = asyncio.get_running_loop()
        keep.extend([loop.create_task(stubborn()), loop.create_task(graceful())])
        await asyncio.sleep(0.05)
        return "done"

    assert run_sync(main()) == "done"
    assert state["swallowed"] >= 1 and state["closed"] and state["slow_cleanup_done"]
    assert all(t.done() for t in keep)
    keep.clear()
    gc.collect()
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err


@pytest.mark.filterwarnings("error")
def test_run_sync_still_waits_for_leftover_tasks_that_stop_when_cancelled(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # the bounded shutdown keeps asyncio.run's guarantee for well-behaved tasks: they are
    # cancelled and their cleanup runs before run_sync returns
    cleaned: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)
            cleaned.append("bg")

    async def gen() -> Any:
        try:
            yield 1
            await asyncio.sleep(30)
        finally:
            cleaned.append("agen")

    async def main() -> int:
        asyncio.get_running_loop().create_task(background())
        g = gen()
        first = await g.__anext__()
        await asyncio.sleep(0)
        return first

    assert run_sync(main()) == 1
    gc.collect()
    assert sorted(cleaned) == ["agen", "bg"]
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err


# -- BeaconRunnable(offload_sync=...) -----------------------------------------------------------
class _BlockingScorer:
    """A synchronous scorer that blocks its thread (``time.sleep``-like, on an Event) for
    ``seconds``, counting how many calls run at once and on which threads."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.active = self.peak = self.finished = 0
        self.threads: set[int] = set()
        self.release = threading.Event()

    def __call__(self, prompt: str, response: str) -> float:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.threads.add(threading.get_ident())
        try:
            self.release.wait(self.seconds)
        finally:
            with self.lock:
                self.active -= 1
                self.finished += 1
        return float(len(response))


async def _model(value: Any) -> str:
    await asyncio.sleep(0)
    return "an answer"


def _runnable(scorer: _BlockingScorer, **kw: Any) -> BeaconRunnable[BeaconResult]:
    # the first round of samples (k0 = 3 under the Jeffreys prior) is drawn at once
    return BeaconRunnable(model=_model, scorer=scorer, return_result=True,
                          config=beacon.BeaconConfig(cost=0.1, horizon=4, family="normal"),
                          retry=RetryPolicy.none(), **kw)


@pytest.mark.timeout(30)
def test_offloaded_sync_scorer_calls_of_concurrent_queries_overlap() -> None:
    # Before: a sync scorer callable ran inline on the event loop; a blocking one held every
    # other call (of this and of the other query) for its whole duration: one at a time.
    scorer = _BlockingScorer(0.3)
    r = _runnable(scorer, offload_sync=True)

    async def two() -> list[BeaconResult]:
        return list(await asyncio.gather(r.ainvoke("q1"), r.ainvoke("q2")))

    loop_thread: list[int] = []

    async def main() -> list[BeaconResult]:
        loop_thread.append(threading.get_ident())
        return await two()

    results = asyncio.run(main())
    assert all(res.error is None and res.n_samples >= 3 for res in results)
    assert scorer.peak >= 2  # calls ran at the same time
    assert loop_thread[0] not in scorer.threads  # in worker threads, not on the loop


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sync_entry", [False, True], ids=["ainvoke", "invoke"])
def test_offloaded_sync_scorer_is_timed_out_while_still_blocked(sync_entry: bool) -> None:
    # Before: the per-call timeout fired only once the blocking scorer returned (here after
    # 10 s): the query waited for it. Now its sample fails at the limit, the call abandoned.
    scorer = _BlockingScorer(10.0)
    r = _runnable(scorer, offload_sync=True, timeout=0.2)
    try:
        res = r.invoke("q") if sync_entry else asyncio.run(r.ainvoke("q"))
        assert scorer.finished == 0  # it returned while every scorer call was still blocked
        failed = [c for c in res.candidates if c.failed]
        assert failed and res.best is None
        assert all(c.error is not None and "scorer call timed out after 0.2 s" in c.error
                   for c in failed)
    finally:
        scorer.release.set()


@pytest.mark.timeout(30)
def test_sync_scorer_stays_inline_on_the_loop_by_default() -> None:
    scorer = _BlockingScorer(0.05)
    r = _runnable(scorer)
    assert r.offload_sync is False
    loop_thread: list[int] = []

    async def main() -> list[BeaconResult]:
        loop_thread.append(threading.get_ident())
        return list(await asyncio.gather(r.ainvoke("q1"), r.ainvoke("q2")))

    results = asyncio.run(main())
    assert all(res.error is None and res.n_samples >= 3 for res in results)
    assert scorer.peak == 1 and scorer.threads == {loop_thread[0]}


def test_offload_sync_is_validated_and_serialized() -> None:
    scorer = _BlockingScorer(0.0)
    for bad in ("yes", 1, None):
        with pytest.raises(ValidationError, match="offload_sync"):
            _runnable(scorer, offload_sync=bad)
    r = _runnable(scorer, offload_sync=np.bool_(True))
    assert r.offload_sync is True
    d = dumpd(r)
    assert d["kwargs"]["offload_sync"] is True
    again = _runnable(scorer, offload_sync=d["kwargs"]["offload_sync"])
    assert again.offload_sync is True
    res = again.invoke("q")
    assert res.error is None and scorer.threads and threading.get_ident() not in scorer.threads


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("error")
def test_sync_stream_is_not_held_up_by_an_abandoned_call(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # stream() runs the query on its own loop in a worker thread; it was shut down with
    # asyncio.run, which waited for the abandoned model call for the client's full 3 s.
    model = _StuckModel()
    r = BeaconRunnable(model=model.generate, scorer=_score, return_result=True,
                       config=beacon.BeaconConfig(cost=1e-9, horizon=8, max_failures=0),
                       budget=Budget(max_seconds=0.5), retry=RetryPolicy.none(), timeout=30.0)
    t0 = time.monotonic()
    chunks = list(r.stream("p"))
    assert time.monotonic() - t0 < 2.5
    final = chunks[-1]
    assert final.kind == "final" and final.stop_reason == "budget" and final.n_samples == 3
    assert model.stuck == 1 and model.ended == 1
    assert all(loop.is_closed() for loop in model.loops)
    gc.collect()
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err
