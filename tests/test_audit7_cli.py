"""Audit 7 of the offline commands (``replay``, ``table``, ``fit-prior``) and what they call:
messages that name what the user typed, bounds that match what the command then enforces.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_cli import run

import beacon
from beacon.errors import ConfigError
from beacon.fitting import GaussianizeTransform, fit_reward_model


def _log(path: Path, rewards: np.ndarray) -> Path:
    path.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [float(v) for v in row]}) + "\n"
            for i, row in enumerate(rewards)
        ),
        encoding="utf-8",
    )
    return path


def _probabilities(prompts: int = 12, samples: int = 8) -> np.ndarray:
    """Judge-like win probabilities in (0, 1), many distinct values (a long gaussianize table)."""
    rng = np.random.default_rng(7)
    return 1.0 / (1.0 + np.exp(-rng.normal(scale=2.0, size=(prompts, samples))))


def _usage_message(err: str) -> str:
    """The ``Error: ...`` part of a click usage error (after the Usage / Try lines)."""
    return err[err.index("Error:") :]


# -- a gaussianize transform named in an error is its summary, not its knots ------------------
def test_gaussianize_repr_is_short_and_names_the_knots() -> None:
    fit = fit_reward_model(_probabilities(40, 10), transform="gaussianize")
    tr = fit.transform
    assert isinstance(tr, GaussianizeTransform)
    text = repr(tr)
    assert len(text) < 300, text
    assert f"{tr.x.size} knots" in text
    # what an error naming it as a value shows: the refusal stays readable
    with pytest.raises(ConfigError) as info:
        beacon.BeaconConfig(family="judge", transform=tr, cost=0.1)
    assert info.value.field == "transform"
    assert len(str(info.value)) < 400, str(info.value)[:200]


@pytest.mark.parametrize("family", ["bernoulli", "judge"])
def test_replay_names_a_transform_file_as_typed_when_the_family_refuses_it(
    tmp_path: Path, family: str
) -> None:
    # a fit-prior output with a gaussianize transform, passed to a Beta family
    rewards = _probabilities()
    if family == "bernoulli":
        rewards = (rewards > 0.5).astype(float)
    log = _log(tmp_path / "log.jsonl", rewards)
    prior = tmp_path / "gauss.json"
    probs = _log(tmp_path / "probs.jsonl", _probabilities(40, 10))
    code, _, err = run("fit-prior", probs, "-o", prior, "--transform", "gaussianize")
    assert code == 0, err
    code, _, err = run("replay", log, "--cost", "0.1", "--family", family, "--transform", prior)
    assert code == 2, err
    msg = _usage_message(err)
    assert "'--transform'" in msg
    assert repr(str(prior)) in msg
    assert f"the {family} family takes raw rewards" in msg
    assert len(msg) < 400, msg[:300]


def test_replay_names_a_transform_kind_as_typed_when_the_family_refuses_it(
    tmp_path: Path,
) -> None:
    log = _log(tmp_path / "log.jsonl", (_probabilities() > 0.5).astype(float))
    code, _, err = run(
        "replay", log, "--cost", "0.1", "--family", "bernoulli", "--transform", "logit"
    )
    assert code == 2, err
    msg = _usage_message(err)
    # the spelling typed, not LogitTransform({'kind': 'logit', 'eps': 0.0001})
    assert "'logit': the bernoulli family takes raw rewards" in msg
    assert "LogitTransform" not in msg


# -- beacon table: the horizon bound is the one the table then enforces -----------------------
@pytest.mark.parametrize("horizon", ["0", "1"])
def test_table_horizon_bound_of_a_proper_prior(tmp_path: Path, horizon: str) -> None:
    # a proper NIG prior (k0 = 0 in the paper's table) decides after one reward: n >= 2
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps({"mu0": 0.0, "nu0": 1.0, "alpha0": 2.0, "beta0": 1.0}))
    need = (
        beacon.BeaconConfig(
            prior=beacon.NIGPrior(mu0=0.0, nu0=1.0, alpha0=2.0, beta0=1.0), cost=0.1, horizon=8
        ).k0
        + 1
    )
    code, _, err = run("table", "--horizon", horizon, "--prior", prior)
    assert code == 2, err
    msg = _usage_message(err)
    assert f"'--horizon': {horizon}: must be >= k0 + 1 = {need} for this prior" in msg
    assert "k_min" not in msg


# -- evaluate: a cross-fit is used only on the prompts it was fitted on ------------------------
DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
WRITING = DATA / "tot_creative_writing_gpt4.jsonl"
ALPACA = DATA / "alpacaeval_tulu2_bon11.jsonl"


def test_evaluate_refuses_a_crossfit_of_another_log_with_as_many_prompts() -> None:
    from beacon.evaluation import cross_fit, evaluate, load_logged

    writing, alpaca = load_logged(WRITING), load_logged(ALPACA)
    assert writing.n_prompts == alpaca.n_prompts  # the count alone cannot tell them apart
    cf = cross_fit(alpaca, "normal", "gaussianize", 5)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=10)
    with pytest.raises(ConfigError) as info:
        evaluate(writing, cfg, cf)
    assert info.value.field == "crossfit"
    # the log it was fitted on still evaluates
    assert evaluate(alpaca, cfg, cf).n_prompts == alpaca.n_prompts


def test_evaluate_refuses_a_crossfit_of_the_prompts_in_another_order() -> None:
    # reordered prompts would each be replayed with another prompt's fold prior: for some,
    # one fitted on their own rewards (the leakage cross-fitting exists to prevent)
    from beacon.evaluation import cross_fit, evaluate, load_logged

    data = load_logged(WRITING)
    cf = cross_fit(data, "normal", "none", 5)
    reordered = data.subset(np.arange(data.n_prompts)[::-1])
    with pytest.raises(ConfigError) as info:
        evaluate(reordered, beacon.BeaconConfig(cost=0.1, horizon=10), cf)
    assert info.value.field == "crossfit"
    assert repr(reordered.ids[0]) in str(info.value)


# -- evaluate / tune: arguments of the wrong type are typed errors naming the argument ---------
@pytest.mark.parametrize("which", ["data", "cfg", "crossfit"])
@pytest.mark.parametrize("entry", ["evaluate", "tune"])
def test_evaluate_and_tune_name_an_argument_of_the_wrong_type(which: str, entry: str) -> None:
    from beacon import evaluation

    data = evaluation.load_logged(WRITING)
    args: dict[str, object] = {
        "data": data,
        "cfg": beacon.BeaconConfig(cost=0.1, horizon=10),
        "crossfit": None,
    }
    args[which] = {"data": data.rewards, "cfg": {"cost": 0.1}, "crossfit": "fit"}[which]
    fn = getattr(evaluation, entry)
    with pytest.raises(beacon.ConfigTypeError) as info:
        fn(args["data"], args["cfg"], crossfit=args["crossfit"])
    assert info.value.field == which
    assert isinstance(info.value, TypeError)


# -- fit-prior: a partly labelled bernoulli log gets a remedy fit-prior can follow -------------
def test_fit_prior_partly_labelled_log_names_a_remedy_it_has(tmp_path: Path) -> None:
    import shlex
    import shutil
    import subprocess

    rng = np.random.default_rng(3)
    lines = []
    for i in range(8):
        rec: dict[str, object] = {"id": f"q{i}", "rewards": [float(v) for v in rng.normal(size=6)]}
        if i % 2:
            rec["correct"] = [bool(v) for v in rng.integers(0, 2, 6)]
        lines.append(json.dumps(rec))
    log = tmp_path / "partly labelled.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "prior.json"
    code, _, err = run("fit-prior", log, "-o", out, "--family", "bernoulli")
    assert code == 1, err
    # fit-prior has no --min-samples: the advice is a command that writes the labelled prompts
    assert "--min-samples" not in err
    assert "jq -c" in err and "q0" not in err.split("jq -c", 1)[1]
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed: the printed command is not run")
    command = "jq -c" + " ".join(err.split("jq -c", 1)[1].splitlines())
    jq_args = shlex.split(command.split(" > ", 1)[0])
    labelled = subprocess.run(jq_args, capture_output=True, text=True, check=True).stdout
    assert len(labelled.splitlines()) == 4  # the odd-numbered prompts, which have labels
    kept = tmp_path / "labelled.jsonl"
    kept.write_text(labelled, encoding="utf-8")
    code, _, err = run("fit-prior", kept, "-o", out, "--family", "bernoulli")
    assert code == 0, err


# -- cross-fitting: a fold too small to fit on is helped by more folds, not fewer --------------
def test_crossfit_fold_failure_advises_more_folds_and_more_folds_fit() -> None:
    from beacon.evaluation import cross_fit, logged_from_records

    rng = np.random.default_rng(5)
    data = logged_from_records(
        {"id": f"p{i}", "rewards": [float(v) for v in rng.normal(size=6)]} for i in range(3)
    )
    # 2 folds of 3 prompts: the fold of two trains on the one prompt left, too few to fit
    with pytest.raises(ConfigError) as info:
        cross_fit(data, "normal", "none", 2)
    text = str(info.value)
    assert "fewer folds" not in text, text
    assert "more folds (at most 3" in text, text
    # following the advice works: each fold's prior is fitted on the two other prompts
    assert cross_fit(data, "normal", "none", 3).n_folds == 3
