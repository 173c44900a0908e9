"""`fbt-probe bench diff-reports`: two reports' tables compared token by token."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.bench.diff_reports import diff_reports as run_diff


def diff_reports(
    old: Annotated[Path, typer.Argument(help="The earlier report.md.", show_default=False)],
    new: Annotated[Path, typer.Argument(help="The report.md to compare with it.", show_default=False)],
    ulps: Annotated[float, typer.Option(help="Allowed difference in units of a number's last printed place.")] = 1.0,
) -> None:
    """Compare two reports' tables token by token: text exactly, numbers to --ulps units in their last
    printed place (a speed-up must leave a study's tables as they were). Exit status 1 on a difference.

    \b
    Example: fbt-probe bench diff-reports reports/tiny/report.md runs/reference/report.md
    """

    lines, bad = run_diff(old, new, ulps)
    typer.echo("\n".join(lines))
    if bad:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("diff-reports")(diff_reports)
