"""`fbt-probe model import-hf`: a Qwen3 checkpoint with fresh fusion weights."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import is_own_checkpoint, save_checkpoint
from fbt_probe.formats.qwen3 import import_qwen3
from fbt_probe.io import atomic_dir, refuse_existing
from fbt_probe.tasks import load_tokenizer, tokenizer_sha256


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
    extra = {"imported_from": str(path), "fusion_seed": seed}
    if tok is not None:
        loaded = load_tokenizer(tok)
        n = loaded.get_vocab_size(with_added_tokens=True)
        if n > model.cfg.d_vocab:  # Qwen3 pads its embedding: fewer ids than rows is its normal layout
            raise FbtError(
                f"{tok}: the tokenizer has {n:,} ids but the checkpoint's embedding has {model.cfg.d_vocab:,} rows; "
                "not the tokenizer of this checkpoint"
            )
        extra["tokenizer"] = {"source": str(tok), "sha256": tokenizer_sha256(loaded), "n_ids": n}
    with atomic_dir(out, force, **own) as tmp:
        save_checkpoint(model, tmp, tok, extra=extra)
    typer.echo(f"{'replaced the earlier checkpoint in' if replacing else 'wrote'} {out}")


def register(app: typer.Typer) -> None:
    app.command("import-hf")(import_hf)
