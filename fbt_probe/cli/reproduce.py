"""`fbt-probe reproduce`: zero to the paper's probing figures and a report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from fbt_probe import distributed
from fbt_probe.config import check_device
from fbt_probe.config import preset as check_preset
from fbt_probe.errors import FbtError
from fbt_probe.reproduce import ReproConfig, reproduce
from fbt_probe.reproduce.config import LM_PRESETS, for_trained_tasks
from fbt_probe.reproduce.pipeline import build_stages, reproduce_seeds
from fbt_probe.reproduce.stages import check_out, default_jobs, start_workers, time_table


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce_cmd)


def check_one_process() -> None:
    """The study runs its stages in one process (and its own workers); under torchrun every process
    would run the whole study into one folder: refused in one line naming what does scale."""
    w = distributed.world()
    if w.several:
        raise FbtError(
            f"reproduce under torchrun ({w.size} processes): the study runs its stages from one process; run "
            "its scaling stages as torchrun commands (extract, patch: docs/distributed.md) or reproduce --device "
            "cuda on one GPU"
        )


def reproduce_cmd(
    out: Annotated[
        Path, typer.Option(help="Study folder (datasets, models, activations, results, figures, report).")
    ] = Path("runs/repro"),
    preset: Annotated[
        str,
        typer.Option(
            help="tiny (trains on this CPU), small-lm (the general language model; its corpus at data/corpus) or paper-1b (needs --model)."
        ),
    ] = "tiny",
    model: Annotated[
        Path | None, typer.Option(help="A checkpoint folder to study instead of training (required for paper-1b).")
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="With --model: its no-feedback baseline checkpoint, studied beside it (same tokenizer; without it the report says there is none)."
        ),
    ] = None,
    train: Annotated[
        bool,
        typer.Option(
            "--train",
            help="Train the feedback model and its baseline from scratch (default: study the reference models shipped with the package, ref:<preset>-feedback and -baseline).",
        ),
    ] = False,
    quick: Annotated[
        bool,
        typer.Option(
            help="A small version of every stage, training small models (minutes; for checking the pipeline)."
        ),
    ] = False,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="The lighter study `make demo` runs (fewer probe groups, no `full` on the register tasks, lighter AtP/DAS/lens): about 5 minutes on 2 cores.",
        ),
    ] = False,
    long: Annotated[
        bool,
        typer.Option("--long", help="Probe sets also at 128 and 256 distractors, past the training lengths (slower)."),
    ] = False,
    steps: Annotated[
        int | None,
        typer.Option(
            help="Training steps with --train (default: the shipped models' recipe's, `fbt-probe train --recipe reference`, docs/training.md; 60 with --quick, which trains on the training defaults)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of data, training and probes.")] = 0,
    methods: Annotated[
        bool,
        typer.Option(
            "--methods/--no-methods",
            help="Run attribution patching, DAS, the lens and the SAEs (stages methods-*, lens-*, sae-feedback; the demo runs no SAE).",
        ),
    ] = True,
    seeds: Annotated[
        int | None,
        typer.Option(
            help="With --train: study N training seeds (0..N-1) in OUT/seed-S/ and quote each headline number's mean and range over them (OUT/seeds.csv)."
        ),
    ] = None,
    force: Annotated[list[str] | None, typer.Option(help="Redo this stage even if up to date (repeatable).")] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Stages run side by side in worker processes, each with cores/JOBS threads (default: 2 where there are 2 cores or more; 1 runs every stage in this process). The bytes of a stage's outputs can depend on its thread count: compare studies made with the same --jobs on the same machine.",
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            help="Device every stage runs its model on (cpu, cuda, cuda:N); with cuda, one stage at a time (--jobs 1 is taken)."
        ),
    ] = "cpu",
) -> None:
    """Generate the task datasets, take the shipped feedback model and its no-feedback baseline (or
    train them: --train), run the contraction diagnostic, extract activations, fit the probe sweep, run the causal experiments,
    draw every figure and write OUT/report.html and OUT/report.md. Up-to-date stages are skipped.

    \b
    Example: fbt-probe reproduce --preset tiny --out runs/repro          (the shipped models)
             fbt-probe reproduce --preset small-lm --out runs/lm          (the shipped general LMs)
             fbt-probe reproduce --preset tiny --train --out runs/retrained (from scratch)
             fbt-probe reproduce --model runs/d20 --baseline runs/d20-base --out runs/d20-study
    """

    check_device(device)  # one line, before anything is read or written
    check_one_process()
    jobs = (1 if device != "cpu" else default_jobs()) if jobs is None else jobs
    if device != "cpu" and jobs > 1:
        raise FbtError(f"--device {device} --jobs {jobs}: stages share the one device; run --jobs 1 on a GPU")
    start_workers(jobs)  # the workers' imports run beside this process's

    check_out(out, seeds=seeds is not None)  # before anything is made or read: a user's folder is never written into
    check_preset(preset)
    if preset not in ("tiny", *LM_PRESETS) and model is None:
        raise FbtError(f"--preset {preset}: training it here is not supported; pass --model PATH (a checkpoint folder)")
    if preset in LM_PRESETS and (quick or steps is not None):
        raise FbtError(
            f"--preset {preset}: the general language model's study has no --quick and no --steps (its recipe: "
            "docs/training.md, 'A general language model')"
        )
    if baseline is not None and model is None:
        raise FbtError("--baseline: needs --model (the checkpoint it is the baseline of)")
    if model is not None and (train or seeds is not None):
        given = "--train" if train else "--seeds"
        raise FbtError(
            f"--model {model} {given}: {given} trains the study's own models, --model studies a checkpoint as it "
            "is; give one of them"
        )
    for option, folder in (("--model", model), ("--baseline", baseline)):
        if folder is not None and _inside(out, folder):
            raise FbtError(
                f"--out {out}: inside {option} {folder}; the study would write into the checkpoint's folder "
                "(choose an --out outside it)"
            )
    kw = {
        "baseline": str(baseline) if baseline else None,
        "preset": preset,
        "seed": seed,
        "model": str(model) if model else None,
        "shipped": not (train or quick or model is not None),
        "methods": methods,
        "device": device,
    }
    if steps is not None:
        kw["steps"] = steps
    if quick + long + demo > 1:
        raise FbtError("--quick, --demo and --long: choose one")
    make = (
        ReproConfig.quick_config
        if quick
        else ReproConfig.demo_config
        if demo
        else ReproConfig.long_config
        if long
        else ReproConfig
    )
    cfg, left = for_trained_tasks(make(**kw))
    if left:
        typer.echo(
            f"note: --model {model} was trained on {', '.join(cfg.knobs)} only: the study leaves out {', '.join(left)}"
        )
    _check_force(cfg, out, set(force or []))
    t0 = time.perf_counter()
    if seeds is not None:
        res = reproduce_seeds(cfg, out, seeds, set(force or []), echo=typer.echo, jobs=jobs)
        typer.echo(
            f"finished in {time.perf_counter() - t0:.0f} s; over seeds: {res['seeds']}; reports: "
            + ", ".join(str(r) for r in res["reports"])
        )
        return
    res = reproduce(cfg, out, set(force or []), echo=typer.echo, jobs=jobs)
    typer.echo(time_table(res["times"], res["ran"]))
    typer.echo(f"finished in {time.perf_counter() - t0:.0f} s; report: {res['report']}")


def _inside(out: Path, folder: Path) -> bool:
    """`out` is `folder` or lies under it (links resolved)."""
    out, folder = Path(out).resolve(), Path(folder).resolve()
    return out == folder or out.is_relative_to(folder)


def _check_force(cfg, out: Path, force: set[str]) -> None:
    """An unknown --force stage is refused before OUT is made."""

    if not force:
        return
    stages = [s.name for s in build_stages(cfg, out)] + ["figures", "report"]
    unknown = sorted(force - set(stages))
    if unknown:
        raise FbtError(f"--force {unknown[0]}: unknown stage (stages: {', '.join(stages)})")
