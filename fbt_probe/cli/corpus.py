"""`fbt-probe corpus fetch|build|info|pin`: the general-LM corpus (fbt_probe.corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fbt_probe.corpus import build, open_corpus, read_files, read_pins
from fbt_probe.corpus.fetch import copy_from, fetch
from fbt_probe.corpus.store import pin
from fbt_probe.marker import mark_named, named_outputs, refuse_named, writing
from fbt_probe.tasks.tokenizer import load_tokenizer

app = typer.Typer(
    help="The general-LM corpus: fetch the pinned archives, check every file, train the tokenizer, store the tokens.",
    no_args_is_help=True,
)

SRC = Path("data/corpus-src")
OUT = Path("data/corpus")


@app.command("fetch")
def fetch_cmd(
    dir: Annotated[Path, typer.Option("--dir", help="Folder for the pinned archives.")] = SRC,
    from_: Annotated[
        Optional[Path],
        typer.Option("--from", help="Copy archives found in this folder first (each checked by sha256)."),
    ] = None,
) -> None:
    """Download the pinned archives with pip (only those DIR lacks), each checked by sha256.

    \b
    Example: fbt-probe corpus fetch --dir data/corpus-src
    """

    pins = read_pins()
    with writing(dir, FETCH_COMMAND):  # one writer of the folder at a time
        refuse_named([dir / a.file for a in pins.archives if not (dir / a.file).exists()], command=FETCH_COMMAND)
        copied = []
        if from_ is not None:
            for name in copy_from(from_, dir, pins):
                copied.append(dir / name)
                typer.echo(f"copied {name} from {from_}")
        records = fetch(dir, pins, say=typer.echo)
        mark_named(copied + [dir / r["file"] for r in records if r["status"] == "fetched"], FETCH_COMMAND)
    for rec in records:
        typer.echo(f"{rec['status']:<8} {rec['file']}  sha256 {rec['sha256'][:16]}...")


FETCH_COMMAND = "corpus fetch"  # the writer of the archives in their folder's marker
PIN_COMMAND = "corpus pin"  # the writer of a files.tsv in its folder's marker


@app.command("build")
def build_cmd(
    src: Annotated[Path, typer.Option(help="Folder holding the pinned archives (fbt-probe corpus fetch).")] = SRC,
    out: Annotated[Path, typer.Option(help="Corpus folder to write.")] = OUT,
    tokenizer: Annotated[
        Optional[Path],
        typer.Option(help="Use this tokenizer.json (or a run folder's) instead of training one on the training files."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it is a corpus folder of ours.")] = False,
) -> None:
    """Check every pinned file by sha256, train the byte-level BPE, tokenize and store the tokens.

    \b
    Example: fbt-probe corpus fetch && fbt-probe corpus build --out data/corpus
    """

    tok = None if tokenizer is None else load_tokenizer(tokenizer)
    rec = build(out, src, tokenizer=tok, force=force, progress=typer.echo)
    c = rec["counts"]
    typer.echo(
        f"corpus {rec['pins']['name']}: {c['train']['tokens']:,} training tokens in {c['train']['files']:,} files, "
        f"{c['heldout']['tokens']:,} held out in {c['heldout']['files']:,}; vocabulary {rec['vocab_size']:,}; "
        f"tokenizer sha256 {rec['sha256']['tokenizer.json'][:16]}...; folder: {out}"
    )


@app.command("info")
def info_cmd(folder: Annotated[Path, typer.Argument(help="A corpus folder.")] = OUT) -> None:
    """The pins, counts and hashes of a built corpus folder (every file's sha256 checked).

    \b
    Example: fbt-probe corpus info data/corpus
    """

    c = open_corpus(folder)
    rec = c.record
    for a in rec["pins"]["archives"]:
        typer.echo(f"{a['package']}=={a['version']}  {a['file']}  sha256 {a['sha256']}")
    for split, n in rec["counts"].items():
        typer.echo(f"{split:<8} {n['files']:>6,} files {n['tokens']:>12,} tokens")
    typer.echo(f"vocabulary {rec['vocab_size']:,}; corpus sha256 {c.sha256}")


@app.command("pin")
def pin_cmd(
    src: Annotated[Path, typer.Option(help="Folder holding the pinned archives.")] = SRC,
    out: Annotated[Path, typer.Option(help="The files.tsv to write.")] = Path("files.tsv"),
    pins: Annotated[Optional[Path], typer.Option(help="A pins.json (default: the built-in one).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a files.tsv this command wrote.")] = False,
) -> None:
    """List every file the pins choose, with its sha256 and split (how the built-in files.tsv was made).

    \b
    Example: fbt-probe corpus pin --src data/corpus-src --out files.tsv
    """

    with named_outputs([out], PIN_COMMAND, force):  # a file of the user's is never replaced
        n = pin(src, out, pins)
        read_files(read_pins(pins), out)  # what was written reads back
    typer.echo(f"listed {n:,} files in {out}")
