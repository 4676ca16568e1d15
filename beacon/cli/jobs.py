"""``beacon run | submit | status | collect | worker``: bulk jobs, in-process or on Celery.

``run`` is the default, no-server path (:mod:`beacon.jobs.local`); ``submit`` / ``status`` /
``collect`` / ``worker`` drive the Celery tier (``worker/``). Celery and redis are imported
inside the commands only, so ``beacon --help`` stays fast.

Exit codes: 0 every prompt done and ok; 1 some prompts failed (in this run, or kept failed from
an earlier run by ``--no-retry-failed``), the run was interrupted (rerun to resume), a job is
unfinished, or the prompts file cannot make a job (no prompt in it, two different prompts with
one id: refused before any model call); 2 usage error (bad option, missing file, unknown job).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import shlex
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from beacon.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    build_config,
    check_family,
    check_input_file,
    check_output_file,
    err_console,
    fail,
    guarded,
    one_line_warnings,
    option_error,
    options_for,
    out_console,
    print_notes,
    refuse_stdout_dash,
    resolve_prior_and_transform,
    usage_error,
)
from beacon.config import BeaconConfig
from beacon.errors import ConfigError
from beacon.jobs.spec import FactorySpec, JobInputError, JobSpec, parse_allow_list

if TYPE_CHECKING:
    from beacon.jobs.local import JobSummary

__all__ = ["build_job_spec", "register"]

# -- shared options -------------------------------------------------------------------------------
PromptsArg = Annotated[
    Path,
    typer.Argument(
        metavar="PROMPTS",
        help="JSONL file, one prompt per line: "
        '{"id": ..., "prompt": ..., "reference": ..., "metadata": {...}}.',
        show_default=False,
    ),
]
GeneratorOpt = Annotated[
    str,
    typer.Option(
        "--generator", "-g", help="Generator factory 'package.module:factory'.", show_default=False
    ),
]
ScorerOpt = Annotated[
    str,
    typer.Option(
        "--scorer", "-s", help="Scorer factory 'package.module:factory'.", show_default=False
    ),
]
GenKwOpt = Annotated[
    str | None,
    typer.Option(
        "--generator-kwargs",
        help="JSON object (or @file.json) of keyword arguments for the generator factory.",
        show_default=False,
    ),
]
ScoKwOpt = Annotated[
    str | None,
    typer.Option(
        "--scorer-kwargs",
        help="JSON object (or @file.json) of keyword arguments for the scorer factory.",
        show_default=False,
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="BeaconConfig JSON (BeaconConfig.to_dict()); the options below override its fields.",
        show_default=False,
    ),
]
CostOpt = Annotated[
    float | None,
    typer.Option(
        "--cost",
        "-c",
        help="Cost c per sample in (transformed) reward units [default: 0.1].",
        show_default=False,
    ),
]
HorizonOpt = Annotated[
    int | None,
    typer.Option(
        "--horizon", "-n", help="Maximum samples per prompt [default: 32].", show_default=False
    ),
]
FamilyOpt = Annotated[
    str | None,
    typer.Option(
        "--family",
        help="Reward family: normal, bernoulli (0/1 rewards) or judge (a judge's win "
        "probabilities, learnt as wins r > 1/2) [default: normal].",
        show_default=False,
    ),
]
BatchOpt = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        help="Samples per decision after the first k0 [default: 1].",
        show_default=False,
    ),
]
RobustOpt = Annotated[
    bool | None,
    typer.Option(
        "--robust/--no-robust",
        help="Robust update of low outliers [default: on].",
        show_default=False,
    ),
]
PriorOpt = Annotated[
    Path | None,
    typer.Option(
        "--prior",
        help="Prior JSON (from 'beacon fit-prior'); a transform stored with it is used too.",
        show_default=False,
    ),
]
TransformOpt = Annotated[
    str | None,
    typer.Option(
        "--transform", help="Reward transform: 'logit', 'none', or a JSON file.", show_default=False
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout", min=0,
        help="Seconds per model/scorer call attempt; 0: no limit [default: 60].",
        show_default=False
    ),
]
AttemptsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-attempts",
        help="Attempts per call, retries with backoff included [default: 3].",
        show_default=False,
    ),
]
MaxRetryAfterOpt = Annotated[
    float | None,
    typer.Option(
        "--max-retry-after",
        help="Longest server Retry-After (seconds) waited for before a retry; a call asked to "
        "wait longer fails [default: 60].",
        show_default=False,
    ),
]
MaxSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--max-seconds",
        help="Wall-time cap per prompt; stops with 'budget' and keeps the best so far.",
        show_default=False,
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens", help="Token cap per prompt (as reported by the model).", show_default=False
    ),
]
CandidatesOpt = Annotated[
    bool, typer.Option("--candidates", help="Write every candidate and its reward to the output.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON summary.")]
OutOpt = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Output JSONL (one line per prompt; existing lines are kept and skipped).",
        show_default=False,
    ),
]
DpoOpt = Annotated[
    Path | None,
    typer.Option(
        "--dpo",
        help="DPO pairs JSONL (prompt, chosen, rejected, margin); "
        "prompts whose rewards are all equal are skipped.",
        show_default=False,
    ),
]


def _kwargs(text: str | None, option: str) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    src = text
    if text.startswith("@"):
        p = Path(text[1:])
        if p.is_dir():
            usage_error(f"{str(p)!r} is a directory, not a JSON file", option)
        if not p.is_file():
            usage_error(f"file {str(p)!r} does not exist", option)
        try:
            src = p.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError:  # a binary file given by mistake: was a bare traceback
            usage_error(f"file {str(p)!r} is not a UTF-8 text file", option)
    try:
        data = json.loads(src)
    except json.JSONDecodeError as exc:
        usage_error(f"not valid JSON ({exc.msg}, column {exc.colno}): {text[:80]!r}", option)
    if not isinstance(data, dict):
        usage_error(f"must be a JSON object, got {type(data).__name__}", option)
    return data


def _factory(path: str, kwargs: dict[str, Any], option: str) -> FactorySpec:
    try:
        return FactorySpec(path, kwargs)
    except JobInputError as exc:
        option_error(exc, option if exc.field == "factory" else f"{option}-kwargs")


_JOB_PARTS = ("generator", "scorer", "sampling", "keep_candidates")


def _base_config(path: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config fields of the ``--config`` file, and the other parts of a job spec given
    there (``generator``, ``scorer``, ``sampling``, ``keep_candidates``; empty for a config)."""
    if path is None:
        return {}, {}
    if path.is_dir():
        usage_error(f"{str(path)!r} is a directory, not a JSON file", "--config")
    if not path.is_file():
        usage_error(f"file {str(path)!r} does not exist", "--config")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        fail(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})")
    except UnicodeDecodeError:  # a binary file given by mistake: was a bare traceback
        fail(f"{path}: not a UTF-8 text file")
    if isinstance(data, dict) and "prior" in data and "fitted_on" in data:
        # fit-prior's output, given to the wrong option: it used to fail on 'fitted_on' as an
        # unknown config field, which does not say what to do
        usage_error(
            f"{str(path)!r} is a prior file (written by beacon fit-prior), not a config: "
            f"pass it as --prior {shlex.quote(str(path))}",
            "--config",
        )
    job: dict[str, Any] = {}
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        job = {k: data[k] for k in _JOB_PARTS if k in data}
        data = data["config"]  # a job spec or a result's config block
    if not isinstance(data, dict):
        fail(f"{path}: a config file must hold a JSON object")
    try:
        return BeaconConfig.from_dict(data).to_dict(), job
    except ConfigError as exc:
        fail(f"{path}: {exc}")


def _check_job_parts(path: Path | None, job: Mapping[str, Any], gen: FactorySpec,
                     sco: FactorySpec, sampling: Mapping[str, Any], candidates: bool) -> None:
    """A job spec given as ``--config`` (``JobSpec.to_dict()``): only its ``config`` is read,
    so a part of it that differs from the command's own options is a usage error naming it.
    Dropped silently, its budget caps (``max_cost`` with prices, ``max_tokens``...) went
    unenforced, its factory kwargs and ``keep_candidates`` unused, with no word said."""
    ignored: list[str] = []
    for role, built in (("generator", gen), ("scorer", sco)):
        if role in job:
            try:
                same = FactorySpec.from_dict(job[role], field_name=role) == built
            except JobInputError:
                same = False
            if not same:
                ignored.append(f"{role} {json.dumps(job[role])}")
    sampling_in = job.get("sampling")
    theirs = dict(sampling_in) if isinstance(sampling_in, Mapping) else {"sampling": sampling_in}
    lost = {k: v for k, v in theirs.items() if v is not None and sampling.get(k) != v}
    if lost:
        ignored.append(f"sampling {json.dumps(lost, default=repr)}")
    if job.get("keep_candidates") is True and not candidates:
        ignored.append("keep_candidates true")
    if ignored:
        usage_error(
            f"{str(path)!r} is a job spec; --config reads only its 'config', and its "
            f"{'; '.join(ignored)} would be ignored: give them as options (-g/-s, "
            "--generator-kwargs/--scorer-kwargs, --max-seconds, --max-tokens, --timeout, "
            "--max-attempts, --max-retry-after, --candidates), or run the spec from Python "
            "(run_job(prompts, JobSpec.from_dict(...), out), which takes every sampling "
            "option, max_cost and prices included)",
            "--config",
        )


def build_job_spec(
    *,
    generator: str,
    scorer: str,
    generator_kwargs: str | None = None,
    scorer_kwargs: str | None = None,
    config: Path | None = None,
    cost: float | None = None,
    horizon: int | None = None,
    family: str | None = None,
    batch_size: int | None = None,
    robust: bool | None = None,
    prior: Path | None = None,
    transform: str | None = None,
    timeout: float | None = None,
    max_attempts: int | None = None,
    max_retry_after: float | None = None,
    max_seconds: float | None = None,
    max_tokens: int | None = None,
    candidates: bool = False,
) -> tuple[JobSpec, list[str]]:
    """The :class:`JobSpec` of the command-line options (usage errors exit 2)."""
    gen = _factory(generator, _kwargs(generator_kwargs, "--generator-kwargs"), "--generator")
    sco = _factory(scorer, _kwargs(scorer_kwargs, "--scorer-kwargs"), "--scorer")
    fields, job_parts = _base_config(config)
    if family is not None:
        fields["family"] = check_family(family)
    for name, v in (
        ("cost", cost),
        ("horizon", horizon),
        ("batch_size", batch_size),
        ("robust", robust),
    ):
        if v is not None:
            fields[name] = v
    pr, tr, notes = resolve_prior_and_transform(prior, transform,
                                                str(fields.get("family", "normal")))
    if pr is not None:
        fields["prior"] = pr
    if tr is not None or transform is not None:
        fields["transform"] = tr
    if isinstance(fields.get("prior"), dict):
        from beacon.priors import prior_from_dict

        fields["prior"] = prior_from_dict(fields["prior"])
    cfg = build_config(**fields)
    sampling: dict[str, Any] = {}
    for name, v in (
        ("timeout", timeout),
        ("max_attempts", max_attempts),
        ("max_retry_after", max_retry_after),
        ("max_seconds", max_seconds),
        ("max_tokens", max_tokens),
    ):
        if v is not None:
            sampling[name] = v
    try:
        spec = JobSpec(gen, sco, cfg, sampling, keep_candidates=candidates)
    except JobInputError as exc:
        opt = "--" + exc.field.split(".")[-1].replace("_", "-")
        option_error(exc, opt)
    _check_job_parts(config, job_parts, gen, sco, spec.sampling, candidates)
    return spec, notes


def _job_spec(options: Mapping[str, Any]) -> JobSpec:
    """The job spec of a command's options (its ``locals()``); prints the notes on stderr."""
    spec, notes = build_job_spec(**options_for(build_job_spec, options, exhaustive=True))
    print_notes(notes)
    return spec


def _check_outputs(prompts: Path, out: Path, dpo: Path | None) -> None:
    refuse_stdout_dash(out, "--out")
    refuse_stdout_dash(dpo, "--dpo")
    paths = [p.resolve() for p in (prompts, out, *([dpo] if dpo else []))]
    if len(set(paths)) != len(paths):
        usage_error("PROMPTS, --out and --dpo must be three different files", "--out")
    from beacon.jobs.local import check_path, check_prompts_text

    for path, option in ((prompts, "PROMPTS"), (out, "--out"), (dpo, "--dpo")):
        if path is not None:
            try:
                check_path(option, path)  # what run_job itself refuses, as a usage error
                if path is prompts:
                    check_prompts_text(path, option)  # a .jsonl.gz, a UTF-16 export
            except JobInputError as exc:
                usage_error(f"{str(path)!r} {exc.reason}", option)


def _check_collect_files(out: Path, dpo: Path | None) -> None:
    for path, option in ((out, "--out"), (dpo, "--dpo")):
        refuse_stdout_dash(path, option)
        if path is not None and path.is_dir():
            usage_error(f"{str(path)!r} is a directory; give a JSONL file path", option)
    if dpo is not None and dpo.resolve() == out.resolve():
        usage_error("--out and --dpo must be different files", "--dpo")


def _local_allow_list(spec: JobSpec) -> tuple[str, ...]:
    # The command line names the job's own factories (trusted: the user typed them); a prompt
    # line may only override them with modules allowed here, so a prompts file from elsewhere
    # cannot make `beacon run` import arbitrary code.
    allowed = parse_allow_list(os.environ.get("BEACON_ALLOWED_FACTORIES"))
    return (*allowed, spec.generator.module, spec.scorer.module)


def _summary_line(counts: dict[str, Any], reasons: Counter[str]) -> str:
    done, failed, skipped = counts["done"], counts["failed"], counts["skipped"]
    samples = counts["samples"]
    per = f" ({samples / done:.2f} per ok prompt)" if done else ""
    rs = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "-"
    extra = "".join(
        f", {counts[name]} {label}"
        for name, label in (
            ("kept_failed", "failed earlier and kept (--no-retry-failed)"),
            ("duplicates", "duplicate line(s)"),
            ("dpo_rebuilt", "DPO pair(s) rebuilt from kept candidates"),
            ("dpo_rerun", "rerun for their missing DPO pair"),
            ("dpo_missing", "left without their DPO pair (--no-dpo-rerun)"),
        )
        if counts[name]
    )
    return (
        f"{done} ok, {failed} failed, {skipped} skipped (already done){extra}; {samples} "
        f"samples{per}; stop reasons: {rs}; {counts['elapsed']:.1f} s"
    )


def _factory_option(role: str, fs: FactorySpec, exc: ConfigError) -> str:
    """The option to blame for a job-level factory that cannot be built."""
    if exc.field == f"{role}.kwargs" or exc.field in fs.kwargs:
        return f"--{role}-kwargs"
    return f"--{role}"


def _check_demo_family(scorer: Any, family: str, prompts: Any) -> None:
    """The offline demo reward model with a family its rewards do not fit: a usage error on
    ``--family`` before any prompt runs. Its rewards are continuous draws (any real number),
    which the bernoulli family (0/1) and the judge family (probabilities in [0, 1]) refuse:
    every prompt failed, one by one, with a reward error.

    Only when some prompt of the file uses the job's scorer: a file whose every line names
    its own scorer (``"scorer": "beacon.demo:verifier"``) runs. The file is read up to its
    first such prompt (the first line, for a file without overrides)."""
    from beacon.demo import DemoScorer
    from beacon.jobs.spec import PromptRecord, iter_prompt_file

    if isinstance(scorer, DemoScorer) and family not in DemoScorer.families:
        if isinstance(prompts, str | Path) and not any(
            isinstance(r, PromptRecord) and r.scorer is None for r in iter_prompt_file(prompts)
        ):
            return
        usage_error(
            f"{family!r}: beacon.demo:scorer gives continuous rewards, which only the normal "
            "family takes; use --family normal, or for 0/1 rewards --scorer "
            "beacon.demo:verifier (prompts with a 'reference' answer)",
            "--family",
        )


def _check_has_prompts(prompts: Path) -> None:
    """An input without a single prompt line is an error (exit 1, as ``replay`` on an empty
    log), not a run that reports 0 ok and 0 failed and exits 0: an empty or truncated export
    must not pass for a finished job. Reads up to the first non-blank line only."""
    from beacon.jobs.spec import is_blank_line, open_prompt_file

    with open_prompt_file(prompts) as fh:
        if any(not is_blank_line(text) for text in fh):
            return
    fail(f"{prompts}: holds no prompt (the file is empty or has only blank lines)")


async def _run_local(
    prompts: Path, spec: JobSpec, out: Path, *, allowed: tuple[str, ...],
    call_concurrency: int, offload_sync: bool, **kwargs: Any,
) -> JobSummary:
    """``arun_job`` with the job's own factories built first, once, in the loop that uses them.

    A factory that cannot be built is a usage error on its option (exit 2) before any prompt
    runs. The objects built are the ones every prompt uses, closed at the end: a factory is
    never called twice (a second HTTP session left unclosed, a local model loaded twice). The
    factories typed on the command line are trusted: a name their module re-exports from
    another package, or a ``functools.partial``, is built although the allow-list (which
    guards the factories named by prompt lines) would refuse it.
    """
    from beacon.jobs.execute import FactoryCache, PromptExecutor
    from beacon.jobs.local import arun_job

    cache = FactoryCache(allowed, trusted=(spec.generator.factory, spec.scorer.factory))
    ex = PromptExecutor(spec, allowed=allowed, call_concurrency=call_concurrency, cache=cache,
                        offload_sync=offload_sync)
    try:
        for role, fs in (("generator", spec.generator), ("scorer", spec.scorer)):
            try:
                built = cache.get(fs, role)
            except ConfigError as exc:
                option_error(exc, _factory_option(role, fs, exc))
            if role == "scorer":
                _check_demo_family(built, spec.config.family, prompts)
        return await arun_job(prompts, spec, out, allowed=allowed,
                              call_concurrency=call_concurrency, executor=ex, **kwargs)
    finally:
        await ex.aclose()


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM (``docker stop``, ``kubectl delete``, systemd) interrupts the run as Ctrl-C does:
    the prompts in flight are cancelled, the summary and the resume hint are printed. By
    default it killed the process on the spot, without either."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def as_sigint(signum: int, frame: Any) -> None:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # SIGINT ignored (a background job of a non-interactive shell): raising it would do
            # nothing, and SIGTERM would be ignored too
            raise KeyboardInterrupt
        signal.raise_signal(signal.SIGINT)  # what asyncio.run does on Ctrl-C follows

    signal.signal(signal.SIGTERM, as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- beacon run ------------------------------------------------------------------------------------
@guarded
@one_line_warnings
def run_command(
    prompts: PromptsArg,
    generator: GeneratorOpt,
    scorer: ScorerOpt,
    out: OutOpt,
    dpo: DpoOpt = None,
    generator_kwargs: GenKwOpt = None,
    scorer_kwargs: ScoKwOpt = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    horizon: HorizonOpt = None,
    family: FamilyOpt = None,
    batch_size: BatchOpt = None,
    robust: RobustOpt = None,
    prior: PriorOpt = None,
    transform: TransformOpt = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-j", min=1, help="Prompts in progress at once.")
    ] = 16,
    call_concurrency: Annotated[
        int,
        typer.Option(
            "--call-concurrency",
            min=1,
            help="Model and scorer calls in flight at once, over all prompts.",
        ),
    ] = 64,
    threads: Annotated[
        bool,
        typer.Option(
            "--threads",
            help="Call a synchronous generator/scorer in worker threads (up to "
            "--call-concurrency at once): prompts run concurrently and --timeout applies. "
            "The client must be thread-safe; without it sync calls run one at a time.",
        ),
    ] = False,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    max_retry_after: MaxRetryAfterOpt = None,
    max_seconds: MaxSecondsOpt = None,
    max_tokens: MaxTokensOpt = None,
    candidates: CandidatesOpt = False,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed/--no-retry-failed", help="Rerun prompts whose earlier line failed."
        ),
    ] = True,
    dpo_rerun: Annotated[
        bool,
        typer.Option(
            "--dpo-rerun/--no-dpo-rerun",
            help="With --dpo on an existing --out: rerun (paid model calls) the prompts whose "
            "DPO pair is missing and cannot be rebuilt because their lines kept no candidates. "
            "--no-dpo-rerun leaves them without a pair (counted as dpo_missing).",
        ),
    ] = True,
    fsync: Annotated[
        bool, typer.Option("--fsync/--no-fsync", help="Sync every output line to disk.")
    ] = True,
    warm_start: Annotated[
        bool,
        typer.Option(
            "--warm-start",
            help="Refit the prior from this job's finished prompts as it runs (after "
            "--warm-start-min prompts, then each time their count doubles); each output line "
            "names the prior it ran with.",
        ),
    ] = False,
    warm_start_min: Annotated[
        int,
        typer.Option("--warm-start-min", min=2, help="Finished prompts before the first refit."),
    ] = 20,
    warm_start_transform: Annotated[
        str | None,
        typer.Option(
            "--warm-start-transform",
            help="'gaussianize': each refit also fits the Gaussianizing transform (normal "
            "family; the cost keeps its raw-reward meaning).",
            show_default=False,
        ),
    ] = None,
    warm_start_wait: Annotated[
        bool,
        typer.Option(
            "--warm-start-wait",
            help="Start no prompt while a refit is pending (with -j 1 the output then does "
            "not depend on timing).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run BEACON on every prompt of PROMPTS in this process (no server needed).

    Writes one line per prompt to --out as it finishes (best response, reward, samples used,
    stop reason, usage, error) and DPO pairs to --dpo. Resumable: rerun the same command after
    Ctrl-C or a crash and finished prompts are skipped; no line is ever written twice.
    """
    from beacon.jobs.local import JobProgress
    from beacon.jobs.warm_start import WarmStart

    if str(prompts) == "-" and not prompts.exists():
        usage_error("prompts cannot be read from stdin (a job reads its file more than once: "
                    "to count the prompts, to resume); save them to a file", "PROMPTS")
    check_input_file(prompts, "PROMPTS")
    _check_outputs(prompts, out, dpo)
    # an output that cannot be written is a usage error (exit 2) before anything is built
    check_output_file(out, "--out")
    if dpo is not None:
        check_output_file(dpo, "--dpo")
    spec = _job_spec(locals())
    _check_has_prompts(prompts)
    ws = None
    if warm_start_transform is not None and not warm_start:
        usage_error("--warm-start-transform needs --warm-start", "--warm-start-transform")
    if not dpo_rerun and dpo is None:
        usage_error("--no-dpo-rerun needs --dpo", "--no-dpo-rerun")
    if warm_start_wait and not warm_start:
        usage_error("--warm-start-wait needs --warm-start", "--warm-start-wait")
    if warm_start:
        from beacon.jobs.warm_start import WarmStarter

        try:
            ws = WarmStart(min_prompts=warm_start_min, transform=warm_start_transform,
                           wait=warm_start_wait)
            WarmStarter(ws, spec.config)  # checks family and transform before any prompt runs
        except ConfigError as exc:
            # a bad transform is --warm-start-transform's, named by its own value
            if exc.field.split(".")[-1] == "transform":
                usage_error(f"{exc.value!r}: {exc.reason}", "--warm-start-transform")
            option_error(exc, "--warm-start")
    reasons: Counter[str] = Counter()
    last: list[JobProgress] = [JobProgress()]
    history: list[dict[str, Any]] | None = None

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    prog = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        # not on a terminal (a log file, CI): no bar to draw, and rich left a blank line
        disable=as_json or not err_console.is_terminal,
    )
    task = prog.add_task(prompts.name, total=None, stats="")

    def on_progress(p: JobProgress) -> None:
        last[0] = p
        prog.update(
            task,
            completed=p.processed,
            total=p.total,
            stats=f"ok {p.done} failed {p.failed + p.kept_failed} skipped {p.skipped}",
        )

    interrupted = False
    t0 = time.perf_counter()
    with prog, _sigterm_as_ctrl_c():
        try:
            summary = asyncio.run(
                _run_local(
                    prompts,
                    spec,
                    out,
                    dpo=dpo,
                    concurrency=concurrency,
                    call_concurrency=call_concurrency,
                    offload_sync=threads,
                    allowed=_local_allow_list(spec),
                    progress=on_progress,
                    retry_failed=retry_failed,
                    dpo_rerun=dpo_rerun,
                    fsync=fsync,
                    warm_start=ws,
                )
            )
            state = summary.progress
            history = summary.warm_start
        except KeyboardInterrupt:
            interrupted = True
            state = last[0]
            history = state.warm_start  # the refits made before the interruption
    reasons.update(state.stop_reasons)
    counts: dict[str, Any] = {
        "done": state.done,
        "failed": state.failed,
        "skipped": state.skipped,
        "samples": state.samples,
        "total": state.total,
        "duplicates": state.duplicates,
        "retried_failed": state.retried_failed,
        "kept_failed": state.kept_failed,
        "dpo_rebuilt": state.dpo_rebuilt,
        "dpo_rerun": state.dpo_rerun,
        "dpo_missing": state.dpo_missing,
        "no_candidates": state.no_candidates,
        "other_lines": state.other_lines,
        "elapsed": time.perf_counter() - t0,
        "interrupted": interrupted,
        "out": str(out),
        "dpo": None if dpo is None else str(dpo),
        "stop_reasons": dict(reasons),
    }
    if history is not None:
        counts["warm_start"] = history
    if as_json:
        typer.echo(json.dumps(counts, indent=2))
    else:
        out_console.print(_summary_line(counts, reasons), markup=False)
        for h in history or []:
            err_console.print(
                f"warm start: refit on {h['prompts']} prompts -> "
                + (json.dumps({k: h[k] for k in ("prior", "cost", "transform")})
                   if h["prior"] else f"kept the prior ({h['error']})"),
                markup=False,
            )
        if interrupted:
            err_console.print(
                f"interrupted: finished prompts are saved in {out}; rerun the same "
                "command to resume.",
                markup=False,
            )
        elif state.failed or state.kept_failed:
            err_console.print(
                f"{state.failed + state.kept_failed} prompt(s) failed: see the lines with "
                f'"ok": false in {out} (rerun'
                + (" without --no-retry-failed" if state.kept_failed else "")
                + " to retry them).",
                markup=False,
            )
        if state.other_lines:
            err_console.print(
                f"note: {out} also holds {state.other_lines} line(s) that are not this "
                "job's: other prompts, or the same prompts run with other options (a changed "
                "--cost, --horizon, factory or kwargs gives new keys: such prompts are run "
                "anew, not skipped); they were left as they are. Write each job to its own "
                "--out to keep them apart.",
                markup=False,
            )
        if state.no_candidates:
            err_console.print(
                f"note: {state.no_candidates} of the skipped prompt(s) have no candidates in "
                f"{out}: an earlier run wrote their lines without --candidates, and a finished "
                "prompt is not run again (--candidates applies to the prompts run now). Write "
                "to a new --out to have every prompt's candidates (paid model calls).",
                markup=False,
            )
        if state.dpo_missing:
            err_console.print(
                f"{state.dpo_missing} prompt(s) have no DPO pair in {dpo}: their lines in {out} "
                "were written without --dpo and kept no candidates, so the pair needs a new "
                "draw. Rerun without --no-dpo-rerun to run them again (paid model calls) and "
                "write their pairs.",
                markup=False,
            )
    if interrupted or state.failed or state.kept_failed:
        raise typer.Exit(EXIT_FAILURE)


# -- the worker tier ----------------------------------------------------------------------------
def _missing_extra(exc: ModuleNotFoundError) -> NoReturn:
    """Exit with one ``error:`` line for a worker-tier import that failed. The hint naming the
    extra is given once: ``worker/__init__.py`` already puts it in the errors of its modules,
    and :func:`beacon.cli.missing_extra_message` adds it only where it is missing. A missing
    module of no extra is a bug, re-raised."""
    from beacon.cli import missing_extra_message

    message = missing_extra_message(exc)
    if message is None:
        raise exc
    fail(message)


def _store() -> Any:
    try:
        from worker.config import WorkerSettings
        from worker.state import JobStore
    except ModuleNotFoundError as exc:
        _missing_extra(exc)
    try:
        settings = WorkerSettings.from_env()
    except ConfigError as exc:
        fail(str(exc))
    return JobStore.from_settings(settings)


def _store_label(store: Any) -> str:
    from worker.config import url_without_credentials

    return url_without_credentials(str(store.url))  # the URL may hold the store's password


@contextlib.contextmanager
def _state_store_errors(store: Any, doing: str = "", after: str = "") -> Iterator[None]:
    """Exit with one ``error:`` line, naming the state store without its credentials, when it
    cannot be reached (down, restarting, a network cut, a timeout) inside the block: ``doing``
    says what was under way, ``after`` what the operator may do about it."""
    import redis

    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        where = f"the job state store at {_store_label(store)}"
        what = f"lost {where} {doing}" if doing else f"cannot reach {where}"
        fail(f"{what}: {str(exc).rstrip('.')}" + (f"; {after}" if after else ""))


def _status_or_exit(store: Any, job: str) -> Any:
    from worker.state import UnknownJobError

    try:
        with _state_store_errors(store):
            return store.status(job)
    except UnknownJobError as exc:
        usage_error(str(exc), "JOB")


def _collect_resume_hint(job: str, out: Path) -> str:
    # KeyedJsonlWriter writes whole lines only (a torn one is cut off when the file is opened
    # again) and skips keys already there: a rerun writes the rest, nothing twice.
    return (f"the lines already written to {out} are complete and kept: run the same command "
            f"again once the store is back to collect the rest of job {job}")


def _wait(store: Any, job: str, *, timeout: float | None, quiet: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    st = _status_or_exit(store, job)
    t0 = time.monotonic()
    with Progress(
        TextColumn("job {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet,
    ) as prog:
        task = prog.add_task(job, total=st.total, stats="")
        while True:
            st = _status_or_exit(store, job)
            prog.update(
                task,
                completed=st.done + st.failed,
                total=st.total,
                stats=f"ok {st.done} failed {st.failed} pending {st.pending}",
            )
            if st.finished or (timeout is not None and time.monotonic() - t0 > timeout):
                return st
            time.sleep(0.5)


@guarded
def submit_command(
    prompts: PromptsArg,
    generator: GeneratorOpt,
    scorer: ScorerOpt,
    generator_kwargs: GenKwOpt = None,
    scorer_kwargs: ScoKwOpt = None,
    config: ConfigOpt = None,
    cost: CostOpt = None,
    horizon: HorizonOpt = None,
    family: FamilyOpt = None,
    batch_size: BatchOpt = None,
    robust: RobustOpt = None,
    prior: PriorOpt = None,
    transform: TransformOpt = None,
    timeout: TimeoutOpt = None,
    max_attempts: AttemptsOpt = None,
    max_retry_after: MaxRetryAfterOpt = None,
    max_seconds: MaxSecondsOpt = None,
    max_tokens: MaxTokensOpt = None,
    candidates: CandidatesOpt = False,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job-id",
            help="Job id [default: derived from "
            "the spec and the file's content, so the same "
            "submission resumes].",
            show_default=False,
        ),
    ] = None,
    retry_failed: Annotated[
        bool,
        typer.Option("--retry-failed", help="Resend prompts that failed in an earlier submission."),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait for the job to finish (progress bar), then collect if --out is given.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="With --wait: collect the results here.", show_default=False
        ),
    ] = None,
    dpo: DpoOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit PROMPTS to the Celery worker tier: one task per prompt. Prints the job id.

    Broker and state store come from BEACON_BROKER_URL / BEACON_RESULT_BACKEND /
    BEACON_STATE_URL. Submitting the same file and spec again resends only unfinished prompts.
    """
    check_input_file(prompts, "PROMPTS")
    from beacon.jobs.local import check_prompts_text

    try:
        check_prompts_text(prompts, "PROMPTS")  # a .jsonl.gz, a UTF-16 export: not sent
    except JobInputError as exc:
        usage_error(f"{str(prompts)!r} {exc.reason}", "PROMPTS")
    # --out / --dpo are written only by --wait: without it they would be silently ignored.
    if out is not None and not wait:
        usage_error("--out needs --wait (or collect later: beacon collect JOB --out FILE)",
                    "--out")
    if dpo is not None and out is None:
        usage_error("--dpo needs --out (and --wait)", "--dpo")
    if out is not None:
        _check_outputs(prompts, out, dpo)
    spec = _job_spec(locals())
    from beacon.jobs.keys import check_unique_ids
    from beacon.jobs.spec import iter_prompt_file

    _check_has_prompts(prompts)
    # before the broker is reached: two different prompts with one id would both be run and
    # collected under that id (raises DuplicateIdError, an error line naming both lines)
    check_unique_ids(iter_prompt_file(prompts), spec, source=prompts.name)
    try:
        from worker.state import SEND_LEASE, UnknownJobError
        from worker.tasks import BrokerUnavailableError, submit_job
    except ModuleNotFoundError as exc:
        _missing_extra(exc)
    h = hashlib.sha256()
    with prompts.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    store = _store()
    with _state_store_errors(store):
        try:
            res = submit_job(
                iter_prompt_file(prompts),
                spec,
                job_id=job_id,
                input_digest=h.hexdigest(),
                source=str(prompts.resolve()),
                retry_failed=retry_failed,
                store=store,
            )
        except BrokerUnavailableError as exc:
            fail(str(exc))
        except UnknownJobError as exc:  # purged (collect --purge elsewhere) while it was sent
            fail(f"{exc} while it was being submitted: submit again to register it anew")
        except JobInputError as exc:
            if exc.field == "job_id":  # checked before anything is registered or sent
                usage_error(f"{job_id!r}: {exc.reason}", "--job-id")
            raise
        except Exception as exc:
            if type(exc).__module__.startswith(("kombu", "amqp")):
                fail(f"cannot reach the broker: {exc}")
            raise
    if as_json and not wait:
        typer.echo(json.dumps(res.to_dict(), indent=2))
    elif not as_json:
        out_console.print(res.job_id, markup=False)
        err_console.print(
            f"job {res.job_id}: {res.total} prompts, {res.enqueued} sent, "
            f"{res.already} already finished, {res.bad_lines} bad input line(s)"
            + (f", {res.duplicates} duplicate line(s)" if res.duplicates else "")
            + (f", {res.queued} still queued or running (not sent again)" if res.queued
               else "")
            + (f", {res.sending} being sent by another submission or sweep (if it died, they"
               f" are sent again by the next sweep, or submit again in {SEND_LEASE:g} s)"
               if res.sending else ""),
            markup=False,
        )
    if not wait:
        return
    st = _wait(store, res.job_id, timeout=None, quiet=as_json)
    code = EXIT_OK if st.failed == 0 else EXIT_FAILURE
    payload: dict[str, Any] = {"submit": res.to_dict(), "status": st.to_dict()}
    if out is not None:
        from worker.state import collect_job

        with _state_store_errors(store, f"while collecting job {res.job_id}",
                                 _collect_resume_hint(res.job_id, out)):
            c = collect_job(store, res.job_id, out, dpo=dpo)
        payload["collect"] = c.to_dict()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        out_console.print(f"job {res.job_id}: {st.done} ok, {st.failed} failed", markup=False)
    raise typer.Exit(code)


@guarded
def status_command(
    job: Annotated[str, typer.Argument(metavar="JOB", help="Job id printed by submit.")],
    requeue_lost: Annotated[
        bool,
        typer.Option(
            "--requeue-lost",
            help="Find pending prompts whose task message the broker lost (a worker killed "
            "at the wrong moment; Redis broker) and send them again. Workers also do this "
            "every BEACON_SWEEP_INTERVAL seconds.",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="With --requeue-lost: resend every pending prompt without inspecting the "
            "broker (any broker; results stay exactly-once, duplicates cost a run).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show a job's done / failed / pending counts (and optionally resend lost prompts)."""
    if force and not requeue_lost:
        usage_error("--force only goes with --requeue-lost", "--force")
    store = _store()
    st = _status_or_exit(store, job)
    payload: dict[str, Any] = st.to_dict()
    rq = None
    if requeue_lost:
        try:
            from kombu.exceptions import OperationalError

            from worker.app import settings
            from worker.config import url_without_credentials
            from worker.recovery import BrokerInspectionError, BrokerUnreachableError
            from worker.recovery import requeue_lost as find_and_resend
            from worker.state import UnknownJobError
            from worker.tasks import resend
        except ModuleNotFoundError as exc:
            _missing_extra(exc)

        rerun = ("lost prompts were not (all) sent again: run --requeue-lost again once it "
                 "is back")
        try:
            # The broker's reads raise BrokerUnreachableError and its sends kombu's
            # OperationalError; a redis ConnectionError left over is the state store's (the
            # same exception type from either side would otherwise blame the wrong service).
            with _state_store_errors(store, f"while requeueing lost prompts of job {job}",
                                     rerun):
                rq = find_and_resend(
                    store,
                    job,
                    broker_url=settings.broker_url,
                    grace=0.0,
                    force=force,
                    send=lambda j, items, q: resend(j, items, q, store=store),
                )
        except (BrokerInspectionError, BrokerUnreachableError) as exc:
            fail(str(exc) if isinstance(exc, BrokerInspectionError) else f"{exc}; {rerun}")
        except UnknownJobError as exc:  # purged or expired since its status was read
            fail(f"{exc}; nothing more was sent for it")
        except OperationalError as exc:
            fail(f"cannot reach the broker {url_without_credentials(settings.broker_url)}: "
                 f"{str(exc).rstrip('.')}; {rerun}")
        payload["requeue"] = rq.to_dict()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    out_console.print(
        f"job {job}: {st.total} prompts, {st.done} done, {st.failed} failed, "
        f"{st.pending} pending ({st.source})",
        markup=False,
    )
    if rq is not None:
        out_console.print(
            f"job {job}: {rq.lost} lost prompt message(s) sent again"
            + (f" ({rq.skipped})" if rq.skipped else ""),
            markup=False,
        )


def _check_wait_timeout(wait_timeout: float | None, wait: bool) -> None:
    """Refuse a ``--wait-timeout`` that would be ignored (no ``--wait``) or never end the wait
    (NaN compares false with every elapsed time: the wait hung forever) or end it at once
    (negative), before anything is read."""
    if wait_timeout is None:
        return
    if not wait:
        usage_error("--wait-timeout needs --wait", "--wait-timeout")
    if not (math.isfinite(wait_timeout) and wait_timeout >= 0):
        usage_error(f"{wait_timeout!r}: must be a finite number of seconds >= 0 (leave it out "
                    "to wait without a limit)", "--wait-timeout")


@guarded
def collect_command(
    job: Annotated[str, typer.Argument(metavar="JOB", help="Job id printed by submit.")],
    out: OutOpt,
    dpo: DpoOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until no prompt is pending.")] = False,
    wait_timeout: Annotated[
        float | None,
        typer.Option(
            "--wait-timeout",
            help="With --wait: give up waiting after this many seconds.",
            show_default=False,
        ),
    ] = None,
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Delete the job's state from Redis once everything is collected, nothing "
            "is pending and no prompt failed (a purged job's prompts would all be sent, and "
            "paid for, again by a later submit --retry-failed).",
        ),
    ] = False,
    purge_failed: Annotated[
        bool,
        typer.Option(
            "--purge-failed",
            help="With --purge: purge even though prompts failed (they are given up).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a job's results (and DPO pairs) to local JSONL files; safe to repeat.

    Exit 0 when the job is finished with no failures and all of it is in --out; 1 when prompts
    failed or are pending, or outcomes changed while the collect ran (collect again).
    """
    try:
        from worker.state import collect_job, purge_refusal
    except ModuleNotFoundError as exc:
        _missing_extra(exc)
    _check_collect_files(out, dpo)  # before waiting: a usage error must not come hours late
    if purge_failed and not purge:
        usage_error("--purge-failed only goes with --purge", "--purge-failed")
    _check_wait_timeout(wait_timeout, wait)
    store = _store()
    st = (
        _wait(store, job, timeout=wait_timeout, quiet=as_json)
        if wait
        else _status_or_exit(store, job)
    )
    with _state_store_errors(store, f"while collecting job {job}",
                             _collect_resume_hint(job, out)):
        c = collect_job(store, job, out, dpo=dpo)
        if c.status.finished and not c.complete:
            # The last prompts finished during the collect: its scan may have missed them,
            # yet the counts read after it say "0 pending". Collect again (idempotent) so a
            # job reported finished (exit 0) is wholly in ``out``, and nothing stored is
            # purged before it is written.
            again = collect_job(store, job, out, dpo=dpo)
            c = replace(again, written=c.written + again.written,
                        dpo_written=c.dpo_written + again.dpo_written,
                        replaced_errors=c.replaced_errors + again.replaced_errors,
                        dpo_foreign=again.dpo_foreign)
    st = c.status
    purged = False
    refused = purge_refusal(c, allow_failed=purge_failed) if purge else None
    if purge and refused is None:
        with _state_store_errors(store, f"while purging job {job}",
                                 f"everything is collected in {out}; run the same command "
                                 "again once the store is back to purge it"):
            store.purge(job)
        purged = True
    if as_json:
        typer.echo(json.dumps({**c.to_dict(), "purged": purged,
                               **({"purge_refused": refused} if refused else {})}, indent=2))
    else:
        out_console.print(
            f"job {job}: wrote {c.written} line(s) to {out}"
            + (f" and {c.dpo_written} pair(s) to {dpo}" if dpo else "")
            + f"; {st.done} done, {st.failed} failed, {st.pending} pending",
            markup=False,
        )
        if c.dpo_foreign:
            err_console.print(
                f"{c.dpo_foreign} pair(s) not written to {dpo}: the lines of those prompts in "
                f"{out} come from another run of them (e.g. beacon run), and a pair must come "
                "from its line's draw; 'beacon run' with --dpo into the same files writes them.",
                markup=False,
            )
        if refused:
            err_console.print(f"job {job}: not purged: {refused}.", markup=False)
        if st.finished and not c.complete:
            err_console.print(
                f"job {job}: outcomes changed while this collect ran (a failed prompt "
                f"redelivered and done, say); {out} may lack some: collect again",
                markup=False,
            )
    if st.failed or st.pending or not c.complete:
        raise typer.Exit(EXIT_FAILURE)


def worker_command(
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help="Worker processes (or threads) [default: CPU count].",
            show_default=False,
        ),
    ] = None,
    pool: Annotated[
        str, typer.Option("--pool", "-P", help="prefork, threads or solo.")
    ] = "prefork",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="Log level.")] = "INFO",
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            "-Q",
            help="Queues to consume [default: BEACON_QUEUE or 'beacon'].",
            show_default=False,
        ),
    ] = None,
    hostname: Annotated[
        str | None, typer.Option("--hostname", "-n", help="Node name.", show_default=False)
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="Module prefix this worker "
            "may import factories from (repeatable; "
            "added to BEACON_ALLOWED_FACTORIES).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a Celery worker of the BEACON tier (settings from BEACON_* variables)."""
    if pool not in ("prefork", "threads", "solo"):
        usage_error(f"{pool!r}: choose prefork, threads or solo", "--pool")
    if allow:
        try:
            parse_allow_list(",".join(allow), include_defaults=False, name="allow")
        except ConfigError as exc:
            option_error(exc, "--allow")
        prev = os.environ.get("BEACON_ALLOWED_FACTORIES", "")
        os.environ["BEACON_ALLOWED_FACTORIES"] = ",".join([p for p in [prev, *allow] if p])
    try:
        from worker.app import app, settings
    except ModuleNotFoundError as exc:
        _missing_extra(exc)
    except ConfigError as exc:
        fail(str(exc))
    # Gossip and mingle are cluster chatter this tier does not use (no revokes, no events);
    # without them a worker starts faster and sends fewer broker messages.
    argv = [
        "worker",
        f"--pool={pool}",
        f"--loglevel={loglevel}",
        f"--queues={queues or settings.queue}",
        "--without-gossip",
        "--without-mingle",
    ]
    if concurrency is not None:
        argv.append(f"--concurrency={concurrency}")
    if hostname:
        argv.append(f"--hostname={hostname}")
    from worker.config import url_without_credentials

    # what an operator checks first when jobs do not progress (never the credentials)
    err_console.print(
        f"beacon worker: broker {url_without_credentials(settings.broker_url)}, state "
        f"{url_without_credentials(settings.state_url)}, key prefix {settings.key_prefix!r}, "
        f"queues {queues or settings.queue}, factories from "
        f"{', '.join(settings.allowed_factories)}",
        markup=False,
    )
    app.worker_main(argv=argv)


def register(app: typer.Typer) -> None:
    """Add ``run``, ``submit``, ``status``, ``collect`` and ``worker`` to the ``beacon`` app."""
    app.command("run")(run_command)
    app.command("submit")(submit_command)
    app.command("status")(status_command)
    app.command("collect")(collect_command)
    app.command("worker")(worker_command)


_ = EXIT_USAGE  # exit code 2 is raised through usage_error (click's BadParameter)
