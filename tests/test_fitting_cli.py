"""``beacon fit-prior``: the file it writes and its use by ``beacon replay --prior``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import beacon
from beacon.cli import app
from beacon.fitting import GaussianizeTransform, load_fit

runner = CliRunner()


def _log(path: Path, rewards: np.ndarray) -> Path:
    path.write_text("".join(
        json.dumps({"id": str(i), "prompt": "p", "rewards": [float(v) for v in row]}) + "\n"
        for i, row in enumerate(rewards)
    ))
    return path


def test_fit_prior_writes_prior_transform_and_provenance(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    r = rng.beta(0.4, 0.6, (60, 8))
    log = _log(tmp_path / "log.jsonl", r)
    out = tmp_path / "prior.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--transform", "gaussianize"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(doc) == {"prior", "transform", "fitted_on"}
    assert doc["prior"]["family"] == "normal" and doc["transform"]["kind"] == "gaussianize"
    assert doc["fitted_on"]["prompts"] == 60 and doc["fitted_on"]["source"] == str(log)
    fit = load_fit(out)
    assert isinstance(fit.transform, GaussianizeTransform)
    with pytest.warns(beacon.priors.TransformNotLoadedWarning):  # the prior alone
        assert beacon.load_prior(out) == fit.prior
    # The same numbers as the Python API.
    from beacon.fitting import fit_reward_model

    assert fit.prior == fit_reward_model(r, transform="gaussianize").prior
    rep = runner.invoke(app, ["replay", str(log), "--prior", str(out), "--cost", "0.1", "--json"])
    assert rep.exit_code == 0, rep.output


def test_fit_prior_bernoulli_and_judge(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    r = rng.beta(0.3, 0.5, (40, 6))
    log = _log(tmp_path / "log.jsonl", r)
    out = tmp_path / "judge.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--family", "judge"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["transform"] is None and doc["fitted_on"]["family"] == "judge"
    assert load_fit(out).family == "judge"


def test_fit_prior_usage_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    log = _log(tmp_path / "log.jsonl", rng.normal(size=(10, 4)))
    out = tmp_path / "p.json"
    bad = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--transform", "bogus"])
    assert bad.exit_code == 2 and "--transform" in bad.output
    bad2 = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--method", "bogus"])
    assert bad2.exit_code == 2
    missing = runner.invoke(app, ["fit-prior", str(tmp_path / "nope.jsonl"), "-o", str(out)])
    assert missing.exit_code == 2
    # logit of rewards outside [0, 1] is a failure naming the reward, not a traceback.
    fail = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--transform", "logit"])
    assert fail.exit_code == 1 and "reward" in fail.output
    assert not out.exists()


def test_fit_prior_takes_the_transform_file_that_tune_prints(tmp_path: Path) -> None:
    # `beacon tune --transform t.json` prints `beacon fit-prior LOG --transform t.json -o ...`
    # as its deploy command: that command has to work.
    rng = np.random.default_rng(3)
    log = _log(tmp_path / "log.jsonl", rng.beta(0.4, 0.6, (30, 6)))
    tfile = tmp_path / "t.json"
    tfile.write_text(json.dumps({"kind": "logit", "eps": 0.001}))
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--transform", str(tfile)])
    assert res.exit_code == 0, res.output
    assert "on logit-transformed rewards" in " ".join(res.output.split())
    fit = load_fit(out)
    assert fit.transform is not None and fit.transform.to_dict() == {"kind": "logit", "eps": 0.001}
    from beacon.evaluation import load_logged
    from beacon.fitting import fit_reward_model

    assert fit.prior == fit_reward_model(load_logged(log).rewards, transform=fit.transform).prior
    bern = runner.invoke(
        app, ["fit-prior", str(log), "-o", str(out), "--family", "judge", "--transform", str(tfile)]
    )
    assert bern.exit_code == 2 and "takes raw rewards" in bern.output


def test_fit_prior_reward_errors_name_the_prompt(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"id": "q1", "rewards": [0.2, 0.4]}\n{"id": "q2", "rewards": [0.5, 3.0]}\n')
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--family", "judge"])
    flat = " ".join(res.output.split())
    assert res.exit_code == 1 and "prompt 'q2' (record 2), sample 1: 3.0" in flat
    assert "(1, 1)" not in flat and not out.exists()


def test_fit_prior_json_stdout_is_json_alone(tmp_path: Path) -> None:
    # `beacon fit-prior ... --json | jq` must work: the summary line goes to stderr.
    rng = np.random.default_rng(4)
    log = _log(tmp_path / "log.jsonl", rng.normal(size=(12, 5)))
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(out.read_text())
    assert "fitted normal prior" in res.stderr
    # without --json the summary stays on stdout
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(out)])
    assert res.exit_code == 0 and "fitted normal prior" in res.stdout
    assert "fitted normal prior" not in res.stderr  # (a 12 x 5 log's small-log cap note is)


def test_fit_prior_output_is_checked_before_the_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import beacon.cli.priors as priors_cli

    rng = np.random.default_rng(5)
    log = _log(tmp_path / "log.jsonl", rng.normal(size=(12, 5)))

    def no_work(*_a: object, **_k: object) -> None:
        raise AssertionError("the log was read before --output was checked")

    with monkeypatch.context() as m:
        m.setattr(priors_cli, "load_log", no_work)
        targets = [(tmp_path, "is a directory"), (log / "p.json", "is not a directory")]
        if Path("/proc/self").is_dir():  # root may "write" in /proc by os.access; it cannot
            targets.append((Path("/proc/beacon-prior.json"), "cannot write it"))
        for target, reason in targets:
            res = runner.invoke(app, ["fit-prior", str(log), "-o", str(target)])
            flat = " ".join(res.stderr.split())
            assert res.exit_code == 2 and "--output" in flat and reason in flat, flat
    # a missing folder is created, as `tune --plot` creates its folder
    nested = tmp_path / "new" / "sub" / "p.json"
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(nested)])
    assert res.exit_code == 0, res.output
    assert load_fit(nested).family == "normal"


def test_fit_prior_refuses_to_overwrite_its_own_log(tmp_path: Path) -> None:
    # `-o` equal to LOGGED used to replace the log with the prior it was fitted on.
    rng = np.random.default_rng(6)
    log = _log(tmp_path / "log.jsonl", rng.normal(size=(12, 5)))
    before = log.read_text()
    res = runner.invoke(app, ["fit-prior", str(log), "-o", str(tmp_path / "." / "log.jsonl")])
    flat = " ".join(res.stderr.split())
    assert res.exit_code == 2 and "--output" in flat and "is the log LOGGED itself" in flat
    assert log.read_text() == before
