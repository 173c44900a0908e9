"""`fbt-probe sae train|analyze`: sparse autoencoders on a hook (first: the carried state) and the feature-level tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fbt_probe.cli.fromconfig import INTS_OR_ALL
from fbt_probe.cli.options import DeviceOption, NBootOption
from fbt_probe.errors import FbtError
from fbt_probe.loading import load_data, open_model, open_pairs
from fbt_probe.marker import refuse_unowned, writing
from fbt_probe.modes import parse_mode, parse_modes
from fbt_probe.provenance import provenance
from fbt_probe.sae.analyze import COMMAND as ANALYZE_COMMAND
from fbt_probe.sae.analyze import KIND as ANALYZE_KIND
from fbt_probe.sae.analyze import analyze as run_analysis
from fbt_probe.sae.analyze import sparsity_sentence
from fbt_probe.sae.data import collect, saelens_metadata
from fbt_probe.sae.metrics import reconstruction
from fbt_probe.sae.model import COMMAND as TRAIN_COMMAND
from fbt_probe.sae.model import KIND as SAE_KIND
from fbt_probe.sae.model import SparseAutoencoder
from fbt_probe.sae.train import SAETrainConfig, train_sae

app = typer.Typer(
    help="Sparse autoencoders on a hook (default: the carried state, fusion.hook_feedback).", no_args_is_help=True
)

RunArg = Annotated[str, typer.Argument(help="Run / checkpoint folder or ref:<name>.", show_default=False)]
DataArg = Annotated[
    Path, typer.Argument(help="A dataset .parquet (with its .manifest.json) or a folder of them.", show_default=False)
]
TasksOption = Annotated[Optional[str], typer.Option(help="Only these tasks (comma-separated).")]


def _tasks(tasks):
    return [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None


@app.command("train")
def train(
    run: RunArg,
    dataset: DataArg,
    out: Annotated[
        Path, typer.Option("--out", help="SAE folder to write (cfg.json + sae_weights.safetensors, SAELens's format).")
    ],
    hook: Annotated[str, typer.Option(help="Hook whose activations the SAE reconstructs.")] = "fusion.hook_feedback",
    mode: Annotated[
        str,
        typer.Option(
            help="Mode the activations are read under; jacobi:2 carries the standard pass's top state into every position (what recurrent:1 carries into the last)."
        ),
    ] = "jacobi:2",
    positions: Annotated[str, typer.Option(help="fed (positions the mode feeds a state into), all, or final.")] = "fed",
    architecture: Annotated[str, typer.Option(help="topk or jumprelu.")] = "topk",
    expansion: Annotated[int, typer.Option(help="d_sae = expansion x d_in.")] = 4,
    k: Annotated[int, typer.Option(help="topk: active latents per row.")] = 8,
    l0_coeff: Annotated[float, typer.Option(help="jumprelu: weight of the L0 penalty.")] = 0.03,
    steps: Annotated[int, typer.Option(help="Adam steps.")] = 2000,
    batch_size: Annotated[int, typer.Option(help="Rows per step.")] = 256,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 2e-3,
    tasks: TasksOption = None,
    seed: Annotated[int, typer.Option(help="Seed (initialisation, batches).")] = 0,
    device: DeviceOption = "cpu",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing SAE folder at OUT.")] = False,
) -> None:
    """Train an SAE on one hook's activations over every sample of DATASET.

    \b
    Example: fbt-probe sae train ref:tiny-feedback runs/demo/data --out runs/sae/topk
    """

    mode = parse_mode(mode)  # a Mode is a str: the SAE folder records its name
    cfg = SAETrainConfig(
        architecture=architecture,
        expansion=expansion,
        k=k,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        l0_coeff=l0_coeff,
    )
    cfg.check()
    with writing(out, TRAIN_COMMAND):  # one writer of OUT from its check to the swap
        keep = refuse_unowned(out, TRAIN_COMMAND, force, SAE_KIND)
        df = load_data(dataset, _tasks(tasks), pairs=False, command="sae train")
        lm = open_model(run, device, seed)
        x, index = collect(lm.model, df, hook, mode, positions)
        typer.echo(f"{len(x)} rows of {hook} ({positions} positions under {mode}), d_in {x.shape[1]}")
        meta = {
            "hook_name": hook,
            "model_name": run,
            "checkpoint_sha256": lm.hash,
            "mode": mode,
            "positions": positions,
            "dataset": str(dataset),
            "dataset_hash": df.attrs.get("dataset_hash"),
            "provenance": provenance(**lm.provenance(), dataset_hash=df.attrs.get("dataset_hash")),
        }
        meta |= saelens_metadata(index, str(dataset))
        sae, record = train_sae(
            x, cfg, meta, log=lambda r: typer.echo("  " + ", ".join(f"{a} {b}" for a, b in r.items()))
        )
        sae.cfg.metadata["training"] = record
        r = reconstruction(sae, x)
        sae.cfg.metadata["reconstruction"] = r
        sae.save(out, force=force)
    typer.echo(
        f"FVU {r['fvu']:.4f}, L0 {r['l0']:.2f}, dead latents {r['dead_latents']} of {r['d_sae']} (training rows)"
    )
    _wrote(out, keep)


def _wrote(out: Path, keep: list[str] | None) -> None:
    if keep is None:
        typer.echo(f"wrote {out}")
    else:
        kept = f"; kept {len(keep)} file(s) it had not written: {', '.join(keep[:3])}" if keep else ""
        typer.echo(f"wrote {out} (replaced the earlier output{kept})")


@app.command("analyze")
def analyze(
    run: RunArg,
    sae: Annotated[Path, typer.Argument(help="SAE folder (fbt-probe sae train --out).", show_default=False)],
    dataset: DataArg,
    out: Annotated[Path, typer.Option("--out", help="Output folder (tables: see docs/sae.md).")],
    mode: Annotated[
        str, typer.Option(help="Mode of the feature tests (the state it carries into the final position).")
    ] = "recurrent:1",
    modes: Annotated[
        str, typer.Option(help="Further modes for reconstruction and loss recovered (comma-separated).")
    ] = "jacobi:3",
    ks: Annotated[
        str, typer.Option(help="Numbers of label latents swapped / ablated (comma-separated).")
    ] = "1,2,4,8,16,32",
    max_pairs: Annotated[Optional[int], typer.Option(help="Pairs per task x length cell (default all).")] = None,
    tasks: TasksOption = None,
    n_boot: NBootOption = 1000,
    seed: Annotated[int, typer.Option(help="Seed (random-latent control, bootstrap).")] = 0,
    device: DeviceOption = "cpu",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing analysis folder at OUT.")] = False,
) -> None:
    """Reconstruction, loss recovered, and the feature swap / ablation of each task's label latents.

    \b
    Example: fbt-probe sae analyze ref:tiny-feedback runs/sae/topk runs/demo/data --out runs/sae/analysis
    """

    mode_list = parse_modes(f"{mode},{modes}" if modes else mode)
    k_list = INTS_OR_ALL.parse(ks, "--ks")
    if not 0 <= seed < 2**63:
        raise FbtError(f"--seed {seed}: expected an integer 0..2**63-1")
    if max_pairs is not None and max_pairs < 1:
        raise FbtError(f"--max-pairs {max_pairs}: expected an integer >= 1")
    if n_boot < 1:
        raise FbtError(f"--n-boot {n_boot}: expected an integer >= 1")
    with writing(out, ANALYZE_COMMAND):  # one writer of OUT from its check to the swap
        keep = refuse_unowned(out, ANALYZE_COMMAND, force, ANALYZE_KIND)
        model_sae = SparseAutoencoder.load(sae)
        lm, df = open_pairs(run, dataset, _tasks(tasks), device=device, seed=seed, command="sae analyze")
        if model_sae.cfg.d_in != lm.model.cfg.d_model:
            raise FbtError(
                f"{sae}: d_in {model_sae.cfg.d_in} does not match the model's d_model {lm.model.cfg.d_model}"
            )
        recorded = model_sae.cfg.metadata.get("checkpoint_sha256")
        if recorded is not None and recorded != lm.hash:
            raise FbtError(
                f"{sae}/cfg.json: field 'metadata.checkpoint_sha256': the SAE was trained on "
                f"{model_sae.cfg.metadata.get('model_name')} (sha256 {str(recorded)[:12]}...), not on {run} "
                f"(sha256 {lm.hash[:12]}...); analyze it with the model it was trained on"
            )
        res = run_analysis(
            lm.model,
            model_sae,
            df,
            out,
            mode_list[0],
            mode_list[1:],
            k_list,
            max_pairs,
            seed=seed,
            n_boot=n_boot,
            force=force,
            info={"model": run, "sae_folder": str(sae), **lm.provenance()},
        )
    for r in res["reconstruction"].itertuples():
        typer.echo(f"{r.mode:<12} FVU {r.fvu:.4f}  L0 {r.l0:.2f}  dead {r.dead_latents}/{r.d_sae}  ({r.rows} rows)")
    for r in res["loss_recovered"].itertuples():
        typer.echo(
            f"{r.mode:<12} {r.task:<16} CE recovered {r.recovered_ce:.3f} [{r.recovered_ce_low:.3f}, {r.recovered_ce_high:.3f}]  "
            f"LD recovered {r.recovered_ld:.3f} [{r.recovered_ld_low:.3f}, {r.recovered_ld_high:.3f}]"
        )
    for task in sorted(res["fractions"]["task"].unique()):
        typer.echo(sparsity_sentence(res["fractions"], task))
    _wrote(out, keep)
