"""Review findings: a cross-fit on a log whose ids are a numpy array or another sequence type
(evaluate / tune compared them with ==), and BOMs of several concatenated exports at the start
of one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import beacon
from beacon.evaluation import LoggedRewards, cross_fit, evaluate, tune
from beacon.jobs import FactorySpec, JobSpec, run_job


def _rewards(n: int = 12, k: int = 6) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.normal(rng.normal(0, 1, (n, 1)), rng.uniform(0.3, 1.5, (n, 1)), (n, k))


@pytest.mark.parametrize("ids", [
    np.array([f"p{i}" for i in range(12)]),
    np.arange(12),
    [f"p{i}" for i in range(12)],
])
def test_a_cross_fit_of_the_same_prompts_is_accepted_whatever_the_ids_sequence(ids: object) -> None:
    data = LoggedRewards(ids, _rewards())  # type: ignore[arg-type]
    cf = cross_fit(data, "normal", "none", 3)
    cfg = beacon.BeaconConfig(cost=0.2, horizon=6)
    ev = evaluate(data, cfg, cf)
    assert ev.beacon.avg_samples > 0
    assert tune(data, cfg, costs=[0.1, 0.3], crossfit=cf).choice.cost > 0
    # the same prompts under another container type are still the same prompts
    again = LoggedRewards(tuple(data.ids), data.rewards)
    assert evaluate(again, cfg, cf).beacon.avg_samples == ev.beacon.avg_samples


def test_a_cross_fit_of_other_prompts_is_still_refused() -> None:
    data = LoggedRewards(np.arange(12), _rewards())  # type: ignore[arg-type]
    cf = cross_fit(data, "normal", "none", 3)
    shuffled = LoggedRewards(np.arange(12)[::-1], _rewards()[::-1])  # type: ignore[arg-type]
    with pytest.raises(beacon.ConfigError, match="crossfit"):
        evaluate(shuffled, beacon.BeaconConfig(cost=0.2, horizon=6), cf)


def test_two_boms_at_the_start_of_a_line_are_dropped(tmp_path: Path) -> None:
    # cat a.jsonl empty.jsonl c.jsonl, the empty export being a BOM alone (no newline)
    prompts = tmp_path / "p.jsonl"
    bom = "\ufeff".encode()
    prompts.write_bytes(
        b'{"id": "a", "prompt": "x"}\n' + bom + bom + b'{"id": "c", "prompt": "y"}\n'
    )
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=8))
    summary = run_job(prompts, spec, tmp_path / "out.jsonl")
    assert summary.exit_code == 0 and summary.progress.done == 2
