"""Sixth audit of the core, the fitting and the CLI: small defects, each with the test that
failed before its fix.

* A normal prior whose statistics overflow (beta0 near the float limit, nu0 ~ 1e28 to 1e30 with
  rewards near 1e140) left sigma_k = inf, so c / sigma_k = 0 and the Stopper (and the replay)
  sampled silently to the horizon. Now a prior that overflows at the first decision whatever the
  rewards is a ConfigError, and the reward whose update overflows is a RewardError, in the
  Stopper and the replay alike.
* A ``NaN`` literal in a JSONL log (Python's ``json`` reads it) was a missing sample.
* ``logged_from_records`` refused ``decimal.Decimal`` rewards.
* A fitted nu0 or alpha0 within 1e-3 of its small-log cap, but not bound by it, was reported
  as capped.
* ``beacon tune`` on a log of 1 or 2 prompts blamed an "Invalid value for '--prior'" that the
  user never gave.
* ``FitNoteWarning`` was not importable from ``beacon``.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_cli import run

import beacon
from beacon import BeaconConfig, ConfigError, Draw, NIGPrior, RewardError, Stopper, replay
from beacon.evaluation import LogFormatError, load_logged, logged_from_records
from beacon.families.normal import MAX_ABS_REWARD
from beacon.fitting import NU0_BOUNDS, _at_caps, fit_reward_model


# -- 1. overflow of the normal model's statistics -----------------------------------------------
@pytest.mark.parametrize(
    ("prior", "field"),
    [
        (NIGPrior(0.0, 1e28, 2.0, 1e308), "prior.beta0"),  # (nu + 1) beta0 overflows
        (NIGPrior(0.0, 1.0, 2.0, 1e308), "prior.beta0"),
        (NIGPrior(0.0, 0.0, 1.0, 1.7e308), "prior.beta0"),  # nu0 = 0: nu = 1 at the decision
        (NIGPrior(1e200, 1.0, 2.0, 1.0), "prior.mu0"),  # beyond the rewards' range
        (NIGPrior(-1.5e140, 1.0, 2.0, 1.0), "prior.mu0"),
    ],
)
def test_a_prior_that_cannot_run_in_floating_point_is_refused_by_the_config(
    prior: NIGPrior, field: str
) -> None:
    # it was accepted, and every query sampled to the horizon on sigma = inf
    with pytest.raises(ConfigError) as ei:
        BeaconConfig(prior=prior, horizon=8, cost=0.1)
    assert ei.value.field == field
    assert ei.value.value == getattr(prior, field.split(".")[1])


def test_priors_at_the_edges_of_the_range_still_work() -> None:
    for prior in (
        NIGPrior(MAX_ABS_REWARD, 1.0, 2.0, 1.0),
        NIGPrior(-MAX_ABS_REWARD, 1e-300, 2.0, 1e280),
        NIGPrior(0.0, 1e20, 2.0, 1e280),
    ):
        cfg = BeaconConfig(prior=prior, horizon=8, cost=0.1)
        s = Stopper(cfg)
        while isinstance(d := s.next_decision(), Draw):
            s.observe([1.0] * d.count)
        assert math.isfinite(s.state.sigma)


def _drive(cfg: BeaconConfig, row: np.ndarray) -> tuple[int, int, str]:
    """The Stopper over one row of logged rewards (NaN = missing): (K, chosen column, reason)."""
    cols = np.flatnonzero(~np.isnan(row))
    s = Stopper(cfg)
    pos = 0
    while isinstance(d := s.next_decision(), Draw):
        take = cols[pos : pos + d.count]
        s.observe(row[take].tolist())
        pos += take.size
        if take.size < d.count:
            return s.k, int(cols[s.best_index]), "horizon"
    return s.k, int(cols[s.best_index]), d.reason


def test_an_overflowing_update_is_a_reward_error_in_the_stopper_and_the_replay() -> None:
    # nu0 = 1e30: nu (r - mu)^2 overflows at a reward of 5e139 (the range allows 1e140)
    cfg = BeaconConfig(prior=NIGPrior(0.0, 1e30, 2.0, 1.0), horizon=16, cost=1e-3)
    row = [1.0, math.nan, 2.0, 5e139, 1.0, 1.0]
    s = Stopper(cfg)
    assert s.next_decision() == Draw(1)
    s.observe(1.0)
    assert s.next_decision() == Draw(1)
    s.observe(2.0)
    before = (s.state, s.k, s.pending)
    assert s.next_decision() == Draw(1)
    with pytest.raises(RewardError) as ei:
        s.observe(5e139)  # it was taken, sigma = inf, and the Stopper drew to the horizon
    assert ei.value.position == 2 and ei.value.value == 5e139
    assert "overflow" in str(ei.value)
    assert (s.state, s.k) == before[:2]  # the refused reward left the Stopper as it was
    # the batch path refuses it as the single-reward path does
    s2 = Stopper(cfg)
    s2.next_decision()
    s2.observe([1.0])
    s2.next_decision()
    s2.observe([2.0])
    s2.next_decision()
    with pytest.raises(RewardError):
        s2.observe(np.array([5e139]))

    x = np.array([[0.5, 0.1, 0.2, 0.3, 0.4, 0.6], row])
    with pytest.raises(RewardError) as er:
        replay(x, cfg)  # it replayed the second prompt to the end of its row
    assert er.value.position == (1, 3) and er.value.value == 5e139
    # the prompt before it was fine: its replay, alone, is the Stopper's
    alone = replay(x[:1], cfg)
    assert (int(alone.n_samples[0]), int(alone.chosen[0]), str(alone.stop_reason[0])) == (
        _drive(cfg, x[0])
    )


@pytest.mark.parametrize("robust", [True, False])
@pytest.mark.parametrize("nu0", [1e26, 1e28, 1e29, 1e30])
def test_replay_and_stopper_agree_on_where_the_statistics_overflow(
    robust: bool, nu0: float
) -> None:
    rng = np.random.default_rng(int(math.log10(nu0)) + 100 * robust)
    cfg = BeaconConfig(
        prior=NIGPrior(0.0, nu0, 2.0, 1.0), horizon=12, cost=1e-300, robust=robust
    )
    overflowed = 0
    for _ in range(12):
        row = rng.uniform(-1.0, 1.0, 12) * 10.0 ** rng.uniform(137.0, 140.0)
        row[rng.random(12) < 0.2] = math.nan
        x = row[None, :]
        try:
            res = replay(x, cfg)
        except RewardError as exc:
            overflowed += 1
            row_index, c = exc.position
            assert row_index == 0
            with pytest.raises(RewardError) as ei:
                _drive(cfg, row)
            # the Stopper counts rewards, the replay names the column of the same reward
            assert ei.value.position == int(np.sum(~np.isnan(row[:c])))
            assert ei.value.value == row[c] == exc.value
            continue
        got = (int(res.n_samples[0]), int(res.chosen[0]), str(res.stop_reason[0]))
        assert got == _drive(cfg, row)
    if nu0 >= 1e29:
        assert overflowed  # the case under test happened


# -- 2. a NaN literal in a JSONL log -------------------------------------------------------------
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_literal_in_a_jsonl_log_is_an_error_naming_the_reward(
    tmp_path: Path, literal: str
) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(
        '{"id": "a", "rewards": [0.1, 0.5, null, 0.3]}\n'
        f'{{"id": "b", "rewards": [0.2, {literal}, 0.4]}}\n',
        encoding="utf-8",
    )
    # NaN was read as a missing sample
    with pytest.raises(LogFormatError) as ei:
        load_logged(log)
    assert ei.value.line == 2 and ei.value.field == "rewards[1]"
    assert "finite" in str(ei.value) and "null" in str(ei.value)
    code, _, err = run("replay", log, "-c", "0.1")
    assert code == 1 and "log.jsonl:2" in err and "rewards[1]" in err, err


def test_null_in_a_log_and_nan_in_python_records_stay_missing(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"id": "a", "rewards": [0.1, null, 0.3]}\n', encoding="utf-8")
    assert load_logged(log).rewards.tolist() == [[0.1, 0.3]]
    data = logged_from_records([{"id": "a", "rewards": [0.1, math.nan, np.nan, 0.3]}])
    assert data.rewards.tolist() == [[0.1, 0.3]]


# -- 3. Decimal (and other real number types) in records ----------------------------------------
def test_records_take_decimal_fraction_and_numpy_rewards() -> None:
    data = logged_from_records([
        {"id": "a", "rewards": [Decimal("0.25"), Fraction(1, 2), np.float32(0.75), None, 2]},
        {"id": "b", "rewards": [Decimal(1), Decimal("-3.5")],
         "correct": [Decimal(1), Decimal(0)]},
    ])  # fmt: skip
    # Decimal was refused as "must be a number or null"
    assert data.rewards[0].tolist() == [0.25, 0.5, 0.75, 2.0]
    assert data.rewards[1, :2].tolist() == [1.0, -3.5]
    assert data.correct is not None and data.correct[1, :2].tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "bad", [Decimal("NaN"), Decimal("sNaN"), Decimal("Infinity"), Decimal("-1e400")]
)
def test_a_non_finite_decimal_reward_is_an_error_naming_it(bad: Decimal) -> None:
    with pytest.raises(LogFormatError) as ei:
        logged_from_records([{"id": "a", "rewards": [0.5, bad]}])
    assert ei.value.field == "rewards[1]" and ei.value.line == 1
    assert ei.value.value is bad and "finite" in str(ei.value)


# -- 4. small-log caps: only a fit that ends on its cap is reported capped ------------------------
def test_at_caps_reports_a_value_on_its_cap_not_one_just_below() -> None:
    cap = 20.0
    bound = NU0_BOUNDS[1]
    # 5e-4 below the cap is a free fit (it was reported capped: within 1e-3)
    assert _at_caps({"nu0": (cap * (1.0 - 5e-4), cap, bound)}) == {}
    # on the cap up to the rounding of exp(log(cap))
    assert _at_caps({"nu0": (math.exp(math.log(cap)), cap, bound)}) == {"nu0": cap}
    assert _at_caps({"nu0": (math.nextafter(cap, 0.0), cap, bound)}) == {"nu0": cap}
    # a cap at the fixed bound is not a small-log cap
    assert _at_caps({"nu0": (bound, bound, bound)}) == {}


def _log_with_moment_nu0(target: float) -> np.ndarray:
    """4 prompts of 5 rewards (20 rewards: nu0's cap is 20) whose moment estimate of nu0 is
    ``target``: Var(prompt means) = E[sigma^2] (1 / nu0 + 1 / k)."""
    k = 5
    u = np.array([-1.5, -0.5, 0.5, 1.5])
    w = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    a = math.sqrt((1.0 / target + 1.0 / k) * np.var(w, ddof=1) / np.var(u, ddof=1))
    out: np.ndarray = a * u[:, None] + w[None, :]
    return out


def test_a_fit_just_below_its_cap_is_not_reported_capped() -> None:
    cap = 20.0
    free = fit_reward_model(_log_with_moment_nu0(cap * (1.0 - 4e-4)), method="moments",
                            robust=False)
    assert abs(free.prior.nu0 - cap) / cap < 1e-3  # within the old tolerance of the cap
    assert "nu0" not in free.fitted_on.get("capped", {})  # it was: {"nu0": 20.0, ...}
    bound = fit_reward_model(_log_with_moment_nu0(1.5 * cap), method="moments", robust=False)
    assert bound.prior.nu0 == cap and bound.fitted_on["capped"]["nu0"] == cap


# -- 5. beacon tune on a log too small to fit a prior --------------------------------------------
@pytest.mark.parametrize("prompts", [1, 2])
def test_tune_on_too_few_prompts_says_what_is_wrong(tmp_path: Path, prompts: int) -> None:
    log = tmp_path / "small.jsonl"
    log.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "rewards": [0.1 * i, 0.5, 0.3, 0.9]}) + "\n"
            for i in range(prompts)
        ),
        encoding="utf-8",
    )
    code, _, err = run("tune", log)
    flat = " ".join(err.split())
    # it said "Invalid value for '--prior'", an option the user never gave
    assert code == 1, flat
    assert "Invalid value" not in flat and "'--prior'" not in flat, flat
    noun = "prompt" if prompts == 1 else "prompts"
    assert f"has {prompts} {noun}, too few to fit a prior" in flat, flat
    assert "at least 3" in flat and "--prior jeffreys" in flat, flat
    # the advice works
    code, _, err = run("tune", log, "--prior", "jeffreys", "--points", "4")
    assert code == 0, err
    # a --prior fit the user wrote is still a usage error on --prior, with the same reason
    code, _, err = run("tune", log, "--prior", "fit")
    flat = " ".join(err.split())
    assert code == 2 and "'--prior'" in flat and "too few to fit a prior" in flat, flat


# -- 6. FitNoteWarning is exported -------------------------------------------------------------
def test_fit_note_warning_is_exported_from_beacon() -> None:
    from beacon.fitting import FitNoteWarning

    assert "FitNoteWarning" in beacon.__all__
    assert beacon.FitNoteWarning is FitNoteWarning
    assert issubclass(FitNoteWarning, UserWarning)
    with pytest.warns(beacon.FitNoteWarning):
        beacon.fit_prior([[0.3, -0.4], [1.1, 0.2]])
