"""`fbt-probe patch RUN DATASET --experiment NAME`: causal interventions over minimal pairs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional

import typer

from fbt_probe.cli.options import DeviceOption
from fbt_probe.cli.patch_fields import OPTIONS
from fbt_probe.distributed import device_for
from fbt_probe.errors import FbtError
from fbt_probe.interventions import PatchConfig
from fbt_probe.interventions import run as run_patch
from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.methods_report import summary_lines
from fbt_probe.interventions.registry import EXPERIMENTS, options_for
from fbt_probe.interventions.runner import COMMAND, RESULTS_KIND
from fbt_probe.loading import open_pairs
from fbt_probe.marker import refuse_unowned


@OPTIONS.command
def patch(
    run: Annotated[
        str,
        typer.Argument(
            help="Run / checkpoint folder (config.json, model.safetensors, tokenizer.json) or a preset name (random init).",
            show_default=False,
        ),
    ],
    dataset: Annotated[
        Path,
        typer.Argument(help="A dataset .parquet (with its .manifest.json) or a folder of them.", show_default=False),
    ],
    experiment: Annotated[
        str,
        typer.Option(
            help="feedback-swap | state-replacement | gate-ablation | residual | probe-direction | attribution | das; several comma-separated run in one command (the final-position ones share one prefill)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Results folder; each experiment writes OUT/<experiment>/.")],
    tasks: Annotated[
        Optional[str], typer.Option(help="Only these tasks (comma-separated; default all in DATASET).")
    ] = None,
    device: DeviceOption = "cpu",
    figures: Annotated[bool, typer.Option(help="Draw the experiment's figures into OUT/<experiment>/figures/.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT/<experiment>/.")] = False,
    given: dict | None = None,
    defaults: dict | None = None,
) -> None:
    """Run causal intervention experiments over the minimal pairs of DATASET.

    Writes rows.parquet|csv (one row per sample of a pair x condition x metric), summary.parquet|csv
    (mean and 95 % CI per docs/statistics.md; length_knob -1 = pooled), manifest.json and figures/.

    \b
    Example: fbt-probe patch runs/tiny data/tasks --experiment feedback-swap --mode recurrent:1 --out results/ ;
    fbt-probe patch runs/tiny data/tasks --experiment feedback-swap,state-replacement,gate-ablation,residual,probe-direction --out results/
    (one command: the final-position experiments share each batch's prefill) ;
    fbt-probe patch runs/tiny data/tasks --experiment attribution --mode standard,jacobi:2 --check 10 --out results/ ;
    fbt-probe patch runs/tiny data/tasks --experiment das --mode recurrent:1 --ks 1,2,4,8 --out results/ ;
    torchrun --standalone --nproc_per_node 2 -m fbt_probe patch runs/tiny data/tasks --experiment residual --out results/
    (feedback-swap and residual share their pair batches over the processes; the others run on rank 0)
    """

    names = [e.strip() for e in experiment.split(",") if e.strip()] or [experiment]
    values = {**defaults, **given}
    shared = {f.name: values[f.name] for f in fields(PatchConfig) if f.name in values}
    cfgs = [  # PatchConfig refuses an experiment not in the registry
        PatchConfig(name, options=options_for(name, **values) if name in EXPERIMENTS else None, **shared)
        for name in names
    ]

    if len(set(names)) != len(names):
        raise FbtError(f"--experiment {experiment}: each experiment at most once")
    replacing = [
        out / c.experiment
        for c in cfgs  # before loading anything
        if refuse_unowned(out / c.experiment, COMMAND, force, RESULTS_KIND) is not None
    ]
    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None

    # torchrun: cuda -> cuda:LOCAL_RANK
    lm, df = open_pairs(run, dataset, task_list, device=device_for(device), seed=values["seed"])
    if len(cfgs) == 1:
        res = run_patch(lm.model, df, cfgs[0], out=out, force=force, model_info=lm.provenance(), figures=figures)
        done = None if res is None else [res]
    else:
        done = run_several(lm.model, df, cfgs, out=out, force=force, model_info=lm.provenance(), figures=figures)
    if done is None:  # torchrun: rank 0 gathers, summarizes and writes (fbt_probe.interventions.runner.run)
        return
    for res in done:
        for line in summary_lines(res):
            typer.echo(line)
        for note in res.manifest["notes"]:
            typer.echo(f"note: {note}", err=True)
        typer.echo(f"wrote {res.out_dir}")
    for path in replacing:
        typer.echo(f"replaced the earlier results in {path}")


def register(app: typer.Typer) -> None:
    app.command("patch")(patch)
