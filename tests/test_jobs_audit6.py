"""Job specs take the 1-hour prompt-cache write price (``Budget.price_per_cache_write_1h_token``)
like the other prices: it round-trips, reaches the budget, enters the prompt key, and a bad one
names its sampling key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import beacon
from beacon.budget import Budget
from beacon.jobs import JobSpec, PromptRecord, iter_prompt_file, prompt_key
from beacon.jobs.execute import PromptExecutor
from tests.test_jobs_audit5 import CACHE_PRICES, _spec, _write_prompts

PRICES = {**CACHE_PRICES, "price_per_cache_write_1h_token": 4e-3}


def test_a_job_spec_takes_the_one_hour_cache_write_price(tmp_path: Path) -> None:
    base = _spec()
    spec = JobSpec(base.generator, base.scorer, base.config, {**PRICES, "max_cost": 5.0})
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    budget = PromptExecutor(spec, allowed=None)._budget(None)
    assert budget == Budget(max_cost=5.0, **PRICES)
    assert budget is not None
    # 200 of 300 writes at the 1-hour price, 100 at the 5-minute one, 100 uncached inputs
    money = budget.price(1000, 10, 600, 300, 200)
    assert money == pytest.approx(600 * 1e-4 + 200 * 4e-3 + 100 * 2.5e-3 + 100 * 1e-3 + 10 * 4e-3)
    other = JobSpec(base.generator, base.scorer, base.config,
                    {**PRICES, "price_per_cache_write_1h_token": 5e-3, "max_cost": 5.0})
    rec = next(iter_prompt_file(_write_prompts(tmp_path / "p.jsonl", 1)))
    assert isinstance(rec, PromptRecord)
    assert prompt_key(rec, spec) != prompt_key(rec, other)


def test_a_bad_one_hour_cache_price_names_its_sampling_key() -> None:
    base = _spec()
    with pytest.raises(beacon.ConfigError, match="price_per_cache_write_1h_token"):
        JobSpec(base.generator, base.scorer, base.config,
                {"price_per_cache_write_1h_token": -1.0})
