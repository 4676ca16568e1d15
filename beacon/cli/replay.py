"""``beacon replay``: BEACON against fixed best-of-N on logged rewards, at one cost ``c``."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from beacon.cli.common import (
    BatchOpt,
    FamilyOpt,
    FoldsOpt,
    HorizonOpt,
    JsonOpt,
    LoggedArg,
    MinSamplesOpt,
    PriorOpt,
    RobustOpt,
    TransformOpt,
    count_noun,
    echo_json,
    fmt,
    guarded,
    horizon_note,
    load_log,
    log_setup,
    one_line_warnings,
    options_for,
    out_console,
    print_notes,
    print_table,
    reward_scale,
    select_prompts,
    spinner,
)
from beacon.config import BeaconConfig
from beacon.evaluation import CrossFit, Evaluation, LoggedRewards, QualityKind, evaluate
from beacon.priors import BetaPrior, NIGPrior

__all__ = [
    "cost_units",
    "describe_config",
    "describe_setup",
    "register",
    "replay_command",
    "replay_table",
]


def describe_config(cfg: BeaconConfig) -> str:
    """One line naming the family, prior, transform, batch size and robust update."""
    p = cfg.resolved_prior
    if isinstance(p, NIGPrior):
        prior = (
            "Jeffreys prior"
            if p.is_jeffreys
            else (
                f"NIG prior (mu0={p.mu0:.3g}, nu0={p.nu0:.3g}, alpha0={p.alpha0:.3g}, "
                f"beta0={p.beta0:.3g})"
            )
        )
    elif isinstance(p, BetaPrior):
        prior = f"Beta({p.a0:.3g}, {p.b0:.3g}) prior"
    else:  # a plugin family's prior
        prior = f"prior {p!r}"
    parts = [cfg.family, prior, f"k0={cfg.k0}"]
    if cfg.transform is not None:
        parts.append(f"{cfg.transform.kind} transform")
    if cfg.batch_size > 1:
        parts.append(f"batch size {cfg.batch_size}")
    if cfg.family == "normal":
        parts.append("robust update" if cfg.robust else "no robust update")
    return ", ".join(parts)


def describe_setup(cfg: BeaconConfig, crossfit: CrossFit | None) -> str:
    """:func:`describe_config`, or for a cross-fitted prior what was fitted and the cost units."""
    if crossfit is None:
        return describe_config(cfg)
    k0 = sorted({crossfit.fold_config(f, cfg).k0 for f in range(crossfit.n_folds)})
    parts = [cfg.family, crossfit.describe(), f"k0={'/'.join(str(k) for k in k0)}"]
    parts.append(cost_units(crossfit, cfg.family))
    if cfg.batch_size > 1:
        parts.append(f"batch size {cfg.batch_size}")
    if cfg.family == "normal":
        parts.append("robust update" if cfg.robust else "no robust update")
    return ", ".join(parts)


def cost_units(crossfit: CrossFit | None, family: str = "normal") -> str:
    """What a cost ``c`` means under ``crossfit`` (model units without one)."""
    if family != "normal":
        return "c in successes per sample"
    if crossfit is None:
        return "c in (transformed) reward units"
    s = crossfit.scales
    return f"c in per-prompt sd units (Stopper cost c*s, fitted s = {s.min():.3g}..{s.max():.3g})"


def replay_table(ev: Evaluation, title: str) -> Table:
    """The rich table: BEACON's row, then best-of-N for N = 1..horizon."""
    labels = ev.beacon.accuracy is not None
    t = Table(
        title=escape(title),
        title_justify="left",
        caption=escape(
            "avg K: samples used per prompt; best reward: mean raw reward of the chosen sample; "
            "zhat: the same standardized per prompt; value: E[zhat - K*c]"
        ),
        caption_justify="left",
    )
    t.add_column("policy")
    t.add_column("avg K", justify="right")
    t.add_column("best reward", justify="right")
    t.add_column("zhat", justify="right")
    if labels:
        t.add_column("accuracy", justify="right")
    t.add_column("value", justify="right")
    best_value = max(m.value for m in (ev.beacon, *ev.fixed))
    scale = reward_scale(ev.fixed)
    for m in (ev.beacon, *ev.fixed):
        name = f"BEACON c={ev.config.cost:g}" if m.n is None else f"best-of-{m.n}"
        value = fmt(m.value)
        if m.value == best_value:
            value = f"[bold]{value}[/]"
        row = [
            name,
            f"{m.avg_samples:.2f}",
            fmt(m.mean_best_reward, scale=scale),
            fmt(m.mean_standardized_reward),
        ]
        if labels:
            row.append(fmt(m.accuracy))
        row.append(value)
        t.add_row(*row, style="bold cyan" if m.n is None else None)
    return t


def _paired(ev: Evaluation, quality: QualityKind) -> str:
    """BEACON minus matched best-of-N, with its paired standard error over prompts when the
    log has two prompts or more (the spread of the per-prompt differences: a difference within
    about 2 SE is one this log cannot tell from noise)."""
    md = ev.matched(quality)
    if md.se is None:
        return f"{md.diff:+.3f}"
    return f"{md.diff:+.3f} ± {md.se:.3f} SE over {md.n_prompts} prompts"


def summary_lines(ev: Evaluation) -> list[str]:
    """Plain-language comparison: savings, matched-samples quality, best fixed N by value."""
    b, full = ev.beacon, ev.fixed[-1]
    saved = 100.0 * (1.0 - b.avg_samples / full.avg_samples)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted((b.stop_reasons or {}).items()))
    lines = [
        f"BEACON used {b.avg_samples:.2f} samples per prompt on average, {saved:.0f}% fewer than "
        f"best-of-{full.n} (stop reasons: {reasons}).",
        f"Quality, mean zhat: BEACON {b.mean_standardized_reward:.3f}; best-of-N at the same "
        f"{b.avg_samples:.2f} samples (interpolated in N) {ev.matched_fixed_standardized:.3f} "
        f"({_paired(ev, 'standardized')}); "
        f"best-of-{full.n} {full.mean_standardized_reward:.3f}.",
    ]
    if b.accuracy is not None and ev.matched_fixed_accuracy is not None:
        lines.append(
            f"Accuracy: BEACON {b.accuracy:.3f}; best-of-N at matched samples "
            f"{ev.matched_fixed_accuracy:.3f} ({_paired(ev, 'accuracy')}); "
            f"best-of-{full.n} {full.accuracy:.3f}."
        )
    bf = ev.best_fixed
    diff = b.value - bf.value
    # An absurd c (1e308) makes both values -inf: their difference is no number to print.
    shown = f"{diff:+.3f}" if not math.isnan(diff) else "both -inf: K*c overflows at this c"
    lines.append(
        f"Value E[zhat-K*c] at c={ev.config.cost:g}: BEACON {b.value:.3f}; best fixed N is "
        f"{bf.n} with {bf.value:.3f} ({shown})."
    )
    if b.truncated:
        lines.append(f"{b.truncated} prompts ran out of logged samples before BEACON stopped.")
    return lines


def run_replay(
    data: LoggedRewards, cfg: BeaconConfig, crossfit: CrossFit | None = None
) -> Evaluation:
    with spinner(f"replaying {count_noun(data.n_prompts, 'prompt')}"):
        return evaluate(data, cfg, crossfit)


@guarded
@one_line_warnings
def replay_command(
    logged: LoggedArg,
    cost: Annotated[
        float,
        typer.Option(
            "--cost",
            "-c",
            help="Cost c per sample, > 0: in (transformed) reward units; with --prior fit in "
            "per-prompt standardized units (one typical within-prompt sd of the reward = 1).",
            show_default=False,
        ),
    ],
    horizon: HorizonOpt = None,
    min_samples: MinSamplesOpt = None,
    family: FamilyOpt = "normal",
    batch_size: BatchOpt = 1,
    robust: RobustOpt = True,
    prior: PriorOpt = None,
    transform: TransformOpt = None,
    folds: FoldsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay BEACON on logged rewards and compare it with fixed best-of-N, N = 1..horizon.

    Prints average samples, mean best reward, mean standardized best reward (zhat, per-prompt
    z-scores), accuracy where the log has 'correct' labels, and the value E[zhat - K*c].
    With --prior fit, each of --folds folds of prompts is replayed with a prior (and transform)
    fitted on the other folds only.
    """
    data, kept_notes = select_prompts(load_log(logged), family, min_samples)
    setup = log_setup(data, **options_for(log_setup, locals()))
    notes = kept_notes + setup.notes
    ev = run_replay(data, setup.config, setup.crossfit)
    notes += horizon_note(ev.requested_horizon, ev.config, data.for_family(family))
    if as_json:
        out = ev.to_dict()
        out["source"] = str(logged)
        out["crossfit"] = None if setup.crossfit is None else setup.crossfit.to_dict()
        out["notes"] = notes
        echo_json(out)
        return
    print_notes(notes)
    title = (
        f"{logged.name}: {count_noun(ev.n_prompts, 'prompt')}, horizon {ev.horizon}; "
        f"{describe_setup(ev.config, setup.crossfit)}"
    )
    print_table(replay_table(ev, title))
    for line in summary_lines(ev):
        out_console.print(line, markup=False)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
