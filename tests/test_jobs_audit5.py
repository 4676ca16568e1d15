"""Audit 5 of bulk jobs (``beacon run`` / ``submit``) and of ``tune``'s deploy hint: prompt
cache prices in a job spec, prompts that share an id, empty prompt files, the demo reward model
under a family it cannot serve, and the tuned settings in the printed ``BeaconConfig``."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_cli import run
from test_cli_audit5 import _log, _rewards
from test_jobs import _spec, _write_prompts

from beacon.budget import Budget
from beacon.engine.protocol import Generation
from beacon.jobs import (
    DuplicateIdError,
    FactorySpec,
    JobInputError,
    JobSpec,
    PromptExecutor,
    PromptRecord,
    check_unique_ids,
    iter_prompt_file,
    prompt_key,
    read_jsonl,
    run_job,
)

DEMO = ["-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"]

# -- 1. prompt-cache prices in a job spec ------------------------------------------------------
CACHE_PRICES = {
    "price_per_input_token": 1e-3,
    "price_per_output_token": 4e-3,
    "price_per_cache_read_token": 1e-4,
    "price_per_cache_write_token": 2.5e-3,
}
USAGE = {
    "input_tokens": 1000,
    "output_tokens": 10,
    "cache_read_tokens": 600,
    "cache_write_tokens": 300,
}


def cached_generator() -> Any:
    """Factory of a model whose every response reports prompt-cache tokens (no cost of its
    own, so the budget prices it)."""

    async def generate(prompt: Any) -> Generation:
        return Generation(f"an answer to {prompt}", **USAGE)

    return generate


def test_a_job_spec_takes_the_prompt_cache_prices(tmp_path: Path) -> None:
    base = _spec()
    spec = JobSpec(base.generator, base.scorer, base.config, {**CACHE_PRICES, "max_cost": 5.0})
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    budget = PromptExecutor(spec, allowed=None)._budget(None)
    assert budget == Budget(max_cost=5.0, **CACHE_PRICES)
    # a rerun with other cache prices is another job (other keys), as with the other prices
    other = JobSpec(
        base.generator,
        base.scorer,
        base.config,
        {**CACHE_PRICES, "price_per_cache_read_token": 2e-4, "max_cost": 5.0},
    )
    rec = next(iter_prompt_file(_write_prompts(tmp_path / "p.jsonl", 1)))
    assert isinstance(rec, PromptRecord)
    assert prompt_key(rec, spec) != prompt_key(rec, other)


def test_a_bad_cache_price_names_its_sampling_key() -> None:
    base = _spec()
    with pytest.raises(
        JobInputError, match=r"sampling\.price_per_cache_write_token=-1: must be a finite"
    ):
        JobSpec(base.generator, base.scorer, base.config, {"price_per_cache_write_token": -1})


def test_a_job_prices_cached_input_tokens_at_the_cache_prices(tmp_path: Path) -> None:
    base = _spec(horizon=4)
    spec = JobSpec(
        FactorySpec(f"{__name__}:cached_generator"), base.scorer, base.config, CACHE_PRICES
    )
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    summary = run_job(prompts, spec, tmp_path / "out.jsonl", allowed=None)
    assert summary.exit_code == 0
    per_call = Budget(**CACHE_PRICES).price(**USAGE)
    assert per_call is not None
    # the cache prices are used, not the input price for every input token
    assert per_call != pytest.approx(
        Budget(**{k: v for k, v in CACHE_PRICES.items() if "cache" not in k}).price(1000, 10)
    )
    for line in read_jsonl(tmp_path / "out.jsonl"):
        usage = line["usage"]
        assert usage["cost"] == pytest.approx(usage["model_calls"] * per_call)


# -- 2. two different prompts with one id --------------------------------------------------------
def _lines(path: Path, *records: dict[str, Any] | str) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records),
        encoding="utf-8",
    )
    return path


def test_run_refuses_two_prompts_with_one_id_before_anything_runs(tmp_path: Path) -> None:
    prompts = _lines(
        tmp_path / "p.jsonl",
        {"id": "a", "prompt": "hello"},
        {"id": "b", "prompt": "world"},
        "",
        {"id": "a", "prompt": "different"},
    )
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    code, stdout, err = run("run", prompts, *DEMO, "-o", out, "--dpo", dpo)
    assert code == 1, err
    # one line naming the file, both lines and the id
    assert "p.jsonl line 4" in err and "line 1 has this id too" in err and "'a'" in err
    assert stdout == ""
    # nothing was run or written: no output, no DPO file
    assert not out.exists() or out.read_text() == ""
    assert not dpo.exists() or dpo.read_text() == ""


def test_run_refuses_an_int_and_a_str_id_that_a_log_reads_as_one(tmp_path: Path) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"id": 1, "prompt": "one"}, {"id": "1", "prompt": "uno"})
    code, _, err = run("run", prompts, *DEMO, "-o", tmp_path / "out.jsonl")
    assert code == 1 and "line 2" in err and "line 1 has this id too" in err, err


def test_identical_repeated_lines_still_run_once(tmp_path: Path) -> None:
    line = {"id": "a", "prompt": "hello", "metadata": {"src": "x"}}
    prompts = _lines(tmp_path / "p.jsonl", line, {"id": "b", "prompt": "world"}, line)
    out = tmp_path / "out.jsonl"
    code, stdout, err = run("run", prompts, *DEMO, "-o", out, "--json")
    assert code == 0, err
    assert json.loads(stdout)["duplicates"] == 1
    assert sorted(r["id"] for r in read_jsonl(out)) == ["a", "b"]


def test_run_job_refuses_records_sharing_an_id(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    records = [
        {"id": "x", "prompt": "p"},
        {"id": "y", "prompt": "q"},
        {"id": "x", "prompt": "p", "reference": "42"},
    ]
    with pytest.raises(DuplicateIdError) as info:
        run_job(records, _spec(), out)
    assert info.value.field == "id" and info.value.value == "x"
    assert info.value.line == 3 and info.value.first_line == 1
    assert not out.exists()
    # a per-prompt factory override is part of the prompt: another record, too
    override = {
        "id": "x",
        "prompt": "p",
        "scorer": {"factory": "beacon.demo:scorer", "kwargs": {"seed": 9}},
    }
    with pytest.raises(DuplicateIdError):
        check_unique_ids(iter(_records([records[0], override])), _spec())


def _records(dicts: list[dict[str, Any]]) -> list[Any]:
    from beacon.jobs.local import iter_records

    return list(iter_records(dicts))


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker tier pointed at a port nothing listens on (and a prefix of its own): a
    submit that got past its input checks fails there, and nothing reaches a real Redis."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"redis://127.0.0.1:{s.getsockname()[1]}/13"
    for name in ("BEACON_BROKER_URL", "BEACON_RESULT_BACKEND", "BEACON_STATE_URL"):
        monkeypatch.setenv(name, closed)
    monkeypatch.setenv("BEACON_KEY_PREFIX", "audit5-jobs")


@pytest.mark.usefixtures("no_broker")
def test_submit_refuses_two_prompts_with_one_id_before_the_broker(tmp_path: Path) -> None:
    pytest.importorskip("celery")
    prompts = _lines(
        tmp_path / "p.jsonl", {"id": "a", "prompt": "hello"}, {"id": "a", "prompt": "other"}
    )
    code, _, err = run("submit", prompts, *DEMO)
    assert code == 1 and "p.jsonl line 2" in err and "line 1 has this id too" in err, err
    assert "broker" not in err


# -- 3. an empty prompts file ------------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "\n  \n\u00a0\n"])
def test_run_on_a_file_without_prompts_is_an_error(tmp_path: Path, content: str) -> None:
    prompts = tmp_path / "empty.jsonl"
    prompts.write_text(content, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code, stdout, err = run("run", prompts, *DEMO, "-o", out)
    assert code == 1, (stdout, err)
    assert "empty.jsonl" in err and "holds no prompt" in err
    assert "0 ok" not in stdout
    assert not out.exists()


@pytest.mark.usefixtures("no_broker")
def test_submit_on_a_file_without_prompts_is_an_error(tmp_path: Path) -> None:
    prompts = tmp_path / "empty.jsonl"
    prompts.write_text("\n", encoding="utf-8")
    code, _, err = run("submit", prompts, *DEMO)
    assert code == 1 and "empty.jsonl" in err and "holds no prompt" in err, err


# -- 4. the demo reward model under a family it cannot serve -------------------------------------
@pytest.mark.parametrize("family", ["bernoulli", "judge"])
def test_demo_scorer_with_a_non_normal_family_is_refused_up_front(
    tmp_path: Path, family: str
) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"id": "a", "prompt": "2+2", "reference": "4"})
    out = tmp_path / "out.jsonl"
    code, _, err = run("run", prompts, *DEMO, "-o", out, "--family", family)
    assert code == 2, err
    assert "--family" in err and repr(family) in err and "beacon.demo:verifier" in err
    assert not out.exists() or out.read_text() == ""


def test_demo_verifier_serves_the_bernoulli_family(tmp_path: Path) -> None:
    prompts = _lines(tmp_path / "p.jsonl", {"id": "a", "prompt": "2+2", "reference": "4"})
    code, _, err = run(
        "run",
        prompts,
        "-g",
        "beacon.demo:generator",
        "-s",
        "beacon.demo:verifier",
        "-o",
        tmp_path / "out.jsonl",
        "--family",
        "bernoulli",
        "-n",
        "4",
    )
    assert code == 0, err


# -- 5. tune: the printed BeaconConfig carries the tuned settings -------------------------------
def _config_kwargs(deploy: list[str]) -> dict[str, str]:
    (line,) = [x for x in deploy if "BeaconConfig(" in x]
    inner = re.search(r"BeaconConfig\(([^)]*)\)", line)
    assert inner is not None, line
    return dict(part.strip().split("=", 1) for part in inner.group(1).split(","))


def test_tune_deploy_config_carries_horizon_batch_size_and_robust(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", _rewards())
    code, out, err = run(
        "tune", log, "--horizon", "6", "--batch-size", "2", "--no-robust", "--points", "8", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    kw = _config_kwargs(got["deploy"])
    assert int(kw["horizon"]) == got["config"]["horizon"] == 6
    assert int(kw["batch_size"]) == got["config"]["batch_size"] == 2
    assert kw["robust"] == str(got["config"]["robust"]) == "False"


def test_tune_deploy_config_without_options_adds_none(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.jsonl", _rewards())
    code, out, err = run("tune", log, "--points", "8", "--json")
    assert code == 0, err
    kw = _config_kwargs(json.loads(out)["deploy"])
    assert not {"batch_size", "robust"} & set(kw)
    # c was tuned at the log's samples per prompt, which the deployed config must name (the
    # default horizon's index would stop elsewhere at the same c)
    assert kw.get("horizon") == str(_rewards().shape[1]), kw


def test_tune_deploy_config_of_a_bernoulli_log_carries_the_horizon(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    wins = (rng.random((30, 8)) < rng.uniform(0.1, 0.9, size=(30, 1))).astype(float)
    log = _log(tmp_path / "log.jsonl", wins)
    code, out, err = run(
        "tune",
        log,
        "--family",
        "bernoulli",
        "--prior",
        "fit",
        "-n",
        "6",
        "--points",
        "6",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    kw = _config_kwargs(got["deploy"])
    assert kw["family"] == "'bernoulli'" and int(kw["horizon"]) == got["config"]["horizon"] == 6
