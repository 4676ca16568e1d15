"""``beacon tune``: sweep the cost ``c``, plot quality versus samples, recommend a ``c``.

With ``--prior fit`` (the default for the ``normal`` family, with the ``gaussianize`` transform)
two BEACON variants are swept on the same log: the paper's default prior (Jeffreys, ``k0 = 3``,
raw rewards; costs in reward units) and the cross-fitted empirical-Bayes prior (each fold of
prompts replayed with the prior and transform fitted on the other folds; costs in per-prompt
standardized units, see :mod:`beacon.evaluation`). The cross-fitted variant is the recommended
one; the default is plotted and printed next to it so the gain is visible, not asserted.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from beacon.cli.common import (
    DEFAULT_HORIZON,
    BatchOpt,
    FamilyOpt,
    FoldsOpt,
    HorizonOpt,
    JsonOpt,
    LoggedArg,
    MinSamplesOpt,
    RobustOpt,
    TransformOpt,
    check_output_file,
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
    progress_bar,
    reward_scale,
    scale_note,
    select_prompts,
    spinner,
    usage_error,
    warm_up,
)
from beacon.cli.replay import cost_units, describe_setup
from beacon.config import BeaconConfig
from beacon.errors import ConfigError
from beacon.evaluation import (
    QUALITY_KINDS,
    LoggedRewards,
    MatchedDifference,
    PolicyMetrics,
    QualityKind,
    SweepPoint,
    TuneResult,
    cost_grid,
    interpolate_fixed,
    matched_difference,
    quality_of,
    tune,
)

__all__ = [
    "QUALITY_LABELS",
    "check_plot_path",
    "choice_cost_text",
    "config_options",
    "cost_text",
    "deploy_lines",
    "matched_range",
    "plot_tune",
    "point_cost_text",
    "register",
    "replay_options",
    "se_band",
    "sweep_rows",
    "sweep_table",
    "tune_command",
    "variant_label",
    "verdict",
]

QUALITY_LABELS: dict[str, str] = {
    "standardized": "mean standardized best reward  E[zhat_K]",
    "reward": "mean best reward  E[z_K]",
    "accuracy": "accuracy of the chosen sample",
}


def variant_label(res: TuneResult, short: bool = False) -> str:
    """Name of a sweep's BEACON variant, for legends and tables (``short`` for narrow tables)."""
    cf = res.crossfit
    if cf is not None:
        tr = "" if cf.transform == "none" else f" + {cf.transform}"
        return f"fitted{tr}" if short else f"cross-fitted prior{tr} ({cf.n_folds} folds)"
    if res.config.prior is None:
        if res.config.family == "normal":
            return "Jeffreys" if short else "Jeffreys prior (paper default)"
        return "Beta(1, 1)" if short else "uniform Beta(1, 1) prior (default)"
    tr = "" if res.config.transform is None else f" + {res.config.transform.kind}"
    return f"prior file{tr}"


def matched_range(res: TuneResult) -> tuple[float, float]:
    """Smallest and largest (BEACON - best-of-N at the same average samples) over the sweep.

    In units of ``res.quality``. Points at the same average samples count once.
    """
    diffs = [md.diff for md in res.sweep_matched()]
    return min(diffs), max(diffs)


def cost_text(c: float) -> str:
    """A ``c`` as printed: 4 significant digits, more where those would read back as another
    number, so that pasting it into ``beacon replay --cost`` or a config replays exactly this
    ``c``. :func:`beacon.evaluation.tune` makes the ``c`` it prints short: a default grid's
    are rounded to 4 digits before they are replayed, and a bisected or a given ``c`` is
    shortened to the fewest digits at which BEACON makes the same choices."""
    for digits in range(4, 18):
        text = f"{c:.{digits}g}"
        if float(text) == c:
            return text
    return repr(c)


def point_cost_text(p: SweepPoint) -> str:
    """A swept point's ``c`` as printed: its :attr:`~beacon.evaluation.SweepPoint.shown_cost`
    (the ``c`` that replays to its numbers) by :func:`cost_text`."""
    return cost_text(p.shown_cost)


def choice_cost_text(res: TuneResult) -> str:
    """The recommended ``c`` as printed, as the sweep table prints it: a swept point's by
    :func:`point_cost_text`, a budget's bisected ``c`` by :func:`cost_text`."""
    ch = res.choice
    if res.choice_is_swept:
        return point_cost_text(next(p for p in res.points if p.metrics is ch.metrics))
    return cost_text(ch.cost)


def _pm_se(md: MatchedDifference, scale: float | None) -> str:
    """``+0.185 ± 0.041 SE over 100 prompts`` (the difference alone without an SE)."""
    diff = fmt(md.diff, scale=scale, sign=True)
    if md.se is None:
        return f"{diff} over {md.n_prompts} prompt" if md.n_prompts == 1 else diff
    return f"{diff} ± {fmt(md.se, scale=scale)} SE over {md.n_prompts} prompts"


def verdict(res: TuneResult) -> tuple[bool, str]:
    """Whether BEACON at the recommended ``c`` beats best-of-N at the same average samples.

    Measured on this log, in units of ``res.quality``, with the paired standard error over
    prompts (:func:`beacon.evaluation.matched_difference`): a win only when the difference is
    above 2 SE (and above a thousandth of the best-of-1..best-of-horizon span, a tie at the
    printed precision); a loss only below minus that; in between BEACON is not
    distinguishable from best-of-N on this log. When it is not a win, says whether any ``c`` of
    the sweep beats it, so the summary never implies a gain that was not measured.
    """
    q = res.quality
    md = res.matched()
    d = md.diff
    span = abs(quality_of(res.fixed[-1], q) - quality_of(res.fixed[0], q))
    tol = 1e-3 * span
    scale = _quality_scale(res)
    figure = _pm_se(md, scale)
    n = len(res.fixed)
    side = md.exceeds(2.0)
    # the difference in SEs, so a figure like +0.020 ± 0.010 says on which side of 2 it falls
    ratio = f"{md.diff / md.se:+.2f} SE, " if md.se else ""
    if d > tol and side > 0:
        return True, (
            f"on this log BEACON beats best-of-N at the same average samples by {figure} "
            f"({q}; {ratio}more than 2 SE)."
        )
    if abs(d) <= tol:
        text = (
            "on this log BEACON at this c is no better than best-of-N at the same average "
            f"samples ({figure}, {q})"
        )
    elif side < 0:
        text = (
            "on this log BEACON at this c does worse than best-of-N at the same average samples "
            f"({figure}, {q}; {ratio}more than 2 SE below)"
        )
    else:
        why = f"{ratio}within 2 SE" if md.se is not None else "no standard error" + (
            " from 1 prompt" if md.n_prompts == 1 else ""
        )
        text = (
            "on this log BEACON at this c is not distinguishable from best-of-N at the same "
            f"average samples ({figure}, {q}; {why}: more prompts would tell)"
        )
    lo, hi = matched_range(res)
    if hi > tol:
        best, bmd = max(zip(res.points, res.sweep_matched(), strict=True),
                        key=lambda pm: pm[1].diff)
        text += (
            f"; the sweep's best difference is {_pm_se(bmd, scale)} at c = "
            f"{point_cost_text(best)} ({best.metrics.avg_samples:.2f} samples; the largest of the "
            "sweep's differences, so an optimistic one)."
        )
    else:
        text += (
            f"; no c of the sweep beats it ({fmt(lo, scale=scale, sign=True)}.."
            f"{fmt(hi, scale=scale, sign=True)}): on this log fixed best-of-N (N = 1..{n}) is "
            "at least as good for the same samples."
        )
    return False, text


def _curve(res: TuneResult) -> tuple[list[float], list[float]]:
    pts = sorted(res.points, key=lambda p: p.metrics.avg_samples)
    return [p.metrics.avg_samples for p in pts], [quality_of(p.metrics, res.quality) for p in pts]


def se_band(res: TuneResult, sds: float = 2.0) -> tuple[list[float], list[float], list[float]]:
    """BEACON's sweep as ``(avg samples, quality - sds SE, quality + sds SE)``, by samples.

    SE is each point's paired standard error of BEACON minus best-of-N at the same average
    samples (:meth:`TuneResult.sweep_matched`): the matched best-of-N curve lies outside the
    band exactly where the difference is beyond ``sds`` SE. NaN where there is no SE (1 prompt).
    """
    q = res.quality
    pairs = sorted(
        zip(res.points, res.sweep_matched(), strict=True), key=lambda t: t[0].metrics.avg_samples
    )
    xs, lo, hi = [], [], []
    for p, md in pairs:
        y = quality_of(p.metrics, q)
        half = math.nan if md.se is None else sds * md.se
        xs.append(p.metrics.avg_samples)
        lo.append(y - half)
        hi.append(y + half)
    return xs, lo, hi


# The recommended points (knee star, budget diamond): black-edged, above every curve.
_OUTLINED: dict[str, Any] = {"mec": "black", "mew": 0.6, "zorder": 7}


def _sweep_curve(ax: Any, res: TuneResult, fmt: str, **style: Any) -> None:
    """One BEACON sweep, labelled with its variant and its matched-samples range."""
    x, y = _curve(res)
    lo, hi = matched_range(res)
    label = (
        f"BEACON, {variant_label(res)}; minus best-of-N over c: {_fq(res, lo, True)} to "
        f"{_fq(res, hi, True)}"
    )
    ax.plot(x, y, fmt, label=label, **style)


def _fq(res: TuneResult, x: float, sign: bool = False) -> str:
    """A number in units of ``res.quality``, as the tables print it (raw rewards far from 1 in
    significant digits; plot_tune's ``fmt`` argument hides :func:`fmt` there)."""
    return fmt(x, scale=_quality_scale(res), sign=sign)


def _point(ax: Any, x: float, y: float, label: str, **style: Any) -> None:
    """A single marker with a legend entry (no line)."""
    ax.plot([x], [y], ls="none", label=label, **style)


def check_plot_path(path: Path) -> str:
    """``--plot``: the image format to write (the extension's; ``png`` without one).

    Checked before any work, as usage errors: a directory, an extension matplotlib cannot
    write, or a file that cannot be created there (tried, then removed: see
    :func:`~beacon.cli.common.check_output_file`). The file is written at exactly ``path``
    (matplotlib alone would append ``.png`` to a name without an extension).
    """
    from matplotlib.backend_bases import FigureCanvasBase

    if path.is_dir():
        usage_error(f"{str(path)!r} is a directory; give a file name in it", "--plot")
    fmt = path.suffix.lower().lstrip(".") or "png"
    # pgf is left out: matplotlib writes it through a LaTeX installation.
    known = set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"}
    if fmt not in known:
        usage_error(
            f"{str(path)!r}: cannot write {path.suffix!r} images; use one of "
            f"{', '.join('.' + k for k in sorted(known))}",
            "--plot",
        )
    check_output_file(path, "--plot")
    return fmt


def plot_tune(
    res: TuneResult,
    path: Path,
    title: str,
    subtitle: str = "",
    baseline: TuneResult | None = None,
    fmt: str | None = None,
) -> None:
    """Write the quality-versus-average-samples plot of a sweep (matplotlib, Agg backend).

    ``fmt`` is the image format (default: ``path``'s extension, PNG without one); the file is
    written at exactly ``path``.

    BEACON's sweep is one curve (one point per ``c``); fixed best-of-N is another (one point per
    N, joined by the straight segments that mixing N and N+1 achieves). ``baseline`` (the
    default-prior sweep, when ``res`` is the cross-fitted one) is drawn as a second, lighter
    BEACON curve with its knee ringed. The knee of ``res`` (the recommended variant) is a star
    and, when a budget chose ``c``, the recommended point a diamond; both labels carry their
    paired SE. A band of ±2 paired SE (:func:`se_band`) around ``res``'s curve shows at which
    ``c`` the difference from best-of-N is beyond noise: where the best-of-N curve leaves it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = res.quality
    fig, ax = plt.subplots(figsize=(8.0, 5.0), dpi=150)
    fx = [m.avg_samples for m in res.fixed]
    fy = [quality_of(m, q) for m in res.fixed]
    ax.plot(
        fx, fy, "-s", color="0.3", ms=4, lw=1.6, label="fixed best-of-N (N = 1..horizon)", zorder=3
    )
    for m, x, y in zip(res.fixed, fx, fy, strict=True):
        if m.n in (1, 2, 4, 8, 16, 32, 64) or m.n == len(res.fixed):
            ax.annotate(
                f"N={m.n}",
                (x, y),
                textcoords="offset points",
                xytext=(4, -10),
                ha="left",
                fontsize=7,
                color="0.3",
            )
    if baseline is not None:
        _sweep_curve(ax, baseline, "--o", color="tab:red", lw=1.3, ms=2.5, alpha=0.8, zorder=4)
        bk = baseline.points[baseline.knee]
        bkx, bky = bk.metrics.avg_samples, quality_of(bk.metrics, q)
        bgain = bky - interpolate_fixed(baseline.fixed, bkx, q)
        _point(
            ax,
            bkx,
            bky,
            f"its knee: c={point_cost_text(bk)}, {bkx:.2f} samples, "
            f"{_fq(baseline, bgain, True)} vs "
            "best-of-N",
            marker="o",
            ms=9,
            mfc="none",
            mec="tab:red",
            mew=1.4,
            zorder=5,
        )
    bx, blo, bhi = se_band(res)
    if res.n_prompts > 1:
        ax.fill_between(
            bx,
            blo,
            bhi,
            color="tab:blue",
            alpha=0.15,
            lw=0,
            zorder=2,
            label="± 2 paired SE of BEACON minus best-of-N (best-of-N outside: beyond noise)",
        )
    _sweep_curve(ax, res, "-o", color="tab:blue", lw=2.0, ms=3.5, zorder=6)
    knee = res.points[res.knee]
    kx, ky = knee.metrics.avg_samples, quality_of(knee.metrics, q)
    fyk = interpolate_fixed(res.fixed, kx, q)
    kse = res.sweep_matched()[res.knee].se
    _point(
        ax,
        kx,
        ky,
        f"recommended knee: c={point_cost_text(knee)}, {kx:.2f} samples, "
        f"{_fq(res, ky - fyk, True)}"
        + ("" if kse is None else f" ± {_fq(res, kse)} SE")
        + " vs best-of-N",
        marker="*",
        ms=17,
        color="tab:orange",
        **_OUTLINED,
    )
    ax.plot([kx, kx], [fyk, ky], ":", color="tab:orange", lw=1.4, zorder=4)
    ch = res.choice
    if ch.rule != "knee":
        cx, cy = ch.metrics.avg_samples, quality_of(ch.metrics, q)
        cmd = res.matched()
        _point(
            ax,
            cx,
            cy,
            f"{ch.rule}: c={choice_cost_text(res)}, {cx:.2f} samples, "
            f"{_fq(res, cmd.diff, True)}"
            + ("" if cmd.se is None else f" ± {_fq(res, cmd.se)} SE")
            + " vs best-of-N",
            marker="D",
            ms=8,
            color="tab:green",
            **_OUTLINED,
        )
    ax.set_xlabel("average samples per prompt  E[K]")
    ylabel = QUALITY_LABELS[q]
    if q == "reward" and res.config.family == "bernoulli":
        ylabel = "success rate (mean best 0/1 reward)"
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    if subtitle:
        import textwrap

        fig.text(
            0.01,
            0.005,
            textwrap.fill(subtitle, 150),
            fontsize=7,
            color="0.35",
            ha="left",
            va="bottom",
        )
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0.5)
    ax.legend(loc="lower right", fontsize=7.5, framealpha=0.92)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=fmt or path.suffix.lower().lstrip(".") or "png")
    plt.close(fig)


_RULE_MARKS = {"knee": "knee", "target-samples": "budget", "max-quality-loss": "budget"}


def sweep_rows(res: TuneResult) -> list[tuple[float, PolicyMetrics, MatchedDifference, str]]:
    """The rows of :func:`sweep_table`: ``(c, metrics, matched difference, mark)`` by ``c``.

    Every swept point, plus the recommendation when a budget chose a ``c`` between swept
    points. Consecutive costs giving the same average samples are merged into one row (the
    recommended one where the group holds it, else the knee, else the first); ``mark`` names
    the knee and the recommendation (``<- knee``, ``<- budget``, or ``<- both``). The
    recommendation's matched difference is :meth:`TuneResult.matched`, the verdict's own.
    """
    ch = res.choice
    rows: list[tuple[float, PolicyMetrics, MatchedDifference, set[str]]] = []
    for i, (p, md) in enumerate(zip(res.points, res.sweep_matched(), strict=True)):
        marks = {"knee"} if i == res.knee else set()
        if p.metrics is ch.metrics:
            marks.add(_RULE_MARKS[ch.rule])
        rows.append((p.cost, p.metrics, md, marks))
    if not res.choice_is_swept:
        rows.append((ch.cost, ch.metrics, res.matched(), {_RULE_MARKS[ch.rule]}))
        rows.sort(key=lambda r: r[0])
    out: list[tuple[float, PolicyMetrics, MatchedDifference, str]] = []
    group: list[tuple[float, PolicyMetrics, MatchedDifference, set[str]]] = []
    for row in [*rows, None]:
        if group and (row is None or row[1].avg_samples != group[0][1].avg_samples):
            # the recommendation's own figures, else the knee's, else the first's
            keep = min(group, key=lambda g: (g[1] is not ch.metrics, "knee" not in g[3]))
            marks = set().union(*(g[3] for g in group))
            shown = "both" if len(marks) == 2 else next(iter(marks), "")
            out.append((keep[0], keep[1], keep[2], f"<- {shown}" if shown else ""))
            group = []
        if row is not None:
            group.append(row)
    return out


def _table_unit(scale: float | None) -> tuple[float, int | None]:
    """``(unit, exponent)``: raw rewards far from 1 are shown in units of ``10**exponent``.

    Where :func:`fmt` would print ``4.421e+09`` (``scale`` outside [0.01, 1e6)), the sweep
    table prints ``4.421`` in units of 1e9 instead, so that its eight columns fit 80 characters.
    """
    if scale is None or scale == 0 or not math.isfinite(scale) or 1e-2 <= abs(scale) < 1e6:
        return 1.0, None
    e = math.floor(math.log10(abs(scale)))
    return 10.0**e, e


def _unit_note(res: TuneResult, columns: str) -> str:
    """A title's note of the unit of ``columns`` where :func:`_table_unit` rescales, else
    empty."""
    _, e = _table_unit(_quality_scale(res))
    return "" if e is None else f" ({res.quality}, {columns} in units of 1e{e})"


def _sweep_caption(res: TuneResult, marks: set[str]) -> str:
    """What the sweep table's diff, SE and ``marks`` (those of its rows) mean."""
    text = f"diff: BEACON minus best-of-N ({res.quality}); SE: its paired standard error over "
    if res.n_prompts > 1:
        text += (
            f"the {res.n_prompts} prompts; diff/SE within ±2: not distinguishable from noise on "
            "this log"
        )
    else:
        text += "prompts, none from 1 prompt"
    if "<- budget" in marks:
        text += f"; <- budget: the c that --{res.choice.rule} chose"
    if "<- both" in marks:
        text += f"; <- both: the knee, also the c that --{res.choice.rule} chose"
    return text


def sweep_table(res: TuneResult) -> Table:
    """One row per distinct policy of the sweep (costs giving the same E[K] are merged).

    Each row: BEACON at that ``c``, best-of-N at the same average samples, their difference and
    its paired standard error over prompts with the difference in SEs
    (:meth:`TuneResult.sweep_matched`), so a ``c`` other than the recommended one can be told
    from noise; the recommended row's figures are the verdict's.
    """
    q = res.quality
    rows = sweep_rows(res)
    t = Table(
        title=f"BEACON, {variant_label(res)}, over c (horizon {res.config.horizon}; "
        f"{cost_units(res.crossfit, res.config.family)}) against fixed best-of-N at the same "
        "average samples" + _unit_note(res, "best-of-N, diff and SE"),
        title_justify="left",
        caption=_sweep_caption(res, {r[3] for r in rows}),
        caption_justify="left",
    )
    t.add_column("c", justify="right")
    t.add_column("avg K", justify="right")
    unit, _ = _table_unit(_quality_scale(res))
    t.add_column(q if q != "standardized" else "zhat", justify="right")
    t.add_column("best-of-N", justify="right")
    t.add_column("diff", justify="right")
    t.add_column("SE", justify="right")
    t.add_column("diff/SE", justify="right")
    t.add_column("")
    # a row's c as the point it shows prints it: the c that replays to the row's numbers
    shown = {id(p.metrics): point_cost_text(p) for p in res.points}
    for _, m, md, mark in rows:
        k = m.avg_samples
        ratio = "-" if not md.se else f"{md.diff / md.se:+.2f}"
        t.add_row(
            choice_cost_text(res) if m is res.choice.metrics else shown[id(m)],
            f"{k:.2f}",
            fmt(quality_of(m, q) / unit),
            fmt(interpolate_fixed(res.fixed, k, q) / unit),
            fmt(md.diff / unit, sign=True),
            fmt(None if md.se is None else md.se / unit),
            ratio,
            mark,
        )
    return t


def _quality_scale(res: TuneResult) -> float | None:
    """:func:`fmt`'s ``scale`` for numbers of ``res.quality``: the rewards' for raw rewards."""
    return reward_scale(res.fixed) if res.quality == "reward" else None


def variants_table(results: list[TuneResult]) -> Table:
    """The variants side by side at their recommended c (the last one is the recommended one)."""
    q = results[-1].quality
    unit, _ = _table_unit(_quality_scale(results[-1]))
    t = Table(
        title="BEACON variants at their recommended c, against best-of-N at the same average "
        "samples" + _unit_note(results[-1], "best-of-N and diff"),
        title_justify="left",
    )
    for col in ("variant", "c", "avg K", q if q != "standardized" else "zhat", "best-of-N", "diff"):
        t.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    for i, r in enumerate(results):
        m = r.choice.metrics
        mine, theirs = quality_of(m, q), interpolate_fixed(r.fixed, m.avg_samples, q)
        name = variant_label(r, short=True) + (" *" if i == len(results) - 1 else "")
        t.add_row(
            name,
            choice_cost_text(r),
            f"{m.avg_samples:.2f}",
            fmt(mine / unit),
            fmt(theirs / unit),
            fmt((mine - theirs) / unit, sign=True),
            style="bold cyan" if i == len(results) - 1 else None,
        )
    return t


def range_lines(results: list[TuneResult]) -> list[str]:
    """BEACON minus best-of-N at the same average samples, smallest..largest over each sweep."""
    parts = []
    for r in results:
        lo, hi = matched_range(r)
        scale = _quality_scale(r)
        parts.append(
            f"{variant_label(r, short=True)} {fmt(lo, scale=scale, sign=True)}.."
            f"{fmt(hi, scale=scale, sign=True)}"
        )
    return [
        f"Over the whole c sweep, BEACON minus best-of-N at the same average samples "
        f"({results[-1].quality}): " + "; ".join(parts) + "."
    ]


def _tuned_settings(horizon: int | None, batch_size: int, robust: bool) -> list[tuple[str, str]]:
    """``(replay option, BeaconConfig keyword)`` of each setting ``tune`` was told to use
    that the commands it prints must repeat: the recommended ``c`` was chosen at them, and the
    defaults (horizon 32, batch 1, robust) would stop elsewhere. Only those the user gave (or
    that differ from the defaults)."""
    out = []
    if horizon is not None:
        out.append((f"--horizon {horizon}", f"horizon={horizon}"))
    if batch_size != 1:
        out.append((f"--batch-size {batch_size}", f"batch_size={batch_size}"))
    if not robust:
        out.append(("--no-robust", "robust=False"))
    return out


def replay_options(
    horizon: int | None, min_samples: int | None, batch_size: int, robust: bool
) -> str:
    """The options of ``tune`` other than the prior's that change what ``replay`` computes,
    as ``replay`` takes them (`` --horizon 6 --batch-size 2``), for the re-check command:
    without them it would replay another horizon or batch size than the one tuned and print
    other numbers (:func:`_tuned_settings`, and ``--min-samples``)."""
    settings = _tuned_settings(horizon, batch_size, robust)
    if min_samples is not None:
        settings.insert(1 if horizon is not None else 0, (f"--min-samples {min_samples}", ""))
    return "".join(f" {option}" for option, _ in settings)


def _deployed_horizon(horizon: int | None, res: TuneResult) -> int | None:
    """The horizon the deploy hint's ``BeaconConfig`` must name: the one ``c`` was tuned at.

    That is ``res.config.horizon``, capped at the samples every prompt has: a log of 10
    samples per prompt tunes ``c`` at horizon 10, and the h-index of another horizon (the
    default 32, or a ``--horizon 50`` the log could not reach) stops elsewhere at the same
    ``c``. None (the default, not repeated) when the tuned horizon is the default one and
    ``--horizon`` was not given.
    """
    tuned = res.config.horizon
    if horizon is None and tuned == DEFAULT_HORIZON:
        return None
    return tuned


def config_options(horizon: int | None, batch_size: int, robust: bool) -> str:
    """The ``BeaconConfig`` fields of :func:`_tuned_settings` for the deploy hint
    (``, horizon=6, batch_size=2, robust=False``)."""
    return "".join(f", {kw}" for _, kw in _tuned_settings(horizon, batch_size, robust))


def deploy_lines(
    res: TuneResult,
    logged: Path,
    data: LoggedRewards,
    transform_spec: str,
    replay_opts: str = "",
    whole: LoggedRewards | None = None,
    config_opts: str = "",
) -> list[str]:
    """How to deploy the recommended cross-fitted variant: fit on the whole log, convert c.

    The deployable prior is fitted on every prompt of the log (nothing is scored with it here);
    its ``within_scale`` turns the recommended ``c`` (per-prompt sd units) into the Stopper's
    cost. ``whole`` is the log before ``--min-samples`` left prompts out: the printed
    ``fit-prior`` command fits all of it, so the cost printed beside it is converted with that
    fit, not with a fit on the prompts tuned on only. ``replay_opts`` (:func:`replay_options`)
    go into the re-check command, so that it replays what was tuned, and ``config_opts``
    (:func:`config_options`) into the ``BeaconConfig(...)`` to deploy. Paths are shell-quoted:
    the commands are meant to be pasted.
    """
    from beacon.fitting import fit_reward_model

    cf = res.crossfit
    assert cf is not None
    fam = res.config.family
    fits_whole = True
    if whole is not None:
        try:
            whole.for_family(fam)
            data = whole
        except ConfigError:
            # unlabelled prompts (bernoulli) that --min-samples left out: fit those kept
            fits_whole = False
    log_arg = shlex.quote(str(logged))
    opts = "" if fam == "normal" else f" --family {fam}"
    if cf.transform != "none":
        opts += f" --transform {shlex.quote(transform_spec)}"
    with spinner("fitting the deployable prior on the whole log"):
        tr = None if cf.transform == "none" else transform_spec
        if tr is not None and tr not in ("gaussianize", "logit"):
            from beacon.cli.common import parse_transform

            fit = fit_reward_model(data.for_family(fam).rewards, fam, transform=parse_transform(tr))
        else:
            fit = fit_reward_model(data.for_family(fam).rewards, fam, transform=tr)
    # from the c printed beside it, so that the line's arithmetic is what it shows
    model_cost = float(choice_cost_text(res)) * fit.within_scale
    # replay --prior fit defaults to gaussianize for the normal family (fit-prior to none):
    # the re-check must name a tuned "none", or it replays another variant
    cli_opts = opts + (" --transform none" if fam == "normal" and cf.transform == "none" else "")
    lines = [
        "To deploy it, fit the prior (and transform) on the whole log:",
        f"  beacon fit-prior {log_arg}{opts} -o prior.json",
    ]
    if not fits_whole:
        lines[0] = ("To deploy it, fit the prior on the log's prompts that have labels (leave "
                    "the others out of a copy of the log first; fit-prior refuses them):")
    if fam == "normal":
        lines.append(
            f"  and use cost = c x within_scale = {choice_cost_text(res)} x "
            f"{fit.within_scale:.4g}"
            f" = {model_cost:.4g} in model units: BeaconConfig(prior=..., transform=..., "
            f"cost={model_cost:.4g}{config_opts}) "
            f"(beacon.fitting.load_fit('prior.json').config(cost=...{config_opts}))."
        )
    elif config_opts:
        lines.append(
            f"  and use cost = {choice_cost_text(res)} (successes per sample): "
            f"BeaconConfig(family={fam!r}, prior=..., cost={choice_cost_text(res)}"
            f"{config_opts})."
        )
    else:
        lines.append(f"  and use cost = {choice_cost_text(res)} (successes per sample).")
    lines.append(
        f"  Re-check on this log without leakage: beacon replay {log_arg} --prior fit{cli_opts}"
        f"{replay_opts} "
        f"--cost {choice_cost_text(res)}"
        + ("" if cf.n_folds == 5 else f" --folds {cf.n_folds}")
    )
    return lines


def recommendation_lines(res: TuneResult) -> list[str]:
    q = res.quality
    ch, full = res.choice, res.fixed[-1]
    m = ch.metrics
    saved = 100.0 * (1.0 - m.avg_samples / full.avg_samples)
    matched = interpolate_fixed(res.fixed, m.avg_samples, q)
    md = res.matched()
    qs, rs = _quality_scale(res), reward_scale(res.fixed)
    why = {
        "knee": "the knee of the quality-samples curve",
        "target-samples": "the smallest c within the target average samples",
        "max-quality-loss": "the largest c within the allowed quality loss",
    }[ch.rule]
    lines = [
        f"Recommended: BEACON with the {variant_label(res)}, c = {choice_cost_text(res)} ({why}; "
        f"{cost_units(res.crossfit, res.config.family)}).",
        f"  BEACON: {m.avg_samples:.2f} samples per prompt ({saved:.0f}% fewer than "
        f"best-of-{full.n}), {q} {fmt(quality_of(m, q), scale=qs)}; best-of-N at the same "
        f"samples {fmt(matched, scale=qs)} ({_pm_se(md, qs)}); best-of-{full.n} "
        f"{fmt(quality_of(full, q), scale=qs)}.",
    ]
    if q != "reward":
        raw = interpolate_fixed(res.fixed, m.avg_samples, "reward")
        rmd = matched_difference(m, res.fixed, "reward")
        lines.append(
            f"  mean raw reward of the chosen sample: BEACON {fmt(m.mean_best_reward, scale=rs)}, "
            f"best-of-N at the same samples {fmt(raw, scale=rs)} ({_pm_se(rmd, rs)})."
        )
    if m.accuracy is not None and q != "accuracy" and full.accuracy is not None:
        lines.append(f"  accuracy: BEACON {m.accuracy:.3f}, best-of-{full.n} {full.accuracy:.3f}.")
    if ch.note:
        lines.append(f"  note: {ch.note}")
    lines.append(f"  verdict: {verdict(res)[1]}")
    return lines


@guarded
@one_line_warnings
def tune_command(
    logged: LoggedArg,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            "-o",
            help="Write the quality-vs-samples plot here, in the format of the file's extension "
            "(.png, .pdf, .svg, ...; PNG without one).",
            show_default=False,
        ),
    ] = None,
    target_samples: Annotated[
        float | None,
        typer.Option(
            "--target-samples",
            "-k",
            help="Choose the c with the best quality using at most K samples on average.",
            show_default=False,
        ),
    ] = None,
    max_quality_loss: Annotated[
        float | None,
        typer.Option(
            "--max-quality-loss",
            "-x",
            help="Choose the largest c whose quality is at most X below best-of-horizon "
            "(X in the units of --quality).",
            show_default=False,
        ),
    ] = None,
    quality: Annotated[
        str | None,
        typer.Option(
            "--quality",
            help="Quality measure: standardized (mean per-prompt z-score of the chosen "
            "reward), reward (raw), or accuracy [default: standardized; reward for "
            "bernoulli].",
            show_default=False,
        ),
    ] = None,
    points: Annotated[
        int,
        typer.Option(
            "--points",
            help="Costs per log-spaced sweep pass: the default sweep makes two (the data's whole "
            "range of c, then where the samples used change); with --cost-min / --cost-max, one "
            "pass over that range.",
        ),
    ] = 25,
    cost_min: Annotated[
        float | None,
        typer.Option(
            "--cost-min",
            help="Smallest c to sweep [default: from the data's scale].",
            show_default=False,
        ),
    ] = None,
    cost_max: Annotated[
        float | None,
        typer.Option(
            "--cost-max",
            help="Largest c to sweep [default: from the data's scale].",
            show_default=False,
        ),
    ] = None,
    horizon: HorizonOpt = None,
    min_samples: MinSamplesOpt = None,
    family: FamilyOpt = "normal",
    batch_size: BatchOpt = 1,
    robust: RobustOpt = True,
    prior: Annotated[
        str | None,
        typer.Option(
            "--prior",
            help="'fit' [default for the normal family]: an empirical-Bayes prior cross-fitted "
            "on the log (each fold replayed with the prior fitted on the other folds; c in "
            "per-prompt sd units), swept next to the paper's default prior; 'default' (or "
            "'jeffreys') [default for bernoulli/judge]: the family's default prior only; or a "
            "prior JSON file from 'beacon fit-prior'.",
            show_default=False,
        ),
    ] = None,
    transform: TransformOpt = None,
    folds: FoldsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Sweep the cost c, compare BEACON with fixed best-of-N, and recommend a variant and a c.

    By default (normal family) the prior and a Gaussianizing transform are cross-fitted on the
    log (--prior fit --transform gaussianize --folds 5) and swept next to the paper's default
    Jeffreys prior. The knee of the recommended variant's quality-versus-samples curve is
    recommended unless --target-samples or --max-quality-loss states a budget.
    """
    if target_samples is not None and max_quality_loss is not None:
        usage_error("give --target-samples or --max-quality-loss, not both", "--target-samples")
    if quality is not None and quality not in QUALITY_KINDS:
        usage_error(f"{quality!r}: choose from {', '.join(QUALITY_KINDS)}", "--quality")
    if points < 2:
        usage_error(f"{points}: need at least 2 costs", "--points")
    # Budgets that no sweep can meet are usage errors now, not after minutes of sweeping.
    if target_samples is not None and not (math.isfinite(target_samples) and target_samples > 0):
        usage_error(f"{target_samples:g}: must be a finite number > 0", "--target-samples")
    if target_samples is not None and target_samples < 1:
        usage_error(
            f"{target_samples:g}: not reachable, every prompt uses at least 1 sample",
            "--target-samples",
        )
    if max_quality_loss is not None and not (
        math.isfinite(max_quality_loss) and max_quality_loss >= 0
    ):
        usage_error(f"{max_quality_loss:g}: must be a finite number >= 0", "--max-quality-loss")
    for option, bound in (("--cost-min", cost_min), ("--cost-max", cost_max)):
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            usage_error(f"{bound:g}: must be a finite number > 0", option)
    plot_format = None if plot is None else check_plot_path(plot)
    whole = load_log(logged)
    data, kept_notes = select_prompts(whole, family, min_samples)
    # The sweep replaces the cost; 0.1 only has to be a valid placeholder for validation.
    setup = log_setup(
        data,
        **options_for(
            log_setup,
            locals(),
            cost=0.1,
            default_prior="fit" if family == "normal" else "default",
        ),
    )
    cfg, cf, notes = setup.config, setup.crossfit, kept_notes + setup.notes
    costs = None
    if cost_min is not None or cost_max is not None:
        fam_data = data.for_family(family)
        lo_hi = cost_grid(fam_data, cfg, points, crossfit=cf)
        lo = cost_min if cost_min is not None else float(lo_hi[0])
        hi = cost_max if cost_max is not None else float(lo_hi[-1])
        if not (0 < lo < hi):
            # blame the bound the user gave when the other one is the data's default
            if cost_min is None:
                usage_error(
                    f"{hi:g}: must be above the default --cost-min {lo:g} (from the data's "
                    "scale); give --cost-min too",
                    "--cost-max",
                )
            if cost_max is None:
                usage_error(
                    f"{lo:g}: must be below the default --cost-max {hi:g} (from the data's "
                    "scale); give --cost-max too",
                    "--cost-min",
                )
            usage_error(f"need 0 < --cost-min < --cost-max, got {lo:g} and {hi:g}", "--cost-min")
        if family in ("bernoulli", "judge") and hi >= 1.0:
            usage_error(f"{hi:g}: the {family} family needs c < 1", "--cost-max")
        import numpy as np

        costs = np.logspace(np.log10(lo), np.log10(hi), points)
    baseline_cfg: BeaconConfig | None = None
    if cf is not None:
        # The paper's default on the raw rewards, swept on the same prompts for comparison.
        try:
            baseline_cfg = cfg.replace(prior=None, transform=None)
        except ConfigError as exc:
            if exc.field != "horizon":
                raise
            # a log too short for the default prior (Jeffreys: 4 samples) is swept fitted only
            notes.append(
                f"the default prior is not swept for comparison: at horizon {cfg.horizon} "
                f"(the samples every prompt has) it fails: {exc.reason}"
            )
    if baseline_cfg is not None:
        notes += scale_note(data, baseline_cfg, "the Jeffreys comparison: ")
        warm_up(data, baseline_cfg)
    warm_up(data, cfg, cf)
    # Two passes of `points` costs each for a default sweep (the baseline's included); over
    # --cost-min..--cost-max one replay per cost, then one checking the digits printed for it.
    base_total = 0 if baseline_cfg is None else 2 * points
    total = 2 * points + base_total
    baseline: TuneResult | None = None
    with progress_bar(f"sweeping c on {count_noun(data.n_prompts, 'prompt')}", total) as update:
        if baseline_cfg is not None:
            baseline = tune(
                data,
                baseline_cfg,
                quality=_quality(quality),
                progress=lambda d, _t: update(d, total),
                n_costs=points,
            )
        done = base_total

        def step(d: int, _t: int) -> None:
            update(done + d, total)

        res = tune(
            data,
            cfg,
            costs,
            target_samples=target_samples,
            max_quality_loss=max_quality_loss,
            quality=_quality(quality),
            progress=step,
            crossfit=cf,
            n_costs=points,
        )
    notes += horizon_note(res.requested_horizon, res.config, data.for_family(family))
    notes += _judge_hint(data, res, family)
    title = (
        f"BEACON vs best-of-N: {logged.name} ({count_noun(res.n_prompts, 'prompt')}, "
        f"horizon {res.config.horizon})"
    )
    subtitle = describe_setup(res.config, cf)
    if cf is not None:
        subtitle += "; no prompt is scored with a prior fitted on itself"
    if plot is not None:
        plot_tune(res, plot, title, subtitle, baseline, plot_format)
    deploy = (
        []
        if cf is None
        else deploy_lines(
            res,
            logged,
            data,
            setup.transform_spec,
            replay_options(horizon, min_samples, batch_size, robust),
            whole,
            config_options(_deployed_horizon(horizon, res), batch_size, robust),
        )
    )
    if as_json:
        out: dict[str, Any] = res.to_dict()
        out["variant"] = variant_label(res)
        out["matched_range"] = list(matched_range(res))
        out["beats_best_of_n"], out["verdict"] = verdict(res)
        out["baseline"] = None
        if baseline is not None:
            b_beats, b_verdict = verdict(baseline)
            out["baseline"] = {
                **baseline.to_dict(),
                "variant": variant_label(baseline),
                "matched_range": list(matched_range(baseline)),
                "beats_best_of_n": b_beats,
                "verdict": b_verdict,
            }
        out["source"] = str(logged)
        out["plot"] = None if plot is None else str(plot)
        out["deploy"] = deploy
        out["notes"] = notes
        echo_json(out)
        return
    print_notes(notes)
    out_console.print(f"{logged.name}: {count_noun(res.n_prompts, 'prompt')}; {subtitle}",
                      markup=False)
    print_table(sweep_table(res))
    if baseline is not None:
        print_table(variants_table([baseline, res]))
        for line in range_lines([baseline, res]):
            out_console.print(line, markup=False)
    for line in recommendation_lines(res):
        out_console.print(line, markup=False)
    for line in deploy:
        out_console.print(line, markup=False)
    if plot is not None:
        out_console.print(f"Plot written to {plot}", markup=False)


def _judge_hint(data: LoggedRewards, res: TuneResult, family: str) -> list[str]:
    """Point at --family judge for rewards in [0, 1], with this log's own measurement.

    Only a suggestion: [0, 1] is the range of a probability, not evidence that the rewards are
    a pairwise judge's win probabilities, so the family is never switched automatically. The
    judge family (default prior) is swept here so the suggestion quotes numbers from this log.
    """
    import numpy as np

    if family != "normal" or data.is_binary:
        return []  # 0/1 rewards: the bernoulli note (log_setup) is the exact model, not judge
    r = data.rewards[~np.isnan(data.rewards)]
    if r.size == 0 or r.min() < 0.0 or r.max() > 1.0:
        return []
    from beacon.families.judge import WIN_THRESHOLD  # registers the judge family

    jcfg = res.config.replace(family="judge", prior=None, transform=None, robust=True)
    try:
        with spinner("sweeping the judge family for comparison"):
            j = tune(data, jcfg, quality=res.quality)
    except ConfigError:
        return []
    jm = j.choice.metrics
    q = res.quality
    jd = quality_of(jm, q) - interpolate_fixed(j.fixed, jm.avg_samples, q)
    lo, hi = matched_range(j)
    rm = res.choice.metrics
    mine = quality_of(rm, q) - interpolate_fixed(res.fixed, rm.avg_samples, q)
    jraw = jm.mean_best_reward - interpolate_fixed(j.fixed, jm.avg_samples, "reward")
    mraw = rm.mean_best_reward - interpolate_fixed(res.fixed, rm.avg_samples, "reward")
    # raw differences as the tables print raw rewards: rewards of 1e-9 are not "+0.0000"
    rs = reward_scale(res.fixed)
    qs = rs if q == "reward" else None

    def show(x: float, digits: int = 3, scale: float | None = qs) -> str:
        return fmt(x, digits, scale=scale, sign=True)

    return [
        f"all rewards lie in [0, 1]. If they are a pairwise judge's win probabilities, try "
        f"--family judge (a Beta model of 'has a win, r > {WIN_THRESHOLD:g}, been found'): on "
        f"this log its knee uses {jm.avg_samples:.2f} samples, {show(jd)} {q} "
        f"({show(jraw, 4, rs)} raw reward) vs best-of-N at the same samples "
        f"({show(lo)}..{show(hi)} over its sweep, which cannot go past the first win), against "
        f"{show(mine)} ({show(mraw, 4, rs)} raw) for the recommended variant."
    ]


def _quality(q: str | None) -> QualityKind | None:
    if q is None:
        return None
    if q == "standardized":
        return "standardized"
    if q == "reward":
        return "reward"
    if q == "accuracy":
        return "accuracy"
    raise ConfigError("quality", q, f"must be one of {', '.join(QUALITY_KINDS)}")


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)
