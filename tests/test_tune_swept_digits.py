"""``beacon tune``: every ``c`` it prints for a swept point replays to the numbers printed for it.

A swept ``c`` was printed with 4 significant digits (``f"{c:.4g}"``) whatever its own digits,
so a sweep point just past a boundary where BEACON's choices change printed a ``c`` that, pasted
into ``beacon replay --cost`` or a config, replayed to other numbers. The setup here finds such
a boundary on a seeded log by bisection and sweeps a ``c`` next to it whose 4-digit text falls
on the other side; then the recommendation, the sweep table, the plot labels and the CLI's
re-check must all print a ``c`` that replays to the figures printed with it.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import beacon.cli.tune as cli_tune
from beacon.cli import app
from beacon.config import BeaconConfig
from beacon.evaluation import LoggedRewards, PolicyMetrics, evaluate_beacon, tune

HORIZON = 8


def _log(seed: int, prompts: int = 60) -> LoggedRewards:
    """A seeded reward log: per-prompt quality levels plus sample noise (as an LLM judge's)."""
    rng = np.random.default_rng(seed)
    levels = rng.normal(5.0, 1.5, (prompts, 1))
    rewards = levels + rng.normal(0.0, 1.0, (prompts, HORIZON))
    return LoggedRewards(tuple(f"p{i}" for i in range(prompts)), rewards)


def _cfg(cost: float = 0.1) -> BeaconConfig:
    return BeaconConfig(cost=cost, horizon=HORIZON)


def _decisions(m: PolicyMetrics) -> tuple[Any, ...]:
    """What BEACON chose at a ``c``: every printed figure and each prompt's chosen reward."""
    assert m.outcomes is not None
    return (
        m.avg_samples,
        m.mean_best_reward,
        m.mean_standardized_reward,
        m.stop_reasons,
        m.truncated,
        tuple(m.outcomes.best_reward.tolist()),
    )


def _at(data: LoggedRewards, c: float) -> tuple[Any, ...]:
    return _decisions(evaluate_beacon(data, _cfg(c)))


def _straddling_cost(data: LoggedRewards) -> float | None:
    """A ``c`` whose own choices differ from those at its 4-digit text, or None.

    Bisects in log ``c`` for a boundary where the average samples change (they are monotone in
    ``c``), down to a relative gap of 1e-9, then takes the side whose 4-digit rounding falls
    across the boundary (rounding moves ``c`` by up to 5e-4 relative).
    """
    lo, hi = 0.02, 2.0
    k_lo = evaluate_beacon(data, _cfg(lo)).avg_samples
    if evaluate_beacon(data, _cfg(hi)).avg_samples == k_lo:
        return None
    while hi / lo - 1.0 > 1e-9:
        mid = math.sqrt(lo * hi)
        if evaluate_beacon(data, _cfg(mid)).avg_samples == k_lo:
            lo = mid
        else:
            hi = mid
    for c in (hi, lo):
        if _at(data, float(f"{c:.4g}")) != _at(data, c):
            return c
    return None


@pytest.fixture(scope="module")
def straddle() -> tuple[LoggedRewards, float]:
    """A log and a ``c`` on it whose 4-digit text makes other choices (searched over seeds)."""
    for seed in range(20):
        data = _log(seed)
        c = _straddling_cost(data)
        if c is not None:
            return data, c
    raise AssertionError("no seed gave a c whose 4-digit text replays differently")


def _table_costs(res: Any) -> list[tuple[str, PolicyMetrics]]:
    """The ``c`` cells of the printed sweep table with the metrics of their rows."""
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(cli_tune.sweep_table(res))
    lines = [x for x in console.file.getvalue().splitlines() if x.startswith("│")]  # type: ignore[attr-defined]
    rows = cli_tune.sweep_rows(res)
    assert len(lines) == len(rows)
    return [(line.split("│")[1].strip(), row[1]) for line, row in zip(lines, rows, strict=True)]


def _plot_costs(res: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``c=...`` texts of the plot's point labels (the recommended knee's included)."""
    labels: list[str] = []
    real = cli_tune._point

    def spy(ax: Any, x: float, y: float, label: str, **kw: Any) -> None:
        labels.append(label)
        real(ax, x, y, label, **kw)

    monkeypatch.setattr(cli_tune, "_point", spy)
    cli_tune.plot_tune(res, tmp_path / "tune.png", "t", "s")
    texts = [m.group(1) for lab in labels if (m := re.search(r"\bc=([^,]+),", lab))]
    assert texts, labels
    return texts


def test_setup_finds_a_c_whose_four_digits_replay_differently(
    straddle: tuple[LoggedRewards, float],
) -> None:
    # the premise of the tests below: f"{c:.4g}" (the old printed text) is another policy
    data, c = straddle
    assert _at(data, float(f"{c:.4g}")) != _at(data, c)


def test_a_swept_recommendation_prints_a_c_that_replays(
    straddle: tuple[LoggedRewards, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, c = straddle
    # two costs: the knee is the cheaper end (the chord from one to the other has no gap), c
    res = tune(data, _cfg(), [c / 100.0, c])
    assert res.choice.rule == "knee" and res.choice_is_swept and res.choice.cost == c
    printed = cli_tune.choice_cost_text(res)
    assert _at(data, float(printed)) == _decisions(res.choice.metrics), printed
    # the sweep table's rows (the recommended one included) and the plot's labels
    for text, m in _table_costs(res):
        assert _at(data, float(text)) == _decisions(m), text
    for text in _plot_costs(res, tmp_path, monkeypatch):
        assert _at(data, float(text)) == _decisions(res.choice.metrics), text
    # a given c is kept exact (the JSON's c replays as it is); only the printed digits differ
    assert [p.cost for p in res.points] == [c / 100.0, c]


def test_the_default_grid_prints_the_c_it_replays(
    straddle: tuple[LoggedRewards, float], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, _ = straddle
    res = tune(data, _cfg())
    assert res.choice.rule == "knee"
    printed = cli_tune.choice_cost_text(res)
    # the printed c is the very number replayed, so it replays to the printed figures
    assert float(printed) == res.choice.cost, (printed, res.choice.cost)
    assert _at(data, float(printed)) == _decisions(res.choice.metrics)
    for text, m in _table_costs(res):
        assert float(text) == m.cost, (text, m.cost)
        assert _at(data, float(text)) == _decisions(m), text
    for text in _plot_costs(res, tmp_path, monkeypatch):
        assert float(text) == res.choice.cost, text


def test_cli_recommendation_and_table_replay_with_beacon_replay(
    straddle: tuple[LoggedRewards, float], tmp_path: Path
) -> None:
    data, c = straddle
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps({"id": pid, "rewards": row.tolist()}) + "\n"
            for pid, row in zip(data.ids, data.rewards, strict=True)
        ),
        encoding="utf-8",
    )
    runner = CliRunner()
    args = ["tune", str(log), "--prior", "default", "--points", "2"]
    out = runner.invoke(app, [*args, "--cost-min", repr(c / 100.0), "--cost-max", repr(c)])
    assert out.exit_code == 0, out.stderr
    rec = re.search(r"Recommended: .*?, c = (\S+) \(", out.stdout)
    k = re.search(r"BEACON: ([0-9.]+) samples per prompt", out.stdout)
    assert rec is not None and k is not None, out.stdout
    replay = runner.invoke(app, ["replay", str(log), "--cost", rec.group(1), "--json"])
    assert replay.exit_code == 0, replay.stderr
    got = json.loads(replay.stdout)["beacon"]
    assert f"{got['avg_samples']:.2f}" == k.group(1)
    # and at full precision: the tuned point's own figures, as the library replays them
    res = tune(data, _cfg(), [c / 100.0, c])
    assert got["avg_samples"] == res.choice.metrics.avg_samples
    assert got["mean_standardized_reward"] == res.choice.metrics.mean_standardized_reward
