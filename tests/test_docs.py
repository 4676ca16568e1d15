"""Every code block in README.md and docs/**/*.md runs, in order, per file.

Conventions for documentation authors:

* ```` ```python ```` blocks run in order in one namespace per Markdown file (a later block sees
  the names of an earlier one), in a fresh temporary working directory where ``examples/`` (the
  repository's) is reachable as a relative path. Top-level ``await`` is allowed (the block is
  then run with ``asyncio.run``).
* ```` ```bash ````, ```` ```sh ````, ```` ```shell ```` and ```` ```console ```` blocks: every
  command that starts with ``beacon `` is run through the CLI in-process and must exit 0 (lines
  are split on ``&&``, ``\\`` continues a line, ``$ `` prompts are stripped; in ``console``
  blocks only ``$`` lines are commands). Other commands (``pip``, ``pytest``, ``celery``...) are
  not run.
* Add ``no-run`` to the info string to show a block without running it (```` ```python no-run ````,
  ```` ```bash no-run ````): for code that needs a server, a key or a long-running process. Use it
  sparingly; prefer a runnable example with a fake model.
* Relative links must point to files that exist.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if p.exists()]
PY_LANGS = {"python", "py", "python3"}
SH_LANGS = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass
class Block:
    lang: str
    flags: set[str]
    code: str
    line: int  # 1-based line of the first code line


def parse_blocks(text: str) -> list[Block]:
    """Fenced code blocks (CommonMark-style fences, possibly indented inside lists)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        words = m["info"].strip().split()
        lang = words[0].lower() if words else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                break
            line = lines[j]
            # Remove the fence's own indentation (blocks nested in list items).
            strip = min(indent, len(line) - len(line.lstrip()))
            body.append(line[strip:])
            j += 1
        blocks.append(Block(lang, set(words[1:]), "\n".join(body) + "\n", i + 2))
        i = j + 1
    return blocks


def shell_commands(block: Block) -> list[str]:
    """The ``beacon ...`` commands of a shell block."""
    logical: list[str] = []
    buf = ""
    for raw in block.code.splitlines():
        line = raw.rstrip()
        if block.lang == "console" and not (line.startswith("$ ") or buf):
            continue
        if line.startswith("$ "):
            line = line[2:]
        if buf:
            line = line.strip()
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        logical.append(buf + line)
        buf = ""
    cmds = []
    for line in logical:
        for seg in line.split("&&"):
            seg = seg.strip()
            if seg.startswith("beacon "):
                cmds.append(seg)
    return cmds


def run_python(block: Block, ns: dict[str, object], where: str) -> None:
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code = compile(block.code, where, "exec", flags=flags, dont_inherit=True)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, ns))  # top-level await
    else:
        exec(code, ns)


def run_beacon(cmd: str, where: str) -> None:
    from beacon.cli import app

    argv = shlex.split(cmd)[1:]
    res = CliRunner().invoke(app, argv)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"{where}: `{cmd}` raised {res.exception!r}") from res.exception
    assert res.exit_code == 0, (
        f"{where}: `{cmd}` exited {res.exit_code}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    )


@pytest.fixture
def docs_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "120")
    return tmp_path


def test_doc_files_found() -> None:
    assert ROOT / "README.md" in DOC_FILES
    assert any(p.parent.name == "docs" for p in DOC_FILES)


@pytest.mark.parametrize("md", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_code_blocks_run(md: Path, docs_workdir: Path) -> None:
    ns: dict[str, object] = {"__name__": "__docs__"}
    for b in parse_blocks(md.read_text(encoding="utf-8")):
        if "no-run" in b.flags:
            continue
        where = f"{md.relative_to(ROOT)}:{b.line}"
        if b.lang in PY_LANGS:
            run_python(b, ns, where)
        elif b.lang in SH_LANGS:
            for cmd in shell_commands(b):
                run_beacon(cmd, where)


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("md", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_relative_links_resolve(md: Path) -> None:
    text = md.read_text(encoding="utf-8")
    # Links inside code blocks are code, not links.
    for b in parse_blocks(text):
        text = text.replace(b.code, "")
    missing = []
    for m in LINK.finditer(text):
        target = m["target"].split("#", 1)[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # same-page anchor, or an absolute URL (http:, mailto:, ...)
        if not (md.parent / target).exists():
            missing.append(m["target"])
    assert not missing, f"{md.relative_to(ROOT)}: broken relative links {missing}"


def test_parser_and_conventions() -> None:
    text = (
        "intro\n```python\nx = 1\n```\n- item\n\n  ```bash no-run\n  beacon worker\n  ```\n"
        "```console\n$ beacon replay a.jsonl \\\n    --cost 0.1\nsome output\n"
        "$ pip install . && beacon tune a.jsonl\n```\n"
    )
    blocks = parse_blocks(text)
    assert [(b.lang, b.flags) for b in blocks] == [
        ("python", set()),
        ("bash", {"no-run"}),
        ("console", set()),
    ]
    assert blocks[0].code == "x = 1\n" and blocks[0].line == 3
    assert blocks[1].code == "beacon worker\n"
    assert shell_commands(blocks[2]) == ["beacon replay a.jsonl --cost 0.1", "beacon tune a.jsonl"]


def test_top_level_await_blocks_run() -> None:
    ns: dict[str, object] = {}
    run_python(
        Block("python", set(), "import asyncio\nawait asyncio.sleep(0)\ny = 2\n", 1), ns, "<test>"
    )
    assert ns["y"] == 2


def test_readme_quickstart_is_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[test]" && pytest -q' in text
    quick = [b for b in parse_blocks(text) if b.lang in SH_LANGS and "pip install ." in b.code]
    assert quick, "README has no install-and-run quickstart block"
    cmds = shell_commands(quick[0])
    assert cmds and cmds[0].startswith("beacon tune examples/data/") and "--plot" in cmds[0]
    assert os.path.exists(ROOT / cmds[0].split()[2])


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_readme_figures_match_the_shipped_data(docs_workdir: Path) -> None:
    """The README's caption quotes the quickstart's `beacon tune`; rerun it and recompute them.

    The caption says the plot is exactly what the quickstart command writes, so the figures are
    taken from that command's own `--json` output (the fitted variant it recommends and the
    Jeffreys baseline it sweeps beside it), not from a re-implementation.
    """
    import json

    import numpy as np

    from beacon.cli import app

    text = _norm((ROOT / "README.md").read_text(encoding="utf-8"))
    quick = [
        b
        for b in parse_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
        if b.lang in SH_LANGS and "pip install ." in b.code
    ]
    argv = shlex.split(shell_commands(quick[0])[0])[1:]
    i = argv.index("--plot")
    argv = argv[:i] + argv[i + 2 :] + ["--json"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    base = out["baseline"]
    assert base is not None, "the quickstart no longer sweeps the Jeffreys baseline"

    def raw_matched(run: dict, k: float) -> float:
        fixed = run["fixed"]
        return float(np.interp(k, [f["n"] for f in fixed], [f["mean_best_reward"] for f in fixed]))

    fit, jef = out["recommended"], base["recommended"]
    horizon = out["horizon"]
    lo, hi = out["matched_range"]
    quoted = [
        f"({out['n_prompts']} prompts, {horizon} samples each;",
        f"uses {fit['avg_samples']:.1f} samples per prompt for a mean standardized best reward "
        f"of {fit['mean_standardized_reward']:.2f}, where best-of-N at the same samples reaches "
        f"{out['matched_fixed_quality']:.2f}",
        f"(mean raw score {fit['mean_best_reward']:.2f} against "
        f"{raw_matched(out, fit['avg_samples']):.2f} on the 1–10 scale)",
        f"between {-lo:.3f} below and {hi:.3f} above best-of-N",
        f"its knee uses {jef['avg_samples']:.1f} samples per prompt instead of {horizon} for a "
        f"mean standardized best reward of {jef['mean_standardized_reward']:.2f} against "
        f"{base['fixed'][-1]['mean_standardized_reward']:.2f}, and at the same samples "
        f"best-of-N reaches {base['matched_fixed_quality']:.2f}",
    ]
    assert lo < 0 < hi, "the caption words the sweep range as 'below' and 'above'"
    assert jef["mean_standardized_reward"] < base["matched_fixed_quality"], (
        "the caption says the default prior does not beat best-of-N at its knee"
    )
    for q in quoted:
        assert q in text, f"README caption out of date: expected {q!r}"


def test_example_data_readme_matches_the_files() -> None:
    """examples/data/README.md states each log's prompts x samples; check them on the files."""
    import json

    readme = (ROOT / "examples" / "data" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(?P<file>[^`]+\.jsonl)` \| (?P<p>\d+) x (?P<s>\d+) \|", readme, re.M)
    shipped = sorted(p.name for p in (ROOT / "examples" / "data").glob("*.jsonl"))
    assert sorted(f for f, _, _ in rows) == shipped, "every shipped log is described, no other"
    for name, n_prompts, n_samples in rows:
        with (ROOT / "examples" / "data" / name).open(encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        assert len(lines) == int(n_prompts), name
        assert {len(r["rewards"]) for r in lines} == {int(n_samples)}, name
        for r in lines:
            assert set(r) == {"id", "prompt", "rewards", "correct", "source"}, name
            assert r["correct"] is None or len(r["correct"]) == len(r["rewards"]), name


def test_h_index_left_tail_figures() -> None:
    """docs/h_index.md quotes how far left of the grid h meets the myopic bound; recompute.

    G_d is computed here with scipy's Student-t (independent of the package's kernels).
    """
    from scipy import stats

    from beacon.index import get_table

    text = _norm((ROOT / "docs" / "h_index.md").read_text(encoding="utf-8"))
    t16, t32 = get_table(16), get_table(32)

    def myopic(z: float, d: float) -> float:
        return float((d + z * z) / (d - 1) * stats.t.pdf(z, d) - z * stats.t.sf(z, d))

    def above(k: int, z: float) -> float:  # Jeffreys: d = 2 alpha0 + k = k - 1
        g = myopic(z, k - 1.0)
        return (t32.h(k, z) - g) / g

    def n16_vs_n32(k: int, z: float) -> float:
        return abs(t32.h(k, z) / t16.h(k, z) - 1.0)

    def e(x: float) -> str:  # the docs' style: 1.1e-3, not 1.1e-03
        mant, exp = f"{x:.1e}".split("e")
        return f"{mant}e{int(exp)}"

    quoted = [
        f"`h` is above `G_d` by {e(above(3, -6))} (relative) in row `k = 3` (`d = 2`), "
        f"{e(above(4, -6))} in row 4, {e(above(5, -6))} in row 5 and below 1e-12 from row 8 on",
        f"at `zhat = -20`, by {e(above(3, -20))} in row 3 and {e(above(4, -20))} in row 4.",
        f"({e(n16_vs_n32(3, -6))} in row 3 at `zhat = -6`, {e(n16_vs_n32(5, -6))} in row 5)",
    ]
    for q in quoted:
        assert q in text, f"docs/h_index.md out of date: expected {q!r}"
    assert all(0 <= above(k, -6) < 1e-12 for k in range(8, 32))
