"""`fbt-probe model info|import-hf|export-hf`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Inspect, import and export models.", no_args_is_help=True)


def model_summary(model) -> dict:
    cfg = model.cfg
    total = sum(p.numel() for p in model.parameters())
    fusion = sum(p.numel() for n, p in model.named_parameters() if n.startswith("fusion.W_"))
    return {
        "config": cfg.to_dict(), "layer_types": list(cfg.resolved_layer_types), "parameters": total,
        "fusion_parameters_2D2": fusion, "fusion_share": fusion / total, "hook_names": sorted(model.hook_dict),
    }


@app.command()
def info(
    source: Annotated[str, typer.Argument(help="A preset (tiny, paper-1b), a checkpoint folder, or a Qwen3-format folder.")],
    hooks: Annotated[bool, typer.Option(help="List every hook name.")] = False,
) -> None:
    """Config, parameter counts and hook points of a model.

    Example: fbt-probe model info paper-1b   (built on the meta device: no memory used)
    """
    import torch

    import fbt_probe as fp
    from fbt_probe.config import PRESETS

    if source in PRESETS and source != "tiny":
        with torch.device("meta"):
            model = fp.load_model(source, device="meta")
    else:
        model = fp.load_model(source)
    s = model_summary(model)
    typer.echo(f"model: {source}")
    for k, v in s["config"].items():
        typer.echo(f"  {k:18s} {v}")
    typer.echo(f"  layer types       {', '.join(t.split('_')[0] for t in s['layer_types'])}")
    typer.echo(f"parameters: {s['parameters']:,}  (fusion W_U + W_G = 2·D² = {s['fusion_parameters_2D2']:,}, {100 * s['fusion_share']:.2f} %)")
    typer.echo(f"hook points: {len(s['hook_names'])}")
    names = s["hook_names"] if hooks else [n for n in s["hook_names"] if not n.startswith("blocks.") or n.startswith("blocks.0.")]
    for n in names:
        typer.echo(f"  {n}")
    if not hooks:
        typer.echo("  (blocks.1.. repeat blocks.0; --hooks lists all)")


@app.command("import-hf")
def import_hf(
    path: Annotated[Path, typer.Argument(help="Qwen3-format folder (config.json + safetensors).")],
    out: Annotated[Path, typer.Argument(help="Checkpoint folder to write.")],
    seed: Annotated[int, typer.Option(help="Seed of the fresh fusion weights.")] = 0,
    tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json to copy (default: PATH/tokenizer.json if present).")] = None,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Import a Qwen3 checkpoint and add fresh fusion weights (W_U, W_G ~ N(0, 0.02); fusion norm
    weight = mean embedding-row RMS), depth scaling off, post-norm feedback.

    Example: fbt-probe model import-hf ./qwen3-small runs/imported
    """
    from fbt_probe.io import atomic_dir, refuse_existing
    from fbt_probe.model.checkpoint import is_own_checkpoint, save_checkpoint
    from fbt_probe.model.hf import import_qwen3

    own = dict(own=is_own_checkpoint, kind="an fbt-probe checkpoint folder")
    replacing = refuse_existing(out, force, **own)  # before the (possibly large) weights are read
    model = import_qwen3(path, seed=seed)
    tok = tokenizer or (path / "tokenizer.json" if (path / "tokenizer.json").is_file() else None)
    with atomic_dir(out, force, **own) as tmp:
        save_checkpoint(model, tmp, tok, extra={"imported_from": str(path), "fusion_seed": seed})
    typer.echo(f"{'replaced the earlier checkpoint in' if replacing else 'wrote'} {out}")


@app.command("export-hf")
def export_hf(
    source: Annotated[str, typer.Argument(help="Checkpoint folder (depth_scaling must be 'none').")],
    out: Annotated[Path, typer.Argument(help="Qwen3-format folder to write.")],
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Export the backbone as a Qwen3 checkpoint (fusion weights go to fusion.safetensors beside it).

    Example: fbt-probe model export-hf runs/imported ./qwen3-again
    """
    import fbt_probe as fp
    from fbt_probe.io import atomic_dir, refuse_existing
    from fbt_probe.model.hf import export_qwen3, is_qwen3_folder

    own = dict(own=is_qwen3_folder, kind="a Qwen3-format folder")
    replacing = refuse_existing(out, force, **own)
    model = fp.load_model(source)
    with atomic_dir(out, force, **own) as tmp:
        export_qwen3(model, tmp, force=True)
    typer.echo(f"{'replaced the earlier export in' if replacing else 'wrote'} {out}")
