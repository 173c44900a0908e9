"""`fbt-probe eval` and `fbt-probe diagnose contraction`: measurements of a trained run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from fbt_probe.errors import FbtError
from fbt_probe.figures import save_figure
from fbt_probe.figures.contraction import fig3
from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import atomic_path, write_json
from fbt_probe.marker import mark_named, refuse_named
from fbt_probe.provenance import provenance
from fbt_probe.reference import is_reference
from fbt_probe.tasks import load_tokenizer
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.data import validation_batch
from fbt_probe.training.evaluate import answer_accuracy, contraction, eval_samples

diagnose_app = typer.Typer(help="Diagnostics of a trained run.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
    app.add_typer(diagnose_app, name="diagnose")


def eval_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder, or a shipped ref:<name> (then --out is required).")],
    pairs: Annotated[int, typer.Option(help="Held-out minimal pairs per task × length cell.")] = 64,
    out: Annotated[Path | None, typer.Option(help="Output folder (default RUN/eval).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Answer accuracy per task × length under Std/Soft, Fused, recurrent:1, jacobi:3 and full, on
    contexts held out of training, plus validation loss per pass.

    \b
    Example: fbt-probe eval runs/tiny
    """

    if is_reference(str(run)) and out is None:
        raise FbtError(f"eval {run}: a shipped model needs --out (its folder is part of the package)")
    model, cfg, folder = load_trained(run)
    tok = load_tokenizer(folder / "tokenizer.json")
    arch = ARCHS[cfg.arch]  # a Hidden Decoding run has one pass only: no feedback modes, no per-pass losses
    modes = {} if arch.eval_modes is None else {"modes": arch.eval_modes}
    acc = answer_accuracy(model, eval_samples(cfg, tok, pairs=pairs), tok, **modes)
    losses = arch.val_losses(model, cfg, tok, max_passes=4)
    dest = out or run / "eval"
    _write_table(acc, dest / "accuracy", folder, cfg, force, extra={"val_loss_per_pass": losses})
    typer.echo(
        acc.pivot_table(index=["task", "length_knob"], columns="decoding", values="accuracy").round(3).to_string()
    )
    typer.echo(arch.val_label + ", ".join(f"{k.removeprefix('val_loss_')}={v:.3f}" for k, v in losses.items()))
    typer.echo(f"wrote {dest}/accuracy.{{parquet,csv,json}}")


MAX_DIAGNOSE_PASSES = 1024  # well past any trained depth (the paper's figure: 32)
MAX_DIAGNOSE_ROWS = 4096


@diagnose_app.command("contraction")
def contraction_cmd(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run folder(s) or shipped ref:<name>; several are drawn in one figure (e.g. two schedules)."
        ),
    ],
    passes: Annotated[int, typer.Option(help="Feedback passes N (well past the trained depth).")] = 32,
    rows: Annotated[int, typer.Option(help="Packed validation rows (held-out contexts).")] = 16,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default RUN/diagnostics; required for several runs).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Fig. 3: validation loss after k = 1..N feedback passes and the carried-state change per pass.

    Every run is measured on the same held-out validation rows (those of the first run's config).

    \b
    Example: fbt-probe diagnose contraction runs/tiny --passes 32 ;
    fbt-probe diagnose contraction runs/tiny runs/tiny-1-2 --out runs/schedules
    """

    if not 1 <= passes <= MAX_DIAGNOSE_PASSES:
        raise FbtError(
            f"--passes {passes}: expected an integer 1..{MAX_DIAGNOSE_PASSES} (feedback passes, each a forward of every row)"
        )
    if not 1 <= rows <= MAX_DIAGNOSE_ROWS:
        raise FbtError(f"--rows {rows}: expected an integer 1..{MAX_DIAGNOSE_ROWS} (packed validation rows)")
    if len(runs) > 1 and out is None:
        raise FbtError("diagnose contraction: several runs need --out (a folder for the shared table and figure)")
    if is_reference(str(runs[0])) and out is None:
        raise FbtError(
            f"diagnose contraction {runs[0]}: a shipped model needs --out (its folder is part of the package)"
        )
    if len({r.name for r in runs}) < len(runs):
        raise FbtError("diagnose contraction: run folders must have distinct names (they label the figure)")
    trained = [load_trained(run) for run in runs]  # (model, cfg, folder); a ref:<name> resolves to its verified folder
    folders = [folder for _, _, folder in trained]
    tok = load_tokenizer(folders[0] / "tokenizer.json")
    for folder in folders[1:]:
        if load_tokenizer(folder / "tokenizer.json").get_vocab() != tok.get_vocab():
            raise FbtError(f"{folder / 'tokenizer.json'}: tokenizer differs from {folders[0] / 'tokenizer.json'}")
    loaded = [(run, model, cfg) for run, (model, cfg, _) in zip(runs, trained)]
    batch = validation_batch(loaded[0][2], tok, rows=rows)
    tables = []
    for run, model, cfg in loaded:
        t = contraction(model, *batch, n_passes=passes)
        t.insert(0, "schedule", "constant:1 (baseline)" if cfg.baseline else str(cfg.schedule_obj))
        t.insert(0, "run", run.name)
        tables.append(t)
    table = pd.concat(tables, ignore_index=True)
    dest = out or runs[0] / "diagnostics"
    cfgs = [c for _, _, c in loaded]
    refuse_named([dest / f"contraction.{s}" for s in ("parquet", "csv", "json", "png", "svg")], force)
    if len(runs) == 1:
        _write_table(table, dest / "contraction", folders[0], cfgs[0], force)
    else:
        _write_table(table, dest / "contraction", folders, cfgs, force)
    depths = {run.name: c.schedule_obj.max_passes for run, c in zip(runs, cfgs)}  # a dotted line per trained depth
    save_figure(fig3(table, trained_passes=depths), dest, "contraction", force, mark=True)
    typer.echo(table[["run", "pass", "val_loss", "answer_accuracy", "state_change"]].round(4).to_string(index=False))
    typer.echo(f"wrote {dest}/contraction.{{parquet,csv,json,png,svg}}")


def _write_table(df, stem: Path, run: Path, cfg, force: bool, extra: dict | None = None) -> None:

    paths = [stem.with_suffix(suffix) for suffix in (".parquet", ".csv", ".json")]
    refuse_named(paths, force)
    with atomic_path(stem.with_suffix(".parquet")) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(stem.with_suffix(".csv")) as tmp:
        df.to_csv(tmp, index=False)
    if isinstance(run, list):  # several runs in one table: every field becomes a list
        fields = {
            "runs": [str(r) for r in run],
            "checkpoint_sha256": [checkpoint_hash(r) for r in run],
            "train_config": [c.to_dict() for c in cfg],
            "seed": [c.seed for c in cfg],
        }
    else:
        fields = {
            "run": str(run),
            "checkpoint_sha256": checkpoint_hash(run),
            "train_config": cfg.to_dict(),
            "seed": cfg.seed,
        }
    write_json(stem.with_suffix(".json"), provenance(**fields, **(extra or {})))
    mark_named(paths)
