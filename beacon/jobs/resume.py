"""What a rerun into an existing output must redo, for THIS job's prompts only.

An output file (and a DPO file) may hold lines of earlier runs of the job and of other jobs
(another prompts file, another spec). Before any prompt runs, :func:`plan_resume` reads them once
and works out, restricted to the keys of the current job's prompts:

* failed lines (``ok: false``) to drop and run again (``retry_failed``); another job's failed
  lines are left untouched;
* with a DPO file: ok lines whose prompt has a preference (rewards not all equal) but no pair in
  the DPO file -- the output of a run without ``--dpo``. The pair is rebuilt from the line's
  ``candidates`` when it kept them (no model call); otherwise the rejected response was never
  saved and the prompt is run again (its line dropped), so that the pair and the output line
  come from the same draw. With ``dpo_rerun=False`` (``--no-dpo-rerun``) such prompts are not
  run again (no paid model call): they keep their line, get no pair, and are counted
  (``dpo_missing``);
* DPO pairs without an output line (an interruption between the DPO write and the output
  write): dropped, so the rerun of the prompt writes the pair of its new result.

A second pass over the prompts (computing their keys) is made only when one of these applies.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from beacon.jobs.dpo import DpoWriter, dpo_record
from beacon.jobs.keys import record_key
from beacon.jobs.output import KeyedJsonlWriter
from beacon.jobs.spec import JobSpec, LineError, PromptRecord
from beacon.result import BeaconResult, Candidate

__all__ = ["OutputScan", "ResumePlan", "plan_resume", "resume_outputs", "scan_output"]


@dataclass
class OutputScan:
    """What the existing files hold. ``failed``: keys of ``ok: false`` lines; ``pair_missing``:
    ok lines with a preference but no DPO pair, key -> byte offset of the line when it kept its
    candidates (the pair can be rebuilt), else None; ``dpo_orphans``: pairs without a line;
    ``no_candidates``: ok lines that kept no candidates (collected only when asked)."""

    failed: set[str] = field(default_factory=set)
    pair_missing: dict[str, int | None] = field(default_factory=dict)
    dpo_orphans: set[str] = field(default_factory=set)
    no_candidates: set[str] = field(default_factory=set)

    def needs_keys(self, retry_failed: bool) -> bool:
        """Whether the plan needs the keys of the job's prompts (a second pass over them)."""
        return bool((retry_failed and self.failed) or self.pair_missing or self.dpo_orphans)


def _has_preference(line: dict[str, Any]) -> bool:
    """Whether an ok line's prompt yields a DPO pair (two scored rewards that differ)."""
    rewards = line.get("rewards")
    if isinstance(line.get("candidates"), list):
        rewards = [c.get("reward") if isinstance(c, dict) and not c.get("failed") else None
                   for c in line["candidates"]]
    if not isinstance(rewards, list):  # a line without rewards: cannot tell, assume it does
        return int(line.get("n_samples") or 0) >= 2
    vals = [float(r) for r in rewards if isinstance(r, int | float) and not isinstance(r, bool)]
    return len(vals) >= 2 and max(vals) > min(vals)


def scan_output(out: Path, dpo_keys: frozenset[str] | None, *,
                candidates: bool = False) -> OutputScan:
    """Read ``out`` once (``dpo_keys``: the keys of the DPO file, None without one;
    ``candidates``: also collect the ok lines without candidates)."""
    scan = OutputScan()
    out_keys: set[str] = set()
    if out.exists():
        with out.open("rb") as fh:
            offset = 0
            for raw in fh:
                start, offset = offset, offset + len(raw)
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue  # a torn tail: the writer has cut it off already
                if not isinstance(obj, dict) or not isinstance(obj.get("key"), str):
                    continue
                key = obj["key"]
                out_keys.add(key)
                if obj.get("ok") is False:
                    scan.failed.add(key)
                    continue
                if candidates and obj.get("ok") is True \
                        and not isinstance(obj.get("candidates"), list):
                    scan.no_candidates.add(key)
                if obj.get("ok") is True and dpo_keys is not None and key not in dpo_keys \
                        and _has_preference(obj):
                    has_cands = isinstance(obj.get("candidates"), list)
                    scan.pair_missing[key] = start if has_cands else None
    if dpo_keys is not None:
        scan.dpo_orphans = set(dpo_keys) - out_keys
    return scan


@dataclass
class ResumePlan:
    """``drop_out`` / ``drop_dpo``: keys whose lines are removed before the run;
    ``rebuilt``: DPO pairs written from kept candidates; ``rerun_for_dpo``: ok prompts run
    again because their pair cannot be rebuilt; ``dpo_missing``: such prompts left without a
    pair because reruns were refused (``dpo_rerun=False``). After :func:`resume_outputs`:
    ``failed``, the keys of the failed lines still in the output; ``retried_failed``, the failed
    lines removed; ``items``, the input when a one-shot iterable had to be read for the plan
    (run it from this list); ``no_candidates``, with ``keep_candidates``, the keys of the ok
    lines kept that have no candidates (written by a run without them)."""

    drop_out: set[str] = field(default_factory=set)
    drop_dpo: set[str] = field(default_factory=set)
    rebuilt: int = 0
    rerun_for_dpo: int = 0
    dpo_missing: int = 0
    failed: set[str] = field(default_factory=set)
    retried_failed: int = 0
    items: list[PromptRecord | LineError] | None = None
    no_candidates: set[str] = field(default_factory=set)


def _rebuild_pair(fh: BinaryIO, offset: int, key: str, rec: PromptRecord
                  ) -> dict[str, Any] | None:
    fh.seek(offset)
    line = json.loads(fh.readline())
    cands = [Candidate.from_dict(c) for c in line["candidates"]]
    return dpo_record(key, rec.id, rec.prompt, BeaconResult(rec.prompt, cands).preference_pair())


def plan_resume(
    items: Iterable[PromptRecord | LineError],
    spec: JobSpec,
    out: Path,
    scan: OutputScan,
    *,
    retry_failed: bool,
    write_pair: Callable[[dict[str, Any]], bool],
    dpo_rerun: bool = True,
) -> ResumePlan:
    """Match the scan against the job's prompts; rebuilt pairs go to ``write_pair`` at once
    (before any output line is dropped, so an interruption loses nothing). ``dpo_rerun``:
    run again the prompts whose pair cannot be rebuilt (else count them in ``dpo_missing``)."""
    plan = ResumePlan()
    with ExitStack() as stack:
        fh = stack.enter_context(out.open("rb")) if scan.pair_missing else None
        for item in items:
            key = record_key(item, spec)
            if retry_failed and key in scan.failed:
                plan.drop_out.add(key)
            if key in scan.dpo_orphans:
                plan.drop_dpo.add(key)
            if not isinstance(item, PromptRecord) or key not in scan.pair_missing:
                continue
            offset = scan.pair_missing.pop(key)  # a repeated prompt is handled once
            pair, rebuilt = None, False
            if offset is not None and fh is not None:
                try:
                    pair, rebuilt = _rebuild_pair(fh, offset, key, item), True
                except (ValueError, KeyError, TypeError):  # candidates in another format
                    rebuilt = False
            if not rebuilt and not dpo_rerun:
                plan.dpo_missing += 1
            elif not rebuilt:
                plan.drop_out.add(key)
                plan.rerun_for_dpo += 1
            elif pair is not None:
                plan.rebuilt += int(write_pair(pair))
    return plan


def _no_pair(_: dict[str, Any]) -> bool:
    return False


def resume_outputs(
    records: Callable[[], Iterable[PromptRecord | LineError]],
    spec: JobSpec,
    out_w: KeyedJsonlWriter,
    dpo_w: DpoWriter | None,
    *,
    retry_failed: bool,
    one_shot: bool,
    dpo_rerun: bool = True,
) -> ResumePlan:
    """Scan the open writers' files, plan for the job's prompts (``records()`` iterates them;
    ``one_shot``: it can be iterated once only) and apply the plan (atomic rewrites).
    ``dpo_rerun=False``: prompts whose missing pair cannot be rebuilt are not run again."""
    scan = scan_output(out_w.path, dpo_w.keys if dpo_w is not None else None,
                       candidates=spec.keep_candidates)
    plan = ResumePlan()
    if scan.needs_keys(retry_failed):
        items = list(records()) if one_shot else None
        plan = plan_resume(records() if items is None else items, spec, out_w.path, scan,
                           retry_failed=retry_failed,
                           write_pair=dpo_w.write if dpo_w is not None else _no_pair,
                           dpo_rerun=dpo_rerun)
        plan.items = items
    if plan.drop_out:
        dropped = out_w.compact(lambda rec: rec.get("key") not in plan.drop_out)
        plan.retried_failed = sum(1 for rec in dropped if rec.get("ok") is False)
    if plan.drop_dpo and dpo_w is not None:
        dpo_w.compact(lambda rec: rec.get("key") not in plan.drop_dpo)
    plan.failed = scan.failed - plan.drop_out
    plan.no_candidates = scan.no_candidates - plan.drop_out
    return plan
