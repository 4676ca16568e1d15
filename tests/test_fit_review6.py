"""Review of the tune audit: the plot labels a budget's recommended c with the digits the text
prints (the ones that replay to its numbers), not 3 significant digits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli import run

import beacon.cli.tune as tune_cli

LOG = Path(__file__).resolve().parents[1] / "examples" / "data" / "tot_creative_writing_gpt4.jsonl"


def test_the_plot_labels_a_budget_c_as_the_text_prints_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    labels: list[str] = []
    original = tune_cli._point

    def recorded(ax: Any, x: float, y: float, label: str, **style: Any) -> None:
        labels.append(label)
        original(ax, x, y, label, **style)

    monkeypatch.setattr(tune_cli, "_point", recorded)
    code, out, err = run("tune", str(LOG), "--target-samples", "5",
                         "--plot", str(tmp_path / "t.png"))
    assert code == 0, err
    (label,) = [x for x in labels if x.startswith("target-samples: c=")]
    printed = label.split("c=", 1)[1].split(",", 1)[0]
    # the recommendation line prints the same c (the one that replays to 5.00 samples)
    assert f"c = {printed}" in " ".join((out + err).split()), (printed, out[-2000:])
    assert len(printed.replace("0.", "", 1)) > 3, printed  # not the 3-digit 0.119
