"""`fbt-probe bench fusion`: the fusion epilogue, fused kernel against eager and compiled PyTorch."""

from __future__ import annotations

from typing import Annotated

import typer

from fbt_probe.bench import fusion as fusion_bench
from fbt_probe.cli.bench.report import ForceOption, OutOption, check_report, write_report


def fusion(
    rows: Annotated[
        str, typer.Option(help="Rows (batch × positions) per call, comma-separated; k = 1024.")
    ] = "1,4,16,64,256,1k,4k,16k,64k",
    d_model: Annotated[int, typer.Option(help="Width D of the fused rows.")] = 1536,
    device: Annotated[str, typer.Option(help="auto (cuda if available), cpu or cuda[:N].")] = "auto",
    dtype: Annotated[
        str, typer.Option(help="auto (bfloat16 on cuda, float32 on cpu), float32, bfloat16 or float16.")
    ] = "auto",
    compile: Annotated[
        bool, typer.Option("--compile/--no-compile", help="Time torch.compile of the reference (CUDA).")
    ] = True,
    model_step: Annotated[
        bool | None,
        typer.Option(
            "--model-step/--no-model-step", help="Also time the real FeedbackTransformer.step (default: on CUDA only)."
        ),
    ] = None,
    decode_batches: Annotated[str, typer.Option(help="Decode batch sizes, comma-separated.")] = "1,8,64",
    decode_ctx: Annotated[int, typer.Option(help="Tokens in the KV cache for the model's step.")] = 2048,
    decode_preset: Annotated[str, typer.Option(help="Model preset whose step is timed.")] = "paper-1b",
    budget_ms: Annotated[float, typer.Option(help="Timing budget per measurement, milliseconds.")] = 100.0,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """Time the fusion epilogue RMSNorm(value ⊙ gate)·w: fused Triton kernel vs eager PyTorch vs
    torch.compile, bandwidth vs the device peak, and its share of the model's step at paper-1b. On CPU only
    the reference path is timed (labelled as such).

    \b
    Example: fbt-probe bench fusion --rows 1,64,4k,64k --out reports/bench/fusion.md
    """

    check_report(out, force)  # before the benchmark runs
    cfg = fusion_bench.FusionBenchConfig(
        rows=fusion_bench.parse_rows(rows),
        d_model=d_model,
        device=device,
        dtype=dtype,
        compile=compile,
        model_step=model_step,
        decode_batches=fusion_bench.parse_rows(decode_batches, "--decode-batches"),
        decode_ctx=decode_ctx,
        decode_preset=decode_preset,
        budget_ms=budget_ms,
    )
    write_report(fusion_bench.run_fusion_bench(cfg), fusion_bench.to_markdown, out, force)


def register(app: typer.Typer) -> None:
    app.command("fusion")(fusion)
