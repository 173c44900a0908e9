"""`fbt-probe bench probes`: a depth x fold probe sweep on synthetic activations."""

from __future__ import annotations

from typing import Annotated

import typer

from fbt_probe.bench import probes as probes_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report
from fbt_probe.errors import FbtError


def probes(
    n: Annotated[int, typer.Option("--n", help="Samples (pairs of two).")] = 1600,
    d: Annotated[int, typer.Option("--d", help="Activation width D.")] = 1536,
    depths: Annotated[int, typer.Option(help="Probe depths (one fit per depth and fold).")] = 25,
    folds: Annotated[int, typer.Option(help="Folds of GroupKFold.")] = 5,
    jobs: Annotated[int, typer.Option(help="joblib workers of the CPU path (-1: all cores).")] = -1,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic activations.")] = 0,
    torch_path: Annotated[bool, typer.Option("--torch", help="Also time the batched torch path.")] = False,
    device: Annotated[str | None, typer.Option(help="Device of the torch path (default: cuda if available).")] = None,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """A depth x fold probe sweep on synthetic activations: the project's CPU path (lbfgs, one BLAS
    thread per fit, fits over cores) against scikit-learn defaults in one loop, and with --torch the
    batched torch path, with the largest held-out accuracy difference between them.

    \b
    Example: fbt-probe bench probes --torch --out reports/bench/probes.md ; fbt-probe bench probes --depths 3 --d 64 --n 200
    """

    for name, value, low in (("n", n, 4), ("d", d, 1), ("depths", depths, 1), ("folds", folds, 2)):
        if value < low:
            raise FbtError(f"--{name} {value}: expected an integer >= {low}")
    if n < 2 * folds:
        raise FbtError(f"--n {n}: expected at least 2 x --folds ({2 * folds}) samples (pairs of two per fold)")
    check_report(out, force)  # before minutes of fitting
    write_report(
        probes_bench.bench_probe_sweep(n, d, depths, folds, jobs, seed, torch_path, device),
        probes_bench.to_markdown,
        out,
        force,
    )


def register(app: typer.Typer) -> None:
    app.command("probes")(probes)
