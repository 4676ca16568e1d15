"""Every script in examples/ runs offline as a subprocess and prints a sound account of its choice.

Scripts may print ``SUMMARY {json}`` lines (one per query): the stop reason must be one of the
closed set, the samples used within the horizon, and the chosen reward the best reward among the
samples used. When a summary names a logged-rewards file under ``examples/data`` and the config
used, the test replays that prompt's logged rewards through an independent ``Stopper`` and requires
the same number of samples, the same stop reason and the same chosen reward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from beacon import STOP_REASONS, BeaconConfig, Draw, Stopper

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))

# The integration examples must exist (a deleted example fails here, not silently), with the
# number of queries each one summarizes.
REQUIRED = {
    "langchain_chain.py": 4,
    "langchain_agent.py": 3,
    "llamaindex_query_engine.py": 6,
    "llamaindex_query_transform.py": 2,
}


def test_integration_examples_are_present() -> None:
    names = {p.name for p in SCRIPTS}
    assert set(REQUIRED) <= names


def _run(script: Path) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (
        f"{script.name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def _replay(rewards: list[float], cfg: BeaconConfig) -> tuple[int, str, float]:
    s = Stopper(cfg)
    it = iter(rewards)
    used: list[float] = []
    while isinstance(d := s.next_decision(), Draw):
        for _ in range(d.count):
            r = next(it)
            s.observe(r)
            used.append(r)
    assert s.stopped is not None
    return len(used), s.stopped.reason, max(used)


def _logged(name: str, row_id: str) -> list[float]:
    with (EXAMPLES / "data" / name).open() as f:
        for line in f:
            row = json.loads(line)
            if row["id"] == row_id:
                return [float(r) for r in row["rewards"]]
    raise AssertionError(f"{row_id} not in {name}")


def _check_summary(summary: dict[str, Any]) -> None:
    assert summary["stop_reason"] in STOP_REASONS
    assert 1 <= summary["n_samples"] <= summary["horizon"]
    assert summary["chosen_reward"] == summary["max_used_reward"]
    if "data" in summary:
        cfg = BeaconConfig.from_dict(summary["config"])
        n, reason, best = _replay(_logged(summary["data"], summary["id"]), cfg)
        assert (summary["n_samples"], summary["stop_reason"]) == (n, reason)
        assert summary["chosen_reward"] == best


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_runs_and_explains_its_choice(script: Path) -> None:
    out = _run(script)
    assert out.strip(), f"{script.name} printed nothing"
    summaries = [json.loads(line[len("SUMMARY "):]) for line in out.splitlines()
                 if line.startswith("SUMMARY ")]
    if script.name in REQUIRED:
        assert len(summaries) == REQUIRED[script.name]
        assert "stop" in out.lower()
    for s in summaries:
        _check_summary(s)
