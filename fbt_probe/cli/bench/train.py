"""`fbt-probe bench train`: training tokens/s of `train --corpus` against a plain PyTorch loop."""

from __future__ import annotations

from typing import Annotated

import typer

from fbt_probe.bench import train as train_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report
from fbt_probe.errors import FbtError


def train(
    corpus: Annotated[str, typer.Option(help="A corpus folder (fbt-probe corpus build).")] = "data/corpus",
    preset: Annotated[str, typer.Option(help="Model preset.")] = "small-lm",
    seq_len: Annotated[int, typer.Option(help="Tokens per window.")] = 256,
    tokens_per_step: Annotated[int, typer.Option(help="Tokens per step (windows x seq_len).")] = 8192,
    passes: Annotated[str, typer.Option(help="Pass counts K to time, comma-separated.")] = "1,2",
    steps: Annotated[int, typer.Option(help="Steps per measurement.")] = 12,
    warmup: Annotated[int, typer.Option(help="Steps left out of the median at the start.")] = 2,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """Training tokens per second of `fbt-probe train --corpus` against a plain PyTorch loop over the same model, windows and objective (hooks off), per pass count K.

    \b
    Example: OMP_NUM_THREADS=1 fbt-probe bench train --corpus data/corpus --out reports/bench/train.md
    """

    check_report(out, force)  # before the benchmark runs
    try:
        ks = tuple(int(x) for x in passes.split(",") if x.strip())
    except ValueError:
        raise FbtError(f"--passes '{passes}': expected comma-separated integers") from None
    if not ks or min(ks) < 1 or max(ks) > 8:
        raise FbtError(f"--passes '{passes}': expected pass counts 1..8")
    if not 1 <= warmup < steps:
        raise FbtError(f"--warmup {warmup} --steps {steps}: expected 1 <= warmup < steps")
    result = train_bench.run_train_bench(corpus, preset, seq_len, tokens_per_step, ks, steps, warmup)
    write_report(result, train_bench.to_markdown, out, force)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
