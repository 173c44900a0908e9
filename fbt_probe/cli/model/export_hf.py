"""`fbt-probe model export-hf`: the backbone as a Qwen3 checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.formats.qwen3 import export_qwen3, is_qwen3_folder
from fbt_probe.loading import load_model
from fbt_probe.marker import output_dir, refuse_unowned, replaced_note, writing

COMMAND, KIND = "model export-hf", "a Qwen3-format folder written by fbt-probe model export-hf"


def export_hf(
    source: Annotated[str, typer.Argument(help="Checkpoint folder (depth_scaling must be 'none').")],
    out: Annotated[Path, typer.Argument(help="Qwen3-format folder to write.")],
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Export the backbone as a Qwen3 checkpoint (fusion weights go to fusion.safetensors beside it).

    \b
    Example: fbt-probe model export-hf runs/imported ./qwen3-again
    """

    with writing(out, COMMAND):  # one writer from the check of OUT to the swap
        keep = refuse_unowned(out, COMMAND, force, KIND, legacy=is_qwen3_folder)
        model = load_model(source)
        with output_dir(out, COMMAND, force, KIND, legacy=is_qwen3_folder) as tmp:
            export_qwen3(model, tmp, force=True)
    typer.echo(f"{'replaced the earlier export in' if keep is not None else 'wrote'} {out}{replaced_note(keep)}")


def register(app: typer.Typer) -> None:
    app.command("export-hf")(export_hf)
