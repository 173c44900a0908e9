"""What every benchmark command shares: the --out / --force options and `write_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable

import typer

from fbt_probe.bench.report import COMMAND, report_paths, save_report
from fbt_probe.marker import refuse_named

OutOption = Annotated[
    Path | None, typer.Option("--out", help="Markdown file to write (FILE.json gets the full result). Default: print.")
]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")]


def write_report(result: dict, to_markdown: Callable[[dict], str], out: Path | None, force: bool) -> None:
    """Print the report, or write it atomically to `out` and the result to `out` + '.json'."""

    text = to_markdown(result)
    if out is None:
        typer.echo(text)
        return
    md, side = save_report(result, text, out, force)
    typer.echo(f"wrote {md} and {side}")


def check_report(out: Path | None, force: bool) -> None:
    """Refuse --out before the benchmark runs (what `write_report` would refuse after it): a file
    there that the benchmark did not write, or any file there without --force."""
    if out is not None:
        refuse_named(report_paths(out), force, COMMAND)
