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
from typer.core import TyperCommand, TyperGroup

from fbt_probe._version import __version__
from fbt_probe.errors import FbtError

# name: (module, the one-line help `fbt-probe --help` lists; tests/test_cli_root.py checks it against
# the command's own). A module exposes `register(app)` (plain commands on the root) or `app` (a group
# of that name). Nothing here imports a module before its command runs, so `--help` and
# `--version` start without torch, and every command module imports what it needs at its top.
COMMANDS = {
    "demo": (
        "fbt_probe.cli.demo",
        "Build the `tiny` model, summarise its hooks, and greedy-generate under Std / Soft / Fused.",
    ),
    "extract": (
        "fbt_probe.cli.probes",
        "Extract the final-position residual stream at every depth for each prefill mode.",
    ),
    "probe": ("fbt_probe.cli.probes", "Fit grouped-CV probes at every depth for each task x mode x length."),
    "figures": ("fbt_probe.cli.probes", "Draw a figure from a results table (never runs a model)."),
    "train": (
        "fbt_probe.cli.train",
        "Train a latent-feedback model (or its no-feedback baseline, or a Hidden Decoding model) on the four tasks.",
    ),
    "eval": (
        "fbt_probe.cli.train",
        "Answer accuracy per task × length under Std/Soft, Fused, recurrent:1, jacobi:3 and full, on contexts held out of training, plus validation loss per pass.",
    ),
    "reproduce": (
        "fbt_probe.cli.reproduce",
        "Generate the task datasets, take the shipped feedback model and its no-feedback baseline (or train them: --train), run the contraction diagnostic, extract activations, fit the probe sweep, run the causal experiments, draw every figure and write OUT/report.html and OUT/report.md.",
    ),
    "patch": ("fbt_probe.cli.patch", "Run causal intervention experiments over the minimal pairs of DATASET."),
    "lens": (
        "fbt_probe.cli.lens",
        "What each depth would predict: the logit lens (final norm + tied unembedding) and a tuned lens (one affine translator per depth, identity init, KL to the final logits of held-out task text), at the final position, under each prefill mode and each Jacobi pass.",
    ),
    "model": ("fbt_probe.cli.model", "Inspect, import and export models."),
    "bench": ("fbt_probe.cli.bench", "Benchmarks (Markdown tables; JSON with provenance beside --out)."),
    "tasks": (
        "fbt_probe.cli.tasks",
        "Synthetic probe tasks (completion, memory, registers, registers-count): specs, datasets, tokenizer.",
    ),
    "diagnose": ("fbt_probe.cli.train", "Diagnostics of a trained run."),
    "sae": ("fbt_probe.cli.sae", "Sparse autoencoders on a hook (default: the carried state, fusion.hook_feedback)."),
}


def load_command(name: str) -> TyperCommand | TyperGroup:
    """The click command `name`, its module imported now."""
    module = importlib.import_module(COMMANDS[name][0])
    holder = typer.Typer(**SETTINGS)
    if hasattr(module, "register"):
        module.register(holder)
    else:
        holder.add_typer(module.app, name=name)
    return typer.main.get_group(holder).commands[name]


class LazyGroup(TyperGroup):
    """The root group: lists `COMMANDS` from the table and imports a command's module only when
    that command is looked up to run (click's lazy-group pattern)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, name: str) -> TyperCommand | TyperGroup | None:
        if name not in COMMANDS:
            return None
        if name not in self.commands:
            self.commands[name] = load_command(name)
        return self.commands[name]

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        """The command list from the table's one-line helps (no module imported)."""
        limit = formatter.width - 6 - max(len(n) for n in COMMANDS)
        rows = [(name, TyperCommand(name, help=text).get_short_help_str(limit)) for name, (_, text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# The root's settings, which every command inherits (the lazy group builds each under a Typer with these).
SETTINGS = dict(
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help and plain one-line errors (FbtError.show)
    context_settings={"help_option_names": ["-h", "--help"]},  # every command and group
)

app = typer.Typer(
    cls=LazyGroup,
    help="fbt-probe: build, train, probe and intervene on latent-feedback transformers.",
    no_args_is_help=True,
    **SETTINGS,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fbt-probe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fbt-probe: build, train, probe and intervene on latent-feedback transformers."""


def main() -> None:
    try:
        if "WORLD_SIZE" in os.environ:  # torchrun: one process group for the whole command
            from fbt_probe.distributed import session  # imports torch, which `--help` does not need

            with session():
                app()
        else:  # one process: nothing to set up, and `--help` does not import torch
            app()
    except FbtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
