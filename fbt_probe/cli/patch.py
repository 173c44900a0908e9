"""`fbt-probe patch RUN DATASET --experiment NAME`: causal interventions over minimal pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fbt_probe.cli.options import DeviceOption, NBootOption
from fbt_probe.distributed import device_for
from fbt_probe.errors import FbtError
from fbt_probe.interventions import PatchConfig
from fbt_probe.interventions import run as run_patch
from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.methods_report import report_lines
from fbt_probe.interventions.registry import EXPERIMENTS, options_for
from fbt_probe.interventions.runner import COMMAND, RESULTS_KIND
from fbt_probe.loading import open_pairs
from fbt_probe.marker import refuse_unowned
from fbt_probe.modes import parse_modes


def _ints(spec: Optional[str], what: str) -> tuple[int, ...] | None:

    if spec is None or spec.strip().lower() == "all":
        return None
    try:
        return tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        raise FbtError(f"{what} '{spec}': expected comma-separated integers or 'all'") from None


def _floats(spec: str, what: str) -> tuple[float, ...]:

    try:
        return tuple(float(s) for s in spec.split(",") if s.strip())
    except ValueError:
        raise FbtError(f"{what} '{spec}': expected comma-separated numbers") from None


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
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            "--modes",
            help="Prefill mode(s), comma-separated: standard, recurrent:k, full, jacobi:K (K passes; K >= the input's length T is the exact recurrence, jacobi:T = full, and runs as full).",
        ),
    ] = "recurrent:1",
    tasks: Annotated[
        Optional[str], typer.Option(help="Only these tasks (comma-separated; default all in DATASET).")
    ] = None,
    lengths: Annotated[
        Optional[str],
        typer.Option(help="Length knobs to keep, comma-separated or 'all' (residual default: the shortest per task)."),
    ] = None,
    max_pairs: Annotated[
        Optional[int], typer.Option(help="Pairs per task x length cell (default all; residual 16).")
    ] = None,
    depths: Annotated[
        Optional[str], typer.Option(help="Probe depths for residual / probe-direction, comma-separated or 'all'.")
    ] = None,
    last_k: Annotated[
        Optional[int], typer.Option(help="Residual: patch only the last K positions (default all).")
    ] = None,
    scales: Annotated[str, typer.Option(help="Probe-direction: steering scales (class-mean gaps).")] = "0.5,1,2,4",
    erase: Annotated[str, typer.Option(help="Probe-direction erasure: auto | leace | orth | leace,orth.")] = "auto",
    folds: Annotated[
        int, typer.Option(help="Probe-direction: grouped folds for cross-fitting (4, as the probes).")
    ] = 4,
    min_gap: Annotated[
        float,
        typer.Option(help="Pairs with |clean - corrupt| logit difference below this are left out of 'normalized'."),
    ] = 0.1,
    decoding: Annotated[bool, typer.Option(help="Gate ablation: also Std / Soft decoding answer accuracy.")] = True,
    check: Annotated[
        int,
        typer.Option(
            help="Attribution: patch exactly the K cells AtP ranks highest plus K random cells, and report rank correlation and worst error (0 = off)."
        ),
    ] = 0,
    hooks: Annotated[
        Optional[str],
        typer.Option(
            help="Attribution / DAS: hook names, comma-separated (default: residual stream + fusion hooks; DAS: fusion.hook_feedback and depths 0, L/2, L)."
        ),
    ] = None,
    ks: Annotated[str, typer.Option(help="DAS: subspace dimensions k.")] = "1,2,4,8",
    steps: Annotated[int, typer.Option(help="DAS: optimizer steps per rotation.")] = 200,
    lr: Annotated[float, typer.Option(help="DAS: learning rate of the rotation (Adam).")] = 1e-2,
    batch_size: Annotated[int, typer.Option(help="Samples per forward (pairs stay together).")] = 32,
    device: DeviceOption = "cpu",
    prefix_reuse: Annotated[
        bool,
        typer.Option(
            "--prefix-reuse/--no-prefix-reuse",
            help="Compute the positions before the edited one once per batch and run only the rest per condition (default); --no-prefix-reuse re-runs the whole sequence each time (same tables up to float rounding, slower).",
        ),
    ] = True,
    n_boot: NBootOption = 1000,
    seed: Annotated[int, typer.Option(help="Seed (bootstrap, donors, random states, folds; preset init).")] = 0,
    figures: Annotated[bool, typer.Option(help="Draw the experiment's figures into OUT/<experiment>/figures/.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT/<experiment>/.")] = False,
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
    knobs = dict(  # each experiment's options take the knobs they declare (registry.options_for)
        depths=_ints(depths, "depths"),
        last_k=last_k,
        scales=_floats(scales, "scales"),
        n_folds=folds,
        erase=erase,
        decoding=decoding,
        check=check,
        hooks=tuple(h.strip() for h in hooks.split(",") if h.strip()) if hooks else None,
        ks=_ints(ks, "ks") or (1, 2, 4, 8),
        steps=steps,
        lr=lr,
    )
    cfgs = [
        PatchConfig(
            experiment=name,
            modes=tuple(parse_modes(mode)),
            options=options_for(name, **knobs) if name in EXPERIMENTS else None,
            batch_size=batch_size,
            min_gap=min_gap,
            n_boot=n_boot,
            seed=seed,
            max_pairs=max_pairs,
            lengths=_ints(lengths, "lengths"),
            prefix_reuse=prefix_reuse,
        )
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

    lm, df = open_pairs(
        run, dataset, task_list, device=device_for(device), seed=seed
    )  # torchrun: cuda -> cuda:LOCAL_RANK
    if len(cfgs) == 1:
        res = run_patch(lm.model, df, cfgs[0], out=out, force=force, model_info=lm.provenance(), figures=figures)
        done = None if res is None else [res]
    else:
        done = run_several(lm.model, df, cfgs, out=out, force=force, model_info=lm.provenance(), figures=figures)
    if done is None:  # torchrun: rank 0 gathers, summarizes and writes (fbt_probe.interventions.runner.run)
        return
    for res in done:
        _report(res)
    for path in replacing:
        typer.echo(f"replaced the earlier results in {path}")


def _report(res) -> None:
    s = res.summary
    head = s[(s["metric"] == "normalized") & (s["length_knob"] == -1) & ~s["experiment"].isin(["attribution", "das"])]
    for r in head.itertuples():
        dec = "" if r.decoding == "prefill" else f" [{r.decoding}]"
        depth = f" depth {r.depth}" if r.depth >= 0 else ""
        scale = f" α={r.scale:g}" if r.condition.startswith("steer") else ""
        typer.echo(
            f"{r.mode:<12} {r.task:<11} {r.condition:<13}{depth}{scale}{dec}: normalized {r.mean:+.3f} "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] over {r.n_pairs} pairs ({r.n_excluded} tiny-gap excluded)"
        )

    for line in report_lines(res):
        typer.echo(line)
    for mode, e in res.manifest["tiny_gap"]["by_mode"].items():
        typer.echo(
            f"{mode}: {e['excluded']} of {e['pairs']} pairs have |clean - corrupt| < {res.manifest['tiny_gap']['min_gap']}"
        )
    for note in res.manifest["notes"]:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"wrote {res.out_dir}")


def register(app: typer.Typer) -> None:
    app.command("patch")(patch)
