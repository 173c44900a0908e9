"""`fbt-probe tasks list|generate|show|tokenizer`: the synthetic probe datasets."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from fbt_probe.errors import FbtError
from fbt_probe.marker import named_outputs, writing
from fbt_probe.tasks import (
    build_tokenizer,
    heldout_groups,
    load_dataset,
    load_tokenizer,
    save_tokenizer,
    tokenizer_sha256,
    write_dataset,
)
from fbt_probe.tasks import generate as gen
from fbt_probe.tasks.dataset import COMMAND, dataset_files
from fbt_probe.tasks.display import format_pairs
from fbt_probe.tasks.spec import builtin_spec_paths, load_spec

app = typer.Typer(
    help="Synthetic probe tasks (completion, memory, registers, registers-count): specs, datasets, tokenizer.",
    no_args_is_help=True,
)


@app.command("list")
def list_cmd() -> None:
    """List the built-in task specs (fbt_probe/tasks/specs/, shipped in the package).

    \b
    Example: fbt-probe tasks list
    """

    for name, path in builtin_spec_paths().items():
        s = load_spec(path)
        grid = "/".join(str(k) for k in s.length_grid)
        per = "per cell" if s.kind in ("registers", "compose") else "over the grid"
        typer.echo(
            f"{name:<16} kind={s.kind:<10} {s.knob_name}={grid:<16} groups={s.groups} ({per}) "
            f"seed={s.seed:<3} labels={s.label_words[0]}/{s.label_words[1]}  {path}"
        )


@app.command()
def generate(
    specs: Annotated[List[str], typer.Argument(help="Built-in task names or spec files (.json).", show_default=False)],
    out: Annotated[
        Path, typer.Option("--out", help="Output folder: <task>.parquet, <task>.manifest.json, tokenizer.json.")
    ],
    groups: Annotated[
        Optional[int],
        typer.Option(
            help="Structural groups: over the whole length grid (completion, memory) or per cell (registers) (default: the spec's, the paper's sizes)."
        ),
    ] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (default: the spec's).")] = None,
    tokenizer: Annotated[
        Optional[Path], typer.Option(help="A Hugging Face tokenizer.json (default: the built-in word-level one).")
    ] = None,
    heldout: Annotated[
        Optional[float],
        typer.Option(help="Draw only contexts held out of training by heldout_groups(task, FRACTION, --heldout-seed)."),
    ] = None,
    heldout_seed: Annotated[int, typer.Option(help="Seed of the held-out split (with --heldout).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace existing dataset files.")] = False,
) -> None:
    """Generate minimal-pair datasets from task specs.

    \b
    Example: fbt-probe tasks generate completion memory registers registers-count --out data/tasks
    """

    loaded = [load_spec(s) for s in specs]
    with writing(out, COMMAND):  # one writer of the folder from its check to the last file
        tok = load_tokenizer(tokenizer) if tokenizer else build_tokenizer(loaded)
        for s in loaded:  # refuse before generating anything
            dataset_files(out, s.task, tok, force)
        frames = []
        for s in loaded:  # generate (and check) everything before writing anything
            contexts = heldout_groups(s, heldout, heldout_seed) if heldout is not None else None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                frames.append(
                    gen(
                        s,
                        groups=groups,
                        seed=seed,
                        tokenizer=tok,
                        contexts=contexts,
                        tokenizer_name=f"tokenizer {tokenizer}" if tokenizer else "the built-in tokenizer",
                        option="--groups",
                    )
                )
            for w in caught:
                typer.echo(f"note: {w.message}", err=True)
        for s, df in zip(loaded, frames):
            path = write_dataset(df, out, tok, force=force, tokenizer_source=str(tokenizer) if tokenizer else "builtin")
            typer.echo(
                f"{s.task}: {len(df)} samples ({len(df) // 2} pairs, {df.group_id.nunique()} groups), "
                f"{df.n_tokens.min()}-{df.n_tokens.max()} tokens -> {path}"
            )


@app.command()
def show(
    file: Annotated[
        Path, typer.Argument(help="A dataset .parquet (its manifest must sit beside it).", show_default=False)
    ],
    n: Annotated[int, typer.Option("--n", help="Number of pairs to show.")] = 3,
    knob: Annotated[
        Optional[int],
        typer.Option(help="Only pairs with this distractor count / writes per register / register count."),
    ] = None,
    max_lines: Annotated[int, typer.Option(help="Lines shown per sample before eliding the middle.")] = 12,
) -> None:
    """Print pairs side by side with labels and token counts ('*' marks lines that differ).

    \b
    Example: fbt-probe tasks show data/tasks/completion.parquet --n 3 --knob 8
    """

    if n < 1:
        raise FbtError(f"--n {n}: expected an integer >= 1 (pairs to show)")
    if max_lines < 1:
        raise FbtError(f"--max-lines {max_lines}: expected an integer >= 1")
    df = load_dataset(file)
    m = df.attrs["manifest"]
    typer.echo(
        f"{file}: task {m['task']}, {m['rows']} samples, {m['pairs']} pairs, seed {m['seed']}, "
        f"final token {m['tokenizer']['final_token']!r}"
    )
    text = format_pairs(df, n=n, knob=knob, max_lines=max_lines)
    typer.echo(text if text else "(no pairs match)")


@app.command("tokenizer")
def tokenizer_cmd(
    out: Annotated[Path, typer.Option("--out", help="Where to write tokenizer.json.")],
    specs: Annotated[
        Optional[List[str]], typer.Argument(help="Variant specs whose extra words to add.", show_default=False)
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Save the built-in word-level tokenizer of the task language.

    \b
    Example: fbt-probe tasks tokenizer --out runs/tokenizer.json
    """

    tok = build_tokenizer(specs or None)
    with named_outputs([out], "tasks tokenizer", force):
        save_tokenizer(tok, out)
    typer.echo(f"{out}: {tok.get_vocab_size()} tokens, sha256 {tokenizer_sha256(tok)}")
