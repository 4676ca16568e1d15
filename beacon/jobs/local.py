"""The in-process bulk runner: a whole job on one machine, no server, on the async engine.

``await arun_job(prompts, spec, out)`` (or ``run_job`` from sync code) runs BEACON on every
prompt with at most ``concurrency`` prompts in progress and ``call_concurrency`` model/scorer
calls in flight, writes one output line per prompt (and a DPO pair where the rewards differ) as
each prompt finishes, and reports progress through a callback.

Resumable and idempotent: each prompt's key (:mod:`beacon.jobs.keys`) is looked up in the
output first and skipped when present, so rerunning the same command after Ctrl-C, a crash or a
kill continues where it stopped; prompts in flight at the interruption are simply run again.
With ``warm_start`` the population prior is refitted from the job's own finished prompts as it
runs (:mod:`beacon.jobs.warm_start`); each output line then names the prior it ran with, and a
resumed run re-seeds the fit from the rewards of the job's prompts already in the output (not
from lines of other jobs sharing it).

Failed prompts (``ok: false``) of this job are retried on a rerun unless ``retry_failed=False``:
their lines are removed first by an atomic rewrite, so no key ever appears twice; failed lines of
other jobs sharing the output are left alone. Kept failed lines (``retry_failed=False``) are
counted as ``kept_failed`` and make the exit code 1. With ``dpo``, every ok prompt of the job
that has a preference ends with exactly one pair, also prompts finished by an earlier run without
``dpo`` (:mod:`beacon.jobs.resume`), unless ``dpo_rerun=False`` refuses the paid reruns of those
whose pair cannot be rebuilt (they are counted in ``dpo_missing``). The DPO line of a prompt is
written before its output line; a pair left without its output line by an interruption is
dropped and the rerun writes the pair of its new result.

Two *different* prompt records with one id are refused before anything is written or run
(:class:`~beacon.jobs.keys.DuplicateIdError`, naming both lines): both results would carry the id,
and the output could not be read back as a reward log. A repeated input line (the same prompt, or
the same bad line) is counted in ``duplicates`` and run or reported once; the error line of a bad
input line lists every line number it occurs on (``lines``). An exception raised by the
``progress`` callback starts no further prompt: the prompts in flight finish and are written, then
the exception is raised (rerun to resume). Once the callback has raised it is not called again;
when the run is interrupted from outside (Ctrl-C, cancellation) it is called once more, with the
final counts of what was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from os import PathLike, fspath
from pathlib import Path
from typing import Any, TypeVar

from beacon._checks import boolean, positive_int
from beacon._sync import call_in_thread, run_sync
from beacon.errors import ConfigError
from beacon.jobs.dpo import DpoWriter
from beacon.jobs.execute import Outcome, PromptExecutor, line_error_record, prepare_config
from beacon.jobs.keys import InputKeys, check_unique_ids, record_key
from beacon.jobs.output import KeyedJsonlWriter, OutputError, read_jsonl
from beacon.jobs.resume import resume_outputs
from beacon.jobs.spec import (
    JobInputError,
    JobSpec,
    LineError,
    PromptRecord,
    is_blank_line,
    iter_prompt_file,
    normalize_allow_list,
    open_prompt_file,
)
from beacon.jobs.warm_start import WarmStart, WarmStarter, seed_rewards

T = TypeVar("T")

__all__ = ["JobProgress", "JobSummary", "arun_job", "check_prompts_text", "count_prompt_lines",
           "iter_records", "run_job"]


@dataclass(frozen=True)
class JobProgress:
    """Counts so far. ``total``: non-blank input lines (None if unknown). ``skipped``: done and
    ok in the output from an earlier run; ``kept_failed``: failed in the output from an earlier
    run and not retried (``retry_failed=False``); ``done`` / ``failed``: finished in this run
    (``failed`` includes bad input lines); ``duplicates``: lines repeating a prompt (or bad line)
    seen earlier in the input; ``samples``: samples charged in this run; ``retried_failed``:
    earlier failed lines removed to be run again; ``dpo_rebuilt``: DPO pairs written from the
    candidates kept in earlier output lines; ``dpo_rerun``: earlier ok prompts run again because
    their DPO pair was never written; ``dpo_missing``: earlier ok prompts left without their
    DPO pair because those reruns were refused (``dpo_rerun=False``); ``no_candidates``: of
    the ``skipped``, those whose line an earlier run wrote without candidates although this
    spec keeps them (``keep_candidates``: it applies to the prompts run now); ``other_lines``: lines
    of the output that are not this job's (other prompts, or other options: another cost,
    horizon, factory... gives other keys), left as they are -- counted once the whole input is
    read; ``stop_reasons``: the lines written in this run by ``stop_reason`` (``input-error``
    for a prompt that never ran), counted as they are written, also those written while the
    callback is muted by an interruption; ``last``: the outcome just written (or None);
    ``warm_start``: with a warm start, its
    refits so far (:meth:`~beacon.jobs.warm_start.WarmStarter.history`; None without one), so
    that a run interrupted before its summary still tells which priors it fitted."""

    total: int | None = None
    skipped: int = 0
    done: int = 0
    failed: int = 0
    duplicates: int = 0
    in_flight: int = 0
    samples: int = 0
    retried_failed: int = 0
    kept_failed: int = 0
    dpo_rebuilt: int = 0
    dpo_rerun: int = 0
    dpo_missing: int = 0
    no_candidates: int = 0
    other_lines: int = 0
    stop_reasons: Mapping[str, int] = field(default_factory=dict, hash=False)
    last: Outcome | None = field(default=None, compare=False, repr=False)
    warm_start: list[dict[str, Any]] | None = field(default=None, compare=False, repr=False)

    @property
    def processed(self) -> int:
        """Lines accounted for (the progress bar's position)."""
        return self.skipped + self.kept_failed + self.done + self.failed + self.duplicates


@dataclass(frozen=True)
class JobSummary:
    """Final counts of a run; ``interrupted`` when it was cancelled (Ctrl-C) before the end."""

    progress: JobProgress
    elapsed: float
    interrupted: bool = False
    warm_start: list[dict[str, Any]] | None = None

    @property
    def exit_code(self) -> int:
        """0 when every prompt is done and ok; 1 when the run was interrupted or the output
        holds a failed line for one of the job's prompts (failed now, or kept from an earlier
        run with ``retry_failed=False``)."""
        p = self.progress
        return 1 if self.interrupted or p.failed or p.kept_failed else 0

    def to_dict(self) -> dict[str, Any]:
        p = self.progress
        return {
            "total": p.total,
            "skipped": p.skipped,
            "done": p.done,
            "failed": p.failed,
            "duplicates": p.duplicates,
            "samples": p.samples,
            "retried_failed": p.retried_failed,
            "kept_failed": p.kept_failed,
            "dpo_rebuilt": p.dpo_rebuilt,
            "dpo_rerun": p.dpo_rerun,
            "dpo_missing": p.dpo_missing,
            "no_candidates": p.no_candidates,
            "other_lines": p.other_lines,
            "stop_reasons": dict(p.stop_reasons),
            "elapsed": self.elapsed,
            "interrupted": self.interrupted,
            "warm_start": self.warm_start,
        }


def count_prompt_lines(path: str | Path) -> int:
    """Non-blank lines of a prompts file (the job's size, for the progress bar), split and
    judged blank exactly as the reader does (:func:`~beacon.jobs.spec.iter_prompt_file`): a
    line of Unicode whitespace only (a non-breaking space) is skipped by both, a lone ``\r``
    ends a line for both, so the bar ends at its total."""
    with open_prompt_file(path) as fh:
        return sum(1 for text in fh if not is_blank_line(text))


def iter_records(
    prompts: str | Path | Iterable[PromptRecord | LineError | Mapping[str, Any]],
) -> Iterator[PromptRecord | LineError]:
    """Records from a JSONL path, or from records / dicts (a bad dict becomes a LineError)."""
    path = _check_prompts(prompts)
    if path is not None:
        yield from iter_prompt_file(path)
        return
    assert not isinstance(prompts, str | Path)
    for n, item in enumerate(prompts, start=1):
        if isinstance(item, PromptRecord | LineError):
            yield item
            continue
        try:
            yield PromptRecord.from_dict(item, line=n)
        except JobInputError as exc:
            # The whole repr, as a file's whole line: it is the bad record's key, and records
            # sharing a long prefix (a templated prompt) are different records, not repeats.
            yield LineError(n, repr(item), exc)


_PROMPTS_REASON = ("must be a JSONL path or an iterable of PromptRecord / dict records "
                   "(a list, a generator)")


def check_path(name: str, value: Any) -> Path:
    """``value`` as the path of a job file, or a :class:`JobInputError` naming ``name``: a
    non-empty str or os.PathLike, not a directory, and a regular file if it exists."""
    if not isinstance(value, str | PathLike):
        raise JobInputError(name, value, "must be a file path (str or os.PathLike)")
    raw = fspath(value)
    if not isinstance(raw, str) or not raw.strip():
        raise JobInputError(name, value, "must be a non-empty str path")
    path = Path(raw)
    if path.is_dir():
        raise JobInputError(name, value, "is a directory; give a JSONL file path")
    if path.exists() and not path.is_file():
        # /dev/null, a named pipe, <(...): a job reads its files more than once (to count the
        # prompts, to resume) and syncs its outputs line by line, which these cannot do --
        # fsync(/dev/null) failed after the first prompt was paid for, a pipe blocked forever
        raise JobInputError(name, value, "is not a regular file (a device or a pipe); a job "
                                         "reads its files more than once: give a file path")
    return path


# How files that are not UTF-8 text start (a BOM, a compressor's magic number), and what to
# do with them: read as UTF-8 JSONL, every line was a "not valid JSON" error quoting binary
# noise, written to the output as if the job had run.
_NOT_TEXT: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip)"),
    (b"BZh", "bzip2-compressed", "decompress it first (bunzip2)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd)"),
    (b"PK\x03\x04", "a zip archive", "extract the JSONL file from it"),
    (b"\x00\x00\xfe\xff", "UTF-32 text", "save it as UTF-8"),
    (b"\xff\xfe\x00\x00", "UTF-32 text", "save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "save it as UTF-8"),
    (b"\xff\xfe", "UTF-16 text", "save it as UTF-8"),
    (b"\x00", "UTF-16 or UTF-32 text (big-endian, no BOM)", "save it as UTF-8"),
)


def check_prompts_text(path: Path, name: str = "prompts") -> None:
    """Raise :class:`JobInputError` naming ``name`` when the file at ``path`` starts like a
    compressed file or UTF-16/32 text instead of UTF-8 JSONL (only its first bytes are read)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(6)
    except OSError:  # unreadable: the reader itself raises, naming the file
        return
    for magic, what, fix in _NOT_TEXT:
        if head.startswith(magic) and (magic != b"BZh" or head[3:4].isdigit()):
            raise JobInputError(name, str(path), f"is {what}, not UTF-8 JSONL text: {fix}")
    if len(head) >= 2 and head[1:2] == b"\x00":  # '{' or '[' then NUL: little-endian, no BOM
        raise JobInputError(
            name, str(path), "is UTF-16 or UTF-32 text (no BOM), not UTF-8 JSONL text: save it "
            "as UTF-8"
        )


def _check_prompts(prompts: Any) -> Path | None:
    """The prompts path (None for an iterable of records); raises for anything else."""
    if isinstance(prompts, str | PathLike):
        path = check_path("prompts", prompts)
        if not path.exists():
            raise JobInputError("prompts", prompts, "no such file")
        check_prompts_text(path)
        return path
    if isinstance(prompts, bytes | bytearray | Mapping | PromptRecord) \
            or not isinstance(prompts, Iterable):
        hint = " (wrap a single record in a list)" if isinstance(
            prompts, Mapping | PromptRecord) else ""
        raise JobInputError("prompts", prompts, _PROMPTS_REASON + hint)
    return None


async def _to_thread_to_the_end(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` whose cancellation (Ctrl-C) waits for the thread to finish before
    it propagates: the thread works on the open writers (an atomic rewrite of the output), which
    the run closes as it unwinds -- closing them under it would leave a half-written temporary
    copy behind, or let the thread use a closed (or reused) file descriptor."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait({fut})
        if not fut.cancelled():
            fut.exception()  # retrieved: the interruption is what propagates
        raise


def _ok_lines(out: Path) -> dict[str, dict[str, Any]]:
    """The ok lines of an output file, by key, reduced to what the warm start's seeding reads
    (``ok``, ``rewards``; and ``id``, to name it, for a line whose rewards are damaged): whole
    lines (responses, kept candidates) of a large job's output would not fit in memory."""
    lines: dict[str, dict[str, Any]] = {}
    for r in read_jsonl(out):
        if r.get("ok") is True and isinstance(r.get("key"), str):
            rw = r.get("rewards")
            lines[r["key"]] = ({"ok": True, "rewards": rw} if _rewards_ok(rw)
                               else {"ok": True, "rewards": rw, "id": r.get("id")})
    return lines


def _rewards_ok(rw: Any) -> bool:
    """A line's ``rewards`` as written: a list of numbers and nulls (None: no rewards)."""
    return rw is None or (isinstance(rw, list) and all(
        v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in rw))


def _own_lines(items: Iterable[PromptRecord | LineError], spec: JobSpec,
               lines: Mapping[str, dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    """The ``lines`` of the job's prompts, each once, in the output's order: the order they
    finished, in which an uninterrupted warm start would have added them to the fit (the
    fitted prior is then the same to the last bit).

    An own line whose ``rewards`` is not a list of numbers and nulls (an output edited by
    hand, or damaged) raises :class:`~beacon.jobs.output.OutputError` naming the file, the
    prompt and the value: seeding the fit from it raised a bare ValueError."""
    own = {record_key(item, spec) for item in items if isinstance(item, PromptRecord)}
    found = [line for key, line in lines.items() if key in own]
    for line in found:
        if "id" in line:  # kept by _ok_lines for a line whose rewards are damaged only
            rw = line["rewards"]
            raise OutputError(
                f"{out}: the line of prompt id {line.get('id')!r} has rewards={str(rw)[:200]}, "
                "not a list of numbers and nulls; the warm start seeds its prior from them: "
                "fix or remove that line (a removed line's prompt is run again)")
    return found


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


async def arun_job(
    prompts: str | Path | Iterable[PromptRecord | LineError | Mapping[str, Any]],
    spec: JobSpec,
    out: str | Path,
    *,
    dpo: str | Path | None = None,
    concurrency: int = 16,
    call_concurrency: int = 64,
    allowed: str | Iterable[str] | None = None,
    progress: Callable[[JobProgress], None] | None = None,
    retry_failed: bool = True,
    dpo_rerun: bool = True,
    fsync: bool = True,
    executor: PromptExecutor | None = None,
    warm_start: WarmStart | None = None,
    offload_sync: bool = False,
) -> JobSummary:
    """Run ``spec`` on every prompt; resumable (see the module docstring).

    Args:
        prompts: a JSONL path, or an iterable of :class:`PromptRecord` / dicts. Two
            different records with one id raise :class:`~beacon.jobs.keys.DuplicateIdError`
            before any file is opened (checked for a path or a sequence; an iterable that can
            be read only once is not read twice for it).
        out: output JSONL (created; existing keys are skipped).
        dpo: optional DPO JSONL (``prompt``/``chosen``/``rejected``/``margin``).
        concurrency: prompts in progress at once (each runs BEACON's sequential or batched loop).
        call_concurrency: model and scorer calls in flight at once, over all prompts.
        allowed: factory module prefixes that may be imported; ``None`` allows any (local code).
            A string is parsed like ``BEACON_ALLOWED_FACTORIES`` (comma-separated, the defaults
            included, ``*`` = every module); a list or tuple is taken as is.
        progress: called with a :class:`JobProgress` after every prompt (on the event loop).
            If it raises, no further prompt starts; those in flight finish and are written,
            then its exception is raised. A ``KeyboardInterrupt`` or ``CancelledError`` it
            raises interrupts the run like Ctrl-C. It is never called again once it has
            raised; after an interruption from outside it gets one last call with the final
            counts (every prompt written before the interruption).
        retry_failed: rerun this job's prompts whose earlier line says ``ok: false``.
        dpo_rerun: with ``dpo``, run again the earlier ok prompts whose pair is missing and
            cannot be rebuilt from kept candidates (paid model calls). ``False`` leaves them
            without a pair, counted in ``dpo_missing``.
        fsync: sync each line to disk (see :class:`KeyedJsonlWriter`).
        executor: a :class:`PromptExecutor` of this same ``spec`` to run the prompts with (its
            factories already built, its ``call_concurrency``); the caller closes it. One of
            another spec is refused (:class:`~beacon.ConfigError` naming ``executor``).
        warm_start: refit the prior from this job's finished prompts as it runs
            (:class:`~beacon.jobs.warm_start.WarmStart`); ``None`` keeps ``spec.config``.
        offload_sync: call a synchronous generator/scorer in worker threads (see
            :class:`PromptExecutor`; ignored with ``executor``, which has its own).
    """
    # Every argument is checked here, before a file is opened or a model is called.
    if not isinstance(spec, JobSpec):
        raise JobInputError("spec", spec, "must be a JobSpec (JobSpec.from_dict reads a "
                                          "JSON object)")
    prompts_path = _check_prompts(prompts)
    out_path = check_path("out", out)
    dpo_path = None if dpo is None else check_path("dpo", dpo)
    if dpo_path is not None and _same_file(dpo_path, out_path):
        raise JobInputError("dpo", dpo, "must be a different file from out")
    if prompts_path is not None:
        for name, value, path in (("out", out, out_path), ("dpo", dpo, dpo_path)):
            if path is not None and _same_file(path, prompts_path):
                raise JobInputError(name, value, "must be a different file from prompts")
    out, dpo = out_path, dpo_path
    concurrency = positive_int("concurrency", concurrency)
    call_concurrency = positive_int("call_concurrency", call_concurrency)
    allowed = normalize_allow_list(allowed)
    if progress is not None and not callable(progress):
        raise ConfigError("progress", progress, "must be a callable taking a JobProgress, "
                                                "or None")
    retry_failed = boolean("retry_failed", retry_failed)
    dpo_rerun = boolean("dpo_rerun", dpo_rerun)
    fsync = boolean("fsync", fsync)
    if executor is not None and not isinstance(executor, PromptExecutor):
        raise ConfigError("executor", executor, "must be a PromptExecutor or None")
    if executor is not None and executor.spec.to_dict() != spec.to_dict():
        # it would run its own spec's factories and config under this spec's keys: results
        # of another job filed as this one's, skipped as done by every rerun
        raise ConfigError("executor", executor, "runs another job spec than spec; build it "
                                                "with PromptExecutor(spec, ...)")
    if warm_start is not None and not isinstance(warm_start, WarmStart):
        raise ConfigError("warm_start", warm_start, "must be a WarmStart or None")
    starter = WarmStarter(warm_start, spec.config) if warm_start is not None else None
    refitting: asyncio.Task[None] | None = None
    t0 = time.perf_counter()
    total: int | None = None  # the job's size, for the progress bar: known for a file or a list
    if prompts_path is not None or isinstance(prompts, Sequence):
        # Two different prompts with one id would both be paid for and written under that id:
        # refused before any file is opened or model called. (An iterable that can be read
        # only once is not read twice for it.) A daemon thread that only reads: Ctrl-C
        # abandons it at once, where asyncio.run would wait for a big file's scan to end.
        # The scan reads one item per non-blank line, so it also counts the job.
        total = await call_in_thread(functools.partial(
            check_unique_ids, iter_records(prompts if prompts_path is None else prompts_path),
            spec, source=None if prompts_path is None else prompts_path.name))
    own_executor = executor is None
    offload_sync = boolean("offload_sync", offload_sync)
    ex = executor or PromptExecutor(spec, allowed=allowed, call_concurrency=call_concurrency,
                                    offload_sync=offload_sync)
    out_w = KeyedJsonlWriter(out, fsync=fsync, required="ok")  # every output line has "ok"
    dpo_w = DpoWriter(dpo, fsync=fsync) if dpo is not None else None
    state = JobProgress(total=total, warm_start=None if starter is None else [])
    tasks: set[asyncio.Task[None]] = set()
    fatal: list[BaseException] = []
    callback_error: list[Exception] = []
    # mute: set once the callback has raised anything (an Exception, KeyboardInterrupt, a
    # CancelledError; callback_raised) or the run is being interrupted; an interruption from
    # outside still ends with one call carrying the final counts (see the finally below).
    mute = False
    callback_raised = False
    interrupted = False
    run_task = asyncio.current_task()

    def report(**changes: Any) -> None:
        nonlocal state, mute, callback_raised
        state = replace(state, **changes)
        if progress is None or mute:
            return
        if run_task is not None and run_task.cancelling():
            mute = True  # cancelled (Ctrl-C, or the callback itself called cancel())
            return
        try:
            progress(state)
        except Exception as exc:  # the caller's bug: stop starting prompts, lose nothing
            mute = callback_raised = True
            exc.add_note("raised by the progress callback of arun_job: no further prompt "
                         "was started, the prompts in flight were written; rerun to resume")
            callback_error.append(exc)
        except BaseException as exc:  # Ctrl-C or a cancellation in the callback: interrupted
            mute = callback_raised = True
            fatal.append(exc)  # raised in a prompt's task: no further prompt starts either
            raise

    def stopping() -> bool:
        return bool(fatal or callback_error)

    def records() -> Iterable[PromptRecord | LineError]:
        return iter_records(prompts if prompts_path is None else prompts_path)

    stop_counts: dict[str, int] = {}

    def commit(outcome: Outcome) -> None:
        if dpo_w is not None and outcome.dpo is not None:
            dpo_w.write(outcome.dpo)
        out_w.write(outcome.record)
        n = int(outcome.record.get("n_samples") or 0)
        # Counted here, not by the callback from `last`: prompts written while it is muted
        # (in the step of a Ctrl-C) are reported only by the final counts.
        reason = str(outcome.record.get("stop_reason") or "input-error")
        stop_counts[reason] = stop_counts.get(reason, 0) + 1
        reasons = dict(stop_counts)  # a copy: a callback changing it changes no later count
        if outcome.ok:
            report(done=state.done + 1, samples=state.samples + n, stop_reasons=reasons,
                   last=outcome)
        else:
            report(failed=state.failed + 1, samples=state.samples + n, stop_reasons=reasons,
                   last=outcome)
        if starter is not None and outcome.ok:
            starter.add(outcome.record.get("rewards") or [])
            maybe_refit()

    async def refit() -> None:
        assert starter is not None
        # Fitting and building the new prior's h-table are CPU work: off the loop, while
        # prompts keep running with the current prior. The new prior is adopted only once
        # its table is built: a prompt started with it before waited for the build in an
        # engine thread, holding its slot, and a Ctrl-C waited for the whole build. Prompts
        # that finish meanwhile are picked up by the next round.
        while starter.due():
            rows = starter.snapshot()  # on the loop: exactly the prompts committed so far
            old = starter.config
            cfg = await asyncio.to_thread(functools.partial(starter.refit, rows, adopt=False))
            keep_history()
            if cfg is not old:
                try:
                    await call_in_thread(prepare_config, cfg)
                except Exception as exc:  # a table that cannot be built: keep the old prior
                    starter.revert(old, exc)
                    keep_history()
                else:
                    starter.adopt(cfg)

    def keep_history() -> None:
        # In the counts, not reported: the next report (and the last call of an interrupted
        # run) carries it; a callback raising here would have broken the refit task instead.
        nonlocal state
        assert starter is not None
        state = replace(state, warm_start=starter.history())

    def maybe_refit() -> None:
        nonlocal refitting
        if starter is not None and starter.due() and (refitting is None or refitting.done()):
            refitting = asyncio.ensure_future(refit())

    try:
        out_w.open()
        if dpo_w is not None:
            dpo_w.open()
        # Table loading is CPU work in a thread: the caller's loop (progress bar) stays live.
        # A daemon thread, abandoned if the run is interrupted: building a new prior's table
        # takes up to minutes, and Ctrl-C waited for it (asyncio.run joins its executor's
        # threads); the table cache is written atomically, so nothing half-built is left.
        await call_in_thread(prepare_config, spec.config)
        # This job's failed lines to retry, DPO pairs missing from an earlier run: file work,
        # in a thread (a one-shot iterable of prompts is read into a list when it is needed).
        one_shot = prompts_path is None and not isinstance(prompts, Sequence)
        plan = await _to_thread_to_the_end(
            resume_outputs, records, spec, out_w, dpo_w, retry_failed=retry_failed,
            one_shot=one_shot, dpo_rerun=dpo_rerun)
        seeds: dict[str, dict[str, Any]] = {}
        if starter is not None:
            # The warm start is re-seeded from this job's finished prompts only: the output
            # may hold lines of other jobs (other prompts, another scorer or config).
            seeds = await asyncio.to_thread(_ok_lines, out)
            if seeds and one_shot and plan.items is None:
                plan.items = await asyncio.to_thread(lambda: list(records()))
        changes = {name: n for name, n in (("retried_failed", plan.retried_failed),
                                           ("dpo_rebuilt", plan.rebuilt),
                                           ("dpo_rerun", plan.rerun_for_dpo),
                                           ("dpo_missing", plan.dpo_missing)) if n}
        if plan.items is not None:
            changes["total"] = len(plan.items)
        if changes:
            report(**changes)
        if starter is not None and seeds:
            own = await asyncio.to_thread(
                _own_lines, records() if plan.items is None else plan.items, spec, seeds, out)
            for rw in seed_rewards(own):
                starter.add(rw)
        # A refit due on the resumed prompts is made before the first prompt left to run
        # starts -- not at all when none is left (a rerun of a finished job used to wait for
        # a fit and its h-table that no prompt would use, and reported it).
        seeded_refit = starter is not None and starter.due()
        slots = asyncio.Semaphore(concurrency)
        in_flight: set[str] = set()

        async def one(key: str, rec: PromptRecord) -> None:
            try:
                if starter is None:
                    outcome = await ex.run(rec, key)
                else:
                    cfg = starter.config
                    outcome = await ex.run(rec, key, config=cfg)
                    if outcome.ok:
                        outcome.record["prior"] = cfg.resolved_prior.to_dict()
                        outcome.record["cost"] = cfg.cost
                        if cfg.transform is not None:
                            outcome.record["transform"] = cfg.transform.kind
                commit(outcome)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a writer error (disk full...): stop the job
                if exc not in fatal:
                    fatal.append(exc)
            finally:
                in_flight.discard(key)
                slots.release()
                report(in_flight=len(in_flight))

        read_all = False
        # Bad input lines are written once the whole input is read, with every line number.
        keys = InputKeys(spec)
        for item in records() if plan.items is None else plan.items:
            if stopping():
                break
            key = keys.first(item)
            if key is None:
                report(duplicates=keys.duplicates)
                continue
            if key in out_w:
                if key in plan.failed:
                    report(kept_failed=state.kept_failed + 1)
                elif key in plan.no_candidates:
                    # said, not silent: a rerun adding --candidates skips the prompts done
                    # (keep_candidates is not part of the key) and their lines keep none
                    report(skipped=state.skipped + 1, no_candidates=state.no_candidates + 1)
                else:
                    report(skipped=state.skipped + 1)
                continue
            if isinstance(item, LineError):
                keys.add_bad(key, item)
                continue
            if seeded_refit:
                seeded_refit = False
                await refit()
            await slots.acquire()
            if stopping():
                slots.release()
                break
            if warm_start is not None and warm_start.wait and refitting is not None:
                # Reproducible mode: no prompt starts while a refit is pending, so with one
                # prompt in flight the output does not depend on how long a refit takes.
                await asyncio.wait({refitting})
            in_flight.add(key)
            t = asyncio.ensure_future(one(key, item))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            report(in_flight=len(in_flight))
        else:
            read_all = True
        if tasks:
            await asyncio.gather(*list(tasks))
        if refitting is not None:
            await refitting
        if read_all and not fatal:
            for key, (first, lines) in keys.bad.items():
                commit(Outcome(key, line_error_record(key, first, lines), None))
            # Said, not silent: a rerun with a changed option computes every prompt anew
            # next to the old lines (new keys), and a shared output holds other jobs' lines.
            mine = sum(1 for k in keys.seen if k in out_w)  # no copy of a big job's keys
            state = replace(state, other_lines=len(out_w) - mine)
        if fatal:
            raise fatal[0]
        if callback_error:
            raise callback_error[0]
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        raise
    finally:
        mute = True  # the run is over or unwinding: the callback is not called again
        # Cancel what is still running: its prompts have no line yet and are rerun on resume.
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if interrupted and progress is not None and not callback_raised:
            # Interrupted from outside (Ctrl-C): one last call with the final counts, so that a
            # summary built from the callback counts every prompt written before the
            # interruption (prompts finishing in the same step as it are written but were not
            # reported). A callback that raised is never called again.
            with contextlib.suppress(Exception):
                progress(state)
        if refitting is not None and not refitting.done():
            refitting.cancel()
            await asyncio.gather(refitting, return_exceptions=True)
        out_w.close()
        if dpo_w is not None:
            dpo_w.close()
        if own_executor:
            await ex.aclose()
    return JobSummary(
        replace(state, stop_reasons=dict(stop_counts)),  # not the callback's copy
        time.perf_counter() - t0,
        interrupted,
        starter.history() if starter is not None else None,
    )


def run_job(
    prompts: str | Path | Iterable[PromptRecord | LineError | Mapping[str, Any]],
    spec: JobSpec,
    out: str | Path,
    **kwargs: Any,
) -> JobSummary:
    """Synchronous :func:`arun_job` (works inside a running event loop, e.g. Jupyter).

    Bad arguments raise :class:`~beacon.ConfigError` / :class:`JobInputError` naming the
    argument, before any file is opened or any model is called."""
    return run_sync(arun_job(prompts, spec, out, **kwargs))
