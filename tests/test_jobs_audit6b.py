"""Audit 6b of ``beacon run`` (the local job runner and its CLI): files that are not UTF-8 given
to ``--config`` / ``--generator-kwargs @file``, a job spec given as ``--config`` whose other parts
were silently dropped, and the engine's warnings printed with a line of library source."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_cli import run
from test_jobs import _spec, _write_prompts

import beacon
from beacon.jobs import (
    FactorySpec,
    JobProgress,
    JobSpec,
    OutputError,
    WarmStart,
    arun_job,
    read_jsonl,
    run_job,
)

DEMO = ["-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"]


# -- 1. a file that is not UTF-8 text ------------------------------------------------------------
@pytest.mark.parametrize("option", ["--config", "--generator-kwargs", "--scorer-kwargs"])
def test_a_binary_file_is_a_clear_error_not_a_traceback(tmp_path: Path, option: str) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    binary = tmp_path / "blob.json"
    binary.write_bytes(b"\xff\xfe\x00not text\x80")
    value = str(binary) if option == "--config" else "@" + str(binary)
    out = tmp_path / "o.jsonl"
    code, _, err = run("run", prompts, *DEMO, "-o", out, option, value)  # raised before the fix
    assert code in (1, 2)
    assert "UTF-8" in err and "blob.json" in err
    assert not out.exists()


def test_kwargs_from_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    code, _, err = run("run", prompts, *DEMO, "-o", tmp_path / "o.jsonl",
                       "--generator-kwargs", "@" + str(tmp_path))
    assert code == 2
    assert "is a directory" in err and "does not exist" not in err


# -- 2. a job spec given as --config -------------------------------------------------------------
def _job_file(path: Path, **changes: object) -> Path:
    base = _spec()
    parts = {"generator": base.generator, "scorer": base.scorer, "config": base.config,
             "sampling": {}, "keep_candidates": False, **changes}
    path.write_text(json.dumps(JobSpec(**parts).to_dict()))  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"sampling": {"max_cost": 0.5, "price_per_output_token": 1e-3}}, "max_cost"),
        ({"sampling": {"max_tokens": 5}}, "max_tokens"),
        ({"generator": FactorySpec("beacon.demo:generator", {"seed": 3})}, "generator"),
        ({"keep_candidates": True}, "keep_candidates"),
    ],
)
def test_a_job_spec_as_config_does_not_drop_its_other_parts_silently(
        tmp_path: Path, changes: dict[str, object], named: str) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 3)
    job = _job_file(tmp_path / "job.json", **changes)
    out = tmp_path / "o.jsonl"
    # -g/-s as the spec's own factories (seed 1), so only the named part differs
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
                       "--generator-kwargs", '{"seed": 1}', "--scorer-kwargs", '{"seed": 1}',
                       "-o", out, "--config", job)
    # before the fix: exit 0, the budget / kwargs / candidates of the file unused, no word
    assert code == 2, err
    assert "--config" in err and "job spec" in err and named in err
    assert not out.exists()


def test_a_job_spec_as_config_runs_when_the_options_say_the_same(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 3)
    job = _job_file(tmp_path / "job.json", sampling={"max_seconds": 60, "timeout": 30})
    out = tmp_path / "o.jsonl"
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
                       "--generator-kwargs", '{"seed": 1}', "--scorer-kwargs", '{"seed": 1}',
                       "--max-seconds", "60", "--timeout", "30", "--max-tokens", "100000",
                       "-o", out, "--config", job)
    assert code == 0, err
    rows = list(read_jsonl(out))
    assert len(rows) == 3 and all(r["ok"] for r in rows)
    # a plain config file (and a job spec's config block alone) still reads as before
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(_spec().config.to_dict()))
    code, _, err = run("run", prompts, *DEMO, "-o", tmp_path / "o2.jsonl", "--config", cfg)
    assert code == 0, err
    block = tmp_path / "block.json"
    block.write_text(json.dumps({"config": _spec().config.to_dict()}))
    code, _, err = run("run", prompts, *DEMO, "-o", tmp_path / "o3.jsonl", "--config", block)
    assert code == 0, err


def test_build_job_spec_refuses_a_job_spec_whose_sampling_it_would_drop(tmp_path: Path) -> None:
    import typer

    from beacon.cli.jobs import build_job_spec

    job = _job_file(tmp_path / "job.json", sampling={"max_retry_after": 300})
    with pytest.raises(typer.BadParameter, match="max_retry_after"):
        build_job_spec(generator="beacon.demo:generator", scorer="beacon.demo:scorer",
                       generator_kwargs='{"seed": 1}', scorer_kwargs='{"seed": 1}', config=job)
    spec, _ = build_job_spec(generator="beacon.demo:generator", scorer="beacon.demo:scorer",
                             generator_kwargs='{"seed": 1}', scorer_kwargs='{"seed": 1}',
                             config=job, max_retry_after=300.0)
    assert spec.sampling == {"max_retry_after": 300} and spec.config == _spec().config
    assert isinstance(spec.config, beacon.BeaconConfig)


# -- 3. warnings as one line -----------------------------------------------------------------------
def test_run_prints_engine_warnings_as_one_line(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    # the demo model reports no token counts: the token cap cannot be enforced (a warning)
    code, _, err = run("run", prompts, *DEMO, "-o", tmp_path / "o.jsonl", "--max-tokens", "5")
    assert code == 0, err
    assert "warning: Budget max_tokens=5 cannot be enforced" in err
    # before the fix: Python's own display, the library's file and line, then its source line
    assert ".py:" not in err and "BudgetNotEnforcedWarning" not in err


# -- 4. a --prior fitted for another family --------------------------------------------------------
def _judge_prior(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    log = tmp_path / "judge_log.jsonl"
    with log.open("w") as f:
        for i in range(40):
            p = rng.uniform(0.1, 0.9)
            rewards = np.clip(rng.normal(p, 0.2, size=6), 0.0, 1.0)
            f.write(json.dumps({"id": i, "rewards": [float(r) for r in rewards]}) + "\n")
    prior = tmp_path / "judge_prior.json"
    code, _, err = run("fit-prior", log, "--family", "judge", "-o", prior)
    assert code == 0, err
    assert json.loads(prior.read_text())["fitted_on"]["family"] == "judge"
    return prior


@pytest.mark.parametrize("family", [[], ["--family", "bernoulli"]])
def test_run_refuses_a_prior_fitted_for_another_family(tmp_path: Path,
                                                       family: list[str]) -> None:
    prior = _judge_prior(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"{i}+{i}?", "reference": str(2 * i)})
                               + "\n" for i in range(3)))
    out = tmp_path / "o.jsonl"
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:verifier",
                       "-o", out, "--prior", prior, *family)
    # before the fix: bernoulli ran every prompt with the judge's prior, silently; without
    # --family the error said "the normal family needs an NIGPrior"
    assert code == 2, err
    assert "--prior" in err and "fitted for the judge family" in err and "--family judge" in err
    assert not out.exists()
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:verifier",
                       "-o", out, "--prior", prior, "--family", "judge")
    assert code == 0, err
    assert [r["ok"] for r in read_jsonl(out)] == [True] * 3


# -- 5. the allow-list hint of a prompt line's factory -----------------------------------------
def test_a_refused_prompt_factory_says_where_beacon_run_reads_the_allow_list(
        tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": 1, "prompt": "hi", "generator": "json:loads"}) + "\n")
    out = tmp_path / "o.jsonl"
    code, _, err = run("run", prompts, *DEMO, "-o", out)
    assert code == 1, err
    (line,) = read_jsonl(out)
    assert line["error"]["type"] == "FactoryNotAllowedError"
    # before the fix it said "on the worker" only, for a job that ran in this process
    assert "BEACON_ALLOWED_FACTORIES" in line["error"]["message"]
    assert "beacon run" in line["error"]["message"]


# -- 6. a rerun adding --candidates --------------------------------------------------------------
def test_a_rerun_adding_candidates_says_the_finished_prompts_keep_none(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 4)
    out = tmp_path / "o.jsonl"
    assert run_job(prompts, _spec(), out).exit_code == 0
    prompts = _write_prompts(tmp_path / "p.jsonl", 6)  # two prompts more
    with_cands = replace(_spec(), keep_candidates=True)
    s = run_job(prompts, with_cands, out)
    # before the fix nothing told the 4 skipped lines (no candidates) from the 2 new ones
    assert (s.progress.skipped, s.progress.done, s.progress.no_candidates) == (4, 2, 4)
    assert s.to_dict()["no_candidates"] == 4
    assert sum(isinstance(r.get("candidates"), list) for r in read_jsonl(out)) == 2
    # a spec without candidates asks for none: nothing to say
    assert run_job(prompts, _spec(), out).progress.no_candidates == 0
    code, stdout, err = run("run", prompts, "-g", "beacon.demo:generator", "-s",
                            "beacon.demo:scorer", "--generator-kwargs", '{"seed": 1}',
                            "--scorer-kwargs", '{"seed": 1}', "--cost", "0.05", "--horizon",
                            "16", "-o", out, "--candidates")
    assert code == 0, err
    assert "6 skipped" in stdout
    assert "4 of the skipped prompt(s) have no candidates" in err and "--candidates" in err
    code, stdout, _ = run("run", prompts, "-g", "beacon.demo:generator", "-s",
                          "beacon.demo:scorer", "--generator-kwargs", '{"seed": 1}',
                          "--scorer-kwargs", '{"seed": 1}', "--cost", "0.05", "--horizon",
                          "16", "-o", out, "--candidates", "--json")
    assert code == 0 and json.loads(stdout)["no_candidates"] == 4


def test_lines_rerun_for_their_dpo_pair_get_candidates_and_are_not_counted(
        tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 4)
    out, dpo = tmp_path / "o.jsonl", tmp_path / "d.jsonl"
    run_job(prompts, _spec(), out)
    s = run_job(prompts, replace(_spec(), keep_candidates=True), out, dpo=dpo)
    assert s.progress.dpo_rerun == s.progress.done > 0
    assert s.progress.no_candidates == s.progress.skipped


# -- 7. the refits of an interrupted warm start ---------------------------------------------------
def test_an_interrupted_warm_start_still_reports_its_refits(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 40)
    spec = replace(_spec(), generator=FactorySpec("beacon.demo:generator",
                                                  {"seed": 1, "latency_ms": 20}))
    seen: list[JobProgress] = []

    async def interrupted() -> JobProgress:
        task = asyncio.ensure_future(arun_job(
            prompts, spec, tmp_path / "o.jsonl", concurrency=1, progress=seen.append,
            warm_start=WarmStart(min_prompts=4, wait=True)))
        async with asyncio.timeout(120):
            while not (seen and seen[-1].done >= 6):
                await asyncio.sleep(0.01)
        task.cancel()  # what Ctrl-C does to the run
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen[-1]  # the final call, made as the run unwinds

    last = asyncio.run(interrupted())
    assert 6 <= last.done < 40
    # before the fix the refits were only in the JobSummary, which an interrupted run never
    # returns: `beacon run --warm-start` interrupted said nothing of the priors it had fitted
    assert last.warm_start is not None and last.warm_start[0]["prompts"] == 4
    assert last.warm_start[0]["prior"] is not None
    fitted = [r["prior"] for r in read_jsonl(tmp_path / "o.jsonl") if r["line"] > 4]
    assert last.warm_start[0]["prior"] in fitted
    # without a warm start there is nothing to report
    assert run_job(prompts, _spec(), tmp_path / "o2.jsonl").progress.warm_start is None


# -- 8. a damaged line seeding a resumed warm start ------------------------------------------------
@pytest.mark.parametrize("bad", [["oops", 1.0], [True, 0.5], "0.5, 0.7", [{"r": 1}]])
def test_a_damaged_rewards_list_is_a_clear_error_when_a_warm_start_resumes(
        tmp_path: Path, bad: object) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 5)
    out = tmp_path / "o.jsonl"
    run_job(prompts, _spec(), out)
    rows = list(read_jsonl(out))
    rows[2]["rewards"] = bad  # edited by hand
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = out.read_bytes()
    # before the fix: a bare ValueError / TypeError from float() (a traceback from beacon run)
    with pytest.raises(OutputError, match=r"prompt id 2 has rewards=.*fix or remove"):
        run_job(prompts, _spec(), out, warm_start=WarmStart(min_prompts=2))
    assert out.read_bytes() == before
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
                       "--generator-kwargs", '{"seed": 1}', "--scorer-kwargs", '{"seed": 1}',
                       "--cost", "0.05", "--horizon", "16", "-o", out, "--warm-start",
                       "--warm-start-min", "2")
    assert code == 1 and "prompt id 2 has rewards" in err
    # a line of another job is not this job's business: its rewards are not read
    rows[2]["rewards"] = [0.1, 0.2]
    rows.append({**rows[0], "key": "0" * 32, "id": "other", "rewards": ["x"]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = run_job(prompts, _spec(), out, warm_start=WarmStart(min_prompts=2))
    assert s.exit_code == 0 and s.progress.skipped == 5
