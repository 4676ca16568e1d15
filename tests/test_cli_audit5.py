"""Audit 5 of the ``beacon`` commands as a new user meets them from the README and docs/cli.md:
commands printed to be pasted, ``beacon run`` output read back as a reward log, option
spellings, errors that name the value, and notes on a prior that cannot work as fitted.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
from test_cli import run


def _log(path: Path, rewards: np.ndarray) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [float(v) for v in row]}) + "\n"
            for i, row in enumerate(rewards)
        ),
        encoding="utf-8",
    )
    return path


def _rewards(prompts: int = 12, samples: int = 8) -> np.ndarray:
    rng = np.random.default_rng(11)
    # prompts differ in mean and spread, as a reward model's scores do
    mu = rng.normal(size=(prompts, 1))
    sd = np.exp(rng.normal(-0.3, 0.3, size=(prompts, 1)))
    return mu + sd * rng.normal(size=(prompts, samples))


# -- tune: the re-check command replays what was tuned, and pastes into a shell ---------------
def test_tune_recheck_command_replays_the_tuned_setup(tmp_path: Path) -> None:
    # a path with a space: the printed commands must survive a shell
    log = _log(tmp_path / "my log.jsonl", _rewards())
    code, out, err = run(
        "tune",
        log,
        "--horizon",
        "6",
        "--batch-size",
        "2",
        "--no-robust",
        "--points",
        "8",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    fit_cmd = [line.strip() for line in got["deploy"] if "beacon fit-prior" in line]
    recheck = [line.split(": ", 1)[1] for line in got["deploy"] if "beacon replay" in line]
    assert len(fit_cmd) == 1 and len(recheck) == 1
    # the fit-prior command reads the log it names
    args = shlex.split(fit_cmd[0])
    assert str(log) in args
    # the re-check replays the tuned horizon, batch size and update, not replay's defaults
    args = shlex.split(recheck[0])
    assert args[:2] == ["beacon", "replay"] and str(log) in args
    code, out, err = run(*args[1:], "--json")
    assert code == 0, err
    cfg = json.loads(out)["config"]
    assert cfg["horizon"] == got["config"]["horizon"] == 6
    assert cfg["batch_size"] == got["config"]["batch_size"] == 2
    assert cfg["robust"] is got["config"]["robust"] is False


def test_tune_recheck_command_without_options_adds_none(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", _rewards())
    code, out, err = run("tune", log, "--points", "8", "--json")
    assert code == 0, err
    recheck = [line for line in json.loads(out)["deploy"] if "beacon replay" in line]
    assert len(recheck) == 1
    for option in ("--horizon", "--min-samples", "--batch-size", "--no-robust"):
        assert option not in recheck[0]


# -- beacon run output as a reward log: failed prompts -----------------------------------------
def _run_output(path: Path, failed: dict[str, object]) -> Path:
    rows = _rewards(prompts=6)
    lines = [
        {"key": f"k{i}", "id": f"q{i}", "line": i + 1, "ok": True, "rewards": list(map(float, r))}
        for i, r in enumerate(rows)
    ]
    lines.insert(2, failed)
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines), encoding="utf-8")
    return path


def test_failed_run_line_in_a_log_says_what_it_is(tmp_path: Path) -> None:
    # the shape docs/bulk.md gives for a prompt that never ran
    never_ran = {
        "key": "b87e",
        "id": "m99",
        "line": 3,
        "ok": False,
        "error": {"type": "ConfigError", "message": "no reference"},
    }
    # and for one whose samples all failed (rewards of nulls)
    no_sample = {
        "key": "c01d",
        "id": "m98",
        "line": 3,
        "ok": False,
        "rewards": [None, None],
        "stop_reason": "error",
        "error": {"type": "NoSample", "message": "all failed"},
    }
    for name, failed in (("never.jsonl", never_ran), ("nosample.jsonl", no_sample)):
        log = _run_output(tmp_path / name, failed)
        for args in (
            ("replay", log, "--cost", "0.1"),
            ("fit-prior", log, "-o", tmp_path / "p.json"),
        ):
            code, _, err = run(*args)
            flat = " ".join(err.split())
            assert code == 1, err
            assert f"{log}:3:" in flat
            assert "failed in 'beacon run'" in flat
            assert f"jq -c 'select(.ok)' {log} > LOG.jsonl" in flat


def test_two_jobs_in_one_run_output_are_not_to_be_merged(tmp_path: Path) -> None:
    # the same prompt run by a second job (other kwargs: another key) into the same --out
    again = {"key": "other", "id": "q1", "line": 2, "ok": True, "rewards": [0.1, 0.5, 0.2]}
    log = _run_output(tmp_path / "out.jsonl", again)
    code, _, err = run("replay", log, "--cost", "0.1")
    flat = " ".join(err.split())
    assert code == 1, err
    assert f"{log}:3:" in flat and "'beacon run' result" in flat
    assert "do not merge their samples" in flat and "its own --out" in flat


def test_other_bad_lines_get_no_run_hint(tmp_path: Path) -> None:
    # a plain log line without rewards is not a failed run line: no advice about jq
    log = _run_output(tmp_path / "log.jsonl", {"id": "x"})
    code, _, err = run("replay", log, "--cost", "0.1")
    assert code == 1
    assert "rewards" in err and "beacon run" not in err
    # nor is a repeated id in a hand-made log (no keys): merging is the advice there
    plain = _log(tmp_path / "plain.jsonl", _rewards(prompts=4))
    with plain.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "q0", "rewards": [0.1, 0.2, 0.3]}) + "\n")
    code, _, err = run("replay", plain, "--cost", "0.1")
    assert code == 1
    assert "repeats the id" in err and "beacon run" not in err


# -- table --prior: a Beta prior is named -------------------------------------------------------
def test_table_names_a_prior_file_of_another_family(tmp_path: Path) -> None:
    prior = tmp_path / "beta.json"
    prior.write_text(json.dumps({"prior": {"family": "bernoulli", "a0": 1.5, "b0": 4.0}}))
    code, _, err = run("table", "--horizon", "8", "--prior", prior)
    flat = " ".join(err.split())
    assert code == 2
    assert str(prior) in flat and "bernoulli" in flat and "'--prior'" in flat


# -- fit-prior: a prior whose scale the normal model cannot resolve gets a note -----------------
def test_fit_prior_notes_a_scale_below_the_floor(tmp_path: Path) -> None:
    rewards = _rewards()
    tiny = _log(tmp_path / "tiny.jsonl", rewards * 1e-9)
    code, _, err = run("fit-prior", tiny, "-o", tmp_path / "p.json")
    flat = " ".join(err.split())
    assert code == 0, err
    written = json.loads((tmp_path / "p.json").read_text())["prior"]
    scale = (written["beta0"] / written["alpha0"]) ** 0.5
    assert scale < 1e-5
    assert "within_scale" in flat and f"{scale:.3g}" in flat and "--transform gaussianize" in flat
    # the same log on a resolvable scale, or Gaussianized, gets no such note
    plain = _log(tmp_path / "plain.jsonl", rewards)
    for log, extra in ((plain, ()), (tiny, ("--transform", "gaussianize"))):
        code, _, err = run("fit-prior", log, "-o", tmp_path / "q.json", *extra)
        assert code == 0, err
        assert "within_scale" not in err


def test_tune_deploy_cost_matches_the_printed_fit_prior_command(tmp_path: Path) -> None:
    # a ragged log: --min-samples leaves the short prompts out of the sweep, but the printed
    # fit-prior command fits every prompt, so the cost conversion must use that fit
    rows = _rewards(prompts=16, samples=8)
    log = tmp_path / "ragged.jsonl"
    log.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [float(v) for v in r[: 8 if i % 3 else 3]]})
            + "\n"
            for i, r in enumerate(rows)
        ),
        encoding="utf-8",
    )
    code, out, err = run("tune", log, "--min-samples", "4", "--points", "8", "--json")
    assert code == 0, err
    deploy = json.loads(out)["deploy"]
    fit_cmd = [line.strip() for line in deploy if "beacon fit-prior" in line]
    assert len(fit_cmd) == 1
    args = shlex.split(fit_cmd[0])
    args[args.index("-o") + 1] = str(tmp_path / "prior.json")
    code, _, err = run(*args[1:])
    assert code == 0, err
    prior = json.loads((tmp_path / "prior.json").read_text())["prior"]
    within = (prior["beta0"] / prior["alpha0"]) ** 0.5
    cost_line = next(line for line in deploy if "within_scale =" in line)
    assert f" x {within:.4g} = " in cost_line, (within, cost_line)


# -- run --config: a prior file or a folder given as the config ---------------------------------
PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"
DEMO = ("-g", "beacon.demo:generator", "-s", "beacon.demo:scorer")


def test_run_config_that_is_a_prior_file_says_to_pass_it_as_prior(tmp_path: Path) -> None:
    prior = tmp_path / "prior.json"
    code, _, err = run("fit-prior", _log(tmp_path / "log.jsonl", _rewards()), "-o", prior)
    assert code == 0, err
    out = tmp_path / "out.jsonl"
    code, _, err = run("run", PROMPTS, *DEMO, "-o", out, "--config", prior)
    flat = " ".join(err.split())
    assert code == 2, err
    assert "'--config'" in flat and "is a prior file" in flat and f"--prior {prior}" in flat
    assert not out.exists()


def test_run_config_that_is_a_folder_is_named_as_one(tmp_path: Path) -> None:
    code, _, err = run("run", PROMPTS, *DEMO, "-o", tmp_path / "o.jsonl", "--config", tmp_path)
    flat = " ".join(err.split())
    assert code == 2
    assert "'--config'" in flat and "is a directory" in flat and "does not exist" not in flat


# -- '-' as an output file: refused, not written as a file named '-' ----------------------------
def test_dash_output_is_refused_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where a file named '-' would land
    log = _log(tmp_path / "log.jsonl", _rewards())
    cases = [
        (("fit-prior", log, "-o", "-"), "'--output'"),
        (("tune", log, "--prior", "default", "--points", "4", "--plot", "-"), "'--plot'"),
        (("run", PROMPTS, *DEMO, "-o", "-"), "'--out'"),
        (("run", PROMPTS, *DEMO, "-o", tmp_path / "o.jsonl", "--dpo", "-"), "'--dpo'"),
    ]
    for args, option in cases:
        code, _, err = run(*args)
        flat = " ".join(err.split())
        assert code == 2, (args, err)
        assert option in flat and "'-'" in flat and "not stdout" in flat
        assert not (tmp_path / "-").exists()
    assert not (tmp_path / "o.jsonl").exists()


# -- examples: figures printed without float noise -----------------------------------------------
def test_langchain_agent_example_prints_h_without_float_noise() -> None:
    import re
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "examples" / "langchain_agent.py"
    pytest.importorskip("langchain_core")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    shown = re.findall(r"last decision: k=\d+ h\^B=(\S+) ", proc.stdout)
    assert shown, proc.stdout
    for value in shown:
        assert value == f"{float(value):.4g}", value
