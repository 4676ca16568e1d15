"""Run one prompt of a bulk job on the async engine; shared by the local runner and the workers.

:class:`PromptExecutor` builds the generator and scorer from their factories (once per process
and spec, so HTTP sessions inside them are shared by every prompt), binds them to the prompt
record when they have ``bind(record)``, runs :class:`beacon.BeaconSampler` for the prompt under a
concurrency limit shared by all prompts, and turns the :class:`beacon.BeaconResult` into the
output line and the DPO line. It never raises for a bad prompt or a failing model: the outcome
then carries an error record (``ok: false``) naming the field and value.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from beacon._checks import boolean, positive_int
from beacon.budget import Budget
from beacon.config import BeaconConfig
from beacon.engine import BeaconSampler
from beacon.errors import ConfigError
from beacon.events import BeaconEvent, Observer
from beacon.jobs.dpo import dpo_record
from beacon.jobs.spec import (
    FactorySpec,
    JobInputError,
    JobSpec,
    LineError,
    PromptRecord,
    normalize_allow_list,
)
from beacon.result import BeaconResult
from beacon.retry import RetryPolicy
from beacon.stopper import Draw, Stopper

__all__ = ["FactoryCache", "Outcome", "PromptExecutor", "error_record", "line_error_record",
           "prepare_config", "result_record"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one prompt produced: the output line, the DPO line (or None) and whether it is ok."""

    key: str
    record: dict[str, Any]
    dpo: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return bool(self.record.get("ok"))

    def to_payload(self) -> dict[str, Any]:
        return {"record": self.record, "dpo": self.dpo}


def _error_dict(exc: BaseException) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, ConfigError):
        d["field"] = exc.field
        try:
            d["value"] = exc.value if _jsonable(exc.value) else repr(exc.value)
        except Exception:  # pragma: no cover - repr of a hostile object
            d["value"] = None
    return d


def _jsonable(v: Any) -> bool:
    import json

    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def error_record(key: str, record: PromptRecord | None, exc: BaseException, *,
                 line: int | None = None) -> dict[str, Any]:
    """Output line of a prompt that could not run (``ok: false``, ``error`` names the cause)."""
    out: dict[str, Any] = {"key": key, "id": None if record is None else record.id,
                           "line": line if line is not None else (record.line if record else None),
                           "ok": False, "error": _error_dict(exc)}
    return out


def line_error_record(key: str, bad: LineError, lines: Iterable[int] = ()) -> dict[str, Any]:
    """Output line of an input line that is not a valid prompt record.

    ``lines``: every line number the same text occurs on (``bad.line`` is added); the record
    lists them in ``lines`` and, when there are several, its message names them too."""
    out = error_record(key, None, bad.error, line=bad.line)
    where = sorted({bad.line, *lines})
    out["lines"] = where
    if len(where) > 1:
        shown = ", ".join(str(n) for n in where[:_LINES_SHOWN])
        more = f" and {len(where) - _LINES_SHOWN} more" if len(where) > _LINES_SHOWN else ""
        out["error"]["message"] += (f" (the same line occurs {len(where)} times, on lines "
                                    f"{shown}{more}; see 'lines')")
    return out


_LINES_SHOWN = 20  # line numbers named in the message; the record's "lines" has them all


def result_record(key: str, record: PromptRecord, res: BeaconResult, *,
                  keep_candidates: bool = False) -> dict[str, Any]:
    """Output line of a prompt BEACON ran: the best response, its reward, samples, stop reason.

    ``ok`` is true when at least one sample was scored (``best`` is set); a query that ended
    with ``stop_reason == "error"`` but has a best keeps ``ok: true`` and reports ``error``.
    ``budget_unenforced`` is there when a budget cap could not be enforced for the prompt.
    """
    best = res.best
    out: dict[str, Any] = {
        "key": key,
        "id": record.id,
        "line": record.line,
        "ok": best is not None,
        "best": None if best is None else best.text,
        "reward": None if best is None else best.reward,
        "best_index": None if best is None else best.index,
        "n_samples": res.n_samples,
        "n_failed": res.n_failed,
        # Raw rewards in draw order (failed samples as null): the output doubles as a reward
        # log for `beacon fit-prior` / `beacon tune`, and feeds the online warm start.
        "rewards": [c.reward for c in res.candidates],
        "stop_reason": res.stop_reason,
        "usage": res.usage.to_dict(),
        "error": None,
    }
    if best is None:
        out["error"] = {"type": "NoSample",
                        "message": res.error or "no sample was generated and scored"}
    elif res.error:
        out["error"] = {"type": "SampleErrors", "message": res.error}
    if res.budget_unenforced:
        # the caps of sampling this prompt's responses escaped (no token counts or cost
        # reported): kept, as the sampler's warning says, so the line does not look capped
        out["budget_unenforced"] = list(res.budget_unenforced)
    if record.metadata is not None:
        out["metadata"] = dict(record.metadata)
    if keep_candidates:
        out["candidates"] = [c.to_dict() for c in res.candidates]
    return out


def prepare_config(cfg: BeaconConfig) -> None:
    """Load (or build and cache) the index tables ``cfg`` needs, before any deadline runs.

    The first decision under a new prior builds its h-table (seconds to minutes of CPU for a
    fitted prior); doing it here keeps that out of the first prompts' time budgets. Synthetic
    rewards 0 and 1 are valid in every built-in family and transform. Failures are ignored: the
    real query reports them with its own error.
    """
    try:
        s = Stopper(cfg)
        d = s.next_decision()
        while isinstance(d, Draw) and s.k < cfg.k0:
            s.observe([float((s.k + i) % 2) for i in range(d.count)])
            d = s.next_decision()
    except Exception:
        log.debug("prepare_config failed for %r", cfg, exc_info=True)


class FactoryCache:
    """Built generators/scorers, keyed by their spec; LRU-bounded; closed with :meth:`aclose`.

    ``trusted``: factories (``"module:name"``) built without the allow-list check, e.g. the
    job's own factories typed on the command line (``beacon run``): a name it re-exports from
    another package, or a ``functools.partial``, is the user's choice, not a prompt line's.
    """

    def __init__(self, allowed: str | Iterable[str] | None, *, max_size: int = 32,
                 trusted: Iterable[str] = ()) -> None:
        # A string is parsed like BEACON_ALLOWED_FACTORIES, never iterated per character.
        self.allowed = normalize_allow_list(allowed)
        self.max_size = positive_int("max_size", max_size)
        names = None if isinstance(trusted, str) else tuple(trusted)
        if names is None or not all(isinstance(t, str) for t in names):
            raise ConfigError("trusted", trusted, "must be a list of 'module:name' strings")
        self.trusted = frozenset(names)
        self._objs: OrderedDict[str, Any] = OrderedDict()
        # objects leased by running prompts (acquire/release), by id: one evicted meanwhile
        # is closed when its last prompt is done, not under it (a closed HTTP session)
        self._users: dict[int, int] = {}
        self._retired: dict[int, Any] = {}

    def get(self, spec: FactorySpec, role: str) -> Any:
        from beacon.jobs.spec import canonical_json

        k = canonical_json(spec.to_dict())
        obj = self._objs.get(k)
        if obj is None:
            obj = spec.build(None if spec.factory in self.trusted else self.allowed, role=role)
            self._objs[k] = obj
            while len(self._objs) > self.max_size:
                _, old = self._objs.popitem(last=False)
                if self._users.get(id(old)):
                    self._retired[id(old)] = old  # closed by its last release
                else:
                    _close_soon(old)
        else:
            self._objs.move_to_end(k)
        return obj

    def acquire(self, spec: FactorySpec, role: str) -> Any:
        """:meth:`get`, leased until :meth:`release`: an eviction meanwhile does not close it."""
        obj = self.get(spec, role)
        self._users[id(obj)] = self._users.get(id(obj), 0) + 1
        return obj

    def release(self, obj: Any) -> None:
        """End a lease of :meth:`acquire`; an object evicted meanwhile is closed by the last."""
        k = id(obj)
        n = self._users.get(k, 0) - 1
        if n > 0:
            self._users[k] = n
            return
        self._users.pop(k, None)
        old = self._retired.pop(k, None)
        if old is not None:
            _close_soon(old)

    async def aclose(self) -> None:
        objs, self._objs = list(self._objs.values()), OrderedDict()
        objs += self._retired.values()
        self._retired, self._users = {}, {}
        for obj in objs:
            await _aclose(obj)


async def _aclose(obj: Any) -> None:
    for name in ("aclose", "close"):
        fn = getattr(obj, name, None)
        if callable(fn):
            try:
                out = fn()
                if inspect.isawaitable(out):
                    await out
            except Exception:  # closing is best effort; the job's results are already saved
                log.warning("closing %r failed", obj, exc_info=True)
            return


_closing: set[asyncio.Task[None]] = set()


def _close_soon(obj: Any) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    t = loop.create_task(_aclose(obj))
    _closing.add(t)  # keep a reference until done (the loop holds only a weak one)
    t.add_done_callback(_closing.discard)


def _bind(obj: Any, record: dict[str, Any], spec: FactorySpec, role: str) -> Any:
    bind = getattr(obj, "bind", None)
    # LangChain runnables have an unrelated .bind(**kwargs); only a bind(record) is ours.
    if not (callable(bind) and not hasattr(obj, "ainvoke")):
        return obj
    try:
        bound = bind(record)
    except ConfigError:
        raise  # already names its field and value (the demo verifier's missing reference)
    except Exception as exc:
        # A bind that rejects the record (KeyError('reference')): that prompt's error names
        # the factory, with no traceback logged for each such prompt
        raise JobInputError(role, spec.factory, f"its bind(record) raised "
                                                f"{type(exc).__name__}: {exc}") from exc
    if bound is None:
        raise JobInputError(role, spec.factory, "its bind(record) returned None; it must "
                                                "return what to use for the record")
    return bound


class PromptExecutor:
    """Runs prompts of one job spec; reuse it for every prompt of a process.

    ``call_concurrency`` bounds model and scorer calls in flight across all prompts run by this
    executor on one event loop. ``max_seconds`` (per call of :meth:`run`) caps the query's wall
    time on top of the spec's budget: the engine stops with ``budget`` and keeps what it has.

    ``offload_sync``: call a *synchronous* generator or scorer (a ``requests`` or
    ``openai.OpenAI`` client) in worker threads, so the prompts run concurrently and the spec's
    ``timeout`` applies to its calls (one that never returns is abandoned), up to
    ``call_concurrency`` threads at once. Off by default: such a client must then be safe to
    call from many threads at once, and off the main thread (math-verify's own timeouts, any
    ``signal`` handler, need the main thread); inline, every sync call of the job runs one
    after the other on the event loop, with no timeout (an async client runs concurrently
    either way).
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        allowed: str | Iterable[str] | None,
        call_concurrency: int = 64,
        cache: FactoryCache | None = None,
        observers: Sequence[Observer] = (),
        offload_sync: bool = False,
    ) -> None:
        if not isinstance(spec, JobSpec):
            raise JobInputError("spec", spec, "must be a JobSpec (JobSpec.from_dict reads a "
                                              "JSON object)")
        call_concurrency = positive_int("call_concurrency", call_concurrency)
        if cache is not None and not isinstance(cache, FactoryCache):
            raise ConfigError("cache", cache, "must be a FactoryCache or None")
        allowed = normalize_allow_list(allowed)
        self.spec = spec
        self.cache = cache if cache is not None else FactoryCache(allowed)
        self.call_concurrency = call_concurrency
        self.observers = tuple(observers)
        self.offload_sync = boolean("offload_sync", offload_sync)
        s = spec.sampling
        # the spec validated each value as JobSpec sampling.<key>; RetryPolicy's own checks
        # (the same bounds) cannot fail here
        self.retry = RetryPolicy(**spec.retry_kwargs())
        # seconds per call attempt; 0 in the spec: no limit (a client with its own timeouts)
        self.timeout: float | None = (
            60.0 if "timeout" not in s else float(s["timeout"]) or None
        )
        self._budget_kwargs = spec.budget_kwargs()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._slots.get(loop)
        if sem is None:
            sem = self._slots[loop] = asyncio.Semaphore(self.call_concurrency)
        return sem

    def _budget(self, max_seconds: float | None) -> Budget | None:
        kw = dict(self._budget_kwargs)
        if max_seconds is not None:
            cur = kw.get("max_seconds")
            kw["max_seconds"] = max_seconds if cur is None else min(float(cur), max_seconds)
        return Budget(**kw) if kw else None

    async def run(
        self,
        record: PromptRecord,
        key: str,
        *,
        max_seconds: float | None = None,
        observers: Sequence[Callable[[BeaconEvent], Any]] = (),
        config: BeaconConfig | None = None,
    ) -> Outcome:
        """Run ``record``; failures become an error outcome (never raised), except cancellation.

        ``config`` replaces the spec's config for this prompt (the online warm start's refitted
        prior, :mod:`beacon.jobs.warm_start`); the prompt's key is the caller's.
        """
        spec = self.spec
        cfg = spec.config if config is None else config
        in_use: list[Any] = []  # leased from the cache: not closed under this prompt
        try:
            return await self._run(record, key, cfg, max_seconds, observers, in_use)
        finally:
            for obj in in_use:
                self.cache.release(obj)

    async def _run(self, record: PromptRecord, key: str, cfg: BeaconConfig,
                   max_seconds: float | None, observers: Sequence[Callable[[BeaconEvent], Any]],
                   in_use: list[Any]) -> Outcome:
        spec = self.spec
        try:
            gen_spec, sco_spec = spec.generator_for(record), spec.scorer_for(record)
            gen_obj = self.cache.acquire(gen_spec, "generator")
            in_use.append(gen_obj)
            sco_obj = self.cache.acquire(sco_spec, "scorer")
            in_use.append(sco_obj)
            rec = record.to_dict()
            sampler = BeaconSampler(
                _bind(gen_obj, rec, gen_spec, "generator"),
                _bind(sco_obj, rec, sco_spec, "scorer"),
                cfg,
                # The shared semaphore is the global limit; per-prompt slots only need to let
                # one batch through at once.
                max_concurrency=max(cfg.batch_size, cfg.k0),
                rate_limiter=self._slot(),
                retry=self.retry,
                timeout=self.timeout,
                budget=self._budget(max_seconds),
                observers=(*self.observers, *observers),
                offload_sync=self.offload_sync,
            )
        except Exception as exc:
            # A factory that cannot be built, or a bind(record) that rejects this record, fails
            # this prompt only (with the field and value when it is one of ours).
            if not isinstance(exc, JobInputError | ConfigError):
                log.warning("prompt %r: building the generator/scorer failed", record.id,
                            exc_info=True)
            return Outcome(key, error_record(key, record, exc), None)
        try:
            res = await sampler.arun(record.prompt, metadata=record.metadata)
        except Exception as exc:  # the engine only raises on misuse; keep the job going
            log.exception("prompt %r failed", record.id)
            return Outcome(key, error_record(key, record, exc), None)
        out = result_record(key, record, res, keep_candidates=spec.keep_candidates)
        pair = res.preference_pair()
        dpo = dpo_record(key, record.id, record.prompt, pair) if pair is not None else None
        return Outcome(key, out, dpo)

    async def aclose(self) -> None:
        await self.cache.aclose()

    async def __aenter__(self) -> PromptExecutor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
