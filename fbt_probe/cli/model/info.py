"""`fbt-probe model info`: config, parameter counts and hook points of a model."""

from __future__ import annotations

from typing import Annotated

import typer

from fbt_probe.config import PRESETS
from fbt_probe.loading import load_model
from fbt_probe.model.meta import on_meta


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
        with on_meta():
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


def register(app: typer.Typer) -> None:
    app.command("info")(info)
