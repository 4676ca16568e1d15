"""Online warm start of bulk jobs: the prior is refitted from the job's own finished prompts."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import beacon
from beacon.cli import app
from beacon.errors import ConfigError
from beacon.fitting import fit_prior
from beacon.jobs import FactorySpec, JobSpec, WarmStart, WarmStarter, read_jsonl, run_job


def _spec(**cfg: Any) -> JobSpec:
    return JobSpec(FactorySpec("beacon.demo:generator", {"seed": 4}),
                   FactorySpec("beacon.demo:scorer", {"seed": 4}),
                   beacon.BeaconConfig(**{"cost": 0.05, "horizon": 12, **cfg}))


def _prompts(path: Path, ids: range) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"Describe object number {i}."})
                            + "\n" for i in ids))
    return path


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"transform": "logit"}, "warm_start.transform"),
    ({"min_prompts": 1}, "warm_start.min_prompts"),
    ({"min_prompts": 2.5}, "warm_start.min_prompts"),
    ({"growth": 1.0}, "warm_start.growth"),
    ({"growth": float("nan")}, "warm_start.growth"),
])
def test_bad_policy_is_a_typed_error_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        WarmStart(**kwargs)
    assert ei.value.field == field


def test_refit_schedule_and_fit_equal_fit_prior_on_the_same_rewards() -> None:
    rng = np.random.default_rng(0)
    means = rng.normal(0.0, 2.0, size=80)
    rows = [list(m + rng.normal(0.0, 1.0, size=int(rng.integers(1, 9)))) for m in means]
    st = WarmStarter(WarmStart(min_prompts=10, growth=2.0), beacon.BeaconConfig())
    assert st.config.prior is None
    refit_at = []
    for i, row in enumerate(rows, start=1):
        st.add([*row, None])  # a failed sample is dropped
        if st.due():
            st.refit()
            refit_at.append(i)
            assert st.config.prior == fit_prior([r for r in rows[:i]], "normal")
    assert refit_at == [10, 20, 40, 80]
    assert [h["prompts"] for h in st.history()] == refit_at
    # A proper prior: the paper's k0 is 0 or 1, and BEACON never answers before one sample.
    assert st.config.resolved_prior.k0 <= 1 and st.config.k0 == 1


def test_degenerate_history_keeps_the_prior_and_says_why() -> None:
    st = WarmStarter(WarmStart(min_prompts=3), beacon.BeaconConfig(family="bernoulli"))
    for _ in range(3):
        st.add([0.0, 0.0, 0.0])  # never a success: no Beta prior can be fitted
    assert st.due()
    cfg = st.refit()
    (h,) = st.history()
    if h["prior"] is None:
        assert cfg is st.base and h["error"]
    else:  # a fit that succeeds must be the same fit as fit_prior's
        assert cfg.prior == fit_prior([[0.0] * 3] * 3, "bernoulli")


def test_job_refits_from_its_own_outputs_and_each_line_names_its_prior(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    # wait=True and one prompt in flight: which prompt runs with which prior is deterministic.
    s = run_job(_prompts(tmp_path / "p.jsonl", range(30)), _spec(), out, concurrency=1,
                warm_start=WarmStart(min_prompts=6, wait=True))
    assert s.progress.done == 30 and s.warm_start is not None
    recs = list(read_jsonl(out))
    history = s.warm_start
    assert [h["prompts"] for h in history] == [6, 12, 24]
    jeffreys = beacon.BeaconConfig().resolved_prior.to_dict()
    bounds = [0, 6, 12, 24, 30]
    priors = [jeffreys]
    for h in history:
        # Each refit is the empirical-Bayes fit of exactly the prompts finished before it.
        expect = fit_prior([r["rewards"] for r in recs[:h["prompts"]]], "normal")
        assert h["prior"] == expect.to_dict() and h["cost"] == 0.05
        priors.append(h["prior"])
    for a, b, prior in zip(bounds[:-1], bounds[1:], priors, strict=True):
        assert all(r["prior"] == prior and r["cost"] == 0.05 for r in recs[a:b])
    # The output is also a reward log: `beacon fit-prior` and `beacon tune` read it directly.
    from beacon.evaluation import load_logged

    assert load_logged(out).rewards.shape[0] == 30


def test_refits_do_not_hold_up_the_job(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    s = run_job(_prompts(tmp_path / "p.jsonl", range(30)), _spec(), out, concurrency=3,
                warm_start=WarmStart(min_prompts=6))
    assert s.progress.done == 30 and s.warm_start
    counts = [h["prompts"] for h in s.warm_start]
    # A refit still building its table when the next is due runs right after it, on
    # everything finished by then; the last refit covers the end of the job.
    def next_threshold(n: int) -> int:  # the schedule 6, 12, 24, 48, ...
        t = 6
        while t <= n:
            t *= 2
        return t

    assert counts[0] >= 6 and all(b >= next_threshold(a) for a, b in itertools.pairwise(counts))
    assert counts[-1] == 30 or next_threshold(counts[-1]) > 30
    recs = list(read_jsonl(out))
    usable = {json.dumps(beacon.BeaconConfig().resolved_prior.to_dict(), sort_keys=True): 0}
    for h in s.warm_start:
        usable[json.dumps(h["prior"], sort_keys=True)] = h["prompts"]
    for done_before, r in enumerate(recs):
        # A prompt runs with Jeffreys or with a prior fitted on prompts finished before it.
        key = json.dumps(r["prior"], sort_keys=True)
        assert key in usable and usable[key] <= done_before


def test_resumed_job_reseeds_the_fit_from_the_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run_job(_prompts(tmp_path / "a.jsonl", range(12)), _spec(), out, concurrency=2)
    first = list(read_jsonl(out))
    assert all("prior" not in r for r in first)  # no warm start in the first run
    s = run_job(_prompts(tmp_path / "b.jsonl", range(20)), _spec(), out, concurrency=1,
                warm_start=WarmStart(min_prompts=10))
    assert s.progress.skipped == 12 and s.progress.done == 8
    assert s.warm_start is not None and s.warm_start[0]["prompts"] == 12
    expect = fit_prior([r["rewards"] for r in first], "normal").to_dict()
    assert s.warm_start[0]["prior"] == expect
    new = [r for r in read_jsonl(out) if "prior" in r]
    assert len(new) == 8 and new[0]["prior"] == expect


def test_resumed_job_is_not_seeded_from_other_jobs_lines_in_the_output(tmp_path: Path) -> None:
    """Another job (another scorer, other prompts) shares the output: its rewards are not
    this job's history and must not enter the fit."""
    out = tmp_path / "out.jsonl"
    other = JobSpec(_spec().generator, FactorySpec("beacon.demo:scorer", {"seed": 9}),
                    _spec().config)
    run_job(_prompts(tmp_path / "other.jsonl", range(100, 130)), other, out)
    mine = _prompts(tmp_path / "mine.jsonl", range(8))
    run_job(mine, _spec(), out, concurrency=2)
    own = [r for r in read_jsonl(out) if r["id"] < 100]
    # one prompt left to run: the refit on the resumed prompts is made before it starts
    s = run_job(_prompts(tmp_path / "mine9.jsonl", range(9)), _spec(), out,
                warm_start=WarmStart(min_prompts=5))
    assert (s.progress.skipped, s.progress.done) == (8, 1) and s.warm_start is not None
    expect = fit_prior([r["rewards"] for r in own], "normal").to_dict()
    assert [(h["prompts"], h["prior"]) for h in s.warm_start] == [(8, expect)]
    # The same from a one-shot iterable of records.
    own = [r for r in read_jsonl(out) if r["id"] < 100]
    recs = [json.loads(x) for x in
            _prompts(tmp_path / "mine10.jsonl", range(10)).read_text().splitlines()]
    s = run_job((r for r in recs), _spec(), out, warm_start=WarmStart(min_prompts=5))
    assert s.progress.skipped == 9 and s.progress.total == 10 and s.warm_start is not None
    expect = fit_prior([r["rewards"] for r in own], "normal").to_dict()
    assert (s.warm_start[0]["prompts"], s.warm_start[0]["prior"]) == (9, expect)


def test_rerun_of_a_finished_job_makes_no_refit(tmp_path: Path) -> None:
    """With nothing left to run, a rerun used to refit on the resumed prompts (a fit, and
    the h-table of a new prior: seconds to minutes) for no prompt, and report that refit."""
    out = tmp_path / "out.jsonl"
    prompts = _prompts(tmp_path / "a.jsonl", range(12))
    run_job(prompts, _spec(), out, concurrency=2, warm_start=WarmStart(min_prompts=5))
    before = out.read_bytes()
    s = run_job(prompts, _spec(), out, warm_start=WarmStart(min_prompts=5))
    assert (s.progress.skipped, s.progress.done) == (12, 0)
    assert s.warm_start == []
    assert out.read_bytes() == before


def test_cli_run_warm_start(tmp_path: Path) -> None:
    p = _prompts(tmp_path / "p.jsonl", range(16))
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(app, ["run", str(p), "-g", "beacon.demo:generator",
                                   "-s", "beacon.demo:scorer", "-o", str(out), "--cost", "0.05",
                                   "--warm-start", "--warm-start-min", "8", "-j", "1", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert [h["prompts"] for h in payload["warm_start"]] == [8, 16]
    bad = CliRunner().invoke(app, ["run", str(p), "-g", "beacon.demo:generator",
                                   "-s", "beacon.demo:scorer", "-o", str(tmp_path / "x.jsonl"),
                                   "--warm-start", "--warm-start-min", "1"])
    assert bad.exit_code == 2


def test_gaussianize_refit_fits_the_transform_and_keeps_the_cost_relative_to_the_spread() -> None:
    from beacon.fitting import fit_reward_model
    from beacon.jobs.warm_start import pooled_within_sd

    rng = np.random.default_rng(2)
    # Bimodal judge-like probabilities: a normal model fits them badly without a transform.
    rows = [list(np.clip(rng.beta(0.3, 0.6, size=int(rng.integers(2, 9))), 1e-6, 1 - 1e-6))
            for _ in range(40)]
    base = beacon.BeaconConfig(cost=0.02)
    st = WarmStarter(WarmStart(min_prompts=40, transform="gaussianize"), base)
    for r in rows:
        st.add(r)
    cfg = st.refit()
    fit = fit_reward_model(rows, "normal", transform="gaussianize")
    assert cfg.prior == fit.prior and cfg.transform is not None
    assert cfg.transform.to_dict() == fit.transform.to_dict()  # type: ignore[union-attr]
    ss = sum(float(np.sum((np.array(r) - np.mean(r)) ** 2)) for r in rows)
    s_raw = float(np.sqrt(ss / sum(len(r) - 1 for r in rows)))
    assert pooled_within_sd(rows) == pytest.approx(s_raw, rel=1e-12)
    assert cfg.cost == pytest.approx(0.02 * fit.within_scale / s_raw, rel=1e-12)
    (h,) = st.history()
    assert h["transform"] == "gaussianize" and h["cost"] == cfg.cost
    with pytest.raises(ConfigError) as ei:
        WarmStarter(WarmStart(transform="gaussianize"), beacon.BeaconConfig(family="bernoulli"))
    assert ei.value.field == "warm_start.transform"
    with pytest.raises(ConfigError):
        WarmStarter(WarmStart(transform="gaussianize"), beacon.BeaconConfig(transform="logit"))
