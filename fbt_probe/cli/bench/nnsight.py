"""`fbt-probe bench nnsight`: nnsight's trace against run_with_cache on one hook."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fbt_probe.bench import nnsight as nnsight_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report
from fbt_probe.errors import FbtError


def nnsight(
    model: Annotated[str, typer.Option(help="Run / checkpoint folder or ref:<name>.")] = "ref:tiny-feedback",
    batch: Annotated[int, typer.Option(help="Batch of random tokens.")] = 8,
    seq: Annotated[int, typer.Option(help="Sequence length T.")] = 256,
    repeats: Annotated[int, typer.Option(help="Timed calls per measurement (the median is reported).")] = 15,
    layer: Annotated[
        Optional[int], typer.Option(help="Block whose hook_resid_post is read (default: the middle).")
    ] = None,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """nnsight's trace against run_with_cache reading one hook on the same forward: `recurrent:1`,
    and `full` with serial=True through nnsight's iteration support (each value checked first).

    \b
    Example: fbt-probe bench nnsight --out reports/bench/nnsight.md
    """

    if min(batch, seq, repeats) < 1 or seq < 2:
        raise FbtError("--batch and --repeats must be >= 1, --seq >= 2")
    check_report(out, force)
    write_report(
        nnsight_bench.run_nnsight_bench(model, batch, seq, repeats, layer), nnsight_bench.to_markdown, out, force
    )


def register(app: typer.Typer) -> None:
    app.command("nnsight")(nnsight)
