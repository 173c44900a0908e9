"""`fbt-probe model export-hf`: the backbone as a Qwen3 checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.formats.qwen3 import export_qwen3, is_qwen3_folder
from fbt_probe.io import atomic_dir, refuse_existing
from fbt_probe.loading import load_model


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


def register(app: typer.Typer) -> None:
    app.command("export-hf")(export_hf)
