"""``beacon table``: build (or find) the h-index table of a horizon and prior."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from beacon.cli.common import (
    guarded,
    load_prior_file,
    one_line_warnings,
    option_error,
    out_console,
    spinner,
    stopwatch,
    usage_error,
)
from beacon.errors import ConfigError
from beacon.priors import NIGPrior, rewards_before_first_decision

__all__ = ["register", "table_command"]


@guarded
@one_line_warnings
def table_command(
    horizon: Annotated[
        int,
        typer.Option(
            "--horizon", "-n", help="Horizon n of the table (>= k0 + 1).", show_default=False
        ),
    ],
    prior: Annotated[
        Path | None,
        typer.Option(
            "--prior", help="Prior JSON with a NIG prior (default: Jeffreys).", show_default=False
        ),
    ] = None,
    precise: Annotated[
        bool,
        typer.Option(
            "--precise",
            help="Build with the precise recipe (every row to about 1e-6; about 4 minutes for "
            "n = 32) unless a precise table exists. Later runs use it.",
        ),
    ] = False,
) -> None:
    """Build the h-index table h_{n,k} for horizon n (and a prior), or find it in the cache.

    Prints where the table lives (the disk cache: $BEACON_CACHE_DIR or ~/.cache/beacon, or the
    tables shipped with the package), its recipe and how long getting it took.
    """
    from beacon.index.cache import find_table

    p = NIGPrior.jeffreys()
    if prior is not None:
        loaded, _ = load_prior_file(prior)
        if not isinstance(loaded, NIGPrior):
            # name the file and what it holds: a Beta prior of fit-prior --family bernoulli
            usage_error(
                f"{str(prior)!r} holds a {loaded.family} prior; h-index tables belong to the "
                "normal family: give a NIG prior (mu0, nu0, alpha0, beta0)",
                "--prior",
            )
        p = loaded
    # the rewards before the first decision, as replay counts them: a proper prior's k0 is 0
    # but it decides after one reward, so its table needs n >= 2
    need = rewards_before_first_decision(p) + 1
    if horizon < need:
        usage_error(f"{horizon}: must be >= k0 + 1 = {need} for this prior", "--horizon")
    wait = " (a precise build, if needed, takes minutes)" if precise else ""
    try:
        with spinner(f"h-index table n={horizon}{wait}"), stopwatch() as elapsed:
            found = find_table(horizon, p.alpha0, p.nu0, precise=precise)
    except ConfigError as exc:
        if exc.field == "n":
            # the table's n is --horizon (too large, for one)
            option_error(ConfigError("horizon", exc.value, exc.reason), "--horizon")
        if prior is not None and exc.field in ("alpha0", "nu0"):
            # a prior outside the tables' range: the option is --prior, the culprit its file
            usage_error(f"{str(prior)!r}: {exc.field}={exc.value!r}: {exc.reason}", "--prior")
        raise
    cached = found.path.is_file()
    source = found.source
    if not cached and source.endswith(", built and cached"):
        # find_table names the cache file it tried; the warning shown above says why not
        source = source.replace(", built and cached", ", built (not cached)")
    out_console.print(
        f"h-index table n={horizon}, alpha0={p.alpha0:g}, nu0={p.nu0:g}: {source}",
        markup=False,
    )
    out_console.print(f"  recipe: {found.table.recipe.name}", markup=False)
    if cached:
        out_console.print(f"  path: {found.path}", markup=False)
    else:
        out_console.print(f"  path: none (could not write the cache {found.path})", markup=False)
    out_console.print(f"  time: {elapsed[0]:.3f} s", markup=False)


def register(app: typer.Typer) -> None:
    app.command("table")(table_command)
