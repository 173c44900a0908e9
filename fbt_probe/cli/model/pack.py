"""`fbt-probe model pack`: make a finished run a reference model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from fbt_probe import reference
from fbt_probe.errors import FbtError
from fbt_probe.training.pack import pack as do_pack


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
    note: Annotated[
        str | None,
        typer.Option(
            help="A statement the card gives in bold before its numbers (what the model does not do, say); kept when re-packing a ref:<name>."
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
    dest = do_pack(
        run, name, out or reference.ROOT, eval_pairs=eval_pairs, force=force, command=command, timing=timing, note=note
    )
    typer.echo(f"wrote {dest} (ref:{name}; card: {dest / 'card.md'})")


def register(app: typer.Typer) -> None:
    app.command("pack")(pack)
