"""The `fbt-probe` command line. Each sub-command lives in its own module; this file only wires them.

Errors raised as `FbtError` print one line (`error: ...`) and exit with code 2. Under torchrun
(`torchrun --nproc_per_node N -m fbt_probe ...`) every process runs the same command inside one
process group (`fbt_probe.distributed.session`); extract, patch and train share their work out.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

from fbt_probe._version import __version__
from fbt_probe.errors import FbtError


class Command(NamedTuple):
    """A command in a lazy table: the module that defines it and the one-line help the group lists."""

    module: str
    help: str


class Group(NamedTuple):
    """A group of commands in a lazy table: its help and its own table (loaded as lazily as the root)."""

    help: str
    commands: dict[str, Command]


# name: the command or group, and the one-line help `fbt-probe --help` lists (tests/test_cli_root.py
# checks every help here against the command's own). A module exposes `register(app)` (plain commands)
# or `app` (a group of that name). Nothing here imports a module before its command runs, so
# `--help` and `--version` start without torch, `fbt-probe model refs` imports only `refs`, and every
# command module imports what it needs at its top.
COMMANDS: dict[str, Command | Group] = {
    "demo": Command(
        "fbt_probe.cli.demo",
        "Build the `tiny` model, summarise its hooks, and greedy-generate under Std / Soft / Fused.",
    ),
    "extract": Command(
        "fbt_probe.cli.probes",
        "Extract the final-position residual stream at every depth for each prefill mode.",
    ),
    "probe": Command("fbt_probe.cli.probes", "Fit grouped-CV probes at every depth for each task x mode x length."),
    "figures": Command("fbt_probe.cli.probes", "Draw a figure from a results table (never runs a model)."),
    "train": Command(
        "fbt_probe.cli.train",
        "Train a latent-feedback model (or its no-feedback baseline, or a Hidden Decoding model) on the four tasks.",
    ),
    "eval": Command(
        "fbt_probe.cli.evaluate",
        "Answer accuracy and answer loss per task × length under Std/Soft, Fused, recurrent:1, jacobi:3 and full, on contexts held out of training (or, with --contexts trained, on those it trains on), plus validation loss per pass.",
    ),
    "reproduce": Command(
        "fbt_probe.cli.reproduce",
        "Generate the task datasets, take the shipped feedback model and its no-feedback baseline (or train them: --train), run the contraction diagnostic, extract activations, fit the probe sweep, run the causal experiments, draw every figure and write OUT/report.html and OUT/report.md.",
    ),
    "patch": Command("fbt_probe.cli.patch", "Run causal intervention experiments over the minimal pairs of DATASET."),
    "lens": Command(
        "fbt_probe.cli.lens",
        "What each depth would predict: the logit lens (final norm + tied unembedding) and a tuned lens (one affine translator per depth, identity init, KL to the final logits of held-out task text), at the final position, under each prefill mode and each Jacobi pass.",
    ),
    "model": Group(
        "Inspect, import and export models.",
        {
            "info": Command("fbt_probe.cli.model.info", "Config, parameter counts and hook points of a model."),
            "import-hf": Command(
                "fbt_probe.cli.model.import_hf",
                "Import a Qwen3 checkpoint and add fresh fusion weights (W_U, W_G ~ N(0, 0.02); fusion norm weight = mean embedding-row RMS), depth scaling off, post-norm feedback.",
            ),
            "import-nanochat": Command(
                "fbt_probe.cli.model.import_nanochat",
                "Import a checkpoint of the nanochat latent-feedback reproduction (every backbone extra and the fusion variant of its meta; see fbt_probe/formats/nanochat/).",
            ),
            "export-hf": Command(
                "fbt_probe.cli.model.export_hf",
                "Export the backbone as a Qwen3 checkpoint (fusion weights go to fusion.safetensors beside it).",
            ),
            "refs": Command(
                "fbt_probe.cli.model.refs",
                "The reference models shipped with the package (load them as ref:<name> wherever a model is read).",
            ),
            "pack": Command(
                "fbt_probe.cli.model.pack",
                "Make RUN a reference model: copy its checkpoint, evaluate it on held-out contexts, write its model card (card.md) and the sha256 record every load verifies (reference.json).",
            ),
        },
    ),
    "bench": Group(
        "Benchmarks (Markdown tables; JSON with provenance beside --out).",
        {
            "fusion": Command(
                "fbt_probe.cli.bench.fusion",
                "Time the fusion epilogue RMSNorm(value ⊙ gate)·w: fused Triton kernel vs eager PyTorch vs torch.compile, bandwidth vs the device peak, and its share of the model's step at paper-1b.",
            ),
            "model": Command(
                "fbt_probe.cli.bench.model",
                "`standard` and `full` prefill time (and peak memory) at T x batch, full / standard and the time per serial step, and run_with_cache over a plain forward, on this machine's CPU (or GPU: --device cuda).",
            ),
            "patch": Command(
                "fbt_probe.cli.bench.patch",
                "Wall time and peak RSS of `fbt-probe patch` per experiment (each command in its own process), and on a subset the speed-up of prefix reuse over the full re-run with the largest difference between their summary tables.",
            ),
            "nnsight": Command(
                "fbt_probe.cli.bench.nnsight",
                "nnsight's trace against run_with_cache reading one hook on the same forward: `recurrent:1`, and `full` with serial=True through nnsight's iteration support (each value checked first).",
            ),
            "train": Command(
                "fbt_probe.cli.bench.train",
                "Training tokens per second of `fbt-probe train --corpus` against a plain PyTorch loop over the same model, windows and objective (hooks off), per pass count K.",
            ),
            "probes": Command(
                "fbt_probe.cli.bench.probes",
                "A depth x fold probe sweep on synthetic activations: the project's CPU path (lbfgs, one BLAS thread per fit, fits over cores) against scikit-learn defaults in one loop, and with --torch the batched torch path, with the largest held-out accuracy difference between them.",
            ),
            "diff-reports": Command(
                "fbt_probe.cli.bench.diff_reports",
                "Compare two reports' tables token by token: text exactly, numbers to --ulps units in their last printed place (a speed-up must leave a study's tables as they were).",
            ),
        },
    ),
    "tasks": Command(
        "fbt_probe.cli.tasks",
        "Synthetic probe tasks (completion, memory, registers, registers-count): specs, datasets, tokenizer.",
    ),
    "corpus": Command(
        "fbt_probe.cli.corpus",
        "The general-LM corpus: fetch the pinned archives, check every file, train the tokenizer, store the tokens.",
    ),
    "diagnose": Command("fbt_probe.cli.evaluate", "Diagnostics of a trained run."),
    "sae": Command(
        "fbt_probe.cli.sae", "Sparse autoencoders on a hook (default: the carried state, fusion.hook_feedback)."
    ),
}


def load_command(name: str, table: dict[str, Command | Group] = COMMANDS) -> TyperCommand | TyperGroup:
    """The click command `name` of `table`: its module imported now, or a lazy group over its own table."""
    entry = table[name]
    if isinstance(entry, Group):
        group = LazyGroup(
            name=name,
            help=entry.help,
            no_args_is_help=True,
            context_settings=SETTINGS["context_settings"],
            rich_markup_mode=SETTINGS["rich_markup_mode"],
        )
        group.table = entry.commands
        return group
    module = importlib.import_module(entry.module)
    holder = typer.Typer(**SETTINGS)
    if hasattr(module, "register"):
        module.register(holder)
    else:
        holder.add_typer(module.app, name=name)
    return typer.main.get_group(holder).commands[name]


class LazyGroup(TyperGroup):
    """A group that lists its commands from a table and imports a command's module only when that
    command is looked up to run (click's lazy-group pattern). The root's table is `COMMANDS`."""

    table: dict[str, Command | Group] = COMMANDS

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(self.table)

    def get_command(self, ctx: typer.Context, name: str) -> TyperCommand | TyperGroup | None:
        if name not in self.table:
            return None
        if name not in self.commands:
            self.commands[name] = load_command(name, self.table)
        return self.commands[name]

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        """The command list from the table's one-line helps (no module imported)."""
        limit = formatter.width - 6 - max(len(n) for n in self.table)
        rows = [(name, TyperCommand(name, help=e.help).get_short_help_str(limit)) for name, e in self.table.items()]
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


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """The package's own warnings (a cell capped at the groups it has, a length cut) as one `note:`
    line on stderr; anything else's as Python shows it."""
    out = sys.stderr if file is None else file
    if issubclass(category, UserWarning) and "fbt_probe" in str(filename):
        print(f"note: {message}", file=out)
    else:
        out.write(warnings.formatwarning(message, category, filename, lineno, line))


def main() -> None:
    warnings.showwarning = _note
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
