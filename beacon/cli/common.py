"""Helpers shared by the ``beacon`` commands: loading logs, priors and transforms, errors, progress.

Exit codes (:data:`EXIT_OK`, :data:`EXIT_FAILURE`, :data:`EXIT_USAGE`):

* ``0`` success;
* ``1`` failure: the inputs were accepted but the work failed (a malformed line in a log, a prior
  file that is not valid JSON, a reward outside the family's support, an I/O error);
* ``2`` usage: the command line itself is wrong (unknown option, a missing input file, an invalid
  ``--cost``, an unknown ``--family`` or transform kind), reported by click with the usage line;
* ``130`` interrupted: Ctrl-C reached the command (``beacon run`` catches it itself, keeps what it
  finished and exits 1), after the line ``interrupted`` on stderr.

Output piped into a reader that stops early (``| head``) ends the command quietly with exit 1,
as click does for its own output, not with an ``error:`` line.

Other commands (``beacon.cli.jobs``, ``beacon.cli.priors``) may use these helpers too.
"""

from __future__ import annotations

import errno
import inspect
import json
import re
import shlex
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from beacon.config import BeaconConfig
from beacon.errors import BeaconError, ConfigError, RewardError
from beacon.evaluation import (
    DEFAULT_FOLDS,
    FIT_TRANSFORMS,
    CrossFit,
    LogFormatError,
    LoggedRewards,
    PolicyMetrics,
    cross_fit,
    load_logged,
    name_reward_error,
)
from beacon.priors import Prior, prior_from_dict, rewards_before_first_decision
from beacon.transforms import RewardTransform, make_transform, transform_from_dict

__all__ = [
    "DEFAULT_HORIZON",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PRIOR_DEFAULT",
    "PRIOR_FIT",
    "LogSetup",
    "build_config",
    "check_input_file",
    "check_output_file",
    "echo_json",
    "err_console",
    "fail",
    "guarded",
    "load_log",
    "load_prior_file",
    "log_setup",
    "one_line_warnings",
    "option_error",
    "options_for",
    "out_console",
    "parse_transform",
    "print_table",
    "progress_bar",
    "resolve_prior_and_transform",
    "reward_scale",
    "scale_note",
    "select_prompts",
    "spinner",
    "usage_error",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C

# Horizon used when --horizon is not given: the design's default n, or fewer if the log is shorter.
DEFAULT_HORIZON = 32

out_console = Console(highlight=False, soft_wrap=True)
# soft_wrap: error lines stay whole (grep-able "file:line: reason"), whatever the terminal width.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# Which command-line option each config field comes from, so a ConfigError is reported against
# the option the user typed.
_OPTION_OF_FIELD = {
    "cost": "--cost",
    "horizon": "--horizon",
    "family": "--family",
    "batch_size": "--batch-size",
    "robust_quantile": "--robust-quantile",
    "prior": "--prior",
    "transform": "--transform",
    "folds": "--folds",
    "crossfit": "--prior",
    "target_samples": "--target-samples",
    "max_quality_loss": "--max-quality-loss",
    "quality": "--quality",
    "points": "--points",
}

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with :data:`EXIT_FAILURE`."""
    # escape: messages quote log lines, ids and paths ("[/INST]" in a prompt is not markup)
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
    raise typer.Exit(EXIT_FAILURE)


def count_noun(n: int, noun: str) -> str:
    """``1 prompt``, ``2 prompts`` (English plural by ``s``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def usage_error(message: str, option: str | None = None) -> NoReturn:
    """Report a command-line mistake through click (usage line, exit :data:`EXIT_USAGE`)."""
    raise typer.BadParameter(message, param_hint=f"'{option}'" if option else None)


def _option_for(field: str) -> str | None:
    base = field.split(".")[0].split("[")[0]
    return _OPTION_OF_FIELD.get(base)


def option_error(exc: ConfigError, option: str) -> NoReturn:
    """``exc`` (a bad value) as a usage error on ``option``, exit 2.

    ``'value': reason`` when ``exc.field`` is what the option sets (``cost`` for ``--cost``);
    ``field=value: reason`` when it is one field of what the option gives (``alpha0`` of the
    ``--prior`` file, a keyword argument of ``--scorer-kwargs``), so the message says which.
    """
    own = {option.lstrip("-").replace("-", "_")}
    own.update(field for field, opt in _OPTION_OF_FIELD.items() if opt == option)
    parts = [p.rstrip("]") for p in re.split(r"[.\[]", exc.field)]
    if parts[-1] in own:
        usage_error(f"{exc.value!r}: {exc.reason}", option)
    # 'prior.alpha0' under --prior reads as 'alpha0': the option already names the prior
    field = exc.field[len(parts[0]) :].lstrip(".") if parts[0] in own else exc.field
    usage_error(f"{field}={exc.value!r}: {exc.reason}", option)


def config_error(exc: ConfigError) -> NoReturn:
    """A ConfigError from command-line values is a usage error on the option that set it."""
    option = _option_for(exc.field)
    if option is None:
        fail(str(exc))
    option_error(exc, option)


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn BEACON errors raised inside a command into clean messages and exit codes.

    Log-format errors and other BEACON errors exit 1; config errors tied to an option exit 2.
    Unexpected exceptions propagate (a traceback is a bug report, not a user error).
    """

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except LogFormatError as exc:
            fail(str(exc))
        except ConfigError as exc:
            config_error(exc)
        except BeaconError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            # typer would exit 130 without a word; a progress display has been cleared by its
            # own context manager by now, so this line lands on a clean terminal line.
            err_console.print("interrupted", markup=False, highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                # the reader of stdout went away (| head): not a failure to report; typer's
                # handler exits 1 quietly and keeps the final flush from raising again
                raise
            fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))

    return wrapper


def one_line_warnings(fn: Callable[P, R]) -> Callable[P, R]:
    """Show Python warnings raised inside the command as one ``warning:`` line each on stderr.

    Python's own display adds the file, line number and source line of the call (an unwritable
    h-index cache printed ``.../table.py:66: RuntimeWarning: ...`` and then a line of code).
    Only the display changes: the warning filters (``-W error`` included) apply as before.
    """

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        err_console.print(
            f"[yellow]warning:[/] {escape(str(message))}", markup=True, highlight=False
        )

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with warnings.catch_warnings():
            warnings.showwarning = show
            return fn(*args, **kwargs)

    return wrapper


def options_for(
    fn: Callable[..., Any],
    values: Mapping[str, Any],
    *,
    exhaustive: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """The keyword-only arguments of ``fn`` that a command passes through unchanged.

    ``values`` is the command's ``locals()``: every keyword-only parameter of ``fn`` named like
    one of the command's options takes that option's value, so a command forwards its option
    set (e.g. the config options of ``run`` and ``submit``) without spelling it out twice.
    ``overrides`` win; a parameter with neither keeps ``fn``'s default, unless ``exhaustive``:
    then it is a TypeError (a command that lost an option is a bug, not a silent default).
    """
    names = [
        name
        for name, param in inspect.signature(fn).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    out = {name: values[name] for name in names if name in values}
    out.update(overrides)
    missing = [name for name in names if name not in out]
    if exhaustive and missing:
        raise TypeError(f"{fn.__name__}: the command has no option for {', '.join(missing)}")
    return out


def check_input_file(path: Path, argument: str) -> None:
    """A missing input file or a directory is a usage error on ``argument`` (exit 2)."""
    if not path.exists():
        usage_error(f"file {str(path)!r} does not exist", argument)
    if path.is_dir():
        usage_error(f"{str(path)!r} is a directory, not a JSONL file", argument)


def refuse_stdout_dash(path: Path | None, option: str, stdout_hint: str = "") -> None:
    """``-`` as a file to write is a usage error on ``option``: by convention it means stdout,
    and writing a file named ``-`` instead hides the result where nobody looks.
    ``stdout_hint`` says what the command offers on stdout instead, if anything."""
    if path is not None and str(path) == "-":
        usage_error(f"'-': this writes a file, not stdout; give a file name{stdout_hint}", option)


def check_output_file(path: Path, option: str, stdout_hint: str = "") -> None:
    """A file the command will write at ``path``: a usage error on ``option`` now if it cannot.

    Checked before any work. Permission bits are not enough (root passes ``os.access`` on a
    folder it cannot write in, such as ``/proc`` or a read-only mount), so the missing folders
    and the file are created as the command will create them, then removed again; an existing
    file is opened for appending and left as it is.

    ``-`` is refused: by convention it means stdout, and writing a file named ``-`` instead
    (as ``-o -`` used to) hides the result where nobody looks. ``stdout_hint`` says what the
    command offers on stdout instead, if anything.
    """
    refuse_stdout_dash(path, option, stdout_hint)
    if path.is_dir():
        usage_error(f"{str(path)!r} is a directory; give a file name in it", option)
    missing: list[Path] = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        usage_error(f"{str(path)!r}: {str(folder)!r} is not a directory", option)
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        existed = path.exists() or path.is_symlink()
        with open(path, "ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as exc:
        usage_error(f"{str(path)!r}: cannot write it ({exc.strerror or exc})", option)
    finally:
        for d in reversed(created):
            with suppress(OSError):
                d.rmdir()


_GZIP_MAGIC = b"\x1f\x8b"


def _is_gzip(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts like gzip data.

    Only regular files are peeked at: a pipe (``<(zcat log.gz)``) read here would lose the
    bytes read.
    """
    if not path.is_file():
        return False
    with suppress(OSError), open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC
    return False


def load_log(path: Path) -> LoggedRewards:
    """Load LOGGED.jsonl: a missing file is a usage error, a malformed line a failure (line no.)."""
    check_input_file(path, "LOGGED")
    try:
        with spinner(f"reading {path.name}"):
            return load_logged(path)
    except LogFormatError as exc:
        if exc.line == 1 and _is_gzip(path):
            # read as text, gzip data fails on its second byte as "not UTF-8": name the cause
            fail(
                f"{path}: gzip-compressed; logs are read as plain UTF-8 JSONL: decompress it "
                f"first (gunzip -k {shlex.quote(str(path))})"
            )
        hint = _run_output_hint(path, exc)
        if hint is not None:
            # for a repeated id the hint replaces the log error's advice ("merge the lines'
            # samples"), which is wrong for two results of beacon run
            fail(f"{path}:{exc.line}: {hint}" if exc.field == "id" else f"{exc}; {hint}")
        if exc.line == 1:
            document = _json_document(path)
            if document is not None:
                # a pretty-printed export fails on its first line as "invalid line='['"
                what, jq = document
                fail(f"{exc}; {path} holds {what}, not JSON Lines: write one prompt's object "
                     f"per line (jq -c {jq} FILE > LOG.jsonl)")
        fail(str(exc))


def _run_output_hint(path: Path, exc: LogFormatError) -> str | None:
    """What to do when the line ``exc`` names is a ``beacon run`` output line (it has a
    ``"key"``), which is a reward log (docs/bulk.md) except in two cases; None otherwise.

    A failed prompt (``"ok": false``) has no usable rewards: leave such lines out. A repeated
    id is a prompt run by two jobs (other options, factories or kwargs give other keys, and
    one ``--out`` keeps both) or two prompts given one id: merging their samples, as the log
    error suggests for a hand-made log, would mix two configurations or two prompts. The line
    is read only once the log has failed on it, so a good log costs nothing more.
    """
    if exc.line is None:
        return None
    rec: Any = None
    try:
        with path.open("r", encoding="utf-8-sig") as fh:
            for lineno, text in enumerate(fh, start=1):
                if lineno == exc.line:
                    rec = json.loads(text)
                    break
    except (OSError, ValueError):  # ValueError: invalid JSON or UTF-8
        return None
    if not (isinstance(rec, dict) and "key" in rec):
        return None
    if rec.get("ok") is False:
        return (
            f"line {exc.line} is a prompt that failed in 'beacon run' (\"ok\": false, no "
            f"rewards): leave the failed lines out (jq -c 'select(.ok)' "
            f"{shlex.quote(str(path))} > LOG.jsonl)"
        )
    if exc.field == "id":
        return (
            f"line {exc.line} is a 'beacon run' result whose id another result in this output "
            "has too: two jobs written to one --out (other options, factories or kwargs give "
            "other keys) or two prompts with one id; do not merge their samples: write each "
            "job to its own --out and give each prompt its own id"
        )
    return None


# A log that fails on its first line is parsed as one JSON document only up to this size.
_JSON_DOCUMENT_MAX_BYTES = 64 * 2**20


def _json_document(path: Path) -> tuple[str, str] | None:
    """What ``path`` holds when it is one JSON array, or one object over several lines (an
    export written with ``indent``, say), rather than JSON Lines, and the ``jq`` filter that
    turns it into JSON Lines; None otherwise. Regular files only, up to
    :data:`_JSON_DOCUMENT_MAX_BYTES` (a larger array is named without its item count); only
    a file whose first non-blank character is ``[`` or ``{`` is read whole (a CSV export or a
    header line is not)."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
        if not head.startswith((b"[", b"{")):
            return None
        if path.stat().st_size > _JSON_DOCUMENT_MAX_BYTES:
            return ("one JSON array", "'.[]'") if head.startswith(b"[") else None
        text = path.read_text(encoding="utf-8-sig")
        doc = json.loads(text)
    except (OSError, ValueError):  # ValueError: invalid JSON or UTF-8
        return None
    if isinstance(doc, list):
        return f"one JSON array of {count_noun(len(doc), 'item')}", "'.[]'"
    if isinstance(doc, dict) and "\n" in text.strip():
        return "one JSON object over several lines", "."
    return None


def _read_json(path: Path, option: str) -> Any:
    if not path.exists():
        usage_error(f"file {str(path)!r} does not exist", option)
    if path.is_dir():
        usage_error(f"{str(path)!r} is a directory, not a JSON file", option)
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        fail(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})")
    except UnicodeDecodeError:
        fail(f"{path}: not a UTF-8 text file")


def load_prior_file(
    path: Path, family: str | None = None
) -> tuple[Prior, RewardTransform | None]:
    """Read a prior file: ``{"prior": {...}, "transform": {...} | null}`` or a bare prior dict.

    The first form is what ``beacon fit-prior`` writes; the transform (if any) was fitted
    together with the prior and is returned with it. With ``family``, such a file must have
    been fitted for it (:func:`_check_prior_family`).
    """
    data = _read_json(path, "--prior")
    if not isinstance(data, dict):
        fail(f"{path}: a prior file must hold a JSON object, got {type(data).__name__}")
    tr: RewardTransform | None = None
    prior_obj: Any = data
    if "prior" in data:
        prior_obj = data["prior"]
        from beacon.fitting import check_fit_keys

        try:
            check_fit_keys(data)
        except ConfigError as exc:
            fail(f"{path}: {exc}")
        if family is not None:
            _check_prior_family(path, data, family)
        if data.get("transform") is not None:
            try:
                tr = transform_from_dict(data["transform"])
            except ConfigError as exc:
                fail(f"{path}: 'transform': {exc}")
    try:
        return prior_from_dict(prior_obj), tr
    except ConfigError as exc:
        fail(f"{path}: 'prior': {exc}")


def parse_transform(spec: str) -> RewardTransform | None:
    """``--transform``: a kind name (``logit``, ``none``) or a JSON file holding a transform.

    The file may be a bare transform (``{"kind": ...}``) or a fit-prior output
    (``{"prior": ..., "transform": {...}}``).
    """
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        data = _read_json(path, "--transform")
        if isinstance(data, dict) and "kind" not in data and "transform" in data:
            data = data["transform"]
        if data is None:
            return None
        try:
            return transform_from_dict(data)
        except ConfigError as exc:
            fail(f"{path}: {exc}")
    try:
        return make_transform(spec)
    except ConfigError as exc:
        usage_error(f"{spec!r}: {exc.reason}", "--transform")


def resolve_prior_and_transform(
    prior_path: Path | None, transform_spec: str | None, family: str | None = None
) -> tuple[Prior | None, RewardTransform | None, list[str]]:
    """The prior and transform to use, and notes saying where each came from.

    An explicit ``--transform`` (``none`` included) overrides a transform stored in the prior
    file; otherwise the stored one is used, because the prior was fitted on transformed rewards.
    ``family``: the family the prior file must have been fitted for (:func:`load_prior_file`).
    """
    notes: list[str] = []
    prior: Prior | None = None
    stored: RewardTransform | None = None
    if prior_path is not None:
        prior, stored = load_prior_file(prior_path, family)
    if transform_spec is not None:
        tr = parse_transform(transform_spec)
        if stored is not None and tr != stored:
            notes.append(f"--transform overrides the transform stored in {prior_path}")
        return prior, tr, notes
    if stored is not None:
        notes.append(f"using the {stored.kind} transform stored with the prior in {prior_path}")
    return prior, stored, notes


def build_config(**kwargs: Any) -> BeaconConfig:
    """``BeaconConfig(**kwargs)``; an invalid value is a usage error on its option."""
    try:
        return BeaconConfig(**kwargs)
    except ConfigError as exc:
        config_error(exc)


def _progress(*columns: Any) -> Progress:
    # Only on a terminal: in pipes, CI logs and CliRunner a live display is noise on stderr.
    return Progress(
        *columns, console=err_console, transient=True, disable=not err_console.is_terminal
    )


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields ``update(done, total)``."""
    with _progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ) as prog:
        task = prog.add_task(description, total=total)

        def update(done: int, new_total: int) -> None:
            prog.update(task, completed=done, total=new_total)

        yield update


@contextmanager
def spinner(description: str) -> Iterator[None]:
    """A transient spinner with elapsed time on stderr, for work of unknown length."""
    with _progress(
        SpinnerColumn(), TextColumn("[progress.description]{task.description}"), TimeElapsedColumn()
    ) as prog:
        prog.add_task(description, total=None)
        yield


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """Yields a one-element list that holds the elapsed seconds once the block ends."""
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0


# -- options shared by replay and tune -------------------------------------------------------
LoggedArg = Annotated[
    Path,
    typer.Argument(
        metavar="LOGGED",
        help="JSONL log: one line per prompt with its 'rewards' in the order drawn "
        "(optional per-sample 'correct' labels).",
        show_default=False,
    ),
]
HorizonOpt = Annotated[
    int | None,
    typer.Option(
        "--horizon",
        "-n",
        help=f"Maximum samples per prompt [default: {DEFAULT_HORIZON}, or the samples every "
        "prompt has if fewer]. Capped at the samples every prompt has.",
        show_default=False,
    ),
]
MinSamplesOpt = Annotated[
    int | None,
    typer.Option(
        "--min-samples",
        help="Leave out prompts with fewer logged samples than this (rewards; labels with "
        "--family bernoulli) [default: keep every prompt]. Best-of-N needs N samples from "
        "every prompt, so the shortest prompt kept caps the horizon.",
        show_default=False,
    ),
]
FamilyOpt = Annotated[
    str,
    typer.Option(
        "--family",
        help="Reward family: normal; bernoulli (uses the 'correct' labels as 0/1 rewards; "
        "without labels, rewards that are all 0 or 1); or judge (rewards are a judge's win "
        "probabilities, learnt as wins r > 1/2).",
    ),
]
BatchOpt = Annotated[
    int, typer.Option("--batch-size", "-b", help="Samples per decision after the first k0.")
]
RobustOpt = Annotated[
    bool,
    typer.Option(
        "--robust/--no-robust", help="Robust update: low outliers update as if they were the mean."
    ),
]
PriorOpt = Annotated[
    str | None,
    typer.Option(
        "--prior",
        help="'fit': an empirical-Bayes prior cross-fitted on the log (each fold's prompts "
        "replayed with the prior fitted on the other folds; c then in per-prompt sd units); "
        "'default' (or 'jeffreys'): the family's default prior; or a prior JSON file as "
        "written by 'beacon fit-prior' (a transform stored with it is used too).",
        show_default=False,
    ),
]
TransformOpt = Annotated[
    str | None,
    typer.Option(
        "--transform",
        help="Reward transform before the update: 'gaussianize' (fitted per fold; needs "
        "--prior fit), 'logit', 'none', or a JSON file [default with --prior fit: gaussianize "
        "for the normal family].",
        show_default=False,
    ),
]
FoldsOpt = Annotated[
    int | None,
    typer.Option(
        "--folds",
        help=f"Folds of the cross-fitting with --prior fit [default: {DEFAULT_FOLDS}; fixed seed].",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead.")]


def check_family(family: str) -> str:
    """``--family`` must name a registered reward family (usage error listing them otherwise)."""
    from beacon.families import available_families

    known = available_families()
    if family not in known:
        usage_error(
            f"{family!r} is not a reward family; choose from {', '.join(known)}", "--family"
        )
    return family


PRIOR_FIT = "fit"
PRIOR_DEFAULT = "default"
# Accepted spellings of "the family's default prior" (Jeffreys for normal, Beta(1, 1) otherwise).
_DEFAULT_PRIOR_WORDS = ("default", "jeffreys")
# Families whose prior beacon.fitting can fit.
_FIT_FAMILIES = ("normal", "bernoulli", "judge")


@dataclass(frozen=True)
class LogSetup:
    """What ``replay`` / ``tune`` run: a config, maybe a cross-fitted prior, and notes.

    ``crossfit`` is None unless ``--prior fit``; then ``config``'s own prior and transform are
    the family defaults (unused by the replay; on a log too short for the default prior, the
    fitted prior needing most samples) and costs are in per-prompt standardized units.
    """

    config: BeaconConfig
    crossfit: CrossFit | None
    notes: list[str]
    transform_spec: str  # what --prior fit fitted with: gaussianize | logit | none | a path


def prior_mode(prior: str | None, default: str) -> str:
    """``fit``, ``default`` or ``file`` for a ``--prior`` value (None: ``default``)."""
    spec = default if prior is None else prior
    if spec == PRIOR_FIT:
        return PRIOR_FIT
    if spec.lower() in _DEFAULT_PRIOR_WORDS:
        return PRIOR_DEFAULT
    return "file"


def select_prompts(
    data: LoggedRewards, family: str, min_samples: int | None
) -> tuple[LoggedRewards, list[str]]:
    """``--min-samples``: the prompts with at least that many logged samples, and a note.

    Counts are of the samples ``family`` replays (the labels for bernoulli). Leaving every
    prompt out is a usage error on ``--min-samples``.
    """
    if min_samples is None:
        return data, []
    if min_samples < 1:
        usage_error(f"{min_samples}: must be >= 1", "--min-samples")
    what = "logged samples"
    if family == "bernoulli" and data.has_labels:
        assert data.correct is not None
        # labels counted directly: for_family refuses a log with unlabelled prompts, which
        # is what --min-samples is for
        counts = np.sum(~np.isnan(data.correct), axis=1)
        what = "labelled samples"  # a prompt with rewards but no labels has 0 of them
    else:
        counts = data.for_family(family).counts
    keep = counts >= min_samples
    if not keep.any():
        usage_error(
            f"{min_samples}: no prompt in {data.source} has that many {what} (the "
            f"longest has {int(counts.max(initial=0))})",
            "--min-samples",
        )
    if keep.all():
        return data, []
    left_out = int((~keep).sum())
    note = (
        f"left out {left_out} of {data.n_prompts} prompts with fewer than {min_samples} {what} "
        "(--min-samples)"
    )
    return data.subset(np.flatnonzero(keep)), [note]


def _shortest(data: LoggedRewards) -> str:
    """``'id' (n samples)`` of the prompt with the fewest logged samples, for messages."""
    i = int(np.argmin(data.counts))
    return f"{data.ids[i]!r} ({count_noun(int(data.counts[i]), 'logged sample')})"


def _default_horizon(data: LoggedRewards) -> tuple[int, list[str]]:
    """Horizon without ``--horizon``: ``min(DEFAULT_HORIZON, samples every prompt has)``.

    When a few short prompts cap it below what the others have, a note says so and how to
    leave them out (it used to be capped silently).
    """
    horizon = min(DEFAULT_HORIZON, data.min_samples)
    want = min(DEFAULT_HORIZON, data.max_samples)
    if horizon >= want:
        return horizon, []
    short = int((data.counts < want).sum())
    return horizon, [
        f"horizon {horizon}: the shortest prompt, {_shortest(data)}, caps it (best-of-N needs "
        f"N samples from every prompt); {short} of {data.n_prompts} prompts have fewer than "
        f"{want} (--min-samples N leaves out the prompts with fewer than N samples)"
    ]


def log_setup(
    data: LoggedRewards,
    *,
    cost: float,
    horizon: int | None,
    family: str,
    batch_size: int,
    robust: bool,
    prior: str | None,
    transform: str | None,
    folds: int | None,
    default_prior: str = PRIOR_DEFAULT,
) -> LogSetup:
    """Resolve ``--prior`` / ``--transform`` / ``--folds`` into what replay/tune run.

    Without ``--horizon`` the horizon is ``min(DEFAULT_HORIZON, samples every prompt has)``;
    the notes say what was resolved (a prior file's transform, for one).

    ``--prior fit`` cross-fits (:func:`beacon.evaluation.cross_fit`, ``--folds`` folds, fixed
    seed); its transform defaults to ``gaussianize`` for ``normal`` and ``none`` otherwise.
    ``--prior default|jeffreys`` is the family default; anything else is a prior file.
    Bad values are usage errors naming the option and the value.
    """
    check_family(family)
    mode = prior_mode(prior, default_prior)
    notes: list[str] = []
    if mode == "file" and not Path(str(prior)).exists():
        usage_error(
            f"file {prior!r} does not exist (and {prior!r} is not {PRIOR_FIT}, "
            f"{' or '.join(_DEFAULT_PRIOR_WORDS)})",
            "--prior",
        )
    if mode == PRIOR_FIT:
        fitted_with, spec, k = _fit_options(data, family, transform, folds, prior is not None)
        if k < DEFAULT_FOLDS and folds is None:
            notes.append(
                f"cross-fitting on {k} folds of one prompt each: the log has fewer prompts than "
                f"the default {DEFAULT_FOLDS} folds"
            )
    else:
        if folds is not None:
            usage_error(f"{folds}: --folds is only used with --prior fit", "--folds")
        if transform is not None and transform == "gaussianize":
            usage_error(
                "'gaussianize' is fitted from the log: use it with --prior fit (cross-fitted), "
                "or pass the JSON file written by 'beacon fit-prior --transform gaussianize'",
                "--transform",
            )
        spec = "none" if transform is None else transform
    # With --prior fit the config keeps the family defaults: each fold's fit replaces them.
    prior_obj, tr, resolved = resolve_prior_and_transform(
        None if mode in (PRIOR_FIT, PRIOR_DEFAULT) else Path(str(prior)),
        None if mode == PRIOR_FIT else transform,
        family,
    )
    notes += resolved
    fam_data = data.for_family(family)  # a bernoulli log without 0/1 labels fails here
    if family == "normal" and data.is_binary:
        notes = [
            *notes,
            "every reward is 0 or 1 (a verifier's pass/fail?): --family bernoulli models "
            "them exactly (Beta-Bernoulli, stops at the first pass)",
        ]
    fields: dict[str, Any] = {
        "cost": cost,
        "family": family,
        "batch_size": batch_size,
        "robust": robust,
        "prior": prior_obj,
        "transform": tr,
    }
    cf: CrossFit | None = None
    if mode == PRIOR_FIT:
        build_config(horizon=DEFAULT_HORIZON, **fields)  # --cost & co. before the fit
        try:
            with spinner(f"fitting the prior on {k} folds"):
                cf = cross_fit(data, family, fitted_with, k)
        except LogFormatError:
            raise
        except ConfigError as exc:
            # e.g. rewards without variation: say that it is the fit (the default of tune, not
            # asked for by name) that failed, and how to run without it
            with_tr = "" if spec == "none" else f" (--transform {spec})"
            fail(
                f"{data.source}: --prior fit{with_tr} cannot fit a prior on this log: {exc}; "
                "use --prior default (or a prior file)"
            )

    def make(h: int) -> BeaconConfig:
        try:
            return BeaconConfig(horizon=h, **fields)
        except ConfigError as exc:
            if exc.field == "transform" and transform is not None:
                # the family refuses the transform: name it as typed (a kind or a file), not
                # as the object loaded from it
                usage_error(f"{transform!r}: {exc.reason}", "--transform")
            if exc.field != "horizon" or cf is None:
                raise
        # The fitted priors (k0 <= 1), not the family default the config keeps, are replayed:
        # a log too short for the default (Jeffreys needs 4 samples) runs with the fitted prior
        # that needs the most samples as the config's own (unused) prior.
        fit = max(cf.fits, key=lambda f: rewards_before_first_decision(f.prior))
        return BeaconConfig(horizon=h, **{**fields, "prior": fit.prior, "transform": fit.transform})

    if horizon is None:
        horizon, horizon_notes = _default_horizon(fam_data)
        notes = notes + horizon_notes
        try:
            cfg = make(horizon)
        except ConfigError as exc:
            if exc.field != "horizon":
                config_error(exc)
            # the log, not an option, set this horizon: say which prompt and what to do
            need = make(DEFAULT_HORIZON).k0 + 1
            if fam_data.max_samples >= need:
                todo = f"--min-samples {need} leaves such prompts out"
            else:
                todo = f"no prompt has that many (the longest has {fam_data.max_samples})"
                # a fitted prior has k0 <= 1: it needs 2 samples, which a log of single
                # samples does not have either (--prior fit then fails too)
                if mode != PRIOR_FIT and family in _FIT_FAMILIES and fam_data.max_samples >= 2:
                    todo += "; a fitted prior needs fewer (--prior fit)"
            usage_error(
                f"the shortest prompt in {data.source}, {_shortest(fam_data)}, has fewer "
                f"than the {need} (k0 + 1) this prior needs before its first decision: {todo}",
                "--min-samples",
            )
    else:
        try:
            cfg = make(horizon)
        except ConfigError as exc:
            config_error(exc)
    if cf is None:
        return LogSetup(cfg, None, notes + scale_note(fam_data, cfg), spec)
    return LogSetup(cfg, cf, notes, spec)


def _check_prior_family(path: Path, data: dict[str, Any], family: str) -> None:
    """A prior file from ``fit-prior`` (``data``, read from ``path``) is for the family it
    names in ``fitted_on.family``.

    The judge and bernoulli families share the Beta prior, so the prior alone cannot tell
    them apart: a judge prior (wins ``r > 1/2`` of probabilities) replayed as ``--family
    bernoulli`` (correctness labels), or the reverse, ran silently with another quantity's
    prior, and a judge prior without ``--family`` failed as "the normal family needs an
    NIGPrior". Now a usage error on ``--prior`` naming the family to pass.
    """
    fitted = data.get("fitted_on")
    fam = fitted.get("family") if isinstance(fitted, dict) else None
    if isinstance(fam, str) and fam != family:
        usage_error(
            f"{str(path)!r} holds a prior fitted for the {fam} family (its fitted_on.family), "
            f"not for {family}: pass --family {fam}",
            "--prior",
        )


def scale_note(data: LoggedRewards, cfg: BeaconConfig, what: str = "") -> list[str]:
    """A note when the rewards' spread is below what the normal family resolves.

    The family floors its posterior scale at ``SIGMA_FLOOR`` (1e-6), so with a typical
    within-prompt sd under 10 times that the rule weighs ``c`` against the floor, not the
    spread (a ``c`` on the rewards' scale samples every prompt to the horizon). ``what``
    names the variant for tune's baseline.
    """
    if cfg.family != "normal":
        return []
    from beacon.families.normal import SIGMA_FLOOR

    try:
        x = data.rewards if cfg.transform is None else cfg.transform.apply(data.rewards)
    except RewardError:
        return []  # outside the transform's domain: the replay reports it, naming the prompt
    # over: rewards beyond 1e154 overflow the squares (sd inf, dropped below); the replay then
    # rejects them with a message naming the prompt, and a numpy warning would only be noise.
    with np.errstate(invalid="ignore", over="ignore"):
        sd = np.nanstd(x, axis=1)
    sd = sd[np.isfinite(sd) & (sd > 0)]
    if sd.size == 0 or float(np.median(sd)) >= 10 * SIGMA_FLOOR:
        return []
    return [
        f"{what}the rewards' typical within-prompt sd is {float(np.median(sd)):.3g}, below what "
        f"the normal model resolves (its posterior scale is floored at {SIGMA_FLOOR:g}), so it "
        "weighs c against that floor instead of the rewards' spread; multiply the rewards "
        "(and c) by a constant, or use --prior fit (its gaussianize transform does not depend "
        "on the scale)"
    ]


def _fit_options(
    data: LoggedRewards,
    family: str,
    transform: str | None,
    folds: int | None,
    prior_given: bool = True,
) -> tuple[str | RewardTransform | None, str, int]:
    """Check ``--family`` / ``--transform`` / ``--folds`` for ``--prior fit``.

    Returns what :func:`beacon.evaluation.cross_fit` fits with (a kind or a transform loaded
    from JSON), the ``--transform`` spelling, and the number of folds. ``prior_given``: ``fit``
    came from the command line, not the command's default (a log too small to fit a prior on
    is then not a bad ``--prior``).
    """
    if family not in _FIT_FAMILIES:
        usage_error(
            f"{family!r}: --prior fit supports the {', '.join(_FIT_FAMILIES)} families", "--family"
        )
    spec = transform if transform is not None else ("gaussianize" if family == "normal" else "none")
    if spec == "identity":
        spec = "none"  # the spelling replay, tune and fit-prior accept without --prior fit
    fitted_with: str | RewardTransform | None
    if spec in FIT_TRANSFORMS:
        fitted_with = spec
    elif spec.endswith(".json") or Path(spec).is_file():
        fitted_with = parse_transform(spec)
    else:
        usage_error(
            f"{spec!r}: choose from {', '.join(FIT_TRANSFORMS)} or a transform JSON file",
            "--transform",
        )
    if family != "normal" and spec != "none":
        usage_error(f"{spec!r}: the {family} family takes raw rewards", "--transform")
    n_prompts = data.for_family(family).n_prompts
    if n_prompts < 3:
        why = (
            f"{data.source} has {count_noun(n_prompts, 'prompt')}, too few to fit a prior: "
            "--prior fit cross-fits each prompt's prior on the other prompts and needs at least "
            "3 (2 besides the one replayed); add prompts to the log, or pass --prior jeffreys "
            "(the paper's default prior, also spelled --prior default) or a prior file"
        )
        if not prior_given:  # the command's default: nothing the user wrote is wrong
            fail(f"{why} (--prior fit is this command's default for the {family} family)")
        usage_error(why, "--prior")
    # Without --folds a log of fewer prompts than the default folds is cross-fitted leave-one-out.
    k = min(DEFAULT_FOLDS, n_prompts) if folds is None else folds
    if not 2 <= k <= n_prompts:
        usage_error(f"{k}: need 2 <= folds <= {n_prompts} (the prompts in the log)", "--folds")
    return fitted_with, spec, k


def horizon_note(requested: int | None, cfg: BeaconConfig, data: LoggedRewards) -> list[str]:
    """Say so when the horizon was capped at the samples every prompt has."""
    if requested is None:
        return []
    short = int((data.counts < requested).sum())
    if short == data.n_prompts:
        # --min-samples {requested} would leave out every prompt: no advice to give
        return [
            f"horizon capped at {cfg.horizon} (asked for {requested}): no prompt has "
            f"{requested} logged samples (the longest has {data.max_samples}, the shortest "
            f"{data.min_samples}; best-of-N needs N samples from every prompt)"
        ]
    return [
        f"horizon capped at {cfg.horizon} (asked for {requested}): {short} of {data.n_prompts} "
        f"prompts have fewer than {requested} logged samples (the shortest has "
        f"{data.min_samples}), and best-of-N needs N samples from every prompt: "
        f"--min-samples {requested} leaves them out"
    ]


def echo_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout, a non-finite number (no JSON form) as null.

    ``json.dumps`` would write ``NaN`` / ``-Infinity``, which strict parsers reject.
    """
    strict = json.loads(json.dumps(obj), parse_constant=lambda _: None)
    typer.echo(json.dumps(strict, indent=2, allow_nan=False))


def print_table(table: Table) -> None:
    """Print ``table`` on stdout with every cell whole.

    On a terminal (or ``$COLUMNS``) narrower than the table, rich shrinks the columns and cuts
    their numbers to ``0.…``; the table is then laid out at its natural width instead, and the
    terminal wraps the long lines.
    """
    natural = Measurement.get(out_console, out_console.options.update_width(1 << 20), table)
    if natural.maximum > out_console.width:
        table.width = natural.maximum
    out_console.print(table)


def print_notes(notes: list[str]) -> None:
    for n in notes:
        err_console.print(f"[yellow]note:[/] {escape(n)}", markup=True, highlight=False)


def fmt(x: float | None, digits: int = 3, scale: float | None = None, sign: bool = False) -> str:
    """A metric for a table cell ('-' for None), ``digits`` decimals (``sign``: always signed).

    ``scale`` is the size of the raw rewards ``x`` is (or is a difference of): outside
    [0.01, 1e6) fixed decimals would print 0.000 or a dozen digits, so ``x`` gets 4
    significant digits instead.
    """
    if x is None:
        return "-"
    plus = "+" if sign else ""
    if scale is not None and scale != 0 and not 1e-2 <= abs(scale) < 1e6:
        return f"{x:{plus}.4g}"
    return f"{x:{plus}.{digits}f}"


def reward_scale(fixed: Sequence[PolicyMetrics]) -> float:
    """The size of a log's raw rewards for :func:`fmt`: the largest mean best-of-N reward."""
    return max(abs(m.mean_best_reward) for m in fixed)


def warm_up(data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None = None) -> None:
    """Load (or build) the h-index table(s) and compile the replay kernels under a spinner.

    The first run on a machine compiles the numba kernels and may build a table (one per fitted
    prior with ``crossfit``: the table depends on ``(alpha0, nu0)``); without this the sweep's
    progress bar would sit at 0 for that long with no explanation.
    """
    from beacon.replay import replay

    fam = data.for_family(cfg.family)
    horizon = min(cfg.horizon, fam.min_samples)
    cfgs = [cfg]
    if crossfit is not None:
        cfgs = [crossfit.fold_config(f, cfg) for f in range(crossfit.n_folds)]
    what = "table" if len(cfgs) == 1 else f"tables of the {len(cfgs)} fitted priors"
    with spinner(f"loading the h-index {what} (n={horizon}); the first run compiles kernels"):
        for c in cfgs:
            try:
                replay(fam.rewards[:1, :horizon], c.replace(horizon=max(horizon, c.k0 + 1)))
            except RewardError as exc:
                # row 0 of the one-row array is the log's first prompt: name it by its id
                raise name_reward_error(fam, exc) from exc
