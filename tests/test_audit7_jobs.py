"""Audit 7 of the in-process bulk job path (``beacon run`` / ``run_job``): each test failed on
the code before its fix."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import beacon.jobs.local as local_mod
from beacon import BeaconConfig
from beacon.jobs import FactorySpec, JobSpec, arun_job, run_job
from beacon.jobs.execute import Outcome, PromptExecutor
from beacon.jobs.local import JobProgress
from beacon.jobs.warm_start import WarmStart


def _spec(latency_ms: float = 0.0, **sampling: Any) -> JobSpec:
    return JobSpec(
        FactorySpec("beacon.demo:generator", {"latency_ms": latency_ms}),
        FactorySpec("beacon.demo:scorer"),
        BeaconConfig(cost=0.05, horizon=8),
        sampling=sampling,
    )


class _WarmExecutor(PromptExecutor):
    """Records the config each prompt starts with; from the third prompt on, a prompt waits
    until the refit's table build has begun, and the fourth ends that build."""

    def __init__(self, spec: JobSpec, building: threading.Event, release: threading.Event) -> None:
        super().__init__(spec, allowed=None)
        self.building, self.release = building, release
        self.started: dict[int, dict[str, Any]] = {}

    async def run(
        self, record: Any, key: str, *, config: BeaconConfig | None = None, **kwargs: Any
    ) -> Outcome:
        assert config is not None
        self.started[record.id] = config.resolved_prior.to_dict()
        t0 = time.monotonic()
        while record.id >= 2 and not self.building.is_set() and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.01)
        if record.id == 3:
            self.release.set()  # the first prompt started during the build is done
        elif record.id > 3:
            await asyncio.sleep(0.05)  # later prompts start after the new prior is adopted
        rng = random.Random(record.id)
        rewards = [rng.gauss(0.3 * record.id, 1.0) for _ in range(3)]
        return Outcome(
            key,
            {
                "key": key,
                "id": record.id,
                "line": record.line,
                "ok": True,
                "n_samples": 3,
                "rewards": rewards,
                "stop_reason": "index",
                "error": None,
            },
            None,
        )


def test_warm_start_keeps_the_current_prior_while_the_new_table_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A refit's new prior used to be in force as soon as it was fitted, before its h-table
    # was built: the prompts started meanwhile waited for the table in engine threads (each
    # holding its slot; a Ctrl-C waited for the whole build) instead of running with the
    # current prior.
    spec = _spec()
    base = spec.config.resolved_prior.to_dict()
    building, release = threading.Event(), threading.Event()
    built: list[dict[str, Any]] = []

    def slow_prepare(cfg: BeaconConfig) -> None:
        if cfg is not spec.config:  # the refit's table "takes" until prompt 3 is done
            building.set()
            release.wait(30)
            built.append(cfg.resolved_prior.to_dict())

    monkeypatch.setattr(local_mod, "prepare_config", slow_prepare)
    ex = _WarmExecutor(spec, building, release)
    records = [{"id": i, "prompt": f"warm start question {i}"} for i in range(8)]
    summary = run_job(
        records,
        spec,
        tmp_path / "out.jsonl",
        concurrency=1,
        executor=ex,
        warm_start=WarmStart(min_prompts=2),
    )
    assert summary.exit_code == 0 and built and base not in built
    assert ex.started[3] == base  # started during the build: the prior in force before it
    assert ex.started[7] in built  # a refit's prior, once its table is built


class _GatedExecutor(PromptExecutor):
    """Every prompt waits on ``gate``, then ends with stop reason ``index``."""

    def __init__(self, spec: JobSpec, gate: asyncio.Event) -> None:
        super().__init__(spec, allowed=None)
        self.gate = gate

    async def run(self, record: Any, key: str, **kwargs: Any) -> Outcome:
        await self.gate.wait()
        return Outcome(
            key,
            {
                "key": key,
                "id": record.id,
                "line": record.line,
                "ok": True,
                "n_samples": 3,
                "rewards": [0.1, 0.2, 0.3],
                "stop_reason": "index",
                "error": None,
            },
            None,
        )


def test_stop_reasons_count_every_prompt_written_at_an_interruption(tmp_path: Path) -> None:
    # Prompts that finish in the same step as a Ctrl-C are written but not reported one by
    # one (the callback is muted): `beacon run` counted stop reasons from the callback's
    # `last` outcome, so its summary said "4 ok ... stop reasons: index 1".
    spec = _spec()
    calls: list[JobProgress] = []

    async def main() -> JobProgress:
        gate = asyncio.Event()
        records = [{"id": i, "prompt": f"gated {i}"} for i in range(5)]
        task = asyncio.ensure_future(
            arun_job(
                records,
                spec,
                tmp_path / "out.jsonl",
                concurrency=4,
                executor=_GatedExecutor(spec, gate),
                progress=calls.append,
            )
        )
        while not calls or calls[-1].in_flight < 4:
            await asyncio.sleep(0.01)
        gate.set()  # the four prompts finish ...
        task.cancel()  # ... in the step the run is interrupted
        with pytest.raises(asyncio.CancelledError):
            await task
        return calls[-1]

    final = asyncio.run(main())
    assert final.done == 4
    assert final.stop_reasons == {"index": 4}
    assert sum(final.stop_reasons.values()) == final.done + final.failed


def test_stop_reasons_in_the_summary(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text(
        '{"id": 1, "prompt": "fine"}\nnot json\n{"id": 2, "prompt": ""}\n', encoding="utf-8"
    )
    summary = run_job(bad, _spec(), tmp_path / "out.jsonl")
    assert summary.progress.stop_reasons == {"index": 1, "input-error": 2}
    assert summary.to_dict()["stop_reasons"] == {"index": 1, "input-error": 2}


def test_cli_summary_counts_the_stop_reasons_of_muted_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run is interrupted with four prompts written but only the first reported one by
    # one (the others finished in the step of the Ctrl-C): the summary counted 1 stop reason
    # for 4 ok prompts.
    import json

    from typer.testing import CliRunner

    import beacon.cli.jobs as cli_jobs
    from beacon.cli import app

    spec = _spec()

    async def interrupted_run(
        prompts: Path, spec_: JobSpec, out: Path, *, progress: Any, **kwargs: Any
    ) -> Any:
        def outcome(i: int) -> Outcome:
            return Outcome(str(i), {"key": str(i), "ok": True, "stop_reason": "index"}, None)

        first = outcome(0)
        progress(JobProgress(total=5, done=1, stop_reasons={"index": 1}, last=first))
        # the final call of an interrupted run: three more written while muted
        progress(JobProgress(total=5, done=4, stop_reasons={"index": 4}, last=outcome(3)))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_jobs, "_run_local", interrupted_run)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "a"}\n', encoding="utf-8")
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(prompts),
            "-g",
            spec.generator.factory,
            "-s",
            spec.scorer.factory,
            "-o",
            str(tmp_path / "out.jsonl"),
            "--json",
        ],
    )
    assert res.exit_code == 1, res.output
    counts = json.loads(res.stdout)
    assert counts["done"] == 4 and counts["interrupted"] is True
    assert counts["stop_reasons"] == {"index": 4}


def test_output_line_lists_the_caps_it_could_not_enforce(tmp_path: Path) -> None:
    # The warning says "results list it in budget_unenforced", but the job's output lines
    # dropped the list: a job whose model reports no tokens looked capped by --max-tokens.
    import json

    from beacon.budget import BudgetNotEnforcedWarning

    out = tmp_path / "out.jsonl"
    records = [{"id": i, "prompt": f"capped {i}"} for i in range(3)]
    with pytest.warns(BudgetNotEnforcedWarning):
        run_job(records, _spec(max_tokens=100), out)
    lines = [json.loads(t) for t in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3
    assert all(rec["budget_unenforced"] == ["max_tokens"] for rec in lines)
    # a job without caps (or whose caps hold) keeps the documented shape
    plain = tmp_path / "plain.jsonl"
    run_job(records, _spec(), plain)
    assert all(
        "budget_unenforced" not in json.loads(t)
        for t in plain.read_text(encoding="utf-8").splitlines()
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"id": 1, "prompt": "cut short"\n', "line 1 column 32"),  # a truncated copy
        ("{\n", "line 1 column 2"),  # the first line of a pretty-printed JSON file
        ('{"id": 1, "prompt": "x"\r\n', "line 1 column 24"),
    ],
)
def test_bad_json_line_error_points_into_that_line(text: str, where: str) -> None:
    # The parser was given the line with its newline, so a line cut short was reported
    # at "line 2 column 1" of a one-line input: a line the file's message did not mean.
    from beacon.jobs.spec import JobInputError, parse_prompt_line

    with pytest.raises(JobInputError) as ei:
        parse_prompt_line(text, 7, source="p.jsonl")
    msg = str(ei.value)
    assert msg.startswith("p.jsonl line 7: ")
    assert where in msg and "line 2" not in msg


def _not_text_files(tmp_path: Path) -> dict[str, Path]:
    import bz2
    import gzip

    text = '{"id": 1, "prompt": "compressed or re-encoded"}\n{"id": 2, "prompt": "two"}\n'
    files = {
        "gzip": gzip.compress(text.encode("utf-8")),
        "bzip2": bz2.compress(text.encode("utf-8")),
        "UTF-16": text.encode("utf-16"),
    }
    out = {}
    for kind, data in files.items():
        path = tmp_path / f"prompts-{kind}.jsonl"
        path.write_bytes(data)
        out[kind] = path
    return out


def test_compressed_or_utf16_prompts_file_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    # A prompts.jsonl.gz (or a file saved as UTF-16) ran as a job of garbage lines: one
    # "not valid JSON" error line per chunk of bytes in --out, quoting binary noise.
    from beacon.jobs.spec import JobInputError

    for kind, path in _not_text_files(tmp_path).items():
        out = tmp_path / f"out-{kind}.jsonl"
        with pytest.raises(JobInputError) as ei:
            run_job(path, _spec(), out)
        assert ei.value.field == "prompts" and kind in str(ei.value), str(ei.value)
        assert not out.exists()


def test_cli_refuses_a_compressed_prompts_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    path = _not_text_files(tmp_path)["gzip"]
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(path),
            "-g",
            "beacon.demo:generator",
            "-s",
            "beacon.demo:scorer",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 2, res.output
    assert "gzip" in res.output and "PROMPTS" in res.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("config", "x"),
        ("config", 5),
        ("config", None),
        ("config", [["cost", 1.0]]),
        ("sampling", "ab"),
        ("sampling", [1]),
        ("sampling", [["timeout", 1]]),
        ("sampling", 0),
    ],
)
def test_job_spec_from_dict_names_a_config_or_sampling_that_is_no_object(
    name: str, value: Any
) -> None:
    # JobSpec.from_dict (a spec read from JSON, as the workers read it) passed these to
    # dict(): a bare ValueError / TypeError from deep inside, or a list of pairs taken as
    # an object.
    from beacon.jobs.spec import JobInputError

    data = {"generator": "beacon.demo:generator", "scorer": "beacon.demo:scorer", "config": {}}
    with pytest.raises(JobInputError) as ei:
        JobSpec.from_dict({**data, name: value})
    assert ei.value.field == name and "JSON object" in str(ei.value)


def test_job_spec_from_dict_still_reads_a_spec_without_sampling() -> None:
    spec = _spec(timeout=30)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    data = spec.to_dict()
    data["sampling"] = None
    del data["keep_candidates"]
    assert JobSpec.from_dict(data).sampling == {}


def test_a_bom_at_the_start_of_a_later_line_is_dropped(tmp_path: Path) -> None:
    # Files exported with a BOM and concatenated (cat a.jsonl b.jsonl) carry one at the
    # start of b's first line: that prompt failed on every rerun with "Unexpected UTF-8 BOM
    # (decode using utf-8-sig)", which the user cannot do; the file's own BOM is dropped.
    import json

    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        b'\xef\xbb\xbf{"id": 1, "prompt": "first part"}\r\n'
        b'\xef\xbb\xbf{"id": 2, "prompt": "second part"}\r\n'
    )
    out = tmp_path / "out.jsonl"
    summary = run_job(prompts, _spec(), out)
    assert summary.exit_code == 0, out.read_text(encoding="utf-8")
    lines = [json.loads(t) for t in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(rec["id"] for rec in lines if rec["ok"]) == [1, 2]
