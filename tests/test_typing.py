"""The public API as a user's type checker sees it: ``mypy --strict`` on tests/typing_cases/.

``good_*.py`` use the API the way README.md and docs/ show it (sync and async callables,
lambdas, framework objects, numpy and list inputs, a user family class) and must check clean;
``bad_*.py`` hold clearly wrong uses, each line marked ``# E: <code>[, <code>...]`` with the
mypy error code(s) it must get. The test runs mypy once over the folder and compares the errors
it reports in these files with the marks, line by line (so a lost overload, an ``Any`` leaking
out of a public return type or a too-narrow parameter fails it).

mypy's cache lives in ``.mypy_cache/typing_cases`` (one cold run takes ~20 s on 2 cores, a warm
one about a second).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "typing_cases"
MARK = re.compile(r"#\s*E:\s*([a-z0-9-]+(?:\s*,\s*[a-z0-9-]+)*)")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z0-9-]+)\]$")


def _expected() -> Counter[tuple[str, int, str]]:
    out: Counter[tuple[str, int, str]] = Counter()
    for path in sorted(CASES.glob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            m = MARK.search(line)
            if m:
                assert path.name.startswith("bad_"), f"{path.name}:{lineno}: a mark in a good case"
                for code in m.group(1).split(","):
                    out[(path.name, lineno, code.strip())] += 1
    return out


@pytest.fixture(scope="module")
def mypy_errors() -> Counter[tuple[str, int, str]]:
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--no-pretty",
            "--hide-error-context",
            "--cache-dir",
            str(ROOT / ".mypy_cache" / "typing_cases"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(CASES),
        ]
    )
    assert status in (0, 1), f"mypy crashed or was misused (status {status}):\n{stderr}\n{stdout}"
    found: Counter[tuple[str, int, str]] = Counter()
    for line in stdout.splitlines():
        m = ERROR.match(line)
        if m and Path(m["path"]).resolve().parent == CASES:
            found[(Path(m["path"]).name, int(m["line"]), m["code"])] += 1
        elif m:  # an error inside the library itself, reached through the cases
            found[(m["path"], int(m["line"]), m["code"])] += 1
    return found


def test_good_cases_type_check_clean(mypy_errors: Counter[tuple[str, int, str]]) -> None:
    wrong = sorted(k for k in mypy_errors if not k[0].startswith("bad_"))
    assert not wrong, "correct user code (or the library) gets type errors:\n" + "\n".join(
        f"{f}:{n}: [{c}]" for f, n, c in wrong
    )


def test_bad_cases_are_rejected(mypy_errors: Counter[tuple[str, int, str]]) -> None:
    expected = _expected()
    got = Counter({k: v for k, v in mypy_errors.items() if k[0].startswith("bad_")})
    missing = sorted((expected - got).elements())
    extra = sorted((got - expected).elements())
    assert not missing and not extra, (
        f"not rejected as expected: {missing}\nunexpected errors: {extra}"
    )


def test_every_key_api_has_a_negative_case() -> None:
    names = {p.name for p in CASES.glob("bad_*.py")}
    assert {"bad_core.py", "bad_engine.py", "bad_families.py", "bad_integrations.py"} <= names
    assert sum(_expected().values()) >= 20


def _typing_init(path: Path, cls_name: str) -> dict[str, object]:
    """Parameter name -> default (``...`` when none, ``None`` when not a literal) of the
    ``if TYPE_CHECKING: def __init__`` inside ``cls_name``, in order."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    for node in cls.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    a = fn.args
                    positional = a.posonlyargs + a.args
                    pos_defaults: list[ast.expr | None] = [None] * (
                        len(positional) - len(a.defaults)
                    )
                    pairs = list(zip(positional, [*pos_defaults, *a.defaults], strict=True))
                    pairs += list(zip(a.kwonlyargs, a.kw_defaults, strict=True))
                    out: dict[str, object] = {}
                    for arg, default in pairs:
                        if arg.arg == "self":
                            continue
                        try:
                            out[arg.arg] = ... if default is None else ast.literal_eval(default)
                        except ValueError:
                            out[arg.arg] = None
                    return out
    raise AssertionError(f"{cls_name} has no TYPE_CHECKING __init__")


def test_typing_only_constructors_match_the_runtime_ones() -> None:
    """The constructor signatures written for type checkers (``if TYPE_CHECKING: def
    __init__``) list the runtime fields with the same defaults: a field added to the class but
    not to its typed ``__init__`` would be a type error for every user passing it."""
    import dataclasses

    from beacon.config import BeaconConfig

    typed = _typing_init(ROOT / "beacon" / "config.py", "BeaconConfig")
    runtime = {f.name: f.default for f in dataclasses.fields(BeaconConfig) if f.init}
    assert typed == runtime

    lc = pytest.importorskip("beacon_integrations.langchain")
    typed = _typing_init(ROOT / "beacon_integrations" / "langchain.py", "BeaconRunnable")
    fields = lc.BeaconRunnable.model_fields
    assert set(typed) == set(fields)
    for name, default in typed.items():
        info = fields[name]
        if default is ...:  # required, or a default_factory
            assert info.is_required() or info.default_factory is not None, name
        else:
            assert info.default == default, name
