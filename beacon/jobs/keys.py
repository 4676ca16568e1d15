"""Idempotency keys of bulk-job prompts.

key = SHA-256( canonical_json({v, prompt record, generator spec, scorer spec, sampling params,
BeaconConfig.to_dict()}) ), hex, first 32 characters (128 bits: collisions are out of reach for
any job size). Equal inputs give equal keys on every machine and Python version (sorted keys,
no whitespace, floats as ``repr``), so a rerun or a redelivered Celery task finds the work it
already did. Output formatting (``keep_candidates``) and the input line number are not part of
the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from beacon.jobs.spec import JobInputError, JobSpec, LineError, PromptRecord, canonical_json

__all__ = [
    "KEY_VERSION",
    "DuplicateIdError",
    "InputKeys",
    "check_unique_ids",
    "job_fingerprint",
    "line_error_key",
    "prompt_key",
    "record_key",
]

#: Bumped when the key's inputs change meaning, so old outputs are not silently reused.
KEY_VERSION = 1
_KEY_CHARS = 32


def _digest(payload: dict[str, Any]) -> str:
    # surrogatepass: a bad input line may hold undecodable bytes (read with surrogateescape);
    # it changes nothing for valid text, so every existing key stays the same
    data = canonical_json(payload).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:_KEY_CHARS]


def _spec_part(spec: JobSpec, record: PromptRecord | None) -> dict[str, Any]:
    if not isinstance(spec, JobSpec):
        raise JobInputError("spec", spec, "must be a JobSpec (JobSpec.from_dict reads a "
                                          "JSON object)")
    gen = spec.generator if record is None else spec.generator_for(record)
    sco = spec.scorer if record is None else spec.scorer_for(record)
    return {
        "generator": gen.to_dict(),
        "scorer": sco.to_dict(),
        "sampling": dict(spec.sampling),
        "config": spec.config.to_dict(),
    }


def prompt_key(record: PromptRecord, spec: JobSpec) -> str:
    """The idempotency key of running ``record`` under ``spec`` (effective factories)."""
    if not isinstance(record, PromptRecord):
        raise JobInputError("record", record, "must be a PromptRecord "
                                              "(PromptRecord.from_dict reads a dict)")
    rec = record.to_dict()
    # Overrides are already folded into the effective generator/scorer below.
    rec.pop("generator", None)
    rec.pop("scorer", None)
    return _digest({"v": KEY_VERSION, "prompt": rec, **_spec_part(spec, record)})


def line_error_key(raw_line: str, spec: JobSpec) -> str:
    """Key of an input line that did not parse: the same bad line is reported once (its error
    line lists every line number it occurs on; the number is not part of the key)."""
    if not isinstance(raw_line, str):
        raise JobInputError("raw_line", raw_line, "must be the input line as a string")
    return _digest({"v": KEY_VERSION, "bad_line": raw_line, **_spec_part(spec, None)})


def record_key(item: PromptRecord | LineError, spec: JobSpec) -> str:
    """The key of an input item: its prompt's key, or the key of its bad line."""
    if isinstance(item, LineError):
        return line_error_key(item.raw, spec)
    return prompt_key(item, spec)


class InputKeys:
    """The keys of a job's input lines as they are read (the local runner and ``submit``).

    :meth:`first` says whether a line's key is new; a repeat is counted in ``duplicates`` and,
    when it is a bad line kept with :meth:`add_bad`, its line number is added to that line's
    ``bad`` entry, so the one error record lists every line the text occurs on.
    """

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.seen: set[str] = set()
        self.bad: dict[str, tuple[LineError, list[int]]] = {}
        self.duplicates = 0

    def first(self, item: PromptRecord | LineError) -> str | None:
        """``item``'s key when no earlier line had it, else None (a duplicate)."""
        key = record_key(item, self.spec)
        if key not in self.seen:
            self.seen.add(key)
            return key
        if isinstance(item, LineError) and key in self.bad:
            self.bad[key][1].append(item.line)
        self.duplicates += 1
        return None

    def add_bad(self, key: str, item: LineError) -> None:
        """Keep a new bad line, to be reported once the whole input is read."""
        self.bad[key] = (item, [item.line])


class DuplicateIdError(JobInputError):
    """Two different prompt records of one input share an id (``line`` is the second one's,
    ``first_line`` the first one's)."""

    def __init__(self, record_id: str | int, first_line: int, line: int,
                 source: str | None = None) -> None:
        super().__init__(
            "id", record_id,
            f"line {first_line} has this id too, with another prompt record; each prompt "
            "needs an id of its own (both results would carry this id, and the output could "
            "not be read back as a reward log): give one of them another id, or delete the "
            "line that is not wanted (identical lines are run once)",
            line=line, source=source,
        )
        self.first_line = first_line


def _identity(record: PromptRecord, spec: JobSpec) -> int:
    """64 bits of what :func:`prompt_key` hashes that differ between the records of one job:
    the record and its effective factories (the spec's sampling and config, common to all
    of them, are left out: hashing them again for every record made the scan slower)."""
    rec = record.to_dict()
    rec["generator"] = spec.generator_for(record).to_dict()
    rec["scorer"] = spec.scorer_for(record).to_dict()
    data = canonical_json(rec).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def check_unique_ids(items: Iterable[PromptRecord | LineError], spec: JobSpec, *,
                     source: str | None = None) -> int:
    """Raise :class:`DuplicateIdError` for the first prompt record whose id an earlier,
    different record has (run as a job, both would write a result line with that id);
    return how many items there are (a prompts file's non-blank lines: the job's size).

    Ids are compared as the log reader compares them (as strings: ``1`` and ``"1"`` are one
    id); records are told apart as their keys tell them apart, so a repeated line (which
    :class:`InputKeys` runs once) is no conflict. Bad lines have no id and are skipped.
    A record without a line number is numbered by its position in ``items``.
    """
    _spec_part(spec, None)  # a spec that is no JobSpec: the error every key function raises
    # 64 bits of a digest are plenty to tell the records of one id apart, in little memory
    seen: dict[str, tuple[int, int]] = {}
    pos = 0
    for pos, item in enumerate(items, start=1):
        if not isinstance(item, PromptRecord):
            continue
        line = item.line if item.line is not None else pos
        ident = _identity(item, spec)
        first = seen.setdefault(str(item.id), (line, ident))
        if first[1] != ident:
            raise DuplicateIdError(item.id, first[0], line, source)
    return pos


def job_fingerprint(spec: JobSpec, input_digest: str) -> str:
    """A job id derived from the spec and the input's content hash (resubmission = same id)."""
    if not isinstance(input_digest, str) or not input_digest:
        raise JobInputError("input_digest", input_digest, "must be a non-empty string")
    return _digest({"v": KEY_VERSION, "input": input_digest, **_spec_part(spec, None)})[:16]
