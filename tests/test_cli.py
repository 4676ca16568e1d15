"""The ``beacon`` CLI: replay, tune, table; errors and exit codes; the installed entry point.

In-process runs use typer's CliRunner; a few run the installed ``beacon`` script (and
``python -m beacon.cli``) in a subprocess. Expected numbers come from :mod:`beacon.evaluation`
called directly (the CLI must report exactly what the library computes) or from the input.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import beacon
from beacon.cli import app
from beacon.cli.tune import verdict
from beacon.evaluation import (
    CostChoice,
    PolicyMetrics,
    PromptOutcomes,
    SweepPoint,
    TuneResult,
    cross_fit,
    evaluate,
    interpolate_fixed,
    load_logged,
    tune,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "data"
GAME24 = EXAMPLES / "tot_game24_gpt4.jsonl"
WRITING = EXAMPLES / "tot_creative_writing_gpt4.jsonl"
ALPACA = EXAMPLES / "alpacaeval_tulu2_bon11.jsonl"

runner = CliRunner()


def run(*args: str | Path) -> tuple[int, str, str]:
    res = runner.invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def beacon_script() -> str:
    exe = Path(sys.executable).parent / "beacon"
    if exe.exists():
        return str(exe)
    found = shutil.which("beacon")
    if found is None:
        pytest.fail("the 'beacon' console script is not installed (pip install -e .)")
    return found


# ---------------------------------------------------------------------------------------------
# help and registration
# ---------------------------------------------------------------------------------------------
def test_help_lists_commands_and_version() -> None:
    code, out, _ = run("--help")
    assert code == 0
    for cmd in ("table", "replay", "tune"):
        assert cmd in out
    code, out, _ = run("--version")
    assert code == 0 and beacon.__version__ in out
    code, _, _ = run()
    assert code in (0, 2)  # no_args_is_help


def test_optional_command_modules_register_when_present() -> None:
    code, out, _ = run("--help")
    assert code == 0
    if (ROOT / "beacon" / "cli" / "priors.py").exists():
        assert "fit-prior" in out
    if (ROOT / "beacon" / "cli" / "jobs.py").exists():
        assert "run" in out


# ---------------------------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------------------------
def test_replay_json_matches_library_bernoulli() -> None:
    code, out, _ = run("replay", GAME24, "--cost", "0.05", "--family", "bernoulli", "--json")
    assert code == 0
    got = json.loads(out)
    ev = evaluate(
        load_logged(GAME24), beacon.BeaconConfig(cost=0.05, horizon=32, family="bernoulli")
    )
    assert got["horizon"] == 32  # default: min(32, samples every prompt has = 64)
    assert got["requested_horizon"] is None
    assert got["beacon"]["avg_samples"] == pytest.approx(ev.beacon.avg_samples)
    assert got["beacon"]["accuracy"] == pytest.approx(ev.beacon.accuracy)
    assert got["beacon"]["value"] == pytest.approx(ev.beacon.value)
    assert [m["n"] for m in got["fixed"]] == list(range(1, 33))
    assert got["fixed"][7]["mean_best_reward"] == pytest.approx(ev.fixed[7].mean_best_reward)
    assert got["matched_fixed"]["accuracy"] == pytest.approx(ev.matched_fixed_accuracy)
    assert got["config"]["family"] == "bernoulli"


def test_replay_reports_the_matched_difference_with_its_paired_se() -> None:
    """The matched difference's SE, recomputed here from the replay's own choices: per prompt,
    BEACON's chosen z-score minus best-of-N's mixed at BEACON's average samples."""
    from beacon.evaluation import standardize
    from beacon.replay import replay

    code, out, _ = run("replay", WRITING, "--cost", "0.1", "--horizon", "8", "--json")
    assert code == 0
    got = json.loads(out)["matched_difference"]["standardized"]
    data = load_logged(WRITING)
    x = data.rewards[:, :8]
    z = standardize(data.rewards)[:, :8]  # z-scores over all logged samples of the prompt
    res = replay(x, beacon.BeaconConfig(cost=0.1, horizon=8))
    zb = z[np.arange(len(z)), res.chosen]
    k = float(res.n_samples.mean())
    n, f = int(np.floor(k)), k - np.floor(k)

    def best_of(m: int) -> np.ndarray:
        first = np.argmax(x[:, :m], axis=1)  # the first of tied best raw rewards
        return z[np.arange(len(z)), first]

    d = zb - ((1 - f) * best_of(n) + (f * best_of(n + 1) if f > 0 else 0.0))
    assert got["prompts"] == len(d)
    assert got["diff"] == pytest.approx(float(d.mean()), abs=1e-12)
    assert got["se"] == pytest.approx(float(d.std(ddof=1) / np.sqrt(len(d))), rel=1e-9)
    code, text, _ = run("replay", WRITING, "--cost", "0.1", "--horizon", "8")
    assert f"{d.mean():+.3f} ± {got['se']:.3f} SE over {len(d)} prompts" in text


def test_replay_table_normal_family() -> None:
    code, out, _ = run("replay", WRITING, "--cost", "0.1", "--horizon", "8")
    assert code == 0
    ev = evaluate(load_logged(WRITING), beacon.BeaconConfig(cost=0.1, horizon=8))
    assert "BEACON c=0.1" in out and "best-of-8" in out and "best-of-9" not in out
    assert f"{ev.beacon.avg_samples:.2f}" in out
    assert f"{ev.fixed[3].mean_standardized_reward:.3f}" in out
    assert "accuracy" not in out.split("\n", 3)[2]  # no labels in this log: no accuracy column
    assert "Value E[zhat-K*c] at c=0.1" in out


def test_replay_options_reach_the_config() -> None:
    code, out, _ = run(
        "replay", WRITING, "--cost", "0.2", "--batch-size", "2", "--no-robust", "--json"
    )
    assert code == 0
    cfg = json.loads(out)["config"]
    assert (cfg["batch_size"], cfg["robust"], cfg["horizon"]) == (2, False, 10)
    ev = evaluate(
        load_logged(WRITING), beacon.BeaconConfig(cost=0.2, horizon=10, batch_size=2, robust=False)
    )
    assert json.loads(out)["beacon"]["avg_samples"] == pytest.approx(ev.beacon.avg_samples)


def test_replay_caps_horizon_and_says_so() -> None:
    code, out, err = run("replay", GAME24, "-c", "0.1", "--family", "bernoulli", "-n", "100")
    assert code == 0
    assert "horizon capped at 64 (asked for 100)" in " ".join(err.split())
    assert "best-of-64" in out and "best-of-65" not in out
    code, out, _ = run(
        "replay", GAME24, "-c", "0.1", "--family", "bernoulli", "-n", "100", "--json"
    )
    got = json.loads(out)
    assert (got["horizon"], got["requested_horizon"]) == (64, 100)
    assert any("capped" in n for n in got["notes"])


def test_replay_with_transform_and_prior_files(tmp_path: Path) -> None:
    code, out, _ = run("replay", ALPACA, "-c", "0.1", "--transform", "logit", "--json")
    assert code == 0
    assert json.loads(out)["config"]["transform"]["kind"] == "logit"
    prior = tmp_path / "prior.json"
    p = beacon.NIGPrior(mu0=0.0, nu0=1.0, alpha0=2.0, beta0=1.5)
    prior.write_text(json.dumps({"prior": p.to_dict(), "transform": {"kind": "logit"}}))
    code, out, _ = run("replay", ALPACA, "-c", "0.1", "--prior", prior, "--json")
    assert code == 0
    got = json.loads(out)
    assert got["config"]["prior"] == p.to_dict()
    assert got["config"]["transform"]["kind"] == "logit"  # the transform stored with the prior
    ev = evaluate(
        load_logged(ALPACA),
        beacon.BeaconConfig(cost=0.1, horizon=11, prior=p, transform="logit"),
    )
    assert got["beacon"]["avg_samples"] == pytest.approx(ev.beacon.avg_samples)
    # --transform none overrides the stored transform.
    code, out, _ = run(
        "replay", ALPACA, "-c", "0.1", "--prior", prior, "--transform", "none", "--json"
    )
    assert code == 0 and json.loads(out)["config"]["transform"] is None
    # A bare prior dict works too, and so does a Beta prior for the bernoulli family.
    bare = tmp_path / "beta.json"
    bare.write_text(json.dumps(beacon.BetaPrior(0.5, 4.0).to_dict()))
    code, out, _ = run("replay", GAME24, "-c", "0.05", "--family", "bernoulli", "--prior", bare)
    assert code == 0 and "Beta(0.5, 4) prior" in " ".join(out.split())


# ---------------------------------------------------------------------------------------------
# errors and exit codes
# ---------------------------------------------------------------------------------------------
def test_missing_file_is_usage_error(tmp_path: Path) -> None:
    code, _, err = run("replay", tmp_path / "nope.jsonl", "--cost", "0.1")
    assert code == 2 and "does not exist" in err


def test_malformed_line_reports_line_number(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"rewards": [1, 2, 3, 4]}\n{"rewards": [1, 2, 3, 4]}\n{"rewards": [1, "x"]}\n')
    code, out, err = run("replay", bad, "--cost", "0.1")
    assert code == 1 and out == ""
    msg = " ".join(err.split())
    assert f"{bad}:3" in msg and "rewards[1]" in msg and "must be a number or null" in msg
    bad.write_text('{"rewards": [1, 2, 3, 4]}\n{oops\n')
    code, _, err = run("tune", bad)
    assert code == 1 and f"{bad}:2" in " ".join(err.split()) and "not valid JSON" in err


@pytest.mark.parametrize("cost", ["0", "-1", "nan", "inf"])
def test_invalid_cost_is_usage_error(cost: str) -> None:
    code, _, err = run("replay", WRITING, "--cost", cost)
    assert code == 2 and "--cost" in err


def test_bernoulli_cost_of_one_is_usage_error() -> None:
    code, _, err = run("replay", GAME24, "--cost", "1.5", "--family", "bernoulli")
    assert code == 2 and "--cost" in err and "must be < 1" in " ".join(err.split())


def test_unknown_family_lists_known_ones() -> None:
    code, _, err = run("replay", WRITING, "--cost", "0.1", "--family", "gaussian")
    msg = " ".join(err.split())
    assert code == 2 and "--family" in msg and "normal" in msg and "bernoulli" in msg


def test_bernoulli_without_labels_fails_clearly() -> None:
    code, _, err = run("replay", WRITING, "--cost", "0.1", "--family", "bernoulli")
    assert code == 1 and "correct" in err


def test_binary_rewards_get_a_bernoulli_hint_and_replay_as_labels(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in GAME24.read_text().splitlines() if line.strip()]
    log = tmp_path / "verdicts.jsonl"
    log.write_text(
        "".join(
            json.dumps({"id": r["id"], "rewards": [int(c) for c in r["correct"]]}) + "\n"
            for r in rows
        )
    )
    code, out, err = run("replay", log, "-c", "0.1")
    assert code == 0 and "--family bernoulli models them exactly" in " ".join(err.split())
    code, out, _ = run("replay", log, "-c", "0.05", "--family", "bernoulli", "--json")
    assert code == 0
    _, ref, _ = run("replay", GAME24, "-c", "0.05", "--family", "bernoulli", "--json")
    assert json.loads(out)["beacon"] == json.loads(ref)["beacon"]
    _, out, _ = run("replay", WRITING, "-c", "0.1", "--json")
    assert not any("bernoulli" in n for n in json.loads(out)["notes"])
    # tune says bernoulli, not judge (for 0/1 rewards the judge family is the same model)
    code, _, err = run("tune", log, "--prior", "default", "--points", "4", "-n", "8")
    flat = " ".join(err.split())
    assert code == 0 and "--family bernoulli" in flat and "--family judge" not in flat


def test_bad_transform_and_prior_files(tmp_path: Path) -> None:
    code, _, err = run("replay", WRITING, "-c", "0.1", "--transform", "cube")
    assert code == 2 and "--transform" in err
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", tmp_path / "none.json")
    assert code == 2 and "does not exist" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"prior": ')
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", broken)
    assert code == 1 and "not valid JSON" in err
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"prior": {"family": "normal", "nu0": -1}}))
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", wrong)
    assert code == 1 and "nu0" in err
    # A Beta prior for the normal family: a usage error on --prior.
    beta = tmp_path / "beta.json"
    beta.write_text(json.dumps(beacon.BetaPrior().to_dict()))
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", beta)
    assert code == 2 and "--prior" in err


def test_reward_outside_transform_domain_names_the_prompt() -> None:
    code, out, err = run("replay", WRITING, "-c", "0.1", "--transform", "logit")
    first = json.loads(WRITING.read_text().splitlines()[0])
    assert code == 1 and out == ""
    assert f"prompt {first['id']!r} (record 1), sample 0" in err and "logit" in err


def test_horizon_too_small_is_usage_error() -> None:
    code, _, err = run("replay", WRITING, "-c", "0.1", "-n", "2")
    assert code == 2 and "--horizon" in err


def _ragged_log(path: Path) -> list[dict[str, object]]:
    """The creative-writing log with three prompts cut short (2, 5 and 7 samples, one null)."""
    rows = [json.loads(line) for line in WRITING.read_text().splitlines() if line.strip()]
    rows[3]["rewards"] = rows[3]["rewards"][:2]
    rows[10]["rewards"] = rows[10]["rewards"][:5]
    rows[20]["rewards"] = [*rows[20]["rewards"][:7], None]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_short_prompt_below_k0_names_it_and_suggests_min_samples(tmp_path: Path) -> None:
    log = tmp_path / "ragged.jsonl"
    rows = _ragged_log(log)
    for cmd in (("replay", log, "-c", "0.1"), ("tune", log, "--prior", "default")):
        code, _, err = run(*cmd)
        flat = " ".join(err.split())
        assert code == 2, err
        assert f"{rows[3]['id']!r} (2 logged samples)" in flat
        assert "--min-samples 4" in flat  # Jeffreys: k0 + 1 = 4


def test_min_samples_leaves_short_prompts_out(tmp_path: Path) -> None:
    log = tmp_path / "ragged.jsonl"
    rows = _ragged_log(log)
    code, out, _ = run("replay", log, "-c", "0.1", "--min-samples", "4", "--json")
    assert code == 0
    got = json.loads(out)
    keep = [i for i in range(len(rows)) if i != 3]
    expected = evaluate(
        load_logged(log).subset(keep), beacon.BeaconConfig(cost=0.1, horizon=5)
    )
    assert got["horizon"] == 5  # the shortest prompt kept (5 samples) caps it
    assert got["beacon"]["avg_samples"] == pytest.approx(expected.beacon.avg_samples)
    notes = " ".join(got["notes"])
    assert f"left out 1 of {len(rows)} prompts with fewer than 4" in notes
    # the default horizon is held at 5 by one prompt while the others have 10: a note says so
    assert f"the shortest prompt, {rows[10]['id']!r} (5 logged samples), caps it" in notes
    assert "2 of 99 prompts have fewer than 10" in notes
    code, out, _ = run("replay", log, "-c", "0.1", "--min-samples", "8", "--json")
    got = json.loads(out)
    assert got["horizon"] == 10 and got["n_prompts"] == len(rows) - 3
    assert not any("caps it" in n for n in got["notes"])


def test_min_samples_bad_values_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = run("replay", WRITING, "-c", "0.1", "--min-samples", "0")
    assert code == 2 and "--min-samples" in err and "must be >= 1" in " ".join(err.split())
    code, _, err = run("tune", WRITING, "--min-samples", "11")
    flat = " ".join(err.split())
    assert code == 2 and "no prompt" in flat and "the longest has 10" in flat


def test_complete_log_has_no_horizon_note() -> None:
    code, out, _ = run("replay", WRITING, "-c", "0.1", "--json")
    assert code == 0 and json.loads(out)["notes"] == []


def test_unknown_option_is_usage_error() -> None:
    code, _, _ = run("replay", WRITING, "-c", "0.1", "--frobnicate")
    assert code == 2


# ---------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------
def test_tune_writes_png_and_recommends(tmp_path: Path) -> None:
    png = tmp_path / "plots" / "tune.png"
    code, out, _ = run("tune", GAME24, "--family", "bernoulli", "--plot", png)
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    flat = " ".join(out.split())
    assert "Recommended: BEACON with the uniform Beta(1, 1) prior (default), c =" in flat
    assert "<- knee" in out and str(png) in flat


def test_tune_json_and_budgets() -> None:
    code, out, _ = run("tune", GAME24, "--family", "bernoulli", "--target-samples", "6", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["recommended"]["rule"] == "target-samples"
    assert got["recommended"]["avg_samples"] <= 6
    ks = [p["avg_samples"] for p in got["sweep"]]
    assert ks == sorted(ks, reverse=True)  # increasing c, never more samples
    code, out, _ = run("tune", WRITING, "--max-quality-loss", "0.1", "--json")
    assert code == 0
    got = json.loads(out)
    best_n = got["fixed"][-1]["mean_standardized_reward"]
    assert got["recommended"]["rule"] == "max-quality-loss"
    assert got["recommended"]["mean_standardized_reward"] >= best_n - 0.1
    assert got["recommended"]["avg_samples"] < 10


def test_tune_usage_errors() -> None:
    code, _, err = run("tune", GAME24, "--family", "bernoulli", "-k", "5", "-x", "0.1")
    assert code == 2 and "not both" in err
    code, _, err = run("tune", GAME24, "--family", "bernoulli", "--quality", "vibes")
    assert code == 2 and "--quality" in err
    code, _, err = run("tune", GAME24, "--family", "bernoulli", "-k", "0.5")
    assert code == 2 and "--target-samples" in err
    code, _, err = run("tune", WRITING, "--cost-min", "1", "--cost-max", "0.1")
    assert code == 2 and "--cost-min" in err


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("--target-samples", "-1", "finite number > 0"),
        ("--target-samples", "nan", "finite number > 0"),
        ("--target-samples", "0.5", "at least 1 sample"),
        ("--max-quality-loss", "-0.1", "finite number >= 0"),
        ("--max-quality-loss", "inf", "finite number >= 0"),
    ],
)
def test_tune_budget_is_checked_before_any_work(
    option: str, value: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget no sweep can meet is a usage error before the log is even read (it used to
    # surface only after the whole sweep).
    import beacon.cli.tune as tune_cli

    def no_work(*_a: object, **_k: object) -> None:
        raise AssertionError(f"the log was read before {option} was checked")

    monkeypatch.setattr(tune_cli, "load_log", no_work)
    code, out, err = run("tune", WRITING, option, value)
    flat = " ".join(err.split())
    assert code == 2 and out == "" and option in flat and reason in flat, flat


def test_tune_one_cost_bound_against_the_default_blames_the_given_option() -> None:
    # --cost-max alone below the data's default --cost-min was reported against --cost-min,
    # which the user never gave, with a number they never typed.
    code, _, err = run("tune", WRITING, "--prior", "default", "--cost-max", "0.0001")
    flat = " ".join(err.split())
    assert code == 2 and "'--cost-max': 0.0001: must be above the default --cost-min" in flat
    code, _, err = run("tune", WRITING, "--prior", "default", "--cost-min", "1000")
    flat = " ".join(err.split())
    assert code == 2 and "'--cost-min': 1000: must be below the default --cost-max" in flat


def test_tune_explicit_cost_range() -> None:
    code, out, _ = run(
        "tune", WRITING, "--cost-min", "0.05", "--cost-max", "2", "--points", "5", "--json"
    )
    assert code == 0
    costs = [p["cost"] for p in json.loads(out)["sweep"]]
    np.testing.assert_allclose(costs, np.logspace(np.log10(0.05), np.log10(2), 5))


# ---------------------------------------------------------------------------------------------
# --prior fit (cross-fitted priors)
# ---------------------------------------------------------------------------------------------
def test_replay_prior_fit_normal_matches_library() -> None:
    code, out, _ = run(
        "replay", WRITING, "--prior", "fit", "--cost", "0.15", "--folds", "4", "--json"
    )
    assert code == 0
    got = json.loads(out)
    data = load_logged(WRITING)
    cf = cross_fit(data, "normal", "gaussianize", folds=4)
    ev = evaluate(data, beacon.BeaconConfig(cost=0.15, horizon=10), cf)
    assert got["beacon"]["avg_samples"] == pytest.approx(ev.beacon.avg_samples)
    assert got["beacon"]["value"] == pytest.approx(ev.beacon.value)
    assert got["crossfit"]["folds"] == 4 and got["crossfit"]["transform"] == "gaussianize"
    assert [f["within_scale"] for f in got["crossfit"]["fits"]] == pytest.approx(cf.scales.tolist())
    code, out, _ = run("replay", WRITING, "--prior", "fit", "--transform", "none", "-c", "0.15")
    assert code == 0
    flat = " ".join(out.split())
    assert "NIG prior cross-fitted on 5 folds" in flat and "per-prompt sd units" in flat


def test_replay_prior_fit_bernoulli_runs() -> None:
    code, out, _ = run(
        "replay",
        GAME24,
        "--family",
        "bernoulli",
        "--prior",
        "fit",
        "-c",
        "0.02",
        "-n",
        "16",
        "--json",
    )
    assert code == 0
    got = json.loads(out)
    data = load_logged(GAME24)
    cf = cross_fit(data, "bernoulli", "none")
    ev = evaluate(data, beacon.BeaconConfig(cost=0.02, horizon=16, family="bernoulli"), cf)
    assert got["crossfit"]["family"] == "bernoulli"
    assert all(f["prior"]["family"] == "bernoulli" for f in got["crossfit"]["fits"])
    assert got["beacon"]["accuracy"] == pytest.approx(ev.beacon.accuracy)
    assert got["beacon"]["avg_samples"] == pytest.approx(ev.beacon.avg_samples)


def test_tune_default_is_cross_fitted_with_jeffreys_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png = tmp_path / "tune.png"
    code, out, _ = run("tune", WRITING, "--plot", png, "--json")
    assert code == 0 and png.stat().st_size > 10_000
    got = json.loads(out)
    data = load_logged(WRITING)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=10)
    jeff = tune(data, cfg)
    fitted = tune(data, cfg, crossfit=cross_fit(data, "normal", "gaussianize"))
    assert got["crossfit"]["transform"] == "gaussianize" and got["crossfit"]["folds"] == 5
    assert got["recommended"]["cost"] == pytest.approx(fitted.choice.cost)
    assert got["recommended"]["avg_samples"] == pytest.approx(fitted.choice.metrics.avg_samples)
    assert got["baseline"]["variant"] == "Jeffreys prior (paper default)"
    assert got["baseline"]["recommended"]["cost"] == pytest.approx(jeff.choice.cost)
    # The paired SE over prompts, for the recommendation and the baseline; the creative-writing
    # win is more than 2 SE, and the mean of the per-prompt differences is the reported one.
    for part, res in ((got, fitted), (got["baseline"], jeff)):
        md = res.matched()
        assert md.per_prompt is not None and md.se is not None
        m = res.choice.metrics
        assert part["diff"] == pytest.approx(
            m.mean_standardized_reward - interpolate_fixed(res.fixed, m.avg_samples), abs=1e-12
        )
        assert part["diff"] == pytest.approx(float(np.mean(md.per_prompt)), abs=1e-12)
        assert part["diff_se"] == pytest.approx(
            float(np.std(md.per_prompt, ddof=1)) / np.sqrt(data.n_prompts), rel=1e-9
        )
        assert part["diff_prompts"] == data.n_prompts
    assert got["diff"] > 2 * got["diff_se"] and got["beats_best_of_n"] is True
    assert f"by {got['diff']:+.3f} ± {got['diff_se']:.3f} SE over 100 prompts" in got["verdict"]
    # The printed deployment command runs and writes the prior for the whole log.
    fit_cmd = [line.strip() for line in got["deploy"] if "beacon fit-prior" in line]
    assert len(fit_cmd) == 1
    monkeypatch.chdir(tmp_path)
    code, _, _ = run(*fit_cmd[0].split()[1:])
    assert code == 0
    written = json.loads((tmp_path / "prior.json").read_text())
    assert written["transform"]["kind"] == "gaussianize"
    assert written["fitted_on"]["prompts"] == data.n_prompts


def test_tune_prior_default_is_the_single_jeffreys_sweep() -> None:
    code, out, _ = run("tune", WRITING, "--prior", "jeffreys", "--json")
    assert code == 0
    got = json.loads(out)
    jeff = tune(load_logged(WRITING), beacon.BeaconConfig(cost=0.1, horizon=10))
    assert got["crossfit"] is None and got["baseline"] is None and got["deploy"] == []
    assert got["recommended"]["cost"] == pytest.approx(jeff.choice.cost)


def test_tune_says_when_beacon_does_not_beat_best_of_n() -> None:
    """A loss (or tie) at matched samples is stated, in text and JSON, never shown as a win."""
    code, out, _ = run("tune", ALPACA, "--prior", "jeffreys", "--json")
    assert code == 0
    got = json.loads(out)
    jeff = tune(load_logged(ALPACA), beacon.BeaconConfig(cost=0.1, horizon=11))
    m = jeff.choice.metrics
    diff = m.mean_standardized_reward - interpolate_fixed(jeff.fixed, m.avg_samples)
    assert diff <= 0 and got["matched_range"][1] <= 1e-12  # Jeffreys never wins on this log
    assert got["beats_best_of_n"] is False
    assert "no c of the sweep beats it" in got["verdict"]
    code, out, _ = run("tune", ALPACA, "--prior", "jeffreys")
    flat = " ".join(out.split())
    assert code == 0 and "verdict: on this log BEACON at this c" in flat
    assert "fixed best-of-N (N = 1..11) is at least as good for the same samples" in flat
    # A win by more than 2 SE is called one; the baseline sub-dict gets its own verdict (the
    # Jeffreys prior's loss on this log is within 2 SE: not distinguishable, not a loss).
    code, out, _ = run("tune", WRITING, "--json")
    got = json.loads(out)
    assert got["beats_best_of_n"] is True and "beats best-of-N" in got["verdict"]
    assert got["diff"] > 2 * got["diff_se"]
    base = got["baseline"]
    assert base["beats_best_of_n"] is False
    assert base["diff"] < 0 and abs(base["diff"]) <= 2 * base["diff_se"]
    assert "is not distinguishable from best-of-N" in base["verdict"]
    assert "within 2 SE" in base["verdict"]
    code, out, _ = run("tune", WRITING)
    flat = " ".join(out.split())
    assert code == 0
    assert (
        f"best-of-N at the same samples {got['matched_fixed_quality']:.3f} "
        f"({got['diff']:+.3f} ± {got['diff_se']:.3f} SE over 100 prompts)"
    ) in flat
    assert "verdict: on this log BEACON beats best-of-N at the same average samples by" in flat


def _prompts(src: Path, dst: Path, n: int) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


def test_tune_small_noisy_log_is_not_called_a_win(tmp_path: Path) -> None:
    """5 prompts: a positive difference within 2 SE is noise, not a win."""
    log = _prompts(WRITING, tmp_path / "five.jsonl", 5)
    code, out, _ = run("tune", log, "--json")
    assert code == 0
    got = json.loads(out)
    assert got["beats_best_of_n"] is False
    assert got["n_prompts"] == 5 and got["diff_prompts"] == 5
    assert 0 < got["diff"] <= 2 * got["diff_se"]
    assert "is not distinguishable from best-of-N" in got["verdict"]
    assert f"{got['diff']:+.3f} ± {got['diff_se']:.3f} SE over 5 prompts" in got["verdict"]
    assert "more prompts would tell" in got["verdict"]
    code, out, _ = run("tune", log)
    flat = " ".join(out.split())
    assert code == 0 and "verdict: on this log BEACON at this c is not distinguishable" in flat
    assert "beats best-of-N at the same average samples by" not in flat


def test_tune_one_prompt_has_no_standard_error(tmp_path: Path) -> None:
    log = _prompts(WRITING, tmp_path / "one.jsonl", 1)
    code, out, _ = run("tune", log, "--prior", "jeffreys", "--json")
    assert code == 0

    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    got = json.loads(out, parse_constant=no_constant)
    assert got["diff_se"] is None and got["diff_prompts"] == 1
    assert got["beats_best_of_n"] is False


def _tune_result(beacon_q: np.ndarray, fixed_q: np.ndarray, k: float) -> TuneResult:
    """A sweep of one point: BEACON's per-prompt quality at avg samples k; best-of-N's per N."""

    def pm(q: np.ndarray, avg: float, n: int | None) -> PolicyMetrics:
        mean = float(np.mean(q))
        return PolicyMetrics(
            "beacon" if n is None else "best-of-N", n, 0.1, avg, mean, mean, None, mean,
            outcomes=PromptOutcomes(q, q),
        )

    fixed = tuple(pm(fixed_q[:, j], j + 1.0, j + 1) for j in range(fixed_q.shape[1]))
    m = pm(beacon_q, k, None)
    return TuneResult(
        config=beacon.BeaconConfig(cost=0.1, horizon=fixed_q.shape[1]),
        requested_horizon=None,
        n_prompts=beacon_q.size,
        quality="standardized",
        points=(SweepPoint(0.1, m),),
        fixed=fixed,
        knee=0,
        choice=CostChoice(0.1, m, "knee"),
    )


def test_verdict_is_a_win_only_above_two_standard_errors() -> None:
    rng = np.random.default_rng(3)
    p = 40
    fixed_q = np.sort(rng.normal(size=(p, 4)), axis=1)  # best-of-N rises with N
    base = 0.5 * fixed_q[:, 1] + 0.5 * fixed_q[:, 2]  # matched at 2.5 samples
    noise = rng.normal(size=p)
    noise = (noise - noise.mean()) / noise.std(ddof=1)  # mean 0, sd 1: SE = 1 / sqrt(p)
    se = 1.0 / np.sqrt(p)
    for shift, beats, words in (
        (3.0 * se, True, "beats best-of-N"),
        (1.0 * se, False, "is not distinguishable from best-of-N"),
        (-1.0 * se, False, "is not distinguishable from best-of-N"),
        (-3.0 * se, False, "does worse than best-of-N"),
    ):
        res = _tune_result(base + noise + shift, fixed_q, 2.5)
        md = res.matched()
        assert md.diff == pytest.approx(shift, abs=1e-12)
        assert md.se == pytest.approx(se, rel=1e-9)
        won, text = verdict(res)
        assert won is beats and words in text, (shift, text)
        assert f"{shift:+.3f} ± {se:.3f} SE over {p} prompts" in text


def test_tune_text_names_variants_and_deploy_command() -> None:
    code, out, err = run("tune", ALPACA)
    assert code == 0
    flat = " ".join(out.split())
    assert "Jeffreys" in flat and "fitted + gaussianize *" in flat
    assert "Recommended: BEACON with the cross-fitted prior + gaussianize (5 folds), c =" in flat
    assert f"beacon fit-prior {ALPACA} --transform gaussianize -o prior.json" in flat
    # Probability-valued rewards: --family judge is suggested, with this log's numbers.
    assert "--family judge" in " ".join(err.split())


@pytest.mark.parametrize(
    ("args", "option", "value"),
    [
        (("--prior", "fit", "--folds", "1"), "--folds", "1"),
        (("--prior", "fit", "--folds", "101"), "--folds", "101"),
        (("--prior", "fit", "--transform", "cube"), "--transform", "cube"),
        (("--folds", "3"), "--folds", "3"),
        (("--transform", "gaussianize"), "--transform", "gaussianize"),
        (("--prior", "fit", "--family", "judgy"), "--family", "judgy"),
    ],
)
def test_prior_fit_bad_values_are_usage_errors(
    args: tuple[str, ...], option: str, value: str
) -> None:
    code, out, err = run("replay", WRITING, "-c", "0.1", *args)
    flat = " ".join(err.split())
    assert code == 2 and out == ""
    assert option in flat and value in flat


def test_prior_fit_transform_for_a_beta_family_is_a_usage_error() -> None:
    code, _, err = run(
        "tune", GAME24, "--family", "bernoulli", "--prior", "fit", "--transform", "gaussianize"
    )
    flat = " ".join(err.split())
    assert code == 2 and "--transform" in flat and "gaussianize" in flat


def test_readme_caption_quotes_the_fitted_variant() -> None:
    """The README's caption numbers for the cross-fitted prior are what `beacon tune` computes."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    data = load_logged(WRITING)
    res = tune(
        data,
        beacon.BeaconConfig(cost=0.1, horizon=10),
        crossfit=cross_fit(data, "normal", "gaussianize"),
    )
    m = res.choice.metrics
    from beacon.evaluation import interpolate_fixed

    quoted = [
        f"{m.avg_samples:.1f} samples per prompt for a mean standardized best reward of "
        f"{m.mean_standardized_reward:.2f}",
        f"best-of-N at the same samples reaches {interpolate_fixed(res.fixed, m.avg_samples):.2f}",
        f"mean raw score {m.mean_best_reward:.2f} against "
        f"{interpolate_fixed(res.fixed, m.avg_samples, 'reward'):.2f}",
    ]
    for q in quoted:
        assert q in text, f"README caption out of date: expected {q!r}"


# ---------------------------------------------------------------------------------------------
# hostile inputs
# ---------------------------------------------------------------------------------------------
def _writing_log(path: Path, scale: float = 1.0, shift: float = 0.0, n: int | None = None) -> Path:
    """The creative-writing log with every reward r as shift + scale * r (the first n prompts)."""
    rows = [json.loads(line) for line in WRITING.read_text().splitlines() if line.strip()][:n]
    path.write_text(
        "".join(
            json.dumps({"id": r["id"], "rewards": [shift + scale * x for x in r["rewards"]]})
            + "\n"
            for r in rows
        )
    )
    return path


def test_log_errors_are_clean_for_bytes_big_integers_and_repeated_ids(tmp_path: Path) -> None:
    cases = {
        "latin1.jsonl": (b'{"id": "caf\xe9", "rewards": [1, 2, 3, 4]}\n', ":1:", "not UTF-8"),
        "bigint.jsonl": (b'{"rewards": [1' + b"0" * 400 + b", 2, 3, 4]}\n", "rewards[0]", "finite"),
        "dup.jsonl": (
            b'{"id": "a", "rewards": [1, 2, 3, 4]}\n{"id": "a", "rewards": [5, 6, 7, 8]}\n',
            ":2: invalid id='a'",
            "repeats the id of line 1",
        ),
    }
    for name, (raw, where, why) in cases.items():
        log = tmp_path / name
        log.write_bytes(raw)
        for cmd in (("replay", log, "-c", "0.1"), ("fit-prior", log, "-o", tmp_path / "p.json")):
            code, out, err = run(*cmd)  # run() re-raises anything but a clean exit
            flat = " ".join(err.split())
            assert code == 1 and out == "" and where in flat and why in flat, (name, err)


def test_zhat_does_not_depend_on_the_scale_of_the_rewards(tmp_path: Path) -> None:
    want = json.loads(run("replay", WRITING, "-c", "0.15", "--prior", "fit", "--json")[1])
    for scale, shift in ((1e-9, 0.0), (1e-9, 1.0), (1e9, 5e9)):
        log = _writing_log(tmp_path / "scaled.jsonl", scale, shift)
        code, out, _ = run("replay", log, "-c", "0.15", "--prior", "fit", "--json")
        got = json.loads(out)
        assert code == 0
        for key in ("avg_samples", "mean_standardized_reward"):
            assert got["beacon"][key] == pytest.approx(want["beacon"][key], abs=1e-5), (scale, key)
        assert got["fixed"][-1]["mean_standardized_reward"] == pytest.approx(
            want["fixed"][-1]["mean_standardized_reward"], abs=1e-5
        )


def test_raw_rewards_are_printed_readably_at_any_scale(tmp_path: Path) -> None:
    log = _writing_log(tmp_path / "tiny.jsonl", 1e-9)
    code, out, err = run("replay", log, "-c", "1e-10")
    best = load_logged(log).rewards.max(axis=1).mean()
    assert code == 0 and f"{best:.4g}" in out  # not 0.000
    # the Jeffreys prior cannot resolve a 1e-9 spread (sigma floor): a note says so
    flat = " ".join(err.split())
    assert "typical within-prompt sd is 1.11e-09" in flat and "floored at 1e-06" in flat
    code, out, _ = run("tune", log, "--prior", "fit")
    flat = " ".join(out.split())
    assert code == 0 and "mean raw reward of the chosen sample: BEACON 7.7" in flat
    assert "e-09" in flat and "(+0.000)" not in flat


def test_json_output_stays_strict_json_for_an_absurd_cost() -> None:
    code, out, _ = run("replay", WRITING, "-c", "1e308", "--json")
    assert code == 0

    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    got = json.loads(out, parse_constant=no_constant)
    assert got["beacon"]["value"] is None  # -inf has no JSON form


def test_absurd_cost_prints_no_nan() -> None:
    # Every value is -inf at c = 1e308; their difference used to print as "(+nan)".
    code, out, _ = run("replay", WRITING, "-c", "1e308")
    flat = " ".join(out.split())
    assert code == 0 and "nan" not in flat.lower()
    assert "both -inf: K*c overflows at this c" in flat


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_huge_rewards_fail_naming_the_prompt_without_numpy_noise(tmp_path: Path) -> None:
    log = tmp_path / "huge.jsonl"
    log.write_text(
        '{"id": "q1", "rewards": [0.5, 1e300, 0.1, 0.2, 0.3]}\n'
        '{"id": "q2", "rewards": [0.1, 0.2, 0.3, 0.4, 0.5]}\n'
    )
    # replay: the overflow of the scale check's squares was a numpy RuntimeWarning on stderr
    code, _, err = run("replay", log, "--cost", "0.1")
    flat = " ".join(err.split())
    assert code == 1 and "prompt 'q1' (record 1), sample 1: 1e+300" in flat, flat
    # tune: the warm-up replay named the reward by array position "(0, 1)"
    code, _, err = run("tune", log, "--prior", "default")
    flat = " ".join(err.split())
    assert code == 1 and "prompt 'q1' (record 1), sample 1: 1e+300" in flat, flat
    assert "(0, 1)" not in flat
    code, _, err = run("tune", log, "--family", "judge")
    flat = " ".join(err.split())
    assert code == 1 and "prompt 'q1' (record 1), sample 1" in flat and "(0, 1)" not in flat


def test_plot_path_is_checked_before_the_sweep(tmp_path: Path) -> None:
    code, _, err = run("tune", WRITING, "--plot", tmp_path)
    assert code == 2 and "--plot" in err and "is a directory" in err
    assert not tmp_path.with_suffix(".png").exists()  # matplotlib would have written <dir>.png
    code, _, err = run("tune", WRITING, "--plot", tmp_path / "plot.xyz")
    flat = " ".join(err.split())
    assert code == 2 and "cannot write '.xyz' images" in flat and ".svg" in flat
    # no extension: a PNG at exactly the path given (not at path.png)
    plain = tmp_path / "plot"
    code, out, _ = run("tune", GAME24, "--family", "bernoulli", "--plot", plain)
    assert code == 0 and plain.read_bytes()[:4] == b"\x89PNG"
    assert f"Plot written to {plain}" in " ".join(out.split())
    assert not plain.with_suffix(".png").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_unwritable_plot_path_fails_before_reading_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # os.access says root may write in /proc; only creating the file shows it cannot.
    import beacon.cli.tune as tune_cli

    def no_work(*_a: object, **_k: object) -> None:
        raise AssertionError("the log was read before --plot was checked")

    monkeypatch.setattr(tune_cli, "load_log", no_work)
    for target in ("/proc/beacon-plot.png", "/proc/beacon-no-such-dir/plot.png"):
        code, out, err = run("tune", GAME24, "--family", "bernoulli", "--plot", target)
        flat = " ".join(err.split())
        assert code == 2 and out == "" and "--plot" in flat and "cannot write" in flat, flat
        assert target in flat


def test_plot_probe_leaves_no_trace(tmp_path: Path) -> None:
    # The early check creates the folders and the file to prove they can be written; a run that
    # fails afterwards (here: a missing log) must not leave them behind, nor touch a file that
    # is already there.
    new = tmp_path / "new" / "sub" / "p.png"
    code, _, err = run("tune", tmp_path / "missing.jsonl", "--plot", new)
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "new").exists()
    old = tmp_path / "old.png"
    old.write_bytes(b"keep me")
    code, _, _ = run("tune", tmp_path / "missing.jsonl", "--plot", old)
    assert code == 2 and old.read_bytes() == b"keep me"


@pytest.mark.parametrize("option", ["--cost-min", "--cost-max"])
def test_tune_cost_bounds_must_be_finite_and_positive(option: str) -> None:
    for value in ("inf", "nan", "-1"):
        code, out, err = run("tune", WRITING, option, value)
        assert code == 2 and out == "" and option in err and "finite number > 0" in err


def test_tune_points_sets_both_passes_of_the_default_sweep() -> None:
    code, out, _ = run("tune", WRITING, "--points", "7", "--json")
    got = json.loads(out)
    assert code == 0 and len(got["sweep"]) == 7 and len(got["baseline"]["sweep"]) == 7
    # as many costs as the default's 25 per pass, over the range where E[K] changes
    ks = [p["avg_samples"] for p in got["sweep"]]
    assert ks[0] > ks[-1]


def test_prior_fit_on_a_log_of_few_prompts(tmp_path: Path) -> None:
    three = _writing_log(tmp_path / "three.jsonl", n=3)
    code, out, err = run("replay", three, "-c", "0.1", "--prior", "fit", "--json")
    assert code == 0 and json.loads(out)["crossfit"]["folds"] == 3
    assert any("cross-fitting on 3 folds" in n for n in json.loads(out)["notes"])
    two = _writing_log(tmp_path / "two.jsonl", n=2)
    for cmd in (("tune", two), ("replay", two, "-c", "0.1", "--prior", "fit")):
        code, _, err = run(*cmd)
        flat = " ".join(err.split())
        assert "too few to fit a prior" in flat and "--prior default" in flat, flat
        assert "folds <= " not in flat
        if "--prior" in cmd:  # a --prior the user gave is a usage error on it
            assert code == 2 and "'--prior'" in flat, flat
        else:  # tune's default --prior fit: not an "Invalid value for '--prior'"
            assert code == 1 and "'--prior'" not in flat, flat


def test_prior_fit_runs_on_logs_too_short_for_the_default_prior(tmp_path: Path) -> None:
    # Two samples per prompt: Jeffreys (k0 = 3) cannot run, the fitted priors (k0 <= 1) can.
    # replay/tune --prior fit used to refuse such logs on the unused default prior's k0, and
    # told the user to pass --min-samples 4, which leaves out every prompt.
    rows = [json.loads(x) for x in WRITING.read_text().splitlines() if x.strip()]
    log = tmp_path / "two.jsonl"
    log.write_text("".join(json.dumps({"id": r["id"], "rewards": r["rewards"][:2]}) + "\n"
                           for r in rows[:30]))
    code, out, err = run("replay", log, "-c", "0.1", "--prior", "fit", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["horizon"] == 2 and got["crossfit"]["folds"] == 5
    assert 1.0 <= got["beacon"]["avg_samples"] <= 2.0
    code, out, err = run("tune", log, "--points", "4", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["horizon"] == 2 and got["crossfit"] is not None and got["baseline"] is None
    assert any("default prior is not swept" in n for n in got["notes"])
    # without a fitted prior: a usage error whose advice can be followed
    code, _, err = run("replay", log, "-c", "0.1")
    flat = " ".join(err.split())
    assert code == 2 and "no prompt has that many (the longest has 2)" in flat, flat
    assert "--min-samples 4 leaves" not in flat and "--prior fit" in flat


def test_min_samples_leaves_out_unlabelled_prompts_for_bernoulli(tmp_path: Path) -> None:
    rows = [json.loads(x) for x in GAME24.read_text().splitlines() if x.strip()][:10]
    rows[3]["correct"] = [None] * len(rows[3]["correct"])
    log = tmp_path / "unlabelled.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run("replay", log, "-c", "0.05", "--family", "bernoulli")
    flat = " ".join(err.split())
    assert code == 1 and f"prompt {rows[3]['id']!r}" in flat and "no 'correct' label" in flat
    # --min-samples counts labels for bernoulli; it used to fail the same way as above
    code, out, err = run(
        "replay", log, "-c", "0.05", "--family", "bernoulli", "--min-samples", "1", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["n_prompts"] == 9 and any("left out 1 of 10" in n for n in got["notes"])


def test_prior_fit_failing_on_the_log_says_so_and_how_to_run_without(tmp_path: Path) -> None:
    # `beacon tune` fits by default; on rewards without variation the error spoke of a
    # gaussianize transform the user never asked for, with no way out.
    log = tmp_path / "flat.jsonl"
    log.write_text("".join(
        json.dumps({"id": str(i), "rewards": [0.5] * 6}) + "\n" for i in range(6)
    ))
    code, out, err = run("tune", log)
    flat = " ".join(err.split())
    assert code == 1 and out == ""
    assert "--prior fit (--transform gaussianize) cannot fit a prior on this log" in flat, flat
    assert "2 distinct rewards" in flat and "use --prior default" in flat
    code, out, _ = run("tune", log, "--prior", "default", "--json")
    assert code == 0 and json.loads(out)["recommended"]["mean_standardized_reward"] == 0.0


def test_errors_and_notes_quoting_brackets_are_printed_verbatim(tmp_path: Path) -> None:
    # Messages quote log lines and paths; rich read "[/INST]" (a Llama prompt) as a closing tag
    # and crashed with MarkupError, and ate "[red]" out of a path.
    log = tmp_path / "inst.jsonl"
    log.write_text('{"id": "a", "prompt": "[INST] hi [/INST]", "rewards": [0.1, oops]}\n')
    code, _, err = run("replay", log, "-c", "0.1")
    flat = " ".join(err.split())
    assert code == 1 and '"prompt": "[INST] hi [/INST]"' in flat and "not valid JSON" in flat
    fitted = tmp_path / "prior[red].json"
    code, _, _ = run("fit-prior", WRITING, "-o", fitted, "--transform", "gaussianize")
    assert code == 0
    (tmp_path / "runs[").mkdir()
    closing = tmp_path / "runs[" / "]prior.json"
    closing.write_text(fitted.read_text())
    for path in (fitted, closing):
        code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", path)
        flat = " ".join(err.split())
        assert code == 0 and f"stored with the prior in {path}" in flat, flat


def test_prior_word_misspelled_says_what_prior_takes() -> None:
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", "Fit")
    flat = " ".join(err.split())
    assert code == 2 and "file 'Fit' does not exist" in flat and "is not fit, default" in flat


@pytest.mark.parametrize(
    ("prior", "field", "reason"),
    [
        ({"family": "normal", "mu0": 0, "nu0": 1, "alpha0": "1", "beta0": 1}, "alpha0", "real"),
        ({"family": "normal", "mu0": 0, "nu0": 1, "alpha0": True, "beta0": 1}, "alpha0", "real"),
        ({"family": "normal", "mu0": 0, "nu0": 1, "alpha0": 2}, "beta0", "missing"),
        ({"mu0": 0, "nu0": 1, "alpha0": 2, "beta0": 1, "beta": 3}, "beta", "unknown field"),
    ],
)
def test_prior_file_values_and_fields_are_checked(
    tmp_path: Path, prior: dict[str, object], field: str, reason: str
) -> None:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"prior": prior}))
    replay = ("replay", WRITING, "-c", "0.1", "--prior", path)
    for cmd in (replay, ("table", "-n", "8", "--prior", path)):
        code, _, err = run(*cmd)
        flat = " ".join(err.split())
        assert code == 1 and f"prior.{field}=" in flat and reason in flat, flat


# ---------------------------------------------------------------------------------------------
# table
# ---------------------------------------------------------------------------------------------
def test_table_builds_then_loads_from_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from beacon.index.cache import clear_memory_cache

    monkeypatch.setenv("BEACON_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    code, out, _ = run("table", "--horizon", "6")
    assert code == 0
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and str(files[0]) in " ".join(out.split())
    assert "standard, built and cached" in out and "time:" in out and "recipe: standard" in out
    clear_memory_cache()
    code, out, _ = run("table", "-n", "6")
    assert code == 0 and "standard, from the disk cache" in out
    clear_memory_cache()
    code, out, _ = run("table", "-n", "6", "--precise")
    assert code == 0 and "precise, built and cached" in out and "recipe: precise" in out
    assert len(list(tmp_path.glob("*-precise.npz"))) == 1
    clear_memory_cache()
    code, out, _ = run("table", "-n", "6")
    assert code == 0 and "precise, from the disk cache" in out
    code, out, _ = run("table", "-n", "32")
    assert code == 0 and "precise, shipped with the package" in out
    code, _, err = run("table", "-n", "3")
    assert code == 2 and "--horizon" in err
    clear_memory_cache()


def test_table_horizon_too_large_is_usage_error_on_horizon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BEACON_CACHE_DIR", str(tmp_path))
    code, _, err = run("table", "-n", "2000")
    flat = " ".join(err.split())
    # was exit 1 naming an internal field: "invalid n=2000"
    assert code == 2 and "'--horizon': 2000" in flat and "<= 1024" in flat, flat
    assert not list(tmp_path.glob("*.npz"))


def test_a_directory_given_as_a_json_file_is_usage_error(tmp_path: Path) -> None:
    for cmd in (
        ("replay", WRITING, "-c", "0.1", "--prior", tmp_path),
        ("table", "-n", "8", "--prior", tmp_path),
        ("replay", WRITING, "-c", "0.1", "--transform", tmp_path / "t.json"),
    ):
        if cmd[-1] != tmp_path:
            Path(cmd[-1]).mkdir()
        code, _, err = run(*cmd)
        flat = " ".join(err.split())
        # was exit 1, "error: Is a directory: ..." without the option
        assert code == 2 and "is a directory, not a JSON file" in flat, flat
        assert f"'{cmd[-2]}'" in flat


# ---------------------------------------------------------------------------------------------
# the installed entry point, in a real subprocess
# ---------------------------------------------------------------------------------------------
def test_installed_entry_point_replay(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run(
        [
            beacon_script(),
            "replay",
            str(GAME24),
            "--cost",
            "0.05",
            "--family",
            "bernoulli",
            "--horizon",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["horizon"] == 16 and len(got["fixed"]) == 16
    proc = subprocess.run(
        [beacon_script(), "replay", str(tmp_path / "missing.jsonl"), "--cost", "0.1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_python_dash_m_beacon_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "beacon.cli", "--help"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "replay" in proc.stdout


def test_cli_import_stays_light() -> None:
    # `beacon --help` must not pay for numba, matplotlib or the framework adapters.
    code = (
        "import sys, beacon.cli\n"
        "heavy = ('numba', 'matplotlib', 'celery', 'langchain_core', 'llama_index', 'aiohttp')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert proc.stdout.strip() == ""


def test_demo_verifier_reads_boxed_answers_with_braces() -> None:
    """The demo verifier credits LaTeX answers such as \\frac{1}{2} (balanced braces)."""
    import asyncio

    from beacon.demo import generator, verifier

    ref = "\\frac{1}{2}"
    verify = verifier().bind({"id": "h", "reference": ref})
    gen = generator(seed=3).bind({"id": "h", "reference": ref})

    async def go() -> tuple[list[str], list[float]]:
        texts = [await gen("half of one?") for _ in range(40)]
        return texts, [await verify("half of one?", t) for t in texts]

    texts, scores = asyncio.run(go())
    right = [t.endswith(f"\\boxed{{{ref}}}.") for t in texts]
    assert any(right) and not all(right)
    assert scores == [1.0 if r else 0.0 for r in right]
    assert asyncio.run(verify("q", "so \\boxed{ \\frac{1}{2} }")) == 1.0
    assert asyncio.run(verify("q", "\\boxed{\\frac{1}{2}} no, \\boxed{\\frac{1}{3}}")) == 0.0
    assert asyncio.run(verify("q", "\\boxed{\\frac{1}{2}")) == 0.0  # never closed
    # Deterministic by seed: the same seed gives the same samples.
    again = generator(seed=3).bind({"id": "h", "reference": ref})

    async def redo() -> list[str]:
        return [await again("half of one?") for _ in range(40)]

    assert asyncio.run(redo()) == texts


def test_a_one_prompt_log_is_counted_in_the_singular(tmp_path: Path) -> None:
    log = tmp_path / "one.jsonl"
    log.write_text('{"id": "a", "rewards": [1, 2, 3, 4, 5]}\n')
    for args in (("tune", log, "--prior", "default"), ("replay", log, "--cost", "0.1")):
        code, out, _ = run(*args)
        assert code == 0
        header = out.splitlines()[0]
        assert "one.jsonl: 1 prompt" in header and "1 prompts" not in out, header
    code, out, _ = run("replay", WRITING, "--cost", "0.1")
    assert code == 0 and "100 prompts, horizon" in out


def test_a_misspelt_key_of_a_prior_file_is_an_error_not_a_dropped_transform(
    tmp_path: Path,
) -> None:
    # {"prior": ..., "transfrom": ...} replayed the prior (fitted in gaussianized units) on the
    # raw rewards without a word
    fitted = tmp_path / "fit.json"
    code, _, err = run("fit-prior", WRITING, "--transform", "gaussianize", "-o", fitted)
    assert code == 0, err
    data = json.loads(fitted.read_text())
    data["transfrom"] = data.pop("transform")
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps(data))
    for cmd in (("replay", WRITING, "-c", "0.1"), ("tune", WRITING)):
        code, _, err = run(*cmd, "--prior", typo)
        assert code == 1 and "transfrom" in err, (cmd, code, err[-500:])
    code, _, err = run("replay", WRITING, "-c", "0.1", "--prior", fitted)
    assert code == 0, err
