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


def test_readme_figures_match_the_shipped_data() -> None:
    """The README's caption quotes `beacon tune` on the shipped data; recompute it."""
    import beacon
    from beacon.evaluation import interpolate_fixed, load_logged, tune

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    data = load_logged(ROOT / "examples" / "data" / "tot_creative_writing_gpt4.jsonl")
    res = tune(data, beacon.BeaconConfig(cost=0.1, horizon=10))
    m = res.choice.metrics
    quoted = [
        f"uses {m.avg_samples:.1f} samples per prompt instead of 10",
        f"best reward of {m.mean_standardized_reward:.2f} against "
        f"{res.fixed[-1].mean_standardized_reward:.2f}",
        f"best-of-N reaches {interpolate_fixed(res.fixed, m.avg_samples):.2f}",
    ]
    for q in quoted:
        assert q in text, f"README caption out of date: expected {q!r}"
