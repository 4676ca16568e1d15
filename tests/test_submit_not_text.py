"""``beacon submit`` refuses a compressed or UTF-16 prompts file before the broker is reached,
as ``beacon run`` does (tests/test_audit7_jobs.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from typer.testing import CliRunner

from beacon.cli import app


@pytest.mark.parametrize("kind", ["gzip", "utf-16"])
def test_submit_refuses_a_prompts_file_that_is_not_utf8_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    line = '{"id": "a", "prompt": "hello"}\n'
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(gzip.compress(line.encode()) if kind == "gzip" else line.encode("utf-16"))
    # nothing answers here: reaching the broker would be another error
    monkeypatch.setenv("BEACON_BROKER_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("BEACON_STATE_URL", "redis://127.0.0.1:1/0")
    res = CliRunner().invoke(
        app, ["submit", str(path), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"]
    )
    assert res.exit_code == 2, res.output
    assert "PROMPTS" in res.output and kind.split("-")[0].upper() in res.output.upper()
