"""`fbt-probe model import-nanochat`: a checkpoint of the nanochat latent-feedback reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import is_own_checkpoint
from fbt_probe.formats.nanochat.checkpoint import read_import, write_read_import
from fbt_probe.formats.nanochat.tokenizer import find_tokenizer
from fbt_probe.marker import output_dir, refuse_unowned, replaced_note, writing

COMMAND, KIND = "model import-nanochat", "a checkpoint folder written by fbt-probe model import-nanochat"


def import_nanochat(
    ckpt_dir: Annotated[Path, typer.Argument(help="nanochat checkpoint folder (model_<step>.pt + meta_<step>.json).")],
    out: Annotated[Path, typer.Argument(help="Checkpoint folder to write.")],
    step: Annotated[int | None, typer.Option(help="Step to import (default: the last).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of fresh fusion weights (only when the checkpoint has none).")] = 0,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="The checkpoint's tokenizer: nanochat's tokenizer folder (tokenizer.pkl, converted) or a "
            "tokenizer.pkl / tokenizer.json file (default: found in nanochat's layout, <base>/tokenizer/ "
            "beside <base>/base_checkpoints/<tag>/)."
        ),
    ] = None,
    no_tokenizer: Annotated[
        bool, typer.Option("--no-tokenizer", help="Import the weights alone (no tasks can be made for them).")
    ] = False,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Import a checkpoint of the nanochat latent-feedback reproduction (every backbone extra and the
    fusion variant of its meta; see fbt_probe/formats/nanochat/). Refuses what it cannot represent.

    \b
    Example: fbt-probe model import-nanochat ~/.cache/nanochat/base_checkpoints/d20 runs/d20 --step 5000
    """

    if no_tokenizer and tokenizer is not None:
        raise FbtError("--tokenizer and --no-tokenizer: give one of them")
    found = None if no_tokenizer else find_tokenizer(ckpt_dir, tokenizer)
    if found is None and not no_tokenizer:
        raise FbtError(
            f"{ckpt_dir}: no tokenizer.pkl or tokenizer.json in {Path(ckpt_dir).resolve().parent.parent / 'tokenizer'} "
            "(nanochat's layout) or in the folder; pass --tokenizer DIR (nanochat's tokenizer folder), "
            "or --no-tokenizer for the weights alone"
        )
    with writing(out, COMMAND):  # one writer from the check of OUT to the swap
        keep = refuse_unowned(out, COMMAND, force, KIND, legacy=is_own_checkpoint)
        # everything is read and checked before the temporary folder exists: a refusal leaves nothing
        model, record, notes, text = read_import(ckpt_dir, step=step, seed=seed, tokenizer=found)
        with output_dir(out, COMMAND, force, KIND, legacy=is_own_checkpoint) as tmp:
            write_read_import(model, record, text, ckpt_dir, tmp)
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(
        f"{'replaced the earlier checkpoint in' if keep is not None else 'wrote'} {out}{replaced_note(keep)} "
        f"(step {record['step']}, fusion {record['model_config']['latent_feedback_mode']}, "
        + (f"tokenizer {found}: {record['tokenizer']['n_ids']:,} ids)" if found else "no tokenizer)")
    )


def register(app: typer.Typer) -> None:
    app.command("import-nanochat")(import_nanochat)
