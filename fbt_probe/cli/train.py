"""`fbt-probe train`: the `TrainConfig` fields as options (`cli.train_fields`), and what a run needs besides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.cli.train_fields import OPTIONS, hidden_options
from fbt_probe.config import preset as check_preset
from fbt_probe.distributed import world
from fbt_probe.errors import FbtError
from fbt_probe.training import TrainConfig, parse_schedule, run_training
from fbt_probe.training.parallel import process_device
from fbt_probe.training.recipes import recipe as recipe_fields
from fbt_probe.training.resume import RunFinished, resume_config


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)


@OPTIONS.command
def train_cmd(
    out: Annotated[Path, typer.Option(help="Run folder to write (checkpoint, tokenizer, metrics.jsonl).")],
    recipe: Annotated[
        str | None,
        typer.Option(
            help="A named set of training fields, under the options given here: 'reference' (how the shipped reference models are trained: induction warm-up, register documents with a ramp over the register count; its fields: docs/training.md)."
        ),
    ] = None,
    init: Annotated[
        Path | None,
        typer.Option(
            help="Start from the weights of a run folder, a checkpoint (ours or Qwen3-format) or a shipped ref:<name> (fresh optimizer; feedback and --baseline: it must have --preset's shapes). Recorded in the run's config."
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in OUT (bit for bit on CPU) to its recorded steps, or to --steps N past them; every other training option is the record's (one given that differs is refused)."
        ),
    ] = False,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    device: Annotated[
        str,
        typer.Option(
            help="auto (cuda if available, else cpu), cpu or cuda. Under torchrun each process takes its own GPU, cuda:LOCAL_RANK."
        ),
    ] = "auto",
    fsdp: Annotated[
        bool,
        typer.Option(
            "--fsdp",
            help="Under torchrun: shard parameters, gradients and optimizer state with FSDP2 (for paper-1b-sized models; default DDP). No evaluation during training: run fbt-probe eval afterwards.",
        ),
    ] = False,
    stop_at: Annotated[
        int | None,
        typer.Option(
            help="Train only to step N of the run (a checkpoint there), e.g. the baseline's one-pass steps that feedback runs --fork; --resume continues it."
        ),
    ] = None,
    fork: Annotated[
        Path | None,
        typer.Option(
            help="Start from this run's checkpoint and optimizer state at its step N: a run of the same config but for its schedule, N <= --one-pass-steps (those steps are then this run's, bit for bit)."
        ),
    ] = None,
    given: dict | None = None,
    defaults: dict | None = None,
) -> None:
    """Train a latent-feedback model (or its no-feedback baseline, or a Hidden Decoding model) on the four tasks.

    \b
    Example: fbt-probe train --preset tiny --out runs/tiny ; fbt-probe train --out runs/tiny-base --baseline ;
    fbt-probe train --recipe reference --out runs/ref-feedback  (the shipped models' recipe; add --baseline) ;
    fbt-probe train --arch hidden-decoding --streams 2 --init runs/tiny-base --out runs/tiny-hd2 ;
    fbt-probe train --baseline --tasks registers,registers-count --register-mix "2:wpr:1:0 2:wpr:2:0"
    --register-queries 2 --answer-share 1 --min-lr-ratio 1 --steps 400 --out runs/r12  (a register stage; the next
    stage adds --init runs/r12: docs/training.md) ;
    torchrun --standalone --nproc_per_node 2 -m fbt_probe train --preset tiny --out runs/tiny  (DDP: each
    process takes its rows of every step; same global batch, checkpoint written once)
    """

    values = {**defaults, **given}
    check_preset(values["preset"])
    parse_schedule(values["schedule"])
    dev = process_device(device)  # a missing GPU is refused before anything is written
    cfg = _config(out, values["arch"], recipe, init, resume, given, defaults)
    if cfg is None:
        return
    res = _train(cfg, out, None if resume else init, resume, force, fsdp, dev, stop_at, fork)
    if world().main:
        _print_trained(res, cfg, out)


def _config(
    out: Path, arch: str, recipe: str | None, init: Path | None, resume: bool, given: dict, defaults: dict
) -> TrainConfig | None:
    """The run's config: the options given over a recipe's fields over the defaults; with --resume
    the run's record, checked against what was given (None, said in one line, where it is finished)."""
    hidden = hidden_options(arch, given)
    recipe_set = {} if recipe is None else recipe_fields(recipe)
    fields = {**defaults, **recipe_set, **given, **hidden}  # a recipe under the options given
    if not resume:
        return TrainConfig(**fields)
    named = {k: fields[k] for k in (*given, *recipe_set) if k != "steps"}  # a recipe names its fields
    try:
        return resume_config(out, named | ({} if init is None else {"init": str(init)}), given.get("steps"))
    except RunFinished as done:
        typer.echo(str(done))
        return None


def _train(cfg: TrainConfig, out: Path, init, resume: bool, force: bool, fsdp: bool, dev, stop_at, fork) -> dict:
    """`run_training` after the checks of --fork and --stop-at; Ctrl-C exits with code 130 and one line
    on what becomes of OUT."""
    replacing = force and not resume and out.is_dir() and any(out.iterdir())
    try:
        if fork is not None and (resume or init is not None):
            raise FbtError("--fork starts a new run from another run's checkpoint: not with --resume or --init")
        if stop_at is not None and stop_at < 1:
            raise FbtError(f"--stop-at {stop_at}: expected a step >= 1")
        return run_training(
            cfg, out, init=init, resume=resume, force=force, fsdp=fsdp, device=dev, stop_at=stop_at, fork=fork
        )
    except KeyboardInterrupt:
        msg = "the earlier run is unchanged" if replacing else "continue from the last checkpoint with --resume"
        typer.echo(f"interrupted: {out}: {msg}", err=True)
        raise typer.Exit(130) from None


def _print_trained(res: dict, cfg: TrainConfig, out: Path) -> None:
    if res.get("replaced"):
        typer.echo(f"replaced the earlier run in {out}")
    typer.echo(
        f"trained to step {res['step']} of {cfg.steps}"
        f" in {res['seconds']:.0f} s ({res['tokens'] / max(res['seconds'], 1e-9):,.0f} tokens/s); run folder: {out}"
        if res["step"] < cfg.steps
        else f"trained {res['step']} steps in {res['seconds']:.0f} s ({res['tokens'] / max(res['seconds'], 1e-9):,.0f} tokens/s); run folder: {out}"
    )
