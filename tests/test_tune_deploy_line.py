"""The deploy hint's 'cost = c x within_scale = A x B = C' line is arithmetic on the c it prints
(a caller-given cost range keeps exact swept costs and prints shortened ones)."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from beacon.cli import app

LOG = Path(__file__).resolve().parents[1] / "examples" / "data" / "tot_creative_writing_gpt4.jsonl"


def test_the_deploy_line_multiplies_the_printed_c() -> None:
    out = CliRunner().invoke(
        app, ["tune", str(LOG), "--cost-min", "0.05", "--cost-max", "0.5"]
    )
    assert out.exit_code == 0, out.output
    m = re.search(r"c x within_scale = (\S+) x (\S+) = (\S+) in model units", out.output)
    assert m is not None, out.output
    c, scale, product = (float(x) for x in m.groups())
    # within_scale is itself printed to 4 digits: the product agrees to that rounding
    assert abs(c * scale / product - 1) < 2e-4, m.group(0)
