"""`fbt-probe bench fusion | model | nnsight | patch | probes | diff-reports`: benchmarks that write a Markdown report.

Each command builds its config, calls one library function that returns a JSON-able dict, and hands
it to `write_report`, which prints the Markdown or writes it to --out (with the full result as JSON
beside it, provenance included). A new benchmark is one more `@app.command` doing the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from fbt_probe.bench import fusion as fusion_bench
from fbt_probe.bench import model as model_bench
from fbt_probe.bench import nnsight as nnsight_bench
from fbt_probe.bench import patch as patch_bench
from fbt_probe.bench import probes as probes_bench
from fbt_probe.bench.diff_reports import diff_reports as run_diff
from fbt_probe.bench.report import save_report
from fbt_probe.config import check_device
from fbt_probe.errors import FbtError
from fbt_probe.io import refuse_existing
from fbt_probe.modes import parse_mode

app = typer.Typer(help="Benchmarks (Markdown tables; JSON with provenance beside --out).", no_args_is_help=True)

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


@app.command()
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
    decode: Annotated[
        bool | None,
        typer.Option("--decode/--no-decode", help="Share of a paper-1b decode step (default: on CUDA only)."),
    ] = None,
    model_step: Annotated[
        bool | None,
        typer.Option(
            "--model-step/--no-model-step", help="Also time the real FeedbackTransformer.step (default: on CUDA only)."
        ),
    ] = None,
    decode_batches: Annotated[str, typer.Option(help="Decode batch sizes, comma-separated.")] = "1,8,64",
    decode_ctx: Annotated[int, typer.Option(help="Tokens in the KV cache for the decode step.")] = 2048,
    decode_preset: Annotated[str, typer.Option(help="Model preset whose shapes the decode step uses.")] = "paper-1b",
    budget_ms: Annotated[float, typer.Option(help="Timing budget per measurement, milliseconds.")] = 100.0,
    out: OutOption = None,
    force: ForceOption = False,
) -> None:
    """Time the fusion epilogue RMSNorm(value ⊙ gate)·w: fused Triton kernel vs eager PyTorch vs
    torch.compile, bandwidth vs the device peak, and its share of a paper-1b decode step. On CPU only
    the reference path is timed (labelled as such).

    \b
    Example: fbt-probe bench fusion --rows 1,64,4k,64k --out reports/bench/fusion.md
    """

    cfg = fusion_bench.FusionBenchConfig(
        rows=fusion_bench.parse_rows(rows),
        d_model=d_model,
        device=device,
        dtype=dtype,
        compile=compile,
        decode=decode,
        model_step=model_step,
        decode_batches=fusion_bench.parse_rows(decode_batches, "--decode-batches"),
        decode_ctx=decode_ctx,
        decode_preset=decode_preset,
        budget_ms=budget_ms,
    )
    write_report(fusion_bench.run_fusion_bench(cfg), fusion_bench.to_markdown, out, force)


@app.command()
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


@app.command()
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


@app.command()
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
    if out is not None:
        refuse_existing(out, force)
    write_report(
        nnsight_bench.run_nnsight_bench(model, batch, seq, repeats, layer), nnsight_bench.to_markdown, out, force
    )


@app.command()
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

    if out is not None:  # before minutes of fitting
        refuse_existing(out, force)
    write_report(
        probes_bench.bench_probe_sweep(n, d, depths, folds, jobs, seed, torch_path, device),
        probes_bench.to_markdown,
        out,
        force,
    )


@app.command("diff-reports")
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
