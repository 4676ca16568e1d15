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

__all__ = ["app", "main", "missing_extra_message"]

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


# Top-level modules of the optional extras -> the extra that installs them.
_EXTRA_OF_MODULE = {
    "celery": "worker",
    "kombu": "worker",
    "redis": "worker",
    "aiohttp": "http",
    "math_verify": "verify",
    "langchain_core": "langchain",
    "llama_index": "llamaindex",
}


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """What to tell the user when a command failed on ``exc``: the error plus the extra that
    installs the missing module, or ``None`` when that module belongs to no extra."""
    extra = _EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
    if extra is None:
        return None
    message = str(exc)
    if "pip install" not in message:
        message += (
            f' (this command needs the {extra!r} extra: pip install "beacon-sampling[{extra}]")'
        )
    return message


def main() -> None:
    """Entry point of the ``beacon`` console script.

    A command that needs an extra which is not installed (``beacon worker`` without ``worker``)
    exits with :data:`~beacon.cli.common.EXIT_FAILURE` and an ``error:`` line naming the extra,
    not a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        from rich.markup import escape

        from beacon.cli.common import EXIT_FAILURE, err_console

        err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
        raise SystemExit(EXIT_FAILURE) from None
