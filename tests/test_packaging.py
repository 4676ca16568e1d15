"""What `pip install .` ships, and how the package behaves when an extra is not installed.

The wheel and sdist are built from a copy of the source tree (setuptools' PEP 517 backend, no
build isolation, no network), so the tests see exactly what a user installs: every package, the
shipped h-index tables, ``py.typed``, the ``beacon`` console script and the metadata.

Missing extras are simulated in subprocesses: either with ``python -S`` (no site-packages at all,
so the framework really is absent) or with a meta path finder that blocks the extra's modules the
way an absent module fails (``ModuleNotFoundError`` with ``name`` set).
"""

from __future__ import annotations

import email
import email.message
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("beacon", "beacon_integrations", "worker")
TABLES = sorted(p.name for p in (REPO / "beacon" / "index" / "data").glob("*.npz"))


def _source_packages() -> set[str]:
    found = set()
    for top in PACKAGE_DIRS:
        for init in (REPO / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join(init.parent.relative_to(REPO).parts))
    return found


def _setuptools_ok() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77  # the build-system requirement of pyproject.toml


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build the wheel and the sdist once, from a copy of the tree (the checkout stays clean)."""
    if not _setuptools_ok():
        pytest.skip("building needs setuptools >= 77 in this environment")
    root = tmp_path_factory.mktemp("pkg")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for top in PACKAGE_DIRS:
        shutil.copytree(REPO / top, src / top, ignore=ignore)
    out = root / "dist"
    code = (
        # (build_meta rewrites sys.argv: read the output folder first)
        "import sys\nfrom setuptools import build_meta as b\nout = sys.argv[1]\n"
        "w = b.build_wheel(out)\ns = b.build_sdist(out)\n"
        "print('BUILT', w, s)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = [ln for ln in proc.stdout.splitlines() if ln.startswith("BUILT ")]
    assert built, proc.stdout[-3000:]
    _, wheel, sdist = built[-1].split()
    return {"wheel": out / wheel, "sdist": out / sdist}


@pytest.fixture(scope="module")
def wheel_names(dists: dict[str, Path]) -> list[str]:
    with zipfile.ZipFile(dists["wheel"]) as z:
        return z.namelist()


@pytest.fixture(scope="module")
def metadata(dists: dict[str, Path]) -> email.message.Message:
    with zipfile.ZipFile(dists["wheel"]) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


# -- the wheel and the sdist ----------------------------------------------------------------------
def test_wheel_ships_every_package(wheel_names: list[str]) -> None:
    shipped = {n.rsplit("/", 1)[0].replace("/", ".") for n in wheel_names
               if n.endswith("/__init__.py")}
    expected = _source_packages()
    assert {"beacon", "beacon.cli", "beacon_integrations", "beacon_integrations.scorers",
            "worker"} <= expected
    assert expected - shipped == set()


def test_wheel_ships_the_index_tables_and_py_typed(wheel_names: list[str]) -> None:
    assert TABLES, "no shipped .npz tables in beacon/index/data"
    shipped = sorted(n.rsplit("/", 1)[1] for n in wheel_names
                     if n.startswith("beacon/index/data/") and n.endswith(".npz"))
    assert shipped == TABLES
    assert "beacon/py.typed" in wheel_names


def test_sdist_ships_the_index_tables_and_py_typed(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {f"beacon/index/data/{n}" for n in TABLES} <= names
    assert {"beacon/py.typed", "pyproject.toml", "README.md"} <= names


def test_wheel_has_the_beacon_console_script(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(name).decode()
    assert re.search(r"^\[console_scripts\]\s*^beacon\s*=\s*beacon\.cli:main\s*$", text, re.M)


def test_every_requirement_has_a_lower_bound(metadata: email.message.Message) -> None:
    requires = metadata.get_all("Requires-Dist") or []
    assert requires
    for req in requires:
        spec = req.split(";")[0].strip()
        if spec.startswith("beacon-sampling["):  # the aggregate extras
            continue
        assert ">=" in spec, f"no lower bound: {req}"


def test_quickstart_needs_no_extra(metadata: email.message.Message) -> None:
    """`pip install . && beacon tune ... --plot`: typer, rich and matplotlib are core."""
    core = {re.split(r"[\s<>=!~\[]", r, maxsplit=1)[0].lower()
            for r in metadata.get_all("Requires-Dist") or [] if "extra ==" not in r}
    assert {"numpy", "scipy", "numba", "typer", "rich", "matplotlib"} <= core
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"langchain", "llamaindex", "http", "verify", "worker", "all", "test"} <= extras


def test_python_floor_and_classifiers_agree(metadata: email.message.Message) -> None:
    assert metadata["Requires-Python"] == ">=3.11"
    versions = [tuple(int(x) for x in c.rsplit("::", 1)[1].strip().split("."))
                for c in metadata.get_all("Classifier") or []
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert (3, 11) in versions
    assert min(versions) >= (3, 11)


# -- missing extras -------------------------------------------------------------------------------
BLOCKER = textwrap.dedent(
    """
    import sys

    class _Blocker:
        # Fails the way an absent module does: ModuleNotFoundError with its name.
        def __init__(self, names):
            self.names = set(names)

        def find_spec(self, fullname, path=None, target=None):
            if fullname.partition(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None

    sys.meta_path.insert(0, _Blocker({names!r}))
    for _m in list(sys.modules):
        if _m.partition(".")[0] in {names!r}:
            del sys.modules[_m]
    """
)
EXTRA_MODULES = ["langchain_core", "langchain", "llama_index", "celery", "kombu", "redis",
                 "aiohttp", "math_verify"]


def _run(code: str, *, isolated: bool = False, block: list[str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with this checkout first on the path; ``isolated``: without site-packages."""
    prefix = BLOCKER.replace("{names!r}", repr(sorted(block))) if block else ""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{code}"] \
        if isolated else [sys.executable, "-c", prefix + code]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize(
    ("module", "extra", "missing"),
    [
        ("beacon_integrations.langchain", "langchain", "langchain_core"),
        ("beacon_integrations.llama_index", "llamaindex", "llama_index.core"),
        ("worker.app", "worker", "celery"),
        ("worker.tasks", "worker", "celery"),
        ("worker.state", "worker", "redis"),
        ("worker.recovery", "worker", "redis"),
    ],
)
def test_import_without_the_extra_names_it(module: str, extra: str, missing: str) -> None:
    # python -S: no site-packages, so the framework is really not installed
    proc = _run(f"import {module}", isolated=True)
    assert proc.returncode == 1
    last = _last_line(proc)
    assert last.startswith("ModuleNotFoundError: "), proc.stderr[-2000:]
    assert f"'{missing}'" in last
    assert f'pip install "beacon-sampling[{extra}]"' in last, last


def test_missing_extra_error_keeps_the_missing_module_name() -> None:
    proc = _run(
        "try:\n    import beacon_integrations.langchain\n"
        "except ModuleNotFoundError as e:\n    print(e.name)",
        block=["langchain_core"],
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "langchain_core"


@pytest.mark.parametrize(
    ("module", "extra", "missing", "block"),
    [
        ("beacon_integrations.langchain", "langchain", "langchain_core",
         ["langchain_core", "langchain"]),
        ("beacon_integrations.llama_index", "llamaindex", "llama_index.core", ["llama_index"]),
    ],
)
def test_find_spec_without_the_extra_returns_a_spec_and_import_names_the_extra(
    module: str, extra: str, missing: str, block: list[str]
) -> None:
    # find_spec must answer as for any module with a missing dependency (a spec, no exception:
    # tools and user code probe optional modules with it); it raised ModuleNotFoundError.
    code = textwrap.dedent(
        f"""
        import importlib, importlib.util
        try:
            spec = importlib.util.find_spec({module!r})
        except BaseException as exc:
            print("find_spec raised", type(exc).__name__, exc)
            raise SystemExit(0)
        print("spec", spec is not None and spec.name == {module!r})
        try:
            importlib.import_module({module!r})
        except ModuleNotFoundError as exc:
            print("import", exc.name, "|", exc)
        print("left in sys.modules", {module!r} in sys.modules)
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_Blocker"]
        importlib.invalidate_caches()  # the framework is installed after all
        print("imported", importlib.import_module({module!r}).__name__)
        """
    )
    proc = _run(code, block=block)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "spec True", lines
    assert lines[1].startswith(f"import {missing} | "), lines
    assert f'pip install "beacon-sampling[{extra}]"' in lines[1]
    assert lines[2:] == ["left in sys.modules False", f"imported {module}"]


def test_core_works_with_every_extra_missing() -> None:
    code = textwrap.dedent(
        """
        import beacon, worker, worker.config, beacon_integrations
        from beacon_integrations.scorers import HttpRewardScorer, MathAnswerVerifier
        cfg = beacon.BeaconConfig(family="bernoulli", horizon=8)
        s = beacon.Stopper(cfg)
        s.next_decision(); s.observe(1); s.next_decision()
        HttpRewardScorer("http://127.0.0.1:9/score"); MathAnswerVerifier()
        print("ok")
        """
    )
    proc = _run(code, block=EXTRA_MODULES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.parametrize(
    "argv",
    [
        ["worker"],
        ["submit", "{prompts}", "-g", "beacon.demo:make_generator", "-s",
         "beacon.demo:make_scorer"],
        ["collect", "job-1", "-o", "{out}"],
    ],
)
def test_cli_command_without_the_worker_extra_names_it(argv: list[str], tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "2+2"}\n')
    argv = [a.format(prompts=prompts, out=tmp_path / "out.jsonl") for a in argv]
    code = f"import sys\nfrom beacon.cli import main\nsys.argv = ['beacon', *{argv!r}]\nmain()"
    proc = _run(code, block=["celery", "kombu", "redis"])
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = _last_line(proc)
    assert last.startswith("error: "), proc.stderr[-2000:]
    assert 'pip install "beacon-sampling[worker]"' in last, last


def test_cli_reraises_errors_of_modules_outside_the_extras() -> None:
    code = textwrap.dedent(
        """
        import beacon.cli
        def boom():
            raise ModuleNotFoundError("No module named 'nonexistent_xyz'", name="nonexistent_xyz")
        beacon.cli.app = boom
        beacon.cli.main()
        """
    )
    proc = _run(code)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert _last_line(proc) == "ModuleNotFoundError: No module named 'nonexistent_xyz'"


@pytest.mark.parametrize(
    ("code", "extra", "missing"),
    [
        ("from beacon_integrations.scorers import HttpRewardScorer\n"
         "import asyncio\n"
         "asyncio.run(HttpRewardScorer('http://127.0.0.1:9/score').score('q', 'a'))",
         "http", "aiohttp"),
        ("from beacon_integrations.scorers import MathAnswerVerifier\n"
         "MathAnswerVerifier().check({'answer': '2'}, 'so \\\\boxed{2}')",
         "verify", "math_verify"),
    ],
)
def test_a_scorer_used_without_its_extra_names_it(code: str, extra: str, missing: str) -> None:
    proc = _run(code, block=[missing])
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = _last_line(proc)
    assert last.startswith("ModuleNotFoundError: "), proc.stderr[-2000:]
    assert f"'{missing}'" in last and f'pip install "beacon-sampling[{extra}]"' in last, last


def test_python_dash_m_beacon_is_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "beacon", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Usage:" in proc.stdout and "tune" in proc.stdout
