"""``beacon fit-prior``: fit an empirical-Bayes prior (and transform) on logged rewards.

Writes ``{"prior": {...}, "transform": {...} | null, "fitted_on": {...}}``, the file that
``beacon replay --prior`` / ``beacon tune --prior``, :func:`beacon.load_prior` and
:func:`beacon.fitting.load_fit` read (see :mod:`beacon.fitting` for the statistics).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from beacon.cli.common import (
    FamilyOpt,
    LoggedArg,
    check_family,
    check_output_file,
    echo_json,
    err_console,
    fail,
    guarded,
    load_log,
    one_line_warnings,
    out_console,
    parse_transform,
    print_notes,
    usage_error,
)
from beacon.errors import ConfigError, RewardError
from beacon.evaluation import LogFormatError, LoggedRewards, name_reward_error
from beacon.priors import rewards_before_first_decision
from beacon.transforms import RewardTransform

if TYPE_CHECKING:
    from beacon.fitting import FitResult

__all__ = ["fit_prior_command", "register"]

_TRANSFORMS = ("none", "logit", "gaussianize")


@guarded
@one_line_warnings
def fit_prior_command(
    logged: LoggedArg,
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Where to write the prior JSON.", show_default=False),
    ],
    family: FamilyOpt = "normal",
    transform: Annotated[
        str,
        typer.Option(
            "--transform",
            help="Fit the prior on transformed rewards: none (or identity), logit "
            "(probability-valued judges), "
            "gaussianize (empirical CDF then normal quantile, fitted here and stored with "
            "the prior), or a transform JSON file (stored with the prior as it is).",
        ),
    ] = "none",
    method: Annotated[
        str,
        typer.Option("--method", help="marginal (type-II maximum likelihood) or moments."),
    ] = "marginal",
    robust: Annotated[
        bool,
        typer.Option(
            "--robust/--no-robust",
            help="Drop rewards that are far out both in their prompt and in the whole log.",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Also print the file to stdout.")] = False,
) -> None:
    """Fit a proper prior on LOGGED.jsonl (one line per prompt) and write it to -o."""
    from beacon.fitting import fit_reward_model

    check_family(family)
    if family not in ("normal", "bernoulli", "judge"):
        usage_error(f"{family!r}: fit-prior supports normal, bernoulli and judge", "--family")
    # "identity" is "none", as replay and tune spell it too
    fit_with: str | RewardTransform | None = (
        None if transform in ("none", "identity") else transform
    )
    if transform not in (*_TRANSFORMS, "identity"):
        if not (transform.endswith(".json") or Path(transform).is_file()):
            usage_error(
                f"{transform!r}: choose from {', '.join(_TRANSFORMS)} or a transform JSON file",
                "--transform",
            )
        # a file as 'beacon tune' prints it in its deploy command (and replay/tune accept)
        fit_with = parse_transform(transform)
    if family != "normal" and fit_with is not None:
        usage_error(f"{transform!r}: the {family} family takes raw rewards", "--transform")
    if method not in ("marginal", "moments"):
        usage_error(f"{method!r}: choose marginal or moments", "--method")
    if output.exists() and logged.exists() and output.samefile(logged):
        # writing the prior there would replace the log it is fitted on
        usage_error(f"{str(output)!r} is the log LOGGED itself; give another file", "--output")
    check_output_file(output, "--output", " (--json also prints the prior on stdout)")
    data = _family_data(logged, family)
    try:
        fit = fit_reward_model(
            data.rewards, family, transform=fit_with, method=method, robust=robust
        )
    except RewardError as exc:
        raise name_reward_error(data, exc) from exc
    except ConfigError as exc:
        if exc.field != "rewards":
            raise
        # the log's rewards as a whole (too few prompts, no variation, too large): say which log
        fail(f"{logged}: cannot fit a {family} prior on this log: {exc}")
    doc = fit.to_dict()
    doc["fitted_on"]["source"] = str(logged)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    p = fit.prior.to_dict()
    params = ", ".join(f"{k}={v:.4g}" for k, v in p.items() if k != "family")
    # With --json, stdout holds the JSON alone (pipeable into jq); the summary goes to stderr.
    (err_console if as_json else out_console).print(
        f"fitted {family} prior ({params})"
        + (f" on {fit.transform.kind}-transformed rewards" if fit.transform is not None else "")
        + f" from {doc['fitted_on']['prompts']} prompts / {doc['fitted_on']['rewards']} rewards"
        + (
            f" ({doc['fitted_on']['dropped']} more dropped as outliers; --no-robust keeps them)"
            if doc["fitted_on"].get("dropped")
            else ""
        )
        + f"; k0={rewards_before_first_decision(fit.prior)}; wrote {output}",
        markup=False,
    )
    if isinstance(doc["fitted_on"].get("note"), str):
        print_notes([doc["fitted_on"]["note"]])
    print_notes(_scale_note(fit))
    if as_json:
        echo_json(doc)


# jq filter keeping the lines with a label on a logged reward (the samples bernoulli replays)
_LABELLED_LINES = (
    "select([.rewards, (.correct // [])] | transpose | any(.[]; .[0] != null and .[1] != null))"
)


def _family_data(logged: Path, family: str) -> LoggedRewards:
    """The log's data for ``family`` (its labels for bernoulli), read as replay reads it.

    A bernoulli log where some prompts have rewards but no label is refused by
    :meth:`LoggedRewards.for_family` with replay's remedy (``--min-samples 1``), an option
    fit-prior does not have; here the remedy is the ``jq`` command that writes the labelled
    prompts to a copy of the log (what ``beacon tune`` tells you to fit on).
    """
    data = load_log(logged)
    try:
        return data.for_family(family)
    except LogFormatError as exc:
        if family != "bernoulli" or exc.field != "correct" or exc.value is None:
            raise
        reason = exc.reason.split("; ", 1)[0]
        fail(
            f"{logged}: invalid correct={exc.value!r}: {reason}; label them, or fit on the "
            "labelled prompts: "
            f"jq -c {shlex.quote(_LABELLED_LINES)} {shlex.quote(str(logged))} > labelled.jsonl"
        )


def _scale_note(fit: FitResult) -> list[str]:
    """A note when the fitted prior's typical within-prompt sd is below what the normal family
    resolves.

    The family floors its posterior scale at ``SIGMA_FLOOR`` (1e-6): a Stopper running this
    prior on rewards of about 1e-9 weighs ``c`` against the floor, not the rewards' spread, and
    samples to the horizon whatever ``c`` (``replay --prior`` says so; the file itself did not).
    """
    from beacon.families.normal import SIGMA_FLOOR

    if fit.family != "normal":
        return []
    try:
        s = fit.within_scale
    except ConfigError:  # no scale (not a proper NIG prior): nothing to compare
        return []
    if not s < 10 * SIGMA_FLOOR:
        return []
    return [
        f"the fitted prior's typical within-prompt sd (within_scale) is {s:.3g}, below what "
        f"the normal model resolves (its posterior scale is floored at {SIGMA_FLOOR:g}): a "
        "Stopper with this prior weighs c against that floor instead of the rewards' spread; "
        "multiply the rewards by a constant before fitting, or fit with --transform "
        "gaussianize (it does not depend on the scale)"
    ]


def register(app: typer.Typer) -> None:
    """Add ``fit-prior`` to the ``beacon`` app."""
    app.command("fit-prior")(fit_prior_command)
