"""CLI, review of the fifth audit: tune's re-check command with ``--transform none``, the demo
scorer's family check with per-prompt scorers, ``-`` as an output of submit and collect, and
the hint on a run output's repeated id."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beacon.cli import app

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "examples" / "data" / "tot_creative_writing_gpt4.jsonl"


def _invoke(args: list[str]) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.stdout, res.stderr


def test_the_recheck_command_of_a_tune_without_transform_replays_the_tuned_numbers() -> None:
    """``replay --prior fit`` defaults to gaussianize for the normal family: a re-check printed
    without ``--transform none`` replayed another variant than the tuned one (4.58 samples
    where tune reported 4.81, in the reviewer's log)."""
    code, out, err = _invoke(["tune", str(LOG), "--transform", "none"])
    assert code == 0, err
    tuned = re.search(r"BEACON: ([0-9.]+) samples per prompt", out)
    cmd = re.search(r"Re-check on this log without leakage: (beacon replay .*)", out)
    assert tuned and cmd, out
    argv = shlex.split(cmd.group(1))[1:]
    assert "--transform" in argv and argv[argv.index("--transform") + 1] == "none", argv
    code, out2, err2 = _invoke(argv)
    assert code == 0, err2
    replayed = re.search(r"BEACON used ([0-9.]+) samples per prompt", out2)
    assert replayed and replayed.group(1) == tuned.group(1), out2


def test_the_demo_scorer_check_lets_a_file_whose_prompts_all_name_their_scorer_run(
    tmp_path: Path,
) -> None:
    prompts = tmp_path / "ov.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": i, "prompt": f"what is {i} + {i}?", "reference": str(2 * i),
                    "scorer": "beacon.demo:verifier"}) + "\n" for i in range(2)))
    code, _, err = _invoke(["run", str(prompts), "--family", "bernoulli",
                              "--generator", "beacon.demo:generator",
                              "--scorer", "beacon.demo:scorer", "--out", str(tmp_path / "o.jsonl")])
    assert code == 0, err
    # a file with one prompt on the job's scorer is still refused up front
    prompts.write_text(prompts.read_text() + json.dumps({"id": 9, "prompt": "q"}) + "\n")
    code, _, err = _invoke(["run", str(prompts), "--family", "bernoulli",
                            "--generator", "beacon.demo:generator",
                            "--scorer", "beacon.demo:scorer", "--out", str(tmp_path / "p.jsonl")])
    assert code == 2 and "--family" in err, err


@pytest.mark.timeout(120)  # before the fix submit reached the broker and waited for ever
def test_dash_as_an_output_of_submit_or_collect_is_refused_before_any_connection(
    tmp_path: Path,
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": 1, "prompt": "q"}) + "\n")
    code, _, err = _invoke(["submit", str(prompts), "-g", "beacon.demo:generator",
                            "-s", "beacon.demo:scorer", "--wait", "--out", "-"])
    assert code == 2 and "'-': this writes a file" in err, err
    code, _, err = _invoke(["collect", "somejob", "--out", "-"])
    assert code == 2 and "'-': this writes a file" in err, err


def test_a_run_outputs_repeated_id_is_not_told_to_merge(tmp_path: Path) -> None:
    line = {"id": "q03", "key": "k1", "ok": True, "rewards": [0.1, 0.5, 0.3],
            "prompt": "p", "best": {"text": "x", "reward": 0.5}}
    out = tmp_path / "run_dup.jsonl"
    out.write_text(json.dumps(line) + "\n" + json.dumps({**line, "key": "k2"}) + "\n")
    code, _, err = _invoke(["replay", str(out), "--cost", "0.1"])
    assert code != 0
    assert "beacon run" in err and "merge the lines' samples" not in err, err
