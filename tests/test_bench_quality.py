"""The quality benchmark end to end (reduced CI run) and its pieces.

``python -m bench.quality --quick`` must regenerate every block of docs/benchmarks.md and every
figure, and the numbers must agree with each other, so the published tables cannot silently rot.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import beacon

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))  # bench/ is a repository folder, not part of the distribution

from bench import quality as q  # noqa: E402

needs_data = pytest.mark.skipif(
    not all((DATA / s.file).exists() for s in q.DATASETS), reason="../shared/data not present"
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    js = out / "numbers.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.quality", "--quick", "--out", str(out), "--json", str(js)],
        cwd=ROOT, capture_output=True, text=True, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wall time" in proc.stdout
    return out, json.loads(js.read_text()), (out / "benchmarks.md").read_text()


@needs_data
def test_every_block_and_figure_is_generated(quick_run: tuple[Path, dict[str, Any], str]) -> None:
    out, _, md = quick_run
    template = (ROOT / "docs" / "benchmarks.md").read_text()
    names = re.findall(r"<!-- bench:([\w.-]+) -->", template)
    assert names, "the template has no generated blocks"
    for name in names:
        tag = re.escape(name)
        m = re.search(rf"<!-- bench:{tag} -->\n(.*?)\n<!-- /bench:{tag} -->", md, re.S)
        assert m is not None, name
        assert m.group(1).strip(), f"block {name} is empty"
    for img in re.findall(r"\]\((img/bench_[\w.]+\.png)\)", template):
        p = out / img
        assert p.exists() and p.stat().st_size > 10_000, img
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_data
def test_numbers_are_internally_consistent(quick_run: tuple[Path, dict[str, Any], str]) -> None:
    _, res, md = quick_run
    assert set(res["datasets"]) == {s.key for s in q.DATASETS}
    for key, d in res["datasets"].items():
        binary = key == "game24"
        qa = "acc" if binary else "reward"
        n = d["horizon"]
        bon = d["bon"]
        assert [b["param"] for b in bon] == list(range(1, n + 1))
        for b in bon:
            assert b["k_perm"] == pytest.approx(b["param"]) and b["k_logged"] == b["param"]
        # best of a longer prefix is never worse, prompt by prompt, hence on average
        qs = [b[f"{qa}_perm"] for b in bon]
        assert all(x <= y + 1e-12 for x, y in pairwise(qs))
        for rows in [d["threshold"], *d["sweeps"].values()]:
            for r in rows:
                assert 1.0 <= r["k_perm"] <= n and 1.0 <= r["k_logged"] <= n
                zq = r["acc_perm"] if binary else r["z_perm"]
                assert r["value01_perm"] == pytest.approx(zq - 0.1 * r["k_perm"])
                # every method picks among the first n samples: never above best-of-n
                assert r[f"{qa}_perm"] <= bon[-1][f"{qa}_perm"] + 1e-12
        # matched-sample differences = interpolated BEACON curve - best-of-N
        for m in d["matched"]:
            peer = m["variant"] == q.PEER_THRESHOLD
            curve = d["threshold"] if peer else d["sweeps"][m["variant"]]
            sweep = sorted(curve, key=lambda r: (r["k_perm"], r["param"]))
            ks = np.array([r["k_perm"] for r in sweep])
            ys = np.array([r[f"{qa}_perm"] for r in sweep])
            assert ks[0] - 1e-9 <= m["n"] <= ks[-1] + 1e-9
            expect = np.interp(m["n"], ks, ys) - bon[m["n"] - 1][f"{qa}_perm"]
            assert m["diff_reward"] == pytest.approx(expect, abs=1e-9)
        for label, rows in d["sweeps"].items():
            assert f"| {label} |" in md
            ks = [r["k_perm"] for r in sorted(rows, key=lambda r: r["param"])]
            # a larger sampling cost never makes the rule sample more
            assert all(a >= b - 1e-12 for a, b in pairwise(ks)), label
    for h in res["headline"]:
        d = res["datasets"][h["dataset"]]
        row = next(r for r in d["sweeps"][h["variant"]] if r["param"] == pytest.approx(0.1))
        assert h["k"] == pytest.approx(row["k_perm"])
        assert h["saved"] == pytest.approx(1 - row["k_perm"] / d["horizon"])
        qa = "acc" if h["dataset"] == "game24" else "reward"
        assert h["dq"] == pytest.approx(row[f"{qa}_perm"] - d["bon"][-1][f"{qa}_perm"], abs=1e-9)
        assert f"{100 * h['saved']:.0f}%" in md
    assert res["votes"] and all(1.0 <= v["k"] <= 32 for v in res["votes"])


def test_render_requires_every_block() -> None:
    t = "a\n<!-- bench:x -->\nold\n<!-- /bench:x -->\nb\n"
    assert q.render(t, {"x": "new"}) == "a\n<!-- bench:x -->\nnew\n<!-- /bench:x -->\nb\n"
    with pytest.raises(beacon.ConfigError):
        q.render(t, {"x": "new", "y": "more"})
    with pytest.raises(beacon.ConfigError):
        q.render(t, {})


def test_standardized_transform_and_pooled_scale() -> None:
    x = np.array([[0.0, 2.0], [10.0, 14.0]])
    loc, scale = q.pooled_location_scale(x)
    assert loc == pytest.approx(6.5)
    assert scale == pytest.approx(np.sqrt((1.0 + 4.0) / 2))  # within-prompt, not total, spread
    t = q.Standardized(beacon.LogitTransform(), 0.0, 2.0)
    assert t.apply(np.array([0.5, 0.8])) == pytest.approx([0.0, np.log(4.0) / 2])
    with pytest.raises(beacon.ConfigError):
        q.Standardized(None, 0.0, 0.0)


def test_synthetic_answers_are_seeded_and_shaped() -> None:
    a1, c1 = q.synthetic_answers(50, 16, 3)
    a2, c2 = q.synthetic_answers(50, 16, 3)
    assert a1.shape == (50, 16) and np.array_equal(a1, a2) and np.array_equal(c1, c2)
    assert set(np.unique(c1)) <= {0.0, 1.0}
    assert np.array_equal(c1 == 1.0, a1 == 0)


@pytest.mark.parametrize("prior", [None, beacon.BetaPrior(0.3, 2.0)])
@pytest.mark.parametrize("cost", [0.02, 0.1, 0.4])
def test_judge_family_equals_bernoulli_on_wins(prior: beacon.BetaPrior | None, cost: float) -> None:
    """bench replays the judge family as the Bernoulli family on w = 1{r > 1/2}: check it."""
    import beacon.families.judge  # registers the family
    from beacon.replay import replay

    rng = np.random.default_rng(5)
    r = np.where(rng.random((150, 12)) < 0.2, rng.uniform(0.5, 1.0, (150, 12)),
                 rng.uniform(0.0, 0.5, (150, 12)))
    r[rng.random(r.shape) < 0.05] = 0.5  # the boundary itself is not a win
    judge = replay(r, beacon.BeaconConfig(cost=cost, horizon=12, family="judge", prior=prior))
    wins = (r > q.JUDGE_WIN).astype(np.float64)
    bern = replay(wins, beacon.BeaconConfig(cost=cost, horizon=12, family="bernoulli",
                                            prior=prior))
    assert np.array_equal(judge.n_samples, bern.n_samples)
    assert np.array_equal(judge.chosen, q.bl.prefix_best(r, bern.n_samples))
