"""The ``beacon`` command line (typer).

Commands: ``table``, ``replay``, ``tune`` (this package), ``fit-prior`` (``beacon.cli.priors``)
and ``run`` / ``submit`` / ``status`` / ``collect`` / ``worker`` (``beacon.cli.jobs``). Each
command module exposes ``register(app)``. Heavy imports (numba, matplotlib, celery) happen inside
the commands, so ``beacon --help`` stays fast.

Exit codes: 0 success, 1 failure, 2 usage error (see :mod:`beacon.cli.common`).
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from beacon import __version__

__all__ = ["app", "main"]

app = typer.Typer(
    name="beacon",
    help="BEACON: adaptive best-of-N sampling by Bayesian optimal stopping.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts contain literal brackets (E[zhat - K*c], [default: ...]); no markup parsing.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Command modules written elsewhere; present in a full checkout, absent in a partial one.
_OPTIONAL_COMMANDS = ("beacon.cli.priors", "beacon.cli.jobs")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"beacon {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """BEACON: adaptive best-of-N sampling by Bayesian optimal stopping."""


def _register_all() -> None:
    from beacon.cli import replay, table, tune

    table.register(app)
    replay.register(app)
    tune.register(app)
    for name in _OPTIONAL_COMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only the module itself being absent is tolerated; a missing dependency *inside* it
            # is a real error and propagates.
            if exc.name != name:
                raise
            continue
        mod.register(app)


_register_all()


def main() -> None:
    """Entry point of the ``beacon`` console script."""
    app()
