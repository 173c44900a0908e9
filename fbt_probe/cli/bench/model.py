"""`fbt-probe bench model`: prefill, serial step and run_with_cache times of a model."""

from __future__ import annotations

from typing import Annotated

import typer

from fbt_probe.bench import model as model_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report
from fbt_probe.config import check_device
from fbt_probe.errors import FbtError


def model(
    preset: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    batch: Annotated[int, typer.Option(help="Batch of the standard / full prefill measurement.")] = 8,
    seq: Annotated[int, typer.Option(help="Sequence length T of the standard / full prefill measurement.")] = 1024,
    full_batches: Annotated[str, typer.Option(help="Batches at which `full` is timed, comma-separated.")] = "8,1",
    cache_batch: Annotated[int, typer.Option(help="Batch of the run_with_cache measurement.")] = 8,
    cache_seq: Annotated[int, typer.Option(help="Sequence length of the run_with_cache measurement.")] = 256,
    repeats: Annotated[int, typer.Option(help="Timed runs per measurement (the median is reported).")] = 3,
    memory: Annotated[
        bool, typer.Option("--memory/--no-memory", help="Peak RSS of standard and full (a child process each).")
    ] = True,
    device: Annotated[
        str, typer.Option(help="cpu, or cuda[:N] (full is then timed with and without the captured CUDA graph).")
    ] = "cpu",
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """`standard` and `full` prefill time (and peak memory) at T x batch, full / standard and the
    time per serial step, and run_with_cache over a plain forward, on this machine's CPU (or GPU:
    --device cuda).

    \b
    Example: fbt-probe bench model --out reports/bench/model.md
    """

    check_report(out, force)  # before the benchmark runs
    try:
        fb = tuple(int(x) for x in full_batches.split(",") if x.strip())
    except ValueError:
        raise FbtError(f"--full-batches '{full_batches}': expected comma-separated integers") from None
    if min((batch, seq, cache_batch, cache_seq, repeats) + fb) < 1 or seq < 2:
        raise FbtError("--batch, --full-batches, --cache-batch, --cache-seq and --repeats must be >= 1, --seq >= 2")
    if device != "cpu" and not device.startswith("cuda"):
        raise FbtError(f"--device '{device}': expected cpu or cuda[:N]")

    check_device(device)  # CUDA present, the index in range: one line otherwise
    result = model_bench.run_model_bench(preset, batch, seq, fb, cache_batch, cache_seq, repeats, memory, device)
    write_report(result, model_bench.to_markdown, out, force)


def register(app: typer.Typer) -> None:
    app.command("model")(model)
