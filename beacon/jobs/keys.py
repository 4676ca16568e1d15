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
from typing import Any

from beacon.jobs.spec import JobInputError, JobSpec, LineError, PromptRecord, canonical_json

__all__ = [
    "KEY_VERSION",
    "InputKeys",
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


def job_fingerprint(spec: JobSpec, input_digest: str) -> str:
    """A job id derived from the spec and the input's content hash (resubmission = same id)."""
    if not isinstance(input_digest, str) or not input_digest:
        raise JobInputError("input_digest", input_digest, "must be a non-empty string")
    return _digest({"v": KEY_VERSION, "input": input_digest, **_spec_part(spec, None)})[:16]
