"""Audit of ``beacon table`` / ``replay`` / ``fit-prior`` as a user meets them: broken pipes,
Ctrl-C, warnings, gzip logs, errors that name the field, notes that give usable advice.

In-process runs use typer's CliRunner; the pipe and Ctrl-C cases run the installed ``beacon``
script in a subprocess (they are about the process: its exit status and what reaches stderr).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_cli import beacon_script, run

import beacon
from beacon.evaluation import evaluate, load_logged
from beacon.fitting import fit_reward_model


def _log(path: Path, rewards: np.ndarray) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [float(v) for v in row]}) + "\n"
            for i, row in enumerate(rewards)
        ),
        encoding="utf-8",
    )
    return path


def _small_log(tmp_path: Path, prompts: int = 6, samples: int = 8) -> Path:
    rng = np.random.default_rng(7)
    return _log(tmp_path / "log.jsonl", rng.normal(size=(prompts, samples)))


def _prior_file(path: Path, **params: float) -> Path:
    path.write_text(json.dumps({"family": "normal", **params}), encoding="utf-8")
    return path


# -- stdout closed by its reader (| head) -----------------------------------------------------
def test_closed_stdout_pipe_ends_quietly(tmp_path: Path) -> None:
    log = _small_log(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes: every write is EPIPE
    try:
        proc = subprocess.run(
            [beacon_script(), "fit-prior", str(log), "-o", str(tmp_path / "p.json"), "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    # It used to end with "error: [Errno 32] Broken pipe": the reader stopping early is no error
    # of the command's to report. Exit 1 is what click does for its own output in this case.
    assert proc.returncode == 1, proc.stderr
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "p.json").is_file()  # the prior itself was written before the JSON echo


# -- Ctrl-C -------------------------------------------------------------------------------------
def test_ctrl_c_exits_130_with_a_short_message(tmp_path: Path) -> None:
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [beacon_script(), "fit-prior", str(fifo), "-o", str(tmp_path / "p.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = -1
    try:
        # The command blocks reading the FIFO, inside the command, until data comes; opening
        # the write end succeeds only once it has opened the read end, so SIGINT below lands
        # while it waits for the log (no timing guess).
        deadline = time.monotonic() + 120
        while writer < 0:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "beacon never opened the log"
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if writer >= 0:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted", err  # it used to exit 130 without a word
    assert "Traceback" not in err and out == ""


# -- Python warnings ----------------------------------------------------------------------------
def test_unwritable_table_cache_is_one_warning_line_and_not_called_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a file where the cache folder should be")
    monkeypatch.setenv("BEACON_CACHE_DIR", str(not_a_dir))
    # a prior no other test builds a table for, so the in-process memo cannot answer
    prior = _prior_file(tmp_path / "prior.json", mu0=0.0, nu0=0.37, alpha0=1.13, beta0=1.0)
    code, out, err = run("table", "-n", "6", "--prior", prior)
    assert code == 0, err
    flat = " ".join(out.split())
    # the headline said "built and cached" while the path line said it could not be written
    assert "built (not cached)" in flat and "built and cached" not in flat, flat
    assert "path: none (could not write the cache" in flat
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: could not write"), err
    assert str(not_a_dir) in err and "RuntimeWarning" not in err and "find_table" not in err


# -- errors that name the field -----------------------------------------------------------------
def test_table_prior_out_of_range_is_a_usage_error_naming_the_file_and_field(
    tmp_path: Path,
) -> None:
    prior = _prior_file(tmp_path / "wide.json", mu0=0.0, nu0=1.0, alpha0=1e308, beta0=1.0)
    code, _, err = run("table", "-n", "8", "--prior", prior)
    flat = " ".join(err.split())
    # it was exit 1 with "error: invalid alpha0=1e+308: ..." naming neither option nor file
    assert code == 2, flat
    assert "'--prior'" in flat and str(prior) in flat and "alpha0=1e+308" in flat, flat


def test_replay_prior_error_names_the_field_of_the_prior(tmp_path: Path) -> None:
    log = _small_log(tmp_path)
    prior = _prior_file(tmp_path / "wide.json", mu0=0.0, nu0=1.0, alpha0=1e308, beta0=1.0)
    code, _, err = run("replay", log, "-c", "0.1", "--prior", prior)
    flat = " ".join(err.split())
    # it said "Invalid value for '--prior': 1e+308: must be <= 1000": 1e+308 of what?
    assert code == 2 and "'--prior': alpha0=1e+308" in flat, flat


def test_run_kwargs_error_names_the_keyword(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    code, _, err = run(
        "run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
        "-o", tmp_path / "out.jsonl", "--scorer-kwargs", '{"fail_rate": 2}',
    )
    flat = " ".join(err.split())
    # it said "'--scorer-kwargs': 2: must be a number in [0.0, 1.0]", not which keyword
    assert code == 2 and "'--scorer-kwargs': fail_rate=2:" in flat, flat
    assert not (tmp_path / "out.jsonl").exists()


def test_fit_prior_failure_names_the_log(tmp_path: Path) -> None:
    log = _log(tmp_path / "one.jsonl", np.array([[0.1, 0.5, 0.2, 0.9]]))
    code, _, err = run("fit-prior", log, "-o", tmp_path / "p.json")
    flat = " ".join(err.split())
    assert code == 1 and flat.startswith(f"error: {log}: cannot fit a normal prior"), flat
    assert not (tmp_path / "p.json").exists()


def test_fit_prior_summary_counts_the_dropped_outliers(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    r = rng.normal(size=(8, 10))
    r[:, 0] = -1e6  # one broken reward per prompt, far out in its prompt and in the log
    log = _log(tmp_path / "log.jsonl", r)
    code, out, err = run("fit-prior", log, "-o", tmp_path / "p.json")
    assert code == 0, err
    want = fit_reward_model(load_logged(log).rewards, "normal").to_dict()["fitted_on"]
    assert want["dropped"] > 0
    flat = " ".join(out.split())
    # it said "from 8 prompts / N rewards" alone: the rewards left out were not mentioned
    assert f"/ {want['rewards']} rewards ({want['dropped']} more dropped as outliers" in flat, flat


# -- input files --------------------------------------------------------------------------------
def test_gzip_log_is_named_as_such(tmp_path: Path) -> None:
    plain = _small_log(tmp_path)
    packed = tmp_path / "log.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for args in (("fit-prior", packed, "-o", tmp_path / "p.json"), ("replay", packed, "-c", "1")):
        code, _, err = run(*args)
        flat = " ".join(err.split())
        # it was "invalid line=b'\x8b': not UTF-8 text (byte 0x8b at column 2)"
        assert code == 1 and f"{packed}: gzip-compressed" in flat and "gunzip" in flat, flat


def test_json_array_or_pretty_object_log_is_named_as_such(tmp_path: Path) -> None:
    records = [{"id": f"q{i}", "rewards": [0.1 * i, 0.2, 0.3 + i, 0.4]} for i in range(3)]
    cases = {
        "array.json": (json.dumps(records, indent=2), "one JSON array of 3 items", "'.[]'"),
        "flat.json": (json.dumps(records), "one JSON array of 3 items", "'.[]'"),
        "object.json": (json.dumps(records[0], indent=2), "one JSON object over several", "."),
    }
    for name, (text, what, jq) in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        code, _, err = run("fit-prior", path, "-o", tmp_path / "p.json")
        flat = " ".join(err.split())
        # it was "invalid line='[': not valid JSON (Expecting value, column 1)" alone
        assert code == 1 and f"{path} holds {what}" in flat and f"jq -c {jq} " in flat, flat
    # a JSON Lines log with a bad first line gets no such hint
    one_line = tmp_path / "bad.jsonl"
    one_line.write_text(json.dumps({"id": "q", "scores": [1, 2]}) + "\n", encoding="utf-8")
    code, _, err = run("fit-prior", one_line, "-o", tmp_path / "p.json")
    assert code == 1 and "JSON Lines" not in err and "'rewards'" in err, err


def test_log_from_a_pipe_is_read_whole(tmp_path: Path) -> None:
    # <(zcat log.gz) hands the command a pipe: nothing may be read from it before the loader
    plain = _small_log(tmp_path)
    fifo = tmp_path / "piped.jsonl"
    os.mkfifo(fifo)
    feeder = subprocess.Popen(["sh", "-c", 'cat "$1" > "$2"', "sh", str(plain), str(fifo)])
    try:
        code, _, err = run("fit-prior", fifo, "-o", tmp_path / "p.json")
    finally:
        feeder.wait(timeout=60)
    assert code == 0, err
    fitted = json.loads((tmp_path / "p.json").read_text())["fitted_on"]
    assert fitted["prompts"] == load_logged(plain).n_prompts


# -- notes --------------------------------------------------------------------------------------
def test_horizon_note_gives_no_advice_that_leaves_out_every_prompt(tmp_path: Path) -> None:
    log = _small_log(tmp_path, prompts=5, samples=8)
    data = load_logged(log)
    asked = data.max_samples * 4
    code, out, err = run("replay", log, "-c", "0.1", "-n", str(asked), "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    capped = [n for n in notes if n.startswith("horizon capped")]
    assert len(capped) == 1, notes
    # "--min-samples 32 leaves them out" left out every prompt: a usage error when followed
    assert f"--min-samples {asked}" not in capped[0], capped[0]
    assert f"no prompt has {asked} logged samples" in capped[0]
    assert f"the longest has {data.max_samples}" in capped[0]
    code, _, err = run("replay", log, "-c", "0.1", "--min-samples", str(asked))
    assert code == 2  # what the old advice led to


# -- narrow terminals ---------------------------------------------------------------------------
def test_replay_table_keeps_every_digit_on_a_narrow_terminal() -> None:
    game24 = Path(__file__).resolve().parents[1] / "examples" / "data" / "tot_game24_gpt4.jsonl"
    env = {**os.environ, "COLUMNS": "40"}
    env.pop("NO_COLOR", None)
    proc = subprocess.run(
        [beacon_script(), "replay", str(game24), "-c", "0.05", "-n", "4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # at 40 columns rich shrank the columns and printed "0.…" for every number
    assert "…" not in proc.stdout, proc.stdout
    ev = evaluate(load_logged(game24), beacon.BeaconConfig(cost=0.05, horizon=4))
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("│")]
    assert len(rows) == 1 + len(ev.fixed)
    for row, m in zip(rows, (ev.beacon, *ev.fixed), strict=True):
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[1:] == [
            f"{m.avg_samples:.2f}",
            f"{m.mean_best_reward:.3f}",
            f"{m.mean_standardized_reward:.3f}",
            f"{m.accuracy:.3f}",
            f"{m.value:.3f}",
        ], row


# -- the demo endpoint's simulated failures -------------------------------------------------------
def test_demo_scorer_failures_are_transient_under_retries(tmp_path: Path) -> None:
    prompts = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"

    def job(out: Path, *extra: str) -> list[dict[str, Any]]:
        code, _, err = run(
            "run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
            "-o", out, "--max-attempts", "12", *extra,
        )
        assert code == 0, err
        lines = [json.loads(ln) for ln in out.read_text().splitlines()]
        return sorted(lines, key=lambda d: str(d["id"]))

    clean = job(tmp_path / "clean.jsonl")
    flaky = job(tmp_path / "flaky.jsonl", "--scorer-kwargs", '{"fail_rate": 0.3}')
    assert sum(d["usage"]["retries"] for d in flaky) > 0
    # A scorer call that failed once used to fail on every retry (the draw depended on the
    # prompt and response alone): samples were lost and prompts stopped with "error". Retried
    # calls now succeed and the job ends as it does without failures.
    for a, b in zip(clean, flaky, strict=True):
        assert b["ok"] and b["stop_reason"] == a["stop_reason"] != "error", b
        assert b["rewards"] == a["rewards"] and b["best"] == a["best"]


def test_log_of_single_samples_is_not_sent_to_prior_fit(tmp_path: Path) -> None:
    log = _log(tmp_path / "single.jsonl", np.array([[0.3], [0.5], [0.9]]))
    code, _, err = run("replay", log, "-c", "0.1")
    flat = " ".join(err.split())
    assert code == 2 and "(1 logged sample)" in flat and "the longest has 1" in flat, flat
    # it advised "a fitted prior needs fewer (--prior fit)", which fails on this log as well
    assert "--prior fit" not in flat, flat
    code, _, err = run("replay", log, "-c", "0.1", "--prior", "fit")
    assert code != 0, err


def test_tune_tables_keep_every_digit_on_a_narrow_terminal() -> None:
    log = Path(__file__).resolve().parents[1] / "examples" / "data" / "tot_game24_gpt4.jsonl"
    env = {**os.environ, "COLUMNS": "40"}
    env.pop("NO_COLOR", None)
    proc = subprocess.run(
        [beacon_script(), "tune", str(log), "--family", "bernoulli", "-n", "8", "--points", "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("│")]
    assert rows, proc.stdout
    # at 40 columns rich shrank the sweep table's columns and cut its numbers to "0.…"
    assert not any("…" in r for r in rows), proc.stdout


@pytest.mark.parametrize("command", ["replay", "tune", "fit-prior", "run", "submit"])
def test_family_help_names_every_builtin_family(command: str) -> None:
    code, out, _ = run(command, "--help")
    assert code == 0
    # click wraps the help text: compare it without line breaks and box borders
    text = " ".join(ln.strip(" │") for ln in out.splitlines())
    help_text = text[text.index("--family") :][:400]
    for family in beacon.available_families():
        assert family in help_text, (command, family, help_text)


@pytest.mark.parametrize("kind", ["scorer", "verifier"])
def test_demo_failures_of_a_prompt_do_not_depend_on_other_prompts(kind: str) -> None:
    import asyncio

    from beacon.demo import DemoScorer, DemoTransientError, DemoVerifier

    cls = DemoScorer if kind == "scorer" else DemoVerifier
    record = {"id": "a", "reference": "4"}

    async def outcomes(bound: Any) -> list[bool]:
        out = []
        for j in range(40):
            try:
                await bound("same prompt", f"response {j}")
                out.append(True)
            except DemoTransientError:
                out.append(False)
        return out

    async def main() -> tuple[list[bool], list[bool]]:
        used = cls(fail_rate=0.5)
        await outcomes(used.bind(record))  # another prompt with the same text, earlier
        again = await outcomes(used.bind(record))
        fresh = await outcomes(cls(fail_rate=0.5).bind(record))
        return again, fresh

    again, fresh = asyncio.run(main())
    assert not all(fresh) and any(fresh)  # the draw fails some first attempts, not all
    # before, the failed-attempt counts of the first prompt's calls were shared: the second
    # prompt's first attempts drew as retries
    assert again == fresh


def test_a_malformed_first_line_does_not_read_a_large_log_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    from beacon.cli import common

    csv = tmp_path / "export.csv"
    row = "prompt,reward\n" + "q,0.5\n" * 1
    csv.write_text(row + "some prompt text,0.25\n" * 1_000_000)  # 22 MB
    tracemalloc.start()
    try:
        assert common._json_document(csv) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # before, the whole file was read and parsed to look for a JSON array
    assert peak < 1_000_000, peak
    # a JSON array beyond the size read whole is still named, without its count
    arr = tmp_path / "log.json"
    arr.write_text(json.dumps([{"id": i, "rewards": [0.5]} for i in range(50)], indent=1))
    assert common._json_document(arr) == ("one JSON array of 50 items", "'.[]'")
    monkeypatch.setattr(common, "_JSON_DOCUMENT_MAX_BYTES", 100)
    assert common._json_document(arr) == ("one JSON array", "'.[]'")


def test_option_errors_name_the_option_given(tmp_path: Path) -> None:
    # --allow's error named BEACON_ALLOWED_FACTORIES, which the user never set; a bad
    # --warm-start-transform was reported on --warm-start
    code, _, err = run("worker", "--allow", "bad module!")
    assert code == 2 and "'--allow': 'bad module!'" in err and "BEACON_ALLOWED" not in err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "a"}\n')
    code, _, err = run("run", prompts, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
                       "-o", tmp_path / "o.jsonl", "--warm-start",
                       "--warm-start-transform", "bogus")
    assert code == 2 and "'--warm-start-transform': 'bogus'" in err, err
