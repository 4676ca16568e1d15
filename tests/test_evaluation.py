"""beacon.evaluation: loading logs, per-prompt standardization, best-of-N, BEACON metrics, tuning.

Expected values are computed independently here (plain loops, or the Stopper driven by hand),
never copied from the module's own output.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import beacon
from beacon.evaluation import (
    CROSSFIT_SEED,
    CrossFit,
    FoldFit,
    LogFormatError,
    LoggedRewards,
    PolicyMetrics,
    SweepPoint,
    cap_horizon,
    choose_cost_for_max_quality_loss,
    choose_cost_for_target_samples,
    cost_grid,
    cross_fit,
    evaluate,
    evaluate_beacon,
    evaluate_fixed,
    find_knee,
    fixed_best_of_n,
    fold_assignment,
    interpolate_fixed,
    load_logged,
    logged_from_records,
    matched_difference,
    matched_fixed_per_prompt,
    quality_of,
    quality_per_prompt,
    standardize,
    sweep_costs,
    tune,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "data"
GAME24 = EXAMPLES / "tot_game24_gpt4.jsonl"
WRITING = EXAMPLES / "tot_creative_writing_gpt4.jsonl"
ALPACA = EXAMPLES / "alpacaeval_tulu2_bon11.jsonl"


def write_lines(tmp_path: Path, lines: list[str], name: str = "log.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def test_load_shipped_files_shapes_and_labels() -> None:
    g = load_logged(GAME24)
    assert (g.n_prompts, g.min_samples, g.max_samples) == (100, 64, 64)
    assert g.has_labels
    assert g.correct is not None
    np.testing.assert_array_equal(g.correct, g.rewards)  # rewards are the labels in this file
    w = load_logged(WRITING)
    assert (w.n_prompts, w.min_samples) == (100, 10)
    assert not w.has_labels and w.correct is None
    first = json.loads(WRITING.read_text().splitlines()[0])
    assert w.ids[0] == first["id"]
    np.testing.assert_array_equal(w.rewards[0], first["rewards"])


def test_missing_samples_are_dropped_and_rows_left_aligned(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path,
        [
            '{"id": "a", "rewards": [1.0, null, 3.0, 2.0], "correct": [true, false, false, null]}',
            "",
            '{"id": 7, "rewards": [5, 4]}',
        ],
    )
    d = load_logged(p)
    assert d.ids == ("a", "7")
    np.testing.assert_array_equal(d.rewards[0], [1.0, 3.0, 2.0])
    assert np.isnan(d.rewards[1, 2]) and list(d.rewards[1, :2]) == [5.0, 4.0]
    assert d.correct is not None
    np.testing.assert_array_equal(d.correct[0], [1.0, 0.0, np.nan])
    assert np.isnan(d.correct[1]).all()
    assert list(d.counts) == [3, 2] and d.min_samples == 2


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ("{not json", "line", "not valid JSON"),
        ("[1, 2]", "record", "JSON object"),
        ('{"id": "x"}', "rewards", "missing"),
        ('{"rewards": 3}', "rewards", "JSON list"),
        ('{"rewards": [1, "two"]}', "rewards[1]", "a number or null"),
        ('{"rewards": [1, true]}', "rewards[1]", "a number or null"),
        ('{"rewards": [1, Infinity]}', "rewards[1]", "finite"),
        ('{"rewards": [null, null]}', "rewards", "no logged reward"),
        ('{"rewards": [1, 2], "correct": [true]}', "correct", "one label per reward"),
        ('{"rewards": [1, 2], "correct": [true, 2]}', "correct[1]", "true, false"),
        ('{"rewards": [1], "id": [1]}', "id", "string or an integer"),
    ],
)
def test_malformed_line_names_line_field_and_reason(
    tmp_path: Path, line: str, field: str, reason: str
) -> None:
    good = '{"id": "ok", "rewards": [1.0, 2.0]}'
    p = write_lines(tmp_path, [good, good, line])
    with pytest.raises(LogFormatError) as ei:
        load_logged(p)
    err = ei.value
    assert err.line == 3 and err.field == field
    assert f"{p}:3:" in str(err) and reason in str(err)
    assert isinstance(err, beacon.ConfigError) and isinstance(err, ValueError)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="no such file"):
        load_logged(tmp_path / "nope.jsonl")
    p = write_lines(tmp_path, ["", "  "])
    with pytest.raises(LogFormatError, match="empty log"):
        load_logged(p)


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    # JSONL written by Windows tools (PowerShell, Excel's "UTF-8" export) starts with a BOM
    p = tmp_path / "bom.jsonl"
    p.write_text(WRITING.read_text(encoding="utf-8"), encoding="utf-8-sig")
    assert p.read_bytes().startswith(b"\xef\xbb\xbf")
    got, want = load_logged(p), load_logged(WRITING)
    assert got.ids == want.ids
    np.testing.assert_array_equal(got.rewards, want.rewards)


def test_logged_from_records_matches_file(tmp_path: Path) -> None:
    recs = [json.loads(x) for x in WRITING.read_text().splitlines()[:5]]
    d = logged_from_records(recs)
    f = load_logged(WRITING).subset(range(5))
    np.testing.assert_array_equal(d.rewards, f.rewards)
    assert d.ids == f.ids
    with pytest.raises(LogFormatError, match=r"<records>:2: invalid rewards"):
        logged_from_records([{"rewards": [1]}, {"rewards": "x"}])


def test_logged_from_records_takes_numpy_scalars_and_sequences() -> None:
    # Records built in Python hold numpy scalars (numbers everywhere else in BEACON) and
    # tuples or arrays; they used to be refused as "must be a number or null".
    d = logged_from_records(
        [
            {"id": "a", "rewards": [np.float32(0.5), np.int64(2), None], "correct": [
                np.bool_(True), np.int64(0), None]},
            {"id": "b", "rewards": np.array([1.0, -1.0]), "correct": (False, True)},
        ]
    )
    np.testing.assert_array_equal(d.rewards, [[0.5, 2.0], [1.0, -1.0]])
    assert d.correct is not None
    np.testing.assert_array_equal(d.correct, [[1.0, 0.0], [0.0, 1.0]])
    for bad in ([np.bool_(True)], [True], ["0.5"], [[1.0]]):
        with pytest.raises(LogFormatError, match=r"invalid rewards\[0\]=.*must be a number"):
            logged_from_records([{"rewards": bad}])
    with pytest.raises(LogFormatError, match=r"invalid correct\[0\]=.*must be true, false"):
        logged_from_records([{"rewards": [1.0], "correct": [np.float64(0.5)]}])


def test_a_file_that_is_not_utf8_names_the_line_and_the_byte(tmp_path: Path) -> None:
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"id": "a", "rewards": [1, 2]}\n{"id": "caf\xe9", "rewards": [1, 2]}\n')
    with pytest.raises(LogFormatError) as info:
        load_logged(p)
    msg = str(info.value)
    assert f"{p}:2:" in msg and "not UTF-8" in msg and "0xe9" in msg
    assert info.value.line == 2 and info.value.field == "line"


def test_an_integer_beyond_the_float_range_is_a_log_error(tmp_path: Path) -> None:
    p = write_lines(tmp_path, ['{"rewards": [1' + "0" * 400 + ", 2]}"])
    with pytest.raises(LogFormatError, match=r":1: invalid rewards\[0\]=1000.*finite"):
        load_logged(p)


def test_a_repeated_prompt_id_is_a_log_error(tmp_path: Path) -> None:
    # Two lines of one prompt would be scored twice and could land in different cross-fitting
    # folds, each fitted on the other's rewards.
    lines = ['{"id": "a", "rewards": [1, 2]}', "", '{"id": "b", "rewards": [1, 2]}']
    p = write_lines(tmp_path, [*lines, '{"id": "a", "rewards": [3, 4]}'])
    with pytest.raises(LogFormatError) as info:
        load_logged(p)
    assert f"{p}:4: invalid id='a': repeats the id of line 1" in str(info.value)
    with pytest.raises(LogFormatError, match="<records>:2: invalid id='7'"):
        logged_from_records([{"id": 7, "rewards": [1]}, {"id": "7", "rewards": [2]}])


# ---------------------------------------------------------------------------------------------
# standardization and best-of-N
# ---------------------------------------------------------------------------------------------
def test_standardize_is_per_row_population_zscore() -> None:
    r = np.array([[1.0, 2.0, 6.0, np.nan], [3.0, 3.0, 3.0, 3.0], [0.1, 0.1, 0.1, np.nan]])
    z = standardize(r)
    row = np.array([1.0, 2.0, 6.0])
    mean = sum(row) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in row) / 3)
    np.testing.assert_allclose(z[0, :3], (row - mean) / sd)
    assert np.isnan(z[0, 3])
    # Zero spread (exactly, or up to the rounding of the mean of 0.1s): zhat = 0, never inf.
    np.testing.assert_array_equal(z[1], 0.0)
    np.testing.assert_array_equal(z[2, :3], 0.0)


def test_standardize_does_not_depend_on_the_scale_of_the_rewards() -> None:
    # z-scores are scale-free: rewards on a 1e-9 scale (or a 1e-9 spread around 1.0) have the
    # same zhat as the same rewards in units, not zhat = 0 as if every reward were equal.
    r = load_logged(WRITING).rewards
    z = standardize(r)
    for scaled in (r * 1e-9, 1.0 + r * 1e-9, r * 1e9 + 5e9, r * 1e-300):
        np.testing.assert_allclose(standardize(scaled), z, atol=1e-5)  # rounding of 1 + 1e-9 r
    np.testing.assert_array_equal(standardize(np.full((1, 4), 1e-12)), 0.0)
    np.testing.assert_array_equal(standardize(np.zeros((1, 4))), 0.0)


def test_standardization_uses_all_logged_samples_even_after_truncation() -> None:
    d = load_logged(WRITING)
    t = d.truncate(4)
    np.testing.assert_allclose(t.standardized, standardize(d.rewards)[:, :4])
    assert not np.allclose(t.standardized, standardize(t.rewards))


def test_fixed_best_of_n_first_on_ties() -> None:
    r = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, 5.0]])
    idx, best = fixed_best_of_n(r, 4)
    assert list(idx) == [1, 2] and list(best) == [3.0, 5.0]
    idx1, best1 = fixed_best_of_n(r, 1)
    assert list(idx1) == [0, 0] and list(best1) == [1.0, 2.0]


def _manual_fixed(rewards: np.ndarray, labels: np.ndarray | None, n: int, c: float) -> dict:
    """Independent loop implementation of the metrics for best-of-n."""
    best, zs, acc = [], [], []
    for i, row in enumerate(rewards):
        vals = [x for x in row if not math.isnan(x)]
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((x - mean) ** 2 for x in vals) / len(vals))
        j = max(range(n), key=lambda k: (row[k], -k))
        best.append(row[j])
        zs.append(0.0 if sd == 0 else (row[j] - mean) / sd)
        if labels is not None:
            acc.append(labels[i, j])
    return {
        "best": sum(best) / len(best),
        "z": sum(zs) / len(zs),
        "value": sum(z - n * c for z in zs) / len(zs),
        "acc": None if labels is None else sum(acc) / len(acc),
    }


def test_evaluate_fixed_against_manual_loop() -> None:
    d = load_logged(ALPACA)
    c = 0.07
    fixed = evaluate_fixed(d, 11, c)
    assert [m.n for m in fixed] == list(range(1, 12))
    for m in fixed:
        ref = _manual_fixed(d.rewards, None, int(m.n or 0), c)
        assert m.avg_samples == m.n
        assert m.mean_best_reward == pytest.approx(ref["best"], rel=1e-12)
        assert m.mean_standardized_reward == pytest.approx(ref["z"], rel=1e-9)
        assert m.value == pytest.approx(ref["value"], rel=1e-9)
        assert m.accuracy is None
    # More samples never lower the best reward of a prompt.
    assert all(a.mean_best_reward <= b.mean_best_reward for a, b in itertools.pairwise(fixed))
    with pytest.raises(beacon.ConfigError, match="horizon"):
        evaluate_fixed(d, 12, c)


def test_evaluate_fixed_accuracy_uses_label_of_chosen_sample() -> None:
    d = logged_from_records(
        [
            {"rewards": [0.2, 0.9, 0.5], "correct": [True, False, True]},
            {"rewards": [0.7, 0.1, 0.8], "correct": [False, False, True]},
        ]
    )
    fixed = evaluate_fixed(d, 3, 0.1)
    assert [m.accuracy for m in fixed] == [0.5, 0.0, 0.5]


# ---------------------------------------------------------------------------------------------
# BEACON through replay, against the Stopper driven by hand
# ---------------------------------------------------------------------------------------------
def _stopper_run(row: np.ndarray, cfg: beacon.BeaconConfig) -> tuple[int, int]:
    s = beacon.Stopper(cfg)
    pos = 0
    while isinstance(d := s.next_decision(), beacon.Draw):
        s.observe([float(x) for x in row[pos : pos + d.count]])
        pos += d.count
    return s.k, s.best_index


@pytest.mark.parametrize("batch", [1, 3])
def test_evaluate_bernoulli_matches_stopper_loop(batch: int) -> None:
    d = load_logged(GAME24)
    cfg = beacon.BeaconConfig(cost=0.06, horizon=24, family="bernoulli", batch_size=batch)
    ev = evaluate(d, cfg)
    runs = [_stopper_run(row, cfg) for row in d.rewards]
    k = np.array([r[0] for r in runs], dtype=float)
    chosen = np.array([r[1] for r in runs])
    rows = np.arange(d.n_prompts)
    z = standardize(d.rewards)[rows, chosen]
    assert ev.beacon.avg_samples == pytest.approx(k.mean())
    assert ev.beacon.mean_best_reward == pytest.approx(d.rewards[rows, chosen].mean())
    assert ev.beacon.accuracy == pytest.approx(d.rewards[rows, chosen].mean())
    assert ev.beacon.value == pytest.approx(np.mean(z - k * 0.06))
    assert sum((ev.beacon.stop_reasons or {}).values()) == d.n_prompts
    assert ev.beacon.truncated == 0
    # Matched-samples baseline: linear interpolation of best-of-N in N.
    lo = math.floor(ev.beacon.avg_samples)
    frac = ev.beacon.avg_samples - lo
    ql, qh = ev.fixed[lo - 1].mean_best_reward, ev.fixed[lo].mean_best_reward
    assert ev.matched_fixed_reward == pytest.approx(ql + frac * (qh - ql))


def test_evaluate_normal_matches_stopper_loop() -> None:
    d = load_logged(WRITING)
    cfg = beacon.BeaconConfig(cost=0.3, horizon=10, family="normal")
    ev = evaluate(d, cfg)
    runs = [_stopper_run(row, cfg) for row in d.rewards]
    k = np.array([r[0] for r in runs], dtype=float)
    chosen = np.array([r[1] for r in runs])
    rows = np.arange(d.n_prompts)
    assert ev.beacon.avg_samples == pytest.approx(k.mean())
    assert ev.beacon.mean_best_reward == pytest.approx(d.rewards[rows, chosen].mean())
    assert 3 <= ev.beacon.avg_samples <= 10


def test_bernoulli_needs_labels() -> None:
    d = load_logged(WRITING)
    with pytest.raises(LogFormatError, match="correct"):
        evaluate(d, beacon.BeaconConfig(cost=0.1, horizon=5, family="bernoulli"))


def test_bernoulli_names_a_prompt_with_rewards_but_no_labels() -> None:
    # It used to fail as "invalid rewards=\"prompt 'b'\": has no logged reward".
    d = logged_from_records(
        [
            {"id": "a", "rewards": [0.1, 0.9], "correct": [False, True]},
            {"id": "b", "rewards": [0.3, 0.4], "correct": [None, None]},
        ]
    )
    with pytest.raises(LogFormatError) as info:
        d.for_family("bernoulli")
    assert info.value.field == "correct" and info.value.value == "prompt 'b'"
    assert "has rewards but no 'correct' label (1 of 2 prompts" in str(info.value)
    np.testing.assert_array_equal(d.subset([0]).for_family("bernoulli").rewards, [[0.0, 1.0]])


def test_bernoulli_error_names_a_reward_that_is_not_0_or_1() -> None:
    d = load_logged(WRITING)
    first = json.loads(WRITING.read_text().splitlines()[0])
    with pytest.raises(LogFormatError) as info:
        d.for_family("bernoulli")
    assert f"prompt {first['id']!r} has reward {float(first['rewards'][0])!r} (sample 0)" in str(
        info.value
    )


def test_binary_rewards_without_labels_are_their_own_labels() -> None:
    # the game-24 log's labels, logged as the reward and without a 'correct' field
    g = load_logged(GAME24)
    assert g.correct is not None
    as_rewards = LoggedRewards(g.ids, g.correct, None, "verdicts")
    assert as_rewards.is_binary and not load_logged(WRITING).is_binary
    cfg = beacon.BeaconConfig(cost=0.05, horizon=32, family="bernoulli")
    got = evaluate(as_rewards, cfg)
    want = evaluate(g, cfg)
    assert got.beacon.avg_samples == want.beacon.avg_samples
    assert got.beacon.accuracy == want.beacon.accuracy
    assert got.beacon.mean_best_reward == pytest.approx(want.beacon.accuracy)


def test_horizon_capped_at_samples_every_prompt_has() -> None:
    d = logged_from_records(
        [
            {"rewards": [0, 1, 0, 0, 1, 0], "correct": [0, 1, 0, 0, 1, 0]},
            {"rewards": [0, 0, 0, 0], "correct": [0, 0, 0, 0]},
        ]
    )
    cfg = beacon.BeaconConfig(cost=0.1, horizon=16, family="bernoulli")
    capped, requested = cap_horizon(d, cfg)
    assert (capped.horizon, requested) == (4, 16)
    ev = evaluate(d, cfg)
    assert ev.horizon == 4 and ev.requested_horizon == 16 and len(ev.fixed) == 4
    same, none = cap_horizon(d, cfg.replace(horizon=3))
    assert same.horizon == 3 and none is None
    # Too short for Jeffreys (k0 = 3 needs at least 4 samples).
    short = logged_from_records([{"rewards": [1.0, 2.0, 3.0]}])
    with pytest.raises(beacon.ConfigError, match="k0"):
        cap_horizon(short, beacon.BeaconConfig(cost=0.1, horizon=8))


def test_empty_or_misshapen_inputs_are_config_errors() -> None:
    # These escaped as IndexError / AxisError / ValueError from numpy and min()/max().
    d = logged_from_records([{"id": "a", "rewards": [1.0, 2.0, 3.0, 4.0]}])
    cfg = beacon.BeaconConfig(cost=0.1, horizon=4)
    with pytest.raises(beacon.ConfigError, match="no prompt"):
        d.subset([])
    with pytest.raises(beacon.ConfigError) as e1:
        standardize(np.array([1.0, 2.0]))
    assert e1.value.field == "rewards"
    with pytest.raises(beacon.ConfigError) as e2:
        interpolate_fixed([], 2.0)
    assert e2.value.field == "fixed"
    with pytest.raises(beacon.ConfigError) as e3:
        choose_cost_for_target_samples(d, cfg, [], 2.0)
    assert e3.value.field == "points"
    with pytest.raises(beacon.ConfigError) as e4:
        choose_cost_for_max_quality_loss(d, cfg, [], 0.0, 0.1)
    assert e4.value.field == "points"


def test_crossfit_runs_on_logs_too_short_for_the_default_prior() -> None:
    # Two samples per prompt: too few for Jeffreys (k0 = 3), enough for the fitted priors
    # (k0 <= 1) that a cross-fitted replay actually uses. Both used to raise on cfg's k0.
    rng = np.random.default_rng(8)
    d = LoggedRewards(tuple(str(i) for i in range(20)),
                      rng.normal(np.linspace(0, 2, 20)[:, None], 1.0, (20, 2)))
    cf = cross_fit(d, folds=4)
    cfg = beacon.BeaconConfig(cost=0.1)  # Jeffreys, horizon 32
    assert max(max(1, f.prior.k0) for f in cf.fits) + 1 <= 2 < cfg.k0 + 1
    ev = evaluate(d, cfg, cf)
    assert ev.horizon == 2 and len(ev.fixed) == 2
    capped, requested = cap_horizon(d, cfg, cf)
    assert capped.horizon == 2 and requested == cfg.horizon
    # the same as replaying each fold with its own fitted prior by hand
    from beacon.replay import replay

    used = np.zeros(d.n_prompts)
    for f in range(cf.n_folds):
        rows = np.flatnonzero(cf.folds == f)
        res = replay(d.rewards[rows], cf.fold_config(f, capped))
        used[rows] = res.n_samples
    assert ev.beacon.avg_samples == pytest.approx(float(used.mean()))
    res = tune(d, cfg, crossfit=cf, n_costs=4)
    assert res.config.horizon == 2 and 1.0 <= res.choice.metrics.avg_samples <= 2.0
    with pytest.raises(beacon.ConfigError, match="k0"):  # no crossfit: Jeffreys still refuses
        cap_horizon(d, cfg)


# ---------------------------------------------------------------------------------------------
# interpolation, knee, budgets, tune
# ---------------------------------------------------------------------------------------------
def _pm(k: float, q: float, n: int | None = None) -> PolicyMetrics:
    return PolicyMetrics("beacon" if n is None else "best-of-N", n, 0.1, k, q, q, None, q - 0.1 * k)


def test_interpolate_fixed() -> None:
    fixed = [_pm(n, math.log(n) + 1, n) for n in range(1, 6)]
    assert interpolate_fixed(fixed, 3.0) == pytest.approx(math.log(3) + 1)
    assert interpolate_fixed(fixed, 2.5) == pytest.approx((math.log(2) + math.log(3)) / 2 + 1)
    assert interpolate_fixed(fixed, 9.0) == pytest.approx(math.log(5) + 1)
    with pytest.raises(beacon.ConfigError, match="correct"):
        quality_of(fixed[0], "accuracy")


def _small_log() -> LoggedRewards:
    """9 prompts x 6 samples of seeded normal rewards; labels r > 0.5, a quarter unlabelled."""
    rng = np.random.default_rng(7)
    r = rng.normal(size=(9, 6)) * rng.uniform(0.5, 3.0, size=(9, 1)) + rng.normal(size=(9, 1))
    c = (r > 0.5).astype(np.float64)
    c[rng.random(c.shape) < 0.25] = np.nan
    return LoggedRewards(tuple(f"p{i}" for i in range(9)), r, c)


def test_matched_difference_se_against_an_independent_computation() -> None:
    """d_p and sd(d_p) / sqrt(P), recomputed with numpy from the replay's own choices."""
    from beacon.replay import replay

    d = _small_log()
    cfg = beacon.BeaconConfig(cost=0.3, horizon=6)
    ev = evaluate(d, cfg)
    md = matched_difference(ev.beacon, ev.fixed, "standardized")
    # independently: z-scores, BEACON's chosen sample, best-of-N and N+1 mixed with weight f
    r = d.rewards
    z = (r - r.mean(axis=1, keepdims=True)) / r.std(axis=1, keepdims=True)
    rep = replay(r, cfg)
    rows = np.arange(r.shape[0])
    zb = z[rows, np.asarray(rep.chosen)]
    k = float(np.mean(rep.n_samples))
    n = math.floor(k)
    f = k - n
    assert 1 <= n < 6 and 0 < f < 1  # a mixed baseline, not a single N
    z_n = z[rows, np.argmax(r[:, :n], axis=1)]
    z_n1 = z[rows, np.argmax(r[:, : n + 1], axis=1)]
    dp = zb - ((1 - f) * z_n + f * z_n1)
    assert md.n_prompts == 9 and md.per_prompt is not None
    np.testing.assert_allclose(md.per_prompt, dp, rtol=0, atol=1e-12)
    assert md.se == pytest.approx(float(np.std(dp, ddof=1)) / 3.0, rel=1e-12)
    assert md.diff == pytest.approx(float(np.mean(dp)), abs=1e-12)
    # The mean of the d_p is the aggregate difference the CLI prints, for every quality.
    for q in ("standardized", "reward", "accuracy"):
        mq = matched_difference(ev.beacon, ev.fixed, q)
        assert mq.per_prompt is not None and mq.se is not None and mq.se > 0
        agg = quality_of(ev.beacon, q) - interpolate_fixed(ev.fixed, ev.beacon.avg_samples, q)
        assert mq.diff == agg
        assert float(np.mean(mq.per_prompt)) == pytest.approx(agg, rel=1e-12, abs=1e-14)
        for m in (ev.beacon, *ev.fixed):
            assert float(np.mean(quality_per_prompt(m, q))) == pytest.approx(
                quality_of(m, q), rel=1e-12, abs=1e-14
            )
        base = matched_fixed_per_prompt(ev.fixed, ev.beacon.avg_samples, q)
        assert float(np.mean(base)) == pytest.approx(
            interpolate_fixed(ev.fixed, ev.beacon.avg_samples, q), rel=1e-12, abs=1e-14
        )


def test_accuracy_per_prompt_is_the_ratio_linearization() -> None:
    """Unlabelled chosen samples are left out of accuracy; the per-prompt values keep its mean."""
    d = _small_log()
    m = evaluate_beacon(d.truncate(6), beacon.BeaconConfig(cost=0.3, horizon=6))
    assert m.outcomes is not None and m.outcomes.correct is not None
    labels = m.outcomes.correct
    known = ~np.isnan(labels)
    assert 0 < known.sum() < labels.size  # some chosen samples are unlabelled
    acc = float(np.mean(labels[known]))
    want = acc + labels.size / known.sum() * np.where(known, labels - acc, 0.0)
    np.testing.assert_allclose(quality_per_prompt(m, "accuracy"), want, rtol=0, atol=1e-15)
    assert m.accuracy == acc


def test_matched_difference_under_crossfit_uses_each_folds_replay() -> None:
    """Per-prompt BEACON values come from each prompt's own fold's replay; mean(d_p) = diff."""
    from beacon.replay import replay

    data = load_logged(WRITING)
    cf = cross_fit(data, "normal", "gaussianize")
    cfg = beacon.BeaconConfig(cost=0.16, horizon=10)
    ev = evaluate(data, cfg, cf)
    md = matched_difference(ev.beacon, ev.fixed)
    d = data.truncate(10)
    zb = np.empty(d.n_prompts)
    for f in range(cf.n_folds):
        rows = np.flatnonzero(cf.folds == f)
        res = replay(d.rewards[rows], cf.fold_config(f, cfg))
        zb[rows] = d.standardized[rows, np.asarray(res.chosen)]
    base = matched_fixed_per_prompt(ev.fixed, ev.beacon.avg_samples)
    assert md.per_prompt is not None and md.se is not None
    np.testing.assert_allclose(md.per_prompt, zb - base, rtol=0, atol=1e-12)
    assert float(np.mean(md.per_prompt)) == pytest.approx(
        ev.beacon.mean_standardized_reward - ev.matched_fixed_standardized, rel=1e-12
    )
    assert md.se == pytest.approx(float(np.std(zb - base, ddof=1) / 10.0), rel=1e-12)


def test_matched_difference_without_outcomes_or_prompts() -> None:
    """Hand-built metrics carry no per-prompt values: the difference only, no SE."""
    fixed = [_pm(n, math.log(n) + 1, n) for n in range(1, 6)]
    md = matched_difference(_pm(2.5, 1.9), fixed)
    assert md.se is None and md.per_prompt is None and md.exceeds() == 0
    assert md.diff == pytest.approx(1.9 - interpolate_fixed(fixed, 2.5))
    with pytest.raises(beacon.ConfigError, match="per-prompt"):
        quality_per_prompt(fixed[0], "standardized")
    one = _small_log().subset([0])
    ev = evaluate(one, beacon.BeaconConfig(cost=0.3, horizon=6))
    solo = matched_difference(ev.beacon, ev.fixed)
    assert solo.n_prompts == 1 and solo.se is None  # no sd from one prompt


def test_find_knee_on_a_saturating_curve() -> None:
    # Quality rises steeply up to 4 samples and is flat after: the knee is the point at 4.
    ks = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
    qs = [0.0, 0.4, 0.7, 0.9, 0.93, 0.95, 0.97, 1.0]
    pts = [SweepPoint(1.0 / k, _pm(k, q)) for k, q in zip(ks, qs, strict=True)]
    assert pts[find_knee(pts)].metrics.avg_samples == 4.0
    flat = [SweepPoint(1.0 / k, _pm(k, 0.5)) for k in ks]
    assert find_knee(flat) == 0
    # A convex curve never rises above its chord: the cheapest point.
    convex = [SweepPoint(1.0 / k, _pm(k, k**2)) for k in ks]
    assert convex[find_knee(convex)].metrics.avg_samples == 1.0


def test_average_samples_non_increasing_in_cost() -> None:
    d = load_logged(GAME24).truncate(32)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=32, family="bernoulli")
    pts = sweep_costs(d, cfg, np.logspace(-2.5, -0.4, 12))
    ks = [p.metrics.avg_samples for p in pts]
    assert all(a >= b for a, b in itertools.pairwise(ks))
    assert ks[0] > ks[-1]


def test_target_samples_is_tight() -> None:
    d = load_logged(GAME24).truncate(32)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=32, family="bernoulli")
    pts = sweep_costs(d, cfg, np.logspace(-2.5, -0.4, 10))
    target = 9.0
    ch = choose_cost_for_target_samples(d, cfg, pts, target)
    assert ch.rule == "target-samples" and ch.metrics.avg_samples <= target
    below = evaluate_beacon(d, cfg.replace(cost=ch.cost / 1.01))
    assert below.avg_samples > target
    with pytest.raises(beacon.ConfigError, match="target_samples"):
        choose_cost_for_target_samples(d, cfg, pts, 0.5)
    loose = choose_cost_for_target_samples(d, cfg, pts, 1000.0)
    assert "not binding" in loose.note


def test_max_quality_loss() -> None:
    d = load_logged(GAME24).truncate(32)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=32, family="bernoulli")
    pts = sweep_costs(d, cfg, np.logspace(-2.5, -0.4, 10))
    ref = evaluate_fixed(d, 32, 0.1)[-1].mean_best_reward
    ch = choose_cost_for_max_quality_loss(d, cfg, pts, ref, 0.1, "reward")
    assert ch.metrics.mean_best_reward >= ref - 0.1
    bigger = [p for p in pts if p.cost > ch.cost]
    assert bigger and bigger[0].metrics.mean_best_reward < ref - 0.1
    with pytest.raises(beacon.ConfigError, match="max_quality_loss"):
        choose_cost_for_max_quality_loss(d, cfg, pts, ref + 1.0, 0.0, "reward")


def test_tune_bernoulli_end_to_end() -> None:
    d = load_logged(GAME24)
    res = tune(d, beacon.BeaconConfig(cost=0.1, horizon=32, family="bernoulli"))
    assert res.quality == "reward" and res.config.horizon == 32
    assert res.choice.rule == "knee" and res.choice.cost == res.points[res.knee].cost
    ks = [p.metrics.avg_samples for p in res.points]
    assert max(ks) > 15 and min(ks) < 3  # the refined grid spans the policies that differ
    out = res.to_dict()
    json.dumps(out)
    assert out["recommended"]["rule"] == "knee"
    res2 = tune(d, beacon.BeaconConfig(cost=0.1, horizon=32, family="bernoulli"), target_samples=6)
    assert res2.choice.metrics.avg_samples <= 6
    with pytest.raises(beacon.ConfigError, match="not both"):
        tune(
            d,
            beacon.BeaconConfig(family="bernoulli", horizon=8),
            target_samples=3,
            max_quality_loss=0.1,
        )


def test_tune_n_costs_sets_the_size_of_both_sweep_passes() -> None:
    # The default sweep: a coarse pass, then the reported pass over where E[K] changes.
    d, cfg = load_logged(WRITING), beacon.BeaconConfig(cost=0.1, horizon=10)
    assert len(tune(d, cfg).points) == 25
    calls: list[tuple[int, int]] = []
    res = tune(d, cfg, n_costs=6, progress=lambda done, total: calls.append((done, total)))
    assert len(res.points) == 6 and calls[-1] == (12, 12)


def test_subset_keeps_alignment() -> None:
    d = load_logged(GAME24)
    s = d.subset(np.arange(d.n_prompts) % 2 == 0)
    assert s.n_prompts == 50 and s.ids == d.ids[::2]
    np.testing.assert_array_equal(s.rewards, d.rewards[::2])
    np.testing.assert_array_equal(s.standardized, d.standardized[::2])
    assert isinstance(s, LoggedRewards)


def test_permuted_shuffles_within_prompts_only() -> None:
    d = logged_from_records(
        [
            {"rewards": [1.0, 2.0, 3.0, 4.0, 5.0], "correct": [1, 0, 0, 0, 1]},
            {"rewards": [10.0, 20.0, None], "correct": [0, 1, 1]},
        ]
    )
    p = d.permuted(3)
    q = d.permuted(3)
    np.testing.assert_array_equal(p.rewards, q.rewards)  # seeded
    assert sorted(p.rewards[0]) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert sorted(p.rewards[1, :2]) == [10.0, 20.0] and np.isnan(p.rewards[1, 2:]).all()
    assert p.correct is not None and d.correct is not None
    # labels travel with their rewards, and so do the z-scores
    lab = {r: c for r, c in zip(d.rewards[0], d.correct[0], strict=True)}
    assert all(lab[r] == c for r, c in zip(p.rewards[0], p.correct[0], strict=True))
    z = {r: v for r, v in zip(d.rewards[0], d.standardized[0], strict=True)}
    assert all(z[r] == v for r, v in zip(p.rewards[0], p.standardized[0], strict=True))
    big = load_logged(GAME24).permuted(0)
    assert not np.array_equal(big.rewards, load_logged(GAME24).rewards)


def test_direct_construction_left_aligns_and_rejects_empty_rows() -> None:
    r = np.array([[np.nan, 2.0, np.nan, 4.0], [1.0, 3.0, np.nan, np.nan]])
    c = np.array([[np.nan, 1.0, np.nan, 0.0], [0.0, 1.0, np.nan, np.nan]])
    d = LoggedRewards(("a", "b"), r, c)
    np.testing.assert_array_equal(d.rewards[0, :2], [2.0, 4.0])
    assert d.correct is not None
    np.testing.assert_array_equal(d.correct[0, :2], [1.0, 0.0])
    assert list(d.counts) == [2, 2]
    with pytest.raises(beacon.ConfigError, match="'b'"):
        LoggedRewards(("a", "b"), np.array([[1.0, 2.0], [np.nan, np.nan]]))


# ---------------------------------------------------------------------------------------------
# cross-fitted priors
# ---------------------------------------------------------------------------------------------
def test_fold_assignment_is_balanced_seeded_and_validated() -> None:
    f = fold_assignment(23, 5)
    assert sorted(np.bincount(f).tolist()) == [4, 4, 5, 5, 5]
    np.testing.assert_array_equal(f, fold_assignment(23, 5))  # fixed seed
    assert not np.array_equal(f, fold_assignment(23, 5, seed=CROSSFIT_SEED + 1))
    for bad in (1, 0, 24, True):
        with pytest.raises(beacon.ConfigError) as ei:
            fold_assignment(23, bad)  # type: ignore[arg-type]
        assert ei.value.field == "folds"


def _tagged_log(n_prompts: int = 30, n: int = 8, seed: int = 0) -> LoggedRewards:
    """Every reward identifies its prompt: prompt i's rewards lie in (100 i, 100 i + 10)."""
    rng = np.random.default_rng(seed)
    r = 100.0 * np.arange(n_prompts)[:, None] + rng.uniform(0.0, 10.0, (n_prompts, n))
    return LoggedRewards(tuple(str(i) for i in range(n_prompts)), r)


def test_cross_fit_never_shows_a_prompt_its_own_rewards() -> None:
    data = _tagged_log()
    seen: list[set[int]] = []

    def spy(train, family, transform):  # type: ignore[no-untyped-def]
        from beacon.fitting import fit_reward_model

        seen.append({int(v // 100) for v in train[~np.isnan(train)]})
        return fit_reward_model(train, family, transform=transform)

    cf = cross_fit(data, "normal", "gaussianize", folds=4, fitter=spy)
    assert len(seen) == cf.n_folds == 4
    for f, prompts in enumerate(seen):
        held_out = set(np.flatnonzero(cf.folds == f).tolist())
        assert held_out and not (prompts & held_out)
        assert prompts == set(range(data.n_prompts)) - held_out  # all the others, no one else
        np.testing.assert_array_equal(cf.fits[f].train_rows, np.flatnonzero(cf.folds != f))


def test_a_folds_prior_does_not_depend_on_its_own_prompts() -> None:
    """Rewriting the rewards of fold 0's prompts changes every fit except fold 0's."""
    data = _tagged_log()
    folds = fold_assignment(data.n_prompts, 3)
    poisoned = data.rewards.copy()
    rows = folds == 0
    poisoned[rows] = 5.0 * poisoned[rows] + np.arange(poisoned.shape[1])[None, :] ** 2
    a = cross_fit(data, "normal", "none", folds=3)
    b = cross_fit(LoggedRewards(data.ids, poisoned), "normal", "none", folds=3)
    assert a.fits[0].prior == b.fits[0].prior
    assert a.fits[0].within_scale == b.fits[0].within_scale
    for f in (1, 2):
        assert a.fits[f].prior != b.fits[f].prior


def test_crossfit_evaluation_replays_each_fold_with_its_own_fit() -> None:
    from beacon.fitting import fit_reward_model
    from beacon.replay import replay

    data = load_logged(WRITING)
    cf = cross_fit(data, "normal", "gaussianize", folds=5)
    c = 0.15
    ev = evaluate(data, beacon.BeaconConfig(cost=c, horizon=10), cf)
    k = np.zeros(data.n_prompts)
    zbest = np.zeros(data.n_prompts)
    z = standardize(data.rewards)
    for f in range(5):
        test = np.flatnonzero(cf.folds == f)
        fit = fit_reward_model(data.rewards[cf.folds != f], transform="gaussianize")
        res = replay(data.rewards[test], fit.config(cost=c * fit.within_scale, horizon=10))
        k[test] = res.n_samples
        zbest[test] = z[test, res.chosen]
    assert ev.beacon.avg_samples == pytest.approx(k.mean())
    assert ev.beacon.mean_standardized_reward == pytest.approx(zbest.mean())
    # c is in per-prompt standardized units: the value charges it as given.
    assert ev.beacon.cost == c
    assert ev.beacon.value == pytest.approx(float(np.mean(zbest - c * k)))


def test_fold_config_converts_cost_with_the_fitted_scale() -> None:
    data = load_logged(WRITING)
    cf = cross_fit(data, "normal", "none", folds=2)
    cfg = cf.fold_config(1, beacon.BeaconConfig(cost=0.2, horizon=10))
    assert cfg.cost == pytest.approx(0.2 * cf.fits[1].within_scale)
    assert cfg.prior == cf.fits[1].prior and cfg.k0 == 1
    p = cf.fits[1].prior
    assert isinstance(p, beacon.NIGPrior)
    assert cf.fits[1].within_scale == pytest.approx(math.sqrt(p.beta0 / p.alpha0))


def test_cross_fit_bernoulli_fits_on_labels_and_tunes() -> None:
    data = load_logged(GAME24)
    got: list[set[float]] = []

    def spy(train, family, transform):  # type: ignore[no-untyped-def]
        from beacon.fitting import fit_reward_model

        got.append(set(np.unique(train[~np.isnan(train)]).tolist()))
        assert family == "bernoulli" and transform is None
        return fit_reward_model(train, family)

    cf = cross_fit(data, "bernoulli", "none", folds=3, fitter=spy)
    assert all(g <= {0.0, 1.0} for g in got)
    assert all(isinstance(f.prior, beacon.BetaPrior) and f.within_scale == 1.0 for f in cf.fits)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=16, family="bernoulli")
    res = tune(data, cfg, [0.01, 0.05, 0.2], crossfit=cf)
    assert res.crossfit is cf and len(res.points) == 3
    ks = [p.metrics.avg_samples for p in res.points]
    assert ks == sorted(ks, reverse=True)


def test_cross_fit_errors_name_the_field() -> None:
    data = load_logged(WRITING)
    with pytest.raises(beacon.ConfigError) as ei:
        cross_fit(data, "normal", "cube")
    assert ei.value.field == "transform" and ei.value.value == "cube"
    with pytest.raises(beacon.ConfigError) as ei:
        cross_fit(load_logged(GAME24), "bernoulli", "gaussianize")
    assert ei.value.field == "transform"
    with pytest.raises(beacon.ConfigError) as ei:
        cross_fit(data, "normal", "none", folds=1)
    assert ei.value.field == "folds"
    cf = cross_fit(data, "normal", "none", folds=2)
    with pytest.raises(beacon.ConfigError) as ei:
        evaluate(data.subset(range(50)), beacon.BeaconConfig(cost=0.1, horizon=10), cf)
    assert ei.value.field == "crossfit"
    with pytest.raises(beacon.ConfigError) as ei:
        evaluate(
            load_logged(GAME24),
            beacon.BeaconConfig(cost=0.1, horizon=10, family="bernoulli"),
            cf,
        )
    assert ei.value.field == "family"


def test_cost_grid_is_in_standardized_units_under_crossfit() -> None:
    data = load_logged(WRITING)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=10)
    cf = CrossFit(
        "normal",
        "none",
        fold_assignment(data.n_prompts, 2),
        (
            FoldFit(beacon.NIGPrior(0.0, 1.0, 2.0, 50.0), None, 5.0, np.arange(50)),
            FoldFit(beacon.NIGPrior(0.0, 1.0, 2.0, 50.0), None, 5.0, np.arange(50, 100)),
        ),
    )
    grid = cost_grid(data, cfg, 5, crossfit=cf)
    np.testing.assert_allclose(grid, np.logspace(-3, 1, 5))
    raw = cost_grid(data, cfg, 5)
    sd = np.median(np.nanstd(data.rewards, axis=1))
    np.testing.assert_allclose(raw, sd * np.logspace(-3, 1, 5))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_cost_grid_ignores_prompts_whose_spread_overflows() -> None:
    # |r| ~ 1e300 overflows the squares of nanstd: that prompt's sd is left out of the median
    # (the replay rejects such rewards by name), with no numpy warning on the way.
    data = LoggedRewards(("a", "b", "c"), np.array([[0.0, 1e300, 2e300], [0.0, 1.0, 2.0],
                                                     [0.0, 2.0, 4.0]]))
    grid = cost_grid(data, beacon.BeaconConfig(cost=0.1, horizon=4), 3)
    sd = np.median([np.std([0.0, 1.0, 2.0]), np.std([0.0, 2.0, 4.0])])
    np.testing.assert_allclose(grid, sd * np.logspace(-3, 1, 3))


def test_cost_grid_leaves_out_rows_flat_up_to_rounding_so_a_shift_keeps_it() -> None:
    # A prompt whose rewards differ by one ulp (a judge's 0.1 and 0.1 + 1 ulp) is flat, as in
    # `standardize`; counting its ~1e-17 spread moved the median, and shifting every reward by
    # +50 (which rounds that ulp away) changed the grid.
    a = 0.1
    rows = np.array([[a, np.nextafter(a, 1.0), a, a], [0.0, 1.0, 2.0, 1.0],
                     [0.0, 2.0, 4.0, 2.0], [0.0, 3.0, 6.0, 3.0]])
    data = LoggedRewards(("f", "b", "c", "d"), rows)
    shifted = LoggedRewards(("f", "b", "c", "d"), rows + 50.0)
    cfg = beacon.BeaconConfig(cost=0.1, horizon=4)
    sd = np.std([0.0, 2.0, 4.0, 2.0])
    np.testing.assert_allclose(cost_grid(data, cfg, 3), sd * np.logspace(-3, 1, 3))
    np.testing.assert_allclose(cost_grid(shifted, cfg, 3), cost_grid(data, cfg, 3), rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# errors name a sample by its place in the log, a prompt by its record
# ---------------------------------------------------------------------------------------------
def test_a_reward_error_names_the_logged_sample_after_a_missing_one() -> None:
    # rewards[1] is null: the bad reward 1.7 is rewards[2] in the log, not "sample 1" of the
    # left-aligned row (the user looks it up in the file).
    d = logged_from_records(
        [
            {"id": "a", "rewards": [0.2, 0.3, 0.4, 0.5]},
            {"id": "b", "rewards": [0.2, None, 1.7, 0.5, 0.6]},
        ]
    )
    with pytest.raises(beacon.RewardError) as info:
        evaluate(d, beacon.BeaconConfig(cost=0.1, horizon=4, family="judge"))
    assert "prompt 'b' (record 2), sample 2: 1.7" in str(info.value), str(info.value)


def test_a_reward_error_names_the_record_in_the_log_after_a_subset() -> None:
    # --min-samples leaves out record 2; the bad prompt is still record 3 of the log
    d = logged_from_records(
        [
            {"id": "a", "rewards": [0.2, 0.3, 0.4, 0.5]},
            {"id": "b", "rewards": [0.1]},
            {"id": "c", "rewards": [0.2, 1.7, 0.5, 0.6]},
        ]
    )
    kept = d.subset([0, 2])
    with pytest.raises(beacon.RewardError) as info:
        evaluate(kept, beacon.BeaconConfig(cost=0.1, horizon=4, family="judge"))
    assert "prompt 'c' (record 3), sample 1: 1.7" in str(info.value), str(info.value)
    # the same through a permutation of the samples: 1.7 is still rewards[1] of record 3
    with pytest.raises(beacon.RewardError) as info:
        evaluate(kept.permuted(0), beacon.BeaconConfig(cost=0.1, horizon=4, family="judge"))
    assert "prompt 'c' (record 3), sample 1: 1.7" in str(info.value), str(info.value)


def test_bernoulli_error_names_the_logged_sample_after_a_missing_one() -> None:
    d = logged_from_records([{"id": "a", "rewards": [0.0, None, 1.0, 3.0]}])
    with pytest.raises(LogFormatError) as info:
        d.for_family("bernoulli")
    assert "prompt 'a' has reward 3.0 (sample 3)" in str(info.value), str(info.value)


def test_errors_on_bernoulli_labels_name_the_logged_sample() -> None:
    # labels replayed as rewards: an unlabelled sample is dropped like a missing reward, and a
    # later error still names the sample as the log numbers it
    d = logged_from_records(
        [
            {"id": "a", "rewards": [1.0, 2.0, 3.0, 4.0], "correct": [True, None, False, True]},
            {"id": "b", "rewards": [1.0, 2.0, 3.0, 4.0], "correct": [True, False, True, False]},
        ]
    )
    fam = d.subset([1, 0]).for_family("bernoulli")
    assert fam.ids == ("b", "a")
    assert [fam.sample_position(1, j) for j in range(3)] == [0, 2, 3]
    assert fam.record(1) == 1 and fam.record(0) == 2


def test_accuracy_on_a_log_labelling_only_unchosen_samples_says_so() -> None:
    # It said "the log has no 'correct' labels" of a log that has them (on the last sample of
    # each prompt only, which best-of-1 never chooses).
    rng = np.random.default_rng(3)
    records = [
        {
            "id": f"q{i}",
            "rewards": [float(x) for x in rng.normal(size=6)],
            "correct": [None] * 5 + [bool(i % 2)],
        }
        for i in range(10)
    ]
    d = logged_from_records(records)
    assert d.has_labels
    with pytest.raises(beacon.ConfigError) as info:
        tune(d, beacon.BeaconConfig(cost=0.1, horizon=6), [0.01, 0.1, 1.0], quality="accuracy")
    msg = str(info.value)
    assert "has no 'correct' labels" not in msg and "chose is labelled" in msg, msg
    assert info.value.field == "quality"


def test_direct_construction_with_a_gap_names_the_sample_by_its_column() -> None:
    # a NaN given in the middle of a row is moved to its end; errors still name the column given
    d = LoggedRewards(
        ("a", "b"),
        np.array([[0.2, 0.3, 0.4, 0.5, 0.6], [0.2, np.nan, 1.7, 0.5, 0.6]]),
    )
    with pytest.raises(beacon.RewardError) as info:
        evaluate(d, beacon.BeaconConfig(cost=0.1, horizon=4, family="judge"))
    assert "prompt 'b' (record 2), sample 2: 1.7" in str(info.value), str(info.value)


def test_cross_fit_reward_errors_name_the_prompt_not_a_training_row() -> None:
    # It said "invalid reward at position (3, 2)": a row of the fold's training prompts.
    rng = np.random.default_rng(5)
    rows = rng.uniform(0.05, 0.95, size=(12, 5))
    rows[7, 2] = 1.5  # outside the logit transform's [0, 1]
    d = LoggedRewards(tuple(f"q{i}" for i in range(12)), rows)
    with pytest.raises(beacon.RewardError) as info:
        cross_fit(d, "normal", "logit", folds=3)
    msg = str(info.value)
    assert "prompt 'q7' (record 8), sample 2: 1.5" in msg and "position" not in msg, msg
