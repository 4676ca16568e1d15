"""Review findings on the jobs audit (tests/test_audit7_jobs.py): a line holding only a BOM,
JobProgress staying hashable with its stop reasons, a callback that changes the counts it is
given, and UTF-16 text without a BOM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from beacon import BeaconConfig
from beacon.jobs import FactorySpec, JobSpec, run_job
from beacon.jobs.local import JobProgress
from beacon.jobs.spec import JobInputError


def _spec() -> JobSpec:
    return JobSpec(
        FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
        BeaconConfig(cost=0.05, horizon=8),
    )


@pytest.mark.parametrize("middle", [b"\xef\xbb\xbf\n", b"\xef\xbb\xbf  \r\n"])
def test_a_line_holding_only_a_bom_is_skipped_mid_file(tmp_path: Path, middle: bytes) -> None:
    # cat a.jsonl empty_export_with_bom.jsonl b.jsonl
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"id": 1, "prompt": "a"}\n' + middle + b'{"id": 2, "prompt": "b"}\n')
    summary = run_job(prompts, _spec(), tmp_path / "out.jsonl")
    assert summary.exit_code == 0 and summary.progress.done == 2
    assert summary.progress.failed == 0


def test_job_progress_hashes_with_its_stop_reasons() -> None:
    p = JobProgress(done=2, stop_reasons={"index": 2})
    assert hash(p) == hash(JobProgress(done=2, stop_reasons={"horizon": 2}))


def test_a_callback_changing_its_stop_reasons_changes_no_count(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": {i}, "prompt": "q{i}"}}\n' for i in range(5)))

    def meddle(p: Any) -> None:
        if isinstance(p.stop_reasons, dict):
            p.stop_reasons.clear()

    summary = run_job(prompts, _spec(), tmp_path / "out.jsonl", progress=meddle)
    assert sum(summary.progress.stop_reasons.values()) == summary.progress.done == 5


def test_utf16_without_a_bom_is_refused(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes('{"id": 1, "prompt": "a"}\n'.encode("utf-16-le"))
    with pytest.raises(JobInputError, match="UTF-16"):
        run_job(prompts, _spec(), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
