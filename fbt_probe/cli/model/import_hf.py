"""`fbt-probe model import-hf`: a Qwen3 checkpoint with fresh fusion weights."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.formats.checkpoint import is_own_checkpoint, save_checkpoint
from fbt_probe.formats.qwen3 import import_qwen3
from fbt_probe.marker import output_dir, refuse_unowned, replaced_note, writing
from fbt_probe.tasks import check_tokenizer_fits, load_tokenizer, tokenizer_sha256

COMMAND, KIND = "model import-hf", "a checkpoint folder written by fbt-probe model import-hf"


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

    with writing(out, COMMAND):  # one writer from the check of OUT to the swap
        keep = refuse_unowned(out, COMMAND, force, KIND, legacy=is_own_checkpoint)  # before the weights are read
        model = import_qwen3(path, seed=seed)
        tok = tokenizer or (path / "tokenizer.json" if (path / "tokenizer.json").is_file() else None)
        extra = {"imported_from": str(path), "fusion_seed": seed}
        if tok is not None:
            loaded = load_tokenizer(tok)
            # Qwen3 pads its embedding: fewer ids than rows is its normal layout; every id must have a row
            n = check_tokenizer_fits(loaded, model.cfg.d_vocab, str(tok))
            extra["tokenizer"] = {"source": str(tok), "sha256": tokenizer_sha256(loaded), "n_ids": n}
        with output_dir(out, COMMAND, force, KIND, legacy=is_own_checkpoint) as tmp:
            save_checkpoint(model, tmp, tok, extra=extra)
    typer.echo(f"{'replaced the earlier checkpoint in' if keep is not None else 'wrote'} {out}{replaced_note(keep)}")


def register(app: typer.Typer) -> None:
    app.command("import-hf")(import_hf)
