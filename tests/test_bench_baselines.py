"""Peer stopping rules of bench/baselines.py against straightforward per-prompt loops."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate

from beacon.errors import ConfigError, RewardError

# bench/ is a top-level folder of the repository, not part of the installed distribution.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import baselines as bl


def _random_log(seed: int, rows: int = 60, cols: int = 12, nan_frac: float = 0.15) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Few distinct values so ties between rewards are common.
    r = rng.integers(0, 6, size=(rows, cols)).astype(np.float64) / 5.0
    r[rng.random(r.shape) < nan_frac] = np.nan
    r[0] = np.nan  # an empty log
    return r


def _logged(row: np.ndarray) -> list[tuple[int, float]]:
    return [(j, float(v)) for j, v in enumerate(row) if not math.isnan(v)]


def _naive_best(items: list[tuple[int, float]]) -> int:
    best_j, best_v = -1, -math.inf
    for j, v in items:
        if v > best_v:  # a later equal reward does not replace the best
            best_j, best_v = j, v
    return best_j


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 3, 7, 12, 20])
def test_best_of_n_matches_loop(seed: int, n: int) -> None:
    r = _random_log(seed)
    res = bl.best_of_n(r, n)
    for i, row in enumerate(r):
        items = _logged(row)[:n]
        assert res.n_samples[i] == len(items)
        assert res.chosen[i] == _naive_best(items)
        assert res.truncated[i] == (len(_logged(row)) < n)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("thr", [0.0, 0.5, 0.8, 1.0, 2.0])
@pytest.mark.parametrize("horizon", [1, 5, 12])
def test_threshold_stop_is_dspy_best_of_n(seed: int, thr: float, horizon: int) -> None:
    r = _random_log(seed)
    res = bl.threshold_stop(r, thr, horizon)
    for i, row in enumerate(r):
        # dspy.BestOfN: keep the best so far, break at the first reward >= threshold.
        best_j, best_v, used = -1, -math.inf, 0
        for j, v in _logged(row)[:horizon]:
            used += 1
            if v > best_v:
                best_j, best_v = j, v
            if v >= thr:
                break
        assert res.n_samples[i] == used
        assert res.chosen[i] == best_j
        hit = any(v >= thr for _, v in _logged(row)[:horizon])
        assert res.truncated[i] == (not hit and len(_logged(row)) < horizon)


def test_threshold_per_row_and_first_hit() -> None:
    r = np.array([[0.1, 0.9, 0.95, 0.2], [0.1, 0.9, 0.95, 0.2]])
    res = bl.threshold_stop(r, np.array([0.5, 0.92]), 4)
    assert res.n_samples.tolist() == [2, 3]
    assert res.chosen.tolist() == [1, 2]


def test_prefix_best_skips_nan_and_keeps_first_tie() -> None:
    r = np.array([[np.nan, 0.5, 0.5, 0.7], [0.3, np.nan, np.nan, 0.3]])
    assert bl.prefix_best(r, [2, 2]).tolist() == [1, 0]
    assert bl.prefix_best(r, [3, 0]).tolist() == [3, -1]


def _naive_majority(seen: list[int]) -> int:
    votes = [a for a in seen if a >= 0]
    if not votes:
        return -1
    return Counter(votes).most_common(1)[0][0]  # insertion order breaks ties: first seen


def _answers(seed: int, rows: int = 80, cols: int = 24) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.empty((rows, cols), dtype=np.int64)
    for i in range(rows):
        k = rng.integers(1, 5)
        p = rng.dirichlet(np.full(k, 0.5))
        a[i] = rng.choice(k, size=cols, p=p)
    a[rng.random(a.shape) < 0.1] = -1
    return a


@pytest.mark.parametrize("n", [1, 2, 5, 24, 40])
def test_majority_vote_matches_counter(n: int) -> None:
    a = _answers(0)
    res = bl.majority_vote(a, n)
    for i, row in enumerate(a):
        assert res.n_samples[i] == min(n, a.shape[1])
        assert res.answer[i] == _naive_majority(row[:n].tolist())


def test_majority_tie_goes_to_first_seen() -> None:
    a = np.array([[2, 1, 1, 2, 0, 0], [-1, -1, -1, -1, -1, -1]])
    assert bl.majority_vote(a, 6).answer.tolist() == [2, -1]


def _beta_mass_above_half(v1: int, v2: int) -> float:
    # The Adaptive-Consistency reference computes this ratio of integrals with quad.
    num = integrate.quad(lambda x: x**v1 * (1 - x) ** v2, 0.5, 1)[0]
    den = integrate.quad(lambda x: x**v1 * (1 - x) ** v2, 0, 1)[0]
    return num / den


@pytest.mark.parametrize("conf", [0.8, 0.95])
@pytest.mark.parametrize("seed", [0, 1])
def test_adaptive_consistency_matches_reference_loop(conf: float, seed: int) -> None:
    a = _answers(seed)
    horizon = 20
    res = bl.adaptive_consistency_beta(a, horizon, conf)
    for i, row in enumerate(a):
        k_ref, ans_ref = horizon, _naive_majority(row[:horizon].tolist())
        for k in range(1, horizon + 1):
            votes = Counter(x for x in row[:k].tolist() if x >= 0).most_common(2)
            if not votes:
                continue
            v1 = votes[0][1]
            v2 = votes[1][1] if len(votes) > 1 else 0
            if _beta_mass_above_half(v1, v2) >= conf:
                k_ref, ans_ref = k, _naive_majority(row[:k].tolist())
                break
        assert res.n_samples[i] == k_ref, i
        assert res.answer[i] == ans_ref, i


def test_adaptive_consistency_unanimous_stop_points() -> None:
    # With v2 = 0 the criterion is 1 - 2^-(v1+1) >= conf: 4 votes for 0.95, 2 for 0.8.
    a = np.zeros((1, 10), dtype=np.int64)
    assert bl.adaptive_consistency_beta(a, 10, 0.95).n_samples.tolist() == [4]
    assert bl.adaptive_consistency_beta(a, 10, 0.8).n_samples.tolist() == [2]


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_esc_matches_reference_loop(window: int) -> None:
    a = _answers(2)
    horizon = 22
    res = bl.esc_window(a, horizon, window)
    for i, row in enumerate(a):
        k_ref = horizon
        for end in range(window, horizon + 1, window):
            win = row[end - window : end].tolist()
            if win[0] >= 0 and all(x == win[0] for x in win):
                k_ref = end
                break
        assert res.n_samples[i] == k_ref
        assert res.answer[i] == _naive_majority(row[:k_ref].tolist())


def test_factorize_answers() -> None:
    a = bl.factorize_answers([["24", None, "12", "24"], [3.0, 3.0, "x", None]])
    assert a.tolist() == [[0, -1, 1, 0], [0, 0, 1, -1]]
    with pytest.raises(ConfigError) as e:
        bl.factorize_answers([["a"], ["a", "b"]])
    assert e.value.field == "answers"


def test_bad_inputs_name_the_field() -> None:
    r = np.zeros((2, 3))
    with pytest.raises(ConfigError) as e:
        bl.best_of_n(r, 0)
    assert e.value.field == "n"
    with pytest.raises(ConfigError) as e:
        bl.best_of_n(np.zeros(3), 1)
    assert e.value.field == "rewards"
    with pytest.raises(RewardError) as re:
        bl.best_of_n(np.array([[0.0, np.inf]]), 1)
    assert re.value.position == (0, 1)
    with pytest.raises(ConfigError) as e:
        bl.threshold_stop(r, np.nan, 3)
    assert e.value.field == "threshold"
    with pytest.raises(ConfigError) as e:
        bl.adaptive_consistency_beta(np.zeros((2, 3), dtype=np.int64), 3, 1.5)
    assert e.value.field == "confidence"
    with pytest.raises(ConfigError) as e:
        bl.esc_window(np.zeros((2, 3), dtype=np.int64), 3, 0)
    assert e.value.field == "window"
    with pytest.raises(ConfigError) as e:
        bl.majority_vote(np.zeros((2, 3)), 2)
    assert e.value.field == "answers"
    with pytest.raises(ConfigError) as e:
        bl.majority_vote(np.full((2, 3), -3), 2)
    assert e.value.field == "answers"
