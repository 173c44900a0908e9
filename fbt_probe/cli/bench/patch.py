"""`fbt-probe bench patch`: wall time and memory of each `fbt-probe patch` experiment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fbt_probe.bench import patch as patch_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report
from fbt_probe.errors import FbtError
from fbt_probe.modes import parse_mode


def patch(
    run: Annotated[str, typer.Option(help="Run / checkpoint folder or preset (random weights: same cost).")] = "tiny",
    dataset: Annotated[
        Path | None,
        typer.Option(help="Dataset file or folder (default: `tasks generate completion` into a temporary folder)."),
    ] = None,
    experiments: Annotated[str, typer.Option(help="Experiments, comma-separated, or 'all'.")] = "all",
    mode: Annotated[str, typer.Option(help="Prefill mode of the patch commands.")] = "recurrent:1",
    compare_pairs: Annotated[
        int, typer.Option(help="Pairs per cell for the reuse-vs-full-re-run comparison (0: skip it).")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the patch commands (and of a preset's weights).")] = 0,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """Wall time and peak RSS of `fbt-probe patch` per experiment (each command in its own
    process), and on a subset the speed-up of prefix reuse over the full re-run with the largest
    difference between their summary tables.

    \b
    Example: fbt-probe bench patch --out reports/bench/patch.md
    """

    check_report(out, force)  # before the benchmark runs
    names = (
        patch_bench.EXPERIMENTS
        if experiments.strip() == "all"
        else tuple(e.strip() for e in experiments.split(",") if e.strip())
    )
    bad = [e for e in names if e not in patch_bench.EXPERIMENTS]
    if bad or not names:
        raise FbtError(
            f"--experiments '{experiments}': expected 'all' or a comma-separated subset of {', '.join(patch_bench.EXPERIMENTS)}"
        )
    mode = parse_mode(mode)
    if compare_pairs < 0:
        raise FbtError("--compare-pairs must be >= 0")
    if dataset is not None and not dataset.exists():
        raise FbtError(f"{dataset}: no such dataset file or folder")
    result = patch_bench.run_patch_bench(
        run,
        dataset,
        names,
        mode,
        compare_pairs,
        seed,
        progress=lambda line: typer.echo(line, err=True),
    )
    write_report(result, patch_bench.to_markdown, out, force)


def register(app: typer.Typer) -> None:
    app.command("patch")(patch)
