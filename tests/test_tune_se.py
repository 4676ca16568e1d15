"""``beacon tune``: a paired standard error for every swept ``c``, not only the recommended one.

The sweep table, the plot and ``--json`` carry, for each ``c``, BEACON minus best-of-N at the
same average samples and its paired SE over prompts (:func:`beacon.evaluation.matched_difference`,
the verdict's computation); the recommended row's figures are the verdict's own.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from beacon.cli import app
from beacon.cli.common import fmt, reward_scale
from beacon.cli.tune import (
    _pm_se,
    matched_range,
    plot_tune,
    range_lines,
    se_band,
    sweep_rows,
    sweep_table,
    variant_label,
    variants_table,
    verdict,
)
from beacon.config import BeaconConfig
from beacon.evaluation import (
    LoggedRewards,
    TuneResult,
    cross_fit,
    matched_difference,
    quality_of,
    tune,
)

COSTS = np.logspace(-2.5, 0.5, 9)


def _data(
    prompts: int = 40, samples: int = 8, scale: float = 1.0, seed: int = 0, level: float = 0.0
) -> LoggedRewards:
    rng = np.random.default_rng(seed)
    means = rng.normal(level, 1.0, (prompts, 1))
    rewards = scale * (means + rng.normal(0.0, 0.7, (prompts, samples)))
    return LoggedRewards(tuple(f"p{i}" for i in range(prompts)), rewards)


def _tune(data: LoggedRewards, **kw: Any) -> TuneResult:
    return tune(
        data, BeaconConfig(cost=0.1, horizon=data.min_samples), COSTS * kw.pop("s", 1.0), **kw
    )


def _render(res: TuneResult, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(sweep_table(res))
    return console.export_text().splitlines()


def _log(path: Path, data: LoggedRewards) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for rid, row in zip(data.ids, data.rewards, strict=True):
            fh.write(json.dumps({"id": rid, "rewards": [float(x) for x in row]}) + "\n")
    return path


def test_every_swept_c_has_its_paired_difference_and_se() -> None:
    res = _tune(_data())
    got = res.sweep_matched()
    assert len(got) == len(res.points)
    for p, md in zip(res.points, got, strict=True):
        ref = matched_difference(p.metrics, res.fixed, res.quality)
        assert md.diff == ref.diff and md.se == ref.se and md.n_prompts == res.n_prompts
        assert md.per_prompt is not None and md.se is not None
        assert md.se == pytest.approx(np.std(md.per_prompt, ddof=1) / np.sqrt(res.n_prompts))


@pytest.mark.parametrize(
    ("budget", "marks"),
    [
        ({}, ("<- knee",)),
        ({"target_samples": 4.5}, ("<- budget", "<- both")),
        ({"max_quality_loss": 0.2}, ("<- budget", "<- both")),
    ],
)
def test_recommended_row_is_the_verdicts_figures(
    budget: dict[str, float], marks: tuple[str, ...]
) -> None:
    res = _tune(_data(), **budget)
    chosen = [r for r in sweep_rows(res) if r[3] in marks]
    assert len(chosen) == 1, [r[3] for r in sweep_rows(res)]
    cost, m, md, _ = chosen[0]
    ref = res.matched()
    assert cost == res.choice.cost and m is res.choice.metrics
    assert (md.diff, md.se, md.n_prompts) == (ref.diff, ref.se, ref.n_prompts)
    assert md.se is not None
    assert _pm_se(md, None) in verdict(res)[1]
    # the printed row shows the verdict's difference and SE
    line = next(x for x in _render(res) if any(k in x for k in marks))
    cells = [c.strip() for c in line.split("│")]
    assert fmt(ref.diff, sign=True) in cells and fmt(ref.se) in cells
    assert f"{ref.diff / ref.se:+.2f}" in cells


def test_table_rows_show_each_cs_difference_and_se_within_80_columns() -> None:
    res = _tune(_data())
    lines = _render(res)
    assert max(len(x) for x in lines) <= 80 and "…" not in "\n".join(lines)
    body = [x for x in lines if x.startswith("│")]
    rows = sweep_rows(res)
    assert len(body) == len(rows)  # no cell wrapped onto a second line
    for line, (cost, _, md, _) in zip(body, rows, strict=True):
        cells = [c.strip() for c in line.split("│")[1:-1]]
        assert cells[0] == f"{cost:.4g}"
        assert cells[4] == fmt(md.diff, sign=True) and cells[5] == fmt(md.se)


def test_table_fits_80_columns_on_huge_raw_rewards() -> None:
    # --quality reward prints raw rewards with 4 significant digits (1.234e+09)
    res = _tune(_data(scale=1e9), quality="reward", s=1e9)
    lines = _render(res)
    assert max(len(x) for x in lines) <= 80
    assert len([x for x in lines if x.startswith("│")]) == len(sweep_rows(res))


def test_one_prompt_has_no_se_anywhere() -> None:
    res = _tune(_data(prompts=1))
    assert all(md.se is None for md in res.sweep_matched())
    body = [x for x in _render(res) if x.startswith("│")]
    assert body and all(x.split("│")[6].strip() == "-" for x in body)


def test_plot_draws_a_band_of_two_paired_se(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.axes

    res = _tune(_data())
    calls: list[tuple[Any, ...]] = []
    real = matplotlib.axes.Axes.fill_between

    def spy(self: Any, *args: Any, **kw: Any) -> Any:
        calls.append(args)
        return real(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", spy)
    plot_tune(res, tmp_path / "t.png", "title")
    assert len(calls) == 1
    x, lo, hi = (np.asarray(a, dtype=float) for a in calls[0][:3])
    pts = sorted(
        zip(res.points, res.sweep_matched(), strict=True), key=lambda t: t[0].metrics.avg_samples
    )
    se = np.array([md.se for _, md in pts], dtype=float)
    y = np.array([quality_of(p.metrics, res.quality) for p, _ in pts])
    np.testing.assert_array_equal(x, [p.metrics.avg_samples for p, _ in pts])
    np.testing.assert_allclose(hi - y, 2 * se, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(y - lo, 2 * se, rtol=1e-12, atol=1e-15)
    for got, want in zip((x, lo, hi), se_band(res), strict=True):
        np.testing.assert_array_equal(got, want)


def test_json_sweep_carries_difference_and_se(tmp_path: Path) -> None:
    path = _log(tmp_path / "log.jsonl", _data(prompts=12, samples=6))
    res = CliRunner().invoke(
        app, ["tune", str(path), "--prior", "default", "--points", "4", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    sweep = out["sweep"]
    assert sweep and all({"diff", "diff_se", "diff_prompts"} <= set(p) for p in sweep)
    assert all(
        p["diff_prompts"] == out["n_prompts"] and p["diff_se"] > 0 for p in sweep if p["diff"] != 0
    )
    knee = [p for p in sweep if p["cost"] == out["recommended"]["cost"]]
    assert knee and knee[0]["diff"] == out["diff"] and knee[0]["diff_se"] == out["diff_se"]


# ---------------------------------------------------------------------------------------------
# raw rewards far from 1 (--quality reward on a 1e9 or 1e-9 scale)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e9, 1e-9])
def test_sweep_table_on_raw_rewards_far_from_1_fits_80_columns_unclipped(scale: float) -> None:
    res = _tune(_data(scale=scale), quality="reward", s=scale)
    lines = _render(res)
    text = "\n".join(lines)
    assert max(len(x) for x in lines) <= 80 and "…" not in text, text
    exponent = int(np.floor(np.log10(reward_scale(res.fixed))))
    unit = 10.0**exponent
    assert f"SE in units of 1e{exponent})" in " ".join(text.split())
    # the recommended row: the verdict's difference and SE, in the table's unit
    line = next(x for x in lines if "<- knee" in x)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    md = res.matched()
    assert md.se is not None
    assert float(cells[4]) == pytest.approx(md.diff / unit, abs=6e-4)
    assert float(cells[5]) == pytest.approx(md.se / unit, abs=6e-4)


@pytest.mark.parametrize("scale", [1e9, 1e-9])
def test_variants_table_on_raw_rewards_far_from_1_is_not_clipped(scale: float) -> None:
    # it printed 4.128e+… and +2.336e+… at 80 columns: the figures were cut off
    data = _data(scale=scale, level=3.0)
    a = _tune(data, quality="reward", s=scale * 1.2345)  # c printed with 4 digits
    b = _tune(data, quality="reward", crossfit=cross_fit(data, "normal", "gaussianize"))
    assert variant_label(b, short=True) == "fitted + gaussianize"  # as beacon tune shows it
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(variants_table([a, b]))
    text = console.export_text()
    assert "…" not in text, text


@pytest.mark.parametrize("scale", [1e9, 1e-9])
def test_range_line_prints_raw_rewards_far_from_1_in_significant_digits(scale: float) -> None:
    # it printed -100268838.764..+41041275.566 on a 1e9 scale and +0.000..+0.000 on 1e-9
    res = _tune(_data(scale=scale), quality="reward", s=scale)
    lo, hi = matched_range(res)
    line = range_lines([res])[0]
    assert f"{fmt(lo, scale=scale, sign=True)}..{fmt(hi, scale=scale, sign=True)}" in line, line
    assert "+0.000..+0.000" not in line and ".000.." not in line


@pytest.mark.parametrize("scale", [1e9, 1e-9])
def test_plot_labels_print_raw_rewards_far_from_1_in_significant_digits(
    scale: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the legend printed "+0.000 to +0.000" on a 1e-9 scale, "+123456789.012" on 1e9
    import matplotlib.axes

    res = _tune(_data(scale=scale), quality="reward", s=scale)
    labels: list[str] = []
    real = matplotlib.axes.Axes.plot

    def spy(self: Any, *args: Any, **kw: Any) -> Any:
        labels.append(str(kw.get("label", "")))
        return real(self, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    plot_tune(res, tmp_path / "t.png", "title")
    lo, hi = matched_range(res)
    sweep = next(x for x in labels if "minus best-of-N over c" in x)
    assert f"{fmt(lo, scale=scale, sign=True)} to {fmt(hi, scale=scale, sign=True)}" in sweep
    knee = next(x for x in labels if x.startswith("recommended knee"))
    md = res.matched()
    assert md.se is not None
    assert f"{fmt(md.diff, scale=scale, sign=True)} ± {fmt(md.se, scale=scale)} SE" in knee
    assert "0.000" not in sweep + knee


def test_a_knee_merged_with_an_equal_samples_row_keeps_its_mark_and_figures() -> None:
    # Costs giving the same average samples are merged into one row; a knee that was not the
    # first of its group lost its "<- knee" mark.
    from dataclasses import replace

    from beacon.evaluation import CostChoice, SweepPoint

    res = _tune(_data())
    pts = list(res.points)
    i = next(
        j for j in range(1, len(pts)) if pts[j].metrics.avg_samples < pts[0].metrics.avg_samples
    )
    twin = SweepPoint(
        pts[i].cost * 1.01,
        replace(
            pts[i].metrics, mean_standardized_reward=pts[i].metrics.mean_standardized_reward + 0.5
        ),
    )
    pts.insert(i + 1, twin)
    knee = i + 1
    res2 = replace(
        res,
        points=tuple(pts),
        knee=knee,
        choice=CostChoice(twin.cost, twin.metrics, "knee"),
    )
    rows = sweep_rows(res2)
    marked = [r for r in rows if r[3] == "<- knee"]
    assert len(marked) == 1 and marked[0][1] is twin.metrics and marked[0][0] == twin.cost
    assert len(rows) == len({p.metrics.avg_samples for p in pts})
