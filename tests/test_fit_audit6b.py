"""Audit 6b of offline evaluation, tuning and priors, as a user runs ``beacon tune``,
``replay`` and ``fit-prior`` on their own logs: the numbers and commands printed, prior files
read back for another family, and errors that say what to do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_cli import WRITING, run

import beacon
from beacon.cli.common import fmt, select_prompts
from beacon.errors import ConfigError
from beacon.evaluation import cross_fit, load_logged, logged_from_records, tune
from beacon.priors import rewards_before_first_decision


def _log(path: Path, rows: list[list[float]] | np.ndarray, **extra: object) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [float(v) for v in row], **extra}) + "\n"
            for i, row in enumerate(rows)
        ),
        encoding="utf-8",
    )
    return path


def _rewards(prompts: int = 30, samples: int = 6, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(prompts, 1))
    sd = np.exp(rng.normal(-0.3, 0.3, size=(prompts, 1)))
    return mu + sd * rng.normal(size=(prompts, samples))


# -- tune --target-samples: the k0 of the priors replayed ---------------------------------------
def test_unreachable_target_names_the_fitted_priors_k0() -> None:
    # The cross-fitted priors (k0 <= 1) are replayed, not the config's own Jeffreys (k0 = 3):
    # the message said "the prior needs k0 = 3" of a sweep that stops after 1 sample.
    data = load_logged(WRITING)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=10)
    cf = cross_fit(data, "normal", "gaussianize", 5)
    k0 = max(rewards_before_first_decision(f.prior) for f in cf.fits)
    assert k0 != cfg.k0  # else the test could not tell the two apart
    with pytest.raises(ConfigError) as err:
        tune(data, cfg, [0.001, 0.01], target_samples=2.0, crossfit=cf)
    assert err.value.field == "target_samples"
    assert f"k0 = {k0} before the first decision" in str(err.value), err.value
    assert "a c above 0.01 stops sooner" in str(err.value)


# -- --transform identity is none, with --prior fit too -----------------------------------------
def test_identity_transform_is_none_under_prior_fit(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", _rewards())
    out = {}
    for spelling in ("none", "identity"):
        code, stdout, err = run(
            "replay", log, "--prior", "fit", "--transform", spelling, "-c", "0.2", "--json"
        )
        assert code == 0, err
        out[spelling] = json.loads(stdout)
    assert out["identity"]["beacon"] == out["none"]["beacon"]
    assert out["identity"]["crossfit"]["transform"] == "none"
    assert cross_fit(load_logged(log), "normal", "identity", 3).transform == "none"


# -- tune's judge note: raw rewards far from 1 in significant digits ----------------------------
def test_judge_note_prints_raw_differences_of_small_rewards(tmp_path: Path) -> None:
    # creative-writing scores times 1e-9: all in [0, 1], so tune adds its judge note; the
    # raw differences (about 1e-10) were printed with 4 decimals as "+0.0000"
    rows = [[v * 1e-9 for v in row] for row in load_logged(WRITING).rewards]
    log = _log(tmp_path / "small.jsonl", rows)
    code, stdout, err = run("tune", log, "--points", "5", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    note = next(n for n in doc["notes"] if n.startswith("all rewards lie in [0, 1]"))
    m = re.search(r"against \S+ \((\S+) raw\) for the recommended variant", note)
    assert m is not None, note
    rec = doc["recommended"]
    fixed = doc["fixed"]
    matched = np.interp(
        rec["avg_samples"], [f["avg_samples"] for f in fixed],
        [f["mean_best_reward"] for f in fixed],
    )
    mraw = rec["mean_best_reward"] - matched
    assert abs(mraw) > 1e-12  # a difference the note must show
    assert m.group(1) == fmt(mraw, 4, scale=max(abs(f["mean_best_reward"]) for f in fixed),
                             sign=True)
    assert float(m.group(1)) == pytest.approx(mraw, rel=1e-3)


# -- --prior fit on a log no fold count can fit ------------------------------------------------
def test_crossfit_failure_of_the_whole_log_does_not_advise_fewer_folds() -> None:
    # rewards that never vary within a prompt: no prior can be fitted on any fold or on the
    # whole log, so "use fewer folds or a larger log" sent the user the wrong way
    data = logged_from_records({"id": str(i), "rewards": [float(i % 4)] * 5} for i in range(20))
    with pytest.raises(ConfigError) as err:
        cross_fit(data, "normal", "gaussianize", 5)
    text = str(err.value)
    assert "on the whole log" in text and "fewer folds" not in text, text
    # a failure of one fold's training prompts only keeps its fold advice
    rows = [{"id": str(i), "rewards": [1.0, 1.0, 1.0]} for i in range(6)]
    rows[0]["rewards"] = [0.0, 1.0, 2.0]  # the one prompt that varies: its fold fails alone
    with pytest.raises(ConfigError) as err:
        cross_fit(logged_from_records(rows), "normal", "none", 6)
    # (leave-one-out already: the fold advice is to add prompts; more folds cannot help)
    assert "cross-fitting fold" in str(err.value), err.value
    assert "add prompts to the log" in str(err.value), err.value


# -- --min-samples with --family bernoulli counts labels, and says so ---------------------------
def test_min_samples_note_counts_labels_for_bernoulli() -> None:
    recs = [
        {"id": str(i), "rewards": [0.2, 0.9, 0.4],
         **({"correct": [False, True, False]} if i % 2 == 0 else {})}
        for i in range(6)
    ]
    data = logged_from_records(recs)
    kept, notes = select_prompts(data, "bernoulli", 1)
    assert kept.n_prompts == 3
    # the unlabelled prompts have 3 logged samples each: "fewer than 1 logged samples" was false
    assert notes == [
        "left out 3 of 6 prompts with fewer than 1 labelled samples (--min-samples)"
    ], notes


# -- a prior file is for the family it was fitted for -------------------------------------------
def test_prior_file_of_another_family_is_a_usage_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    probs = _log(tmp_path / "probs.jsonl", rng.beta(0.4, 0.6, (30, 6)))
    judge = tmp_path / "judge.json"
    code, _, err = run("fit-prior", probs, "--family", "judge", "-o", judge)
    assert code == 0, err
    code, _, err = run("replay", probs, "--family", "judge", "--prior", judge, "-c", "0.05")
    assert code == 0, err
    # without --family: was "the normal family needs an NIGPrior", no word of --family judge
    code, _, err = run("replay", probs, "--prior", judge, "-c", "0.05")
    flat = " ".join(err.split())
    assert code == 2 and "pass --family judge" in flat, flat
    # 0/1 rewards: a judge's win prior replayed as the bernoulli family ran silently
    binary = _log(tmp_path / "binary.jsonl", (rng.random((30, 6)) < 0.3).astype(float))
    code, _, err = run("replay", binary, "--family", "bernoulli", "--prior", judge, "-c", "0.05")
    flat = " ".join(err.split())
    assert code == 2 and "fitted for the judge family" in flat, flat
    assert "pass --family judge" in flat
    code, _, err = run("tune", binary, "--family", "bernoulli", "--prior", judge)
    assert code == 2 and "fitted for the judge family" in " ".join(err.split())
    # a bare prior object names no family: used as given
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"a0": 0.5, "b0": 2.0}))
    code, _, err = run("replay", binary, "--family", "bernoulli", "--prior", bare, "-c", "0.05")
    assert code == 0, err


# -- tune's deploy hint: the horizon c was tuned at ---------------------------------------------
@pytest.mark.parametrize("asked", [None, 50])
def test_deploy_config_names_the_tuned_horizon(tmp_path: Path, asked: int | None) -> None:
    # A log of 6 samples per prompt tunes c at horizon 6; the hint's BeaconConfig said nothing
    # (the default horizon 32) or the --horizon 50 the log could not reach, whose h-index stops
    # elsewhere at the same c.
    log = _log(tmp_path / "log.jsonl", _rewards(samples=6))
    extra = () if asked is None else ("--horizon", str(asked))
    code, stdout, err = run("tune", log, "--points", "4", "--json", *extra)
    assert code == 0, err
    doc = json.loads(stdout)
    tuned = doc["horizon"]
    assert tuned == 6
    hint = next(line for line in doc["deploy"] if "BeaconConfig(" in line)
    assert f"horizon={tuned})" in hint and f"horizon={tuned}))" in hint, hint
    assert "horizon=50" not in hint
    # the re-check command still replays what was tuned (replay caps --horizon 50 the same way)
    recheck = next(line for line in doc["deploy"] if "beacon replay" in line)
    assert ("--horizon 50" in recheck) == (asked is not None)


def test_deploy_config_leaves_the_default_horizon_out(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", _rewards(prompts=20, samples=33))
    code, stdout, err = run("tune", log, "--points", "3", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["horizon"] == 32
    hint = next(line for line in doc["deploy"] if "BeaconConfig(" in line)
    assert "horizon=" not in hint, hint


# -- a recommended c, as printed, replays to the numbers printed for it -------------------------
def test_budget_c_as_printed_replays_the_printed_numbers() -> None:
    # --target-samples bisects c to just inside the boundary where E[K] changes; printed with 4
    # digits (0.119 for 0.11903517878502555) it replayed to 5.01 samples, not the 5.00 printed
    code, stdout, err = run("tune", WRITING, "--target-samples", "5", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    rec = doc["recommended"]
    recheck = next(line for line in doc["deploy"] if "beacon replay" in line)
    printed = re.search(r"--cost (\S+)", recheck)
    assert printed is not None, recheck
    assert float(printed.group(1)) == rec["cost"]  # the c printed is the c recommended
    code, stdout, err = run(
        "replay", WRITING, "--prior", "fit", "--transform", "gaussianize",
        "--cost", printed.group(1), "--json",
    )
    assert code == 0, err
    b = json.loads(stdout)["beacon"]
    assert b["avg_samples"] == rec["avg_samples"] <= 5.0
    assert b["mean_standardized_reward"] == rec["mean_standardized_reward"]
    assert b["stop_reasons"] == rec["stop_reasons"]
