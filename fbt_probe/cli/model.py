"""`fbt-probe model info|import-hf|import-nanochat|export-hf`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import torch
import typer

from fbt_probe import reference
from fbt_probe.config import PRESETS
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import is_own_checkpoint, save_checkpoint
from fbt_probe.formats.nanochat.checkpoint import write_import
from fbt_probe.formats.qwen3 import export_qwen3, import_qwen3, is_qwen3_folder
from fbt_probe.io import atomic_dir, refuse_existing
from fbt_probe.loading import load_model
from fbt_probe.training.pack import pack as do_pack

app = typer.Typer(help="Inspect, import and export models.", no_args_is_help=True)


def model_summary(model) -> dict:
    cfg = model.cfg
    total = sum(p.numel() for p in model.parameters())
    fusion = sum(p.numel() for n, p in model.named_parameters() if n.startswith("fusion.W_"))
    return {
        "config": cfg.to_dict(),
        "layer_types": list(cfg.resolved_layer_types),
        "parameters": total,
        "fusion_parameters_2D2": fusion,
        "fusion_share": fusion / total,
        "hook_names": sorted(model.hook_dict),
    }


@app.command()
def info(
    source: Annotated[
        str, typer.Argument(help="A preset (tiny, paper-1b), a checkpoint folder, or a Qwen3-format folder.")
    ],
    hooks: Annotated[bool, typer.Option(help="List every hook name.")] = False,
) -> None:
    """Config, parameter counts and hook points of a model.

    \b
    Example: fbt-probe model info paper-1b   (built on the meta device: no memory used)
    """

    if source in PRESETS and source != "tiny":
        with torch.device("meta"):
            model = load_model(source, device="meta")
    else:
        model = load_model(source)
    s = model_summary(model)
    typer.echo(f"model: {source}")
    for k, v in s["config"].items():
        typer.echo(f"  {k:18s} {v}")
    typer.echo(f"  layer types       {', '.join(t.split('_')[0] for t in s['layer_types'])}")
    mats = {
        "glu": "W_U + W_G",
        "gate_product": "W_U + W_G",
        "concat_projection": "W_C",
        "linear_addition": "W_U + W_T",
    }[getattr(model.cfg, "fusion", "glu")]
    typer.echo(
        f"parameters: {s['parameters']:,}  (fusion {mats} = 2·D² = {s['fusion_parameters_2D2']:,}, {100 * s['fusion_share']:.2f} %)"
    )
    typer.echo(f"hook points: {len(s['hook_names'])}")
    names = (
        s["hook_names"]
        if hooks
        else [n for n in s["hook_names"] if not n.startswith("blocks.") or n.startswith("blocks.0.")]
    )
    for n in names:
        typer.echo(f"  {n}")
    if not hooks:
        typer.echo("  (blocks.1.. repeat blocks.0; --hooks lists all)")


@app.command("import-hf")
def import_hf(
    path: Annotated[Path, typer.Argument(help="Qwen3-format folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Argument(help="Checkpoint folder to write.")],
    seed: Annotated[int, typer.Option(help="Seed of the fresh fusion weights.")] = 0,
    tokenizer: Annotated[
        Path | None, typer.Option(help="tokenizer.json to copy (default: PATH/tokenizer.json if present).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Import a Qwen3 checkpoint and add fresh fusion weights (W_U, W_G ~ N(0, 0.02); fusion norm
    weight = mean embedding-row RMS), depth scaling off, post-norm feedback.

    \b
    Example: fbt-probe model import-hf ./qwen3-small runs/imported
    """

    own = dict(own=is_own_checkpoint, kind="an fbt-probe checkpoint folder")
    replacing = refuse_existing(out, force, **own)  # before the (possibly large) weights are read
    model = import_qwen3(path, seed=seed)
    tok = tokenizer or (path / "tokenizer.json" if (path / "tokenizer.json").is_file() else None)
    with atomic_dir(out, force, **own) as tmp:
        save_checkpoint(model, tmp, tok, extra={"imported_from": str(path), "fusion_seed": seed})
    typer.echo(f"{'replaced the earlier checkpoint in' if replacing else 'wrote'} {out}")


@app.command("import-nanochat")
def import_nanochat(
    ckpt_dir: Annotated[Path, typer.Argument(help="nanochat checkpoint folder (model_<step>.pt + meta_<step>.json).")],
    out: Annotated[Path, typer.Argument(help="Checkpoint folder to write.")],
    step: Annotated[int | None, typer.Option(help="Step to import (default: the last).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of fresh fusion weights (only when the checkpoint has none).")] = 0,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json to copy into OUT.")] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Import a checkpoint of the nanochat latent-feedback reproduction (every backbone extra and the
    fusion variant of its meta; see fbt_probe/formats/nanochat/). Refuses what it cannot represent.

    \b
    Example: fbt-probe model import-nanochat ~/.cache/nanochat/base_checkpoints/d20 runs/d20 --step 5000
    """

    if tokenizer is not None and not tokenizer.is_file():
        raise FbtError(f"--tokenizer {tokenizer}: file not found")
    own = dict(own=is_own_checkpoint, kind="an fbt-probe checkpoint folder")
    replacing = refuse_existing(out, force, **own)
    with atomic_dir(out, force, **own) as tmp:
        record, notes = write_import(ckpt_dir, tmp, step=step, seed=seed, tokenizer=tokenizer)
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(
        f"{'replaced the earlier checkpoint in' if replacing else 'wrote'} {out} "
        f"(step {record['step']}, fusion {record['model_config']['latent_feedback_mode']})"
    )


@app.command("export-hf")
def export_hf(
    source: Annotated[str, typer.Argument(help="Checkpoint folder (depth_scaling must be 'none').")],
    out: Annotated[Path, typer.Argument(help="Qwen3-format folder to write.")],
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Export the backbone as a Qwen3 checkpoint (fusion weights go to fusion.safetensors beside it).

    \b
    Example: fbt-probe model export-hf runs/imported ./qwen3-again
    """

    own = dict(own=is_qwen3_folder, kind="a Qwen3-format folder")
    replacing = refuse_existing(out, force, **own)
    model = load_model(source)
    with atomic_dir(out, force, **own) as tmp:
        export_qwen3(model, tmp, force=True)
    typer.echo(f"{'replaced the earlier export in' if replacing else 'wrote'} {out}")


def _took(rec: dict) -> str:
    """The card's time measured alone (its first "(N min)"), else the optimizer steps' summed time,
    which is an upper bound when the model trained beside other jobs."""

    m = re.search(r"\(([\d.]+) min\)", rec.get("timing") or "")
    if m:
        return f"{m.group(1)} min to retrain alone (card)"
    return f"{rec['train_seconds'] / 60:.1f} min of optimizer steps (an upper bound: timed beside other jobs)"


@app.command()
def refs() -> None:
    """The reference models shipped with the package (load them as ref:<name> wherever a model is read).

    \b
    Example: fbt-probe model refs
    """

    records = {
        name: reference.record(name) for name in reference.names()
    }  # every record checked before a line is written
    for name, rec in records.items():
        std = [r for r in rec["accuracy"]["rows"] if r["mode"] == "standard"]
        per_task = {}
        for r in std:
            c, n = per_task.get(r["task"], (0, 0))
            per_task[r["task"]] = (c + r["correct"], n + r["n"])
        accs = ", ".join(f"{t} {c / n:.2f}" for t, (c, n) in per_task.items())
        typer.echo(
            f"ref:{name:<16} {rec['arch']}{' baseline' if rec['baseline'] else ''}, seed {rec['seed']}, "
            f"{rec['steps']} steps, {_took(rec)}; held-out standard accuracy: {accs}"
        )
    typer.echo(f"cards: {reference.ROOT}/<name>/card.md")


@app.command()
def pack(
    run: Annotated[
        str,
        typer.Argument(
            help="A finished training run folder (fbt-probe train), or ref:<name> to re-evaluate a shipped model and rewrite its card (its training record is kept)."
        ),
    ],
    name: Annotated[str, typer.Option(help="Reference name (lower case, digits, '-').")],
    out: Annotated[Path | None, typer.Option(help="Folder of reference models (default: the package's).")] = None,
    eval_pairs: Annotated[int, typer.Option(help="Held-out minimal pairs per task x length for the model card.")] = 16,
    force: Annotated[bool, typer.Option(help="Replace a reference model of the same name.")] = False,
    command: Annotated[
        str | None,
        typer.Option(
            help="The command that retrains RUN, for the card (default: derived from its config; required for Hidden Decoding)."
        ),
    ] = None,
    timing: Annotated[
        str | None,
        typer.Option(
            help="How long the retrain command takes alone, as measured, for the card (the optimizer steps' summed times are an upper bound when RUN trained beside other jobs); kept when re-packing a ref:<name>."
        ),
    ] = None,
) -> None:
    """Make RUN a reference model: copy its checkpoint, evaluate it on held-out contexts, write its
    model card (card.md) and the sha256 record every load verifies (reference.json).

    \b
    Example: fbt-probe model pack runs/reference/models/feedback --name tiny-feedback --force
    (after a change to evaluation: fbt-probe model pack ref:tiny-feedback --name tiny-feedback --force)
    """

    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise FbtError(f"--name {name!r}: expected lower-case letters, digits and '-'")
    if eval_pairs < 1:
        raise FbtError(f"--eval-pairs {eval_pairs}: expected an integer >= 1")
    dest = do_pack(run, name, out or reference.ROOT, eval_pairs=eval_pairs, force=force, command=command, timing=timing)
    typer.echo(f"wrote {dest} (ref:{name}; card: {dest / 'card.md'})")
