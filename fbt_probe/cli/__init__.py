"""The `fbt-probe` command line. Each sub-command lives in its own module; this file only wires them.

Errors raised as `FbtError` print one line (`error: ...`) and exit with code 2. Under torchrun
(`torchrun --nproc_per_node N -m fbt_probe ...`) every process runs the same command inside one
process group (`fbt_probe.distributed.session`); extract, patch and train share their work out.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from fbt_probe.errors import FbtError

app = typer.Typer(
    help="fbt-probe: build, train, probe and intervene on latent-feedback transformers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help and plain one-line errors (FbtError.show)
    context_settings={"help_option_names": ["-h", "--help"]},  # every command and group
)


def _version(value: bool) -> None:
    if value:
        from fbt_probe._version import __version__

        typer.echo(f"fbt-probe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fbt-probe: build, train, probe and intervene on latent-feedback transformers."""


# (name, module): each module exposes either `app` (a typer.Typer, added as a group) or
# `register(app)` (adds plain commands to the root app).
_SUBCOMMANDS = [
    ("model", "fbt_probe.cli.model"),
    ("demo", "fbt_probe.cli.demo"),
    ("bench", "fbt_probe.cli.bench"),
    ("tasks", "fbt_probe.cli.tasks"),
    ("probes", "fbt_probe.cli.probes"),
    ("train", "fbt_probe.cli.train"),
    ("reproduce", "fbt_probe.cli.reproduce"),
    ("patch", "fbt_probe.cli.patch"),
    ("lens", "fbt_probe.cli.lens"),
    ("sae", "fbt_probe.cli.sae"),
]

for _name, _module in _SUBCOMMANDS:
    _mod = importlib.import_module(_module)
    if hasattr(_mod, "register"):
        _mod.register(app)
    else:
        app.add_typer(_mod.app, name=_name)


def main() -> None:
    try:
        if "WORLD_SIZE" in os.environ:  # torchrun: one process group for the whole command (fbt_probe.distributed)
            from fbt_probe.distributed import session

            with session():
                app()
        else:  # one process: nothing to set up, and `--help` does not import torch
            app()
    except FbtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
