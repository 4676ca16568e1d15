"""Bulk offline jobs: BEACON over a JSONL file of prompts, in-process or on the worker tier.

* :mod:`beacon.jobs.spec` -- prompt records, factories named by import path, the allow-list,
  the job spec.
* :mod:`beacon.jobs.keys` -- idempotency keys (hash of prompt, factories, sampling, config).
* :mod:`beacon.jobs.output` / :mod:`beacon.jobs.dpo` -- crash-consistent keyed JSONL writers.
* :mod:`beacon.jobs.execute` -- one prompt on the engine (shared with ``worker/``).
* :mod:`beacon.jobs.local` -- the in-process runner (``beacon run``).
* :mod:`beacon.jobs.resume` -- what a rerun into an existing output redoes (this job's failed
  lines, missing DPO pairs).
"""

from __future__ import annotations

from beacon.jobs.dpo import DpoWriter, dpo_record
from beacon.jobs.execute import FactoryCache, Outcome, PromptExecutor
from beacon.jobs.keys import (
    DuplicateIdError,
    check_unique_ids,
    job_fingerprint,
    line_error_key,
    prompt_key,
)
from beacon.jobs.local import JobProgress, JobSummary, arun_job, run_job
from beacon.jobs.output import KeyedJsonlWriter, OutputError, read_jsonl
from beacon.jobs.spec import (
    DEFAULT_ALLOWED_FACTORIES,
    FactoryNotAllowedError,
    FactorySpec,
    JobInputError,
    JobSpec,
    LineError,
    PromptRecord,
    iter_prompt_file,
    normalize_allow_list,
    parse_allow_list,
)
from beacon.jobs.warm_start import WarmStart, WarmStarter

__all__ = [
    "DEFAULT_ALLOWED_FACTORIES",
    "DpoWriter",
    "DuplicateIdError",
    "FactoryCache",
    "FactoryNotAllowedError",
    "FactorySpec",
    "JobInputError",
    "JobProgress",
    "JobSpec",
    "JobSummary",
    "KeyedJsonlWriter",
    "LineError",
    "Outcome",
    "OutputError",
    "PromptExecutor",
    "PromptRecord",
    "WarmStart",
    "WarmStarter",
    "arun_job",
    "check_unique_ids",
    "dpo_record",
    "iter_prompt_file",
    "job_fingerprint",
    "line_error_key",
    "normalize_allow_list",
    "parse_allow_list",
    "prompt_key",
    "read_jsonl",
    "run_job",
]
