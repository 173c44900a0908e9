"""`fbt-probe extract | probe | figures`: activations -> probe table -> figures."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console

from fbt_probe.activations import ExtractProgress
from fbt_probe.activations import extract as run_extract
from fbt_probe.distributed import world
from fbt_probe.errors import FbtError
from fbt_probe.figures import FIGURES, draw, get_figure, save_figure
from fbt_probe.marker import refuse_named, writing
from fbt_probe.probes import ProbeConfig, probe_sweep, write_results
from fbt_probe.probes.sweep import COMMAND as PROBE_COMMAND
from fbt_probe.probes.sweep import CSV_FILE, PROVENANCE_FILE, SAMPLES_FILE, SUMMARY_FILE, TABLE_FILE
from fbt_probe.shards import is_activation_folder


def _figure_help() -> str:

    return "; ".join(f"{name}: {e.help}" for name, e in sorted(FIGURES.items()))


def extract(
    run: Annotated[
        str,
        typer.Argument(
            help="Checkpoint folder (config.json, model.safetensors, tokenizer.json), ref:<name> (a shipped reference model) or preset name.",
            show_default=False,
        ),
    ],
    dataset: Annotated[
        Path,
        typer.Argument(help="A dataset .parquet (with its .manifest.json) or a folder of them.", show_default=False),
    ],
    out: Annotated[Path, typer.Option("--out", help="Activation folder (shards + manifest).")],
    modes: Annotated[
        Optional[str],
        typer.Option(
            "--modes",
            "--mode",
            help="Comma-separated prefill modes: standard, recurrent:k, full, jacobi:K (K passes; K >= the input's length T is the exact recurrence, jacobi:T = full, and runs as full) (default standard,recurrent:1; a Hidden Decoding model has only standard).",
        ),
    ] = None,
    hooks: Annotated[
        Optional[str],
        typer.Option(help="Extra hook names, comma-separated; NAME@-2 takes the position before the last."),
    ] = None,
    reference: Annotated[
        bool, typer.Option(help="Also extract the carried state h(T-1) (pseudo-mode carried-state).")
    ] = True,
    batch_size: Annotated[int, typer.Option(help="Samples per forward (all of one exact length).")] = 16,
    shard_rows: Annotated[int, typer.Option(help="Samples per shard file.")] = 256,
    dtype: Annotated[str, typer.Option(help="Stored dtype: float32, float16, bfloat16, float64.")] = "float32",
    device: Annotated[Optional[str], typer.Option(help="Device to run the model on (default cpu).")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace an existing activation folder (and nothing else): the new one is built beside it and swapped in when done.",
        ),
    ] = False,
    progress: Annotated[
        Optional[bool],
        typer.Option(
            "--progress/--no-progress",
            help="A progress bar with ETA on stderr instead of one line per shard (default: when stderr is a terminal and one process runs).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Extract the final-position residual stream at every depth for each prefill mode.

    An interrupted extraction (Ctrl-C, a killed process) continues when the same command is run
    again; every finished shard is first checked against the sha256 recorded when it was written.

    Under torchrun every process writes its share of the shards and rank 0 the manifest; the folder
    is byte for byte the single-process one (manifest: world_size). OUT must be one shared folder.

    \b
    Example: fbt-probe extract runs/tiny data/tasks --modes standard,recurrent:1 --out runs/tiny/acts ;
    torchrun --standalone --nproc_per_node 4 -m fbt_probe extract runs/tiny data/tasks --out runs/tiny/acts
    """

    report, use_bar = _progress_report(progress)
    extra = [h.strip() for h in hooks.split(",") if h.strip()] if hooks else []
    replacing = force and out.is_dir() and is_activation_folder(out)
    options = dict(extra_hooks=extra, reference=reference, batch_size=batch_size, shard_rows=shard_rows, dtype=dtype)
    with _exit_on_interrupt(out, replacing), report if use_bar else contextlib.nullcontext():
        store = run_extract(run, dataset, modes, out, device=device, force=force, progress=report, **options)
    if world().main:
        _print_extracted(store, out, replacing)


def _progress_report(progress: bool | None) -> tuple:
    """(report, use_bar): the bar where someone watches a terminal (or --progress asks for it); one
    line per shard in a log or a pipe, and under torchrun, whose processes share one terminal."""
    where = f"rank {world().rank} " if world().several else ""

    def lines(done: int, total: int, shard: dict) -> None:
        typer.echo(
            f"{where}[{done}/{total}] {shard['mode']:<14} {shard['task']:<11} T={shard['n_tokens']:<5} "
            f"{len(shard['rows'])} samples",
            err=True,
        )

    console = Console(stderr=True)
    use_bar = (console.is_terminal if progress is None else progress) and not world().several
    return (ExtractProgress(console) if use_bar else lines), use_bar


@contextlib.contextmanager
def _exit_on_interrupt(out: Path, replacing: bool):
    """Ctrl-C: one line on stderr saying what becomes of OUT, exit code 130 (no traceback)."""
    try:
        yield
    except KeyboardInterrupt:
        msg = (
            f"{out} is unchanged (a forced extraction replaces it only when done)"
            if replacing
            else "rerun the same command to resume"
        )
        typer.echo(f"interrupted: {msg}", err=True)
        raise typer.Exit(130) from None


def _print_extracted(store, out: Path, replacing: bool) -> None:
    """The extraction in one line: shards, samples, modes (a Hidden Decoding model's streams x depths), peak RSS."""
    if replacing:
        typer.echo(f"replaced the earlier activation folder {out}")
    m, n, rss = store.manifest["model"], store.manifest["n_samples"], store.manifest["peak_rss_mb"]
    if "n_streams" in m:  # Hidden Decoding: one mode holding streams x depths
        what = f"{m['n_streams']} streams x {m['n_layers'] + 1} depths (mode standard)"
    else:
        what = f"{len(store.modes)} modes"
    typer.echo(
        f"wrote {len(store.manifest['shards'])} shards for {n} samples x {what} to {out} (peak RSS "
        f"{rss['after_largest_length']:.0f} MB up to the largest length T={rss['largest_length']})"
    )


def probe(
    acts: Annotated[Path, typer.Argument(help="Activation folder written by `fbt-probe extract`.", show_default=False)],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Results folder: probes.parquet, probes.csv, probes_summary.csv, probes.provenance.json, "
            "probes_samples.parquet.",
        ),
    ],
    folds: Annotated[int, typer.Option(help="Folds of grouped K-fold CV (4: the paper's appendix F).")] = 4,
    cv: Annotated[str, typer.Option(help="group (GroupKFold) or stratified-group (StratifiedGroupKFold).")] = "group",
    c: Annotated[float, typer.Option("--C", help="Inverse L2 strength of the logistic regression.")] = 1.0,
    backend: Annotated[str, typer.Option(help="auto | sklearn | torch (auto: torch on CUDA, else sklearn).")] = "auto",
    jobs: Annotated[int, typer.Option(help="Worker processes of the sklearn backend (-1: all cores).")] = -1,
    device: Annotated[Optional[str], typer.Option(help="Device of the torch backend.")] = None,
    control: Annotated[bool, typer.Option(help="Fit the control task (labels permuted across groups).")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the control permutation and stratified folds.")] = 0,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail on a cell with fewer groups than folds instead of skipping it.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace existing result files.")] = False,
) -> None:
    """Fit grouped-CV probes at every depth for each task x mode x length.

    \b
    Example: fbt-probe probe runs/tiny/acts --out runs/tiny/results
    """

    cfg = ProbeConfig(
        n_splits=folds,
        cv=cv,
        C=c,
        backend=backend,
        n_jobs=jobs,
        device=device,
        control=control,
        seed=seed,
        skip_small_cells=not strict,
    )

    def progress(done: int, total: int, cell: tuple) -> None:
        typer.echo(f"[{done}/{total}] {cell[1]:<11} {cell[0]:<14} length {cell[2]}", err=True)

    names = (TABLE_FILE, CSV_FILE, SUMMARY_FILE, PROVENANCE_FILE, SAMPLES_FILE)
    with writing(out, PROBE_COMMAND):  # one writer of the folder from its check to the last table
        refuse_named([out / name for name in names], force, PROBE_COMMAND)  # refuse before hours of fitting
        result = probe_sweep(acts, cfg, progress=progress)
        paths = write_results(result, out, force=force)
    for flag in result.flags:
        typer.echo(f"warning: {flag['task']} {flag['mode']} length {flag['length']}: {flag['message']}", err=True)
    typer.echo(
        f"wrote {len(result.table)} rows to {paths['table']} (+ {paths['csv'].name}, "
        f"{paths['summary'].name}, {paths['provenance'].name}, {paths['samples'].name})"
    )


FIGURES_COMMAND = "figures"  # the writer of a figure's files in its folder's marker


def figures(
    name: Annotated[str, typer.Argument(help="Figure name.", show_default=False)],
    results: Annotated[
        Path, typer.Argument(help="A results table (.parquet/.csv) or a results folder.", show_default=False)
    ],
    out: Annotated[Path, typer.Option("--out", help="Folder for NAME.png and NAME.svg.")],
    baseline: Annotated[
        Optional[Path], typer.Option(help="Table of the no-feedback baseline model (figures that take one).")
    ] = None,
    option: Annotated[
        Optional[List[str]], typer.Option("--option", help="KEY=VALUE passed to the figure function (repeatable).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace existing figure files.")] = False,
) -> None:
    """Draw a figure from a results table (never runs a model).

    \b
    Example: fbt-probe figures fig7a runs/tiny/results --out reports/tiny
    """

    get_figure(name)  # unknown name: one clear line before anything is read
    options: dict = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise FbtError(f"--option '{item}': expected KEY=VALUE")
        options[key.strip()] = value
    if baseline is not None:
        options["baseline"] = baseline
    with writing(out, FIGURES_COMMAND):  # one writer of the folder from its check to the last file
        refuse_named([out / f"{name}.{fmt}" for fmt in ("png", "svg")], force, FIGURES_COMMAND)  # before the table
        fig = draw(name, results, **options)
        paths = save_figure(fig, out, name, force=force, mark=True, command=FIGURES_COMMAND)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


def register(app: typer.Typer) -> None:
    app.command("extract")(extract)
    app.command("probe")(probe)
    app.command(
        "figures",
        help=f"Draw a figure from a results table (never runs a model). Figures: {_figure_help()}."
        f"\n\nExample: fbt-probe figures fig7a runs/tiny/results --out reports/tiny",
    )(figures)
