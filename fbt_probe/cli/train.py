"""`fbt-probe train`, `fbt-probe eval`, `fbt-probe diagnose contraction`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

diagnose_app = typer.Typer(help="Diagnostics of a trained run.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("eval")(eval_cmd)
    app.add_typer(diagnose_app, name="diagnose")


def train_cmd(
    out: Annotated[Path, typer.Option(help="Run folder to write (checkpoint, tokenizer, metrics.jsonl).")],
    preset: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1000,
    schedule: Annotated[str, typer.Option(help="Passes per batch: 'K:p,...' summing to 1, 'constant:K' or 'paper' (1:.75,2:.22,3:.03).")] = "paper",
    baseline: Annotated[bool, typer.Option(help="No-feedback baseline: same data and steps, 1 pass only, fusion unused.")] = False,
    init: Annotated[Path | None, typer.Option(help="Warm start from a checkpoint folder (ours or Qwen3-format).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, data and noise.")] = 0,
    lam: Annotated[float, typer.Option(help="λ of eq. 12 (weight of the passes k >= 2).")] = 1.0,
    noise: Annotated[float, typer.Option(help="σ of the uniform noise on carried states.")] = 0.02,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 (CPU autocast).")] = "float32",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in OUT (bit for bit on CPU).")] = False,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    arch: Annotated[str, typer.Option(help="'feedback' (latent feedback) or 'hidden-decoding' (n streams per token, one pass; fbt_probe.hidden).")] = "feedback",
    streams: Annotated[int | None, typer.Option(help="hidden-decoding: streams per token n (default 2).")] = None,
    cross_layers: Annotated[str | None, typer.Option(help="hidden-decoding: comma-separated cross-stream layers (default: the base's global layers).")] = None,
) -> None:
    """Train a latent-feedback model (or its no-feedback baseline, or a Hidden Decoding model) on the three tasks.

    Example: fbt-probe train --preset tiny --out runs/tiny ; fbt-probe train --out runs/tiny-base --baseline ;
    fbt-probe train --arch hidden-decoding --streams 2 --init runs/tiny-base --out runs/tiny-hd2
    """
    from fbt_probe.config import preset as check_preset
    from fbt_probe.training import TrainConfig, parse_schedule, run_training

    check_preset(preset)
    parse_schedule(schedule)
    hidden = _hidden_options(arch, streams, cross_layers)
    cfg = TrainConfig(preset=preset, steps=steps, schedule=schedule, baseline=baseline, seed=seed, lam=lam, noise=noise, dtype=dtype, **hidden)
    res = run_training(cfg, out, init=init, resume=resume, force=force)
    typer.echo(f"trained {res['step']} steps in {res['seconds']:.0f} s ({res['tokens'] / max(res['seconds'], 1e-9):,.0f} tokens/s); run folder: {out}")


def _hidden_options(arch: str, streams: int | None, cross_layers: str | None) -> dict:
    from fbt_probe.errors import FbtError

    if arch == "feedback":
        if streams is not None or cross_layers is not None:
            raise FbtError("--streams and --cross-layers need --arch hidden-decoding")
        return {}
    if arch != "hidden-decoding":
        raise FbtError(f"--arch '{arch}': expected 'feedback' or 'hidden-decoding'")
    if streams is not None and streams < 1:
        raise FbtError(f"--streams {streams}: expected an integer >= 1")
    try:
        layers = None if cross_layers is None else tuple(int(l) for l in cross_layers.split(",") if l.strip())
    except ValueError:
        raise FbtError(f"--cross-layers '{cross_layers}': expected comma-separated layer indices (e.g. 1,3)") from None
    return {"arch": arch, "streams": 2 if streams is None else streams, "cross_stream_layers": layers}


def eval_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder.")],
    pairs: Annotated[int, typer.Option(help="Held-out minimal pairs per task × length cell.")] = 64,
    out: Annotated[Path | None, typer.Option(help="Output folder (default RUN/eval).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Answer accuracy per task × length under Std/Soft, Fused, recurrent:1, jacobi:3 and full, on
    contexts held out of training, plus validation loss per pass.

    Example: fbt-probe eval runs/tiny
    """
    from fbt_probe.tasks import load_tokenizer
    from fbt_probe.training.checkpoint import load_run
    from fbt_probe.training.evaluate import answer_accuracy, eval_samples, loss_per_pass

    model, cfg, _, _ = load_run(run)
    tok = load_tokenizer(run / "tokenizer.json")
    if cfg.arch == "hidden-decoding":  # one pass only: no feedback modes, no per-pass losses
        from fbt_probe.hidden.train import val_loss

        acc = answer_accuracy(model, eval_samples(cfg, tok, pairs=pairs), tok, modes=("standard",))
        losses = val_loss(model, cfg, tok)
    else:
        acc = answer_accuracy(model, eval_samples(cfg, tok, pairs=pairs), tok)
        losses = loss_per_pass(model, cfg, tok, max_passes=4)
    dest = out or run / "eval"
    _write_table(acc, dest / "accuracy", run, cfg, force, extra={"val_loss_per_pass": losses})
    typer.echo(acc.pivot_table(index=["task", "length_knob"], columns="decoding", values="accuracy").round(3).to_string())
    typer.echo("validation loss per pass: " + ", ".join(f"{k[-5:]}={v:.3f}" for k, v in losses.items()))
    typer.echo(f"wrote {dest}/accuracy.{{parquet,csv,json}}")


@diagnose_app.command("contraction")
def contraction_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder.")],
    passes: Annotated[int, typer.Option(help="Feedback passes N (well past the trained depth).")] = 32,
    rows: Annotated[int, typer.Option(help="Packed validation rows (held-out contexts).")] = 16,
    out: Annotated[Path | None, typer.Option(help="Output folder (default RUN/diagnostics).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Fig. 3: validation loss after k = 1..N feedback passes and the carried-state change per pass.

    Example: fbt-probe diagnose contraction runs/tiny --passes 32
    """
    from fbt_probe.figures import save_figure
    from fbt_probe.figures.contraction import fig3
    from fbt_probe.tasks import load_tokenizer
    from fbt_probe.training.checkpoint import load_run
    from fbt_probe.training.evaluate import contraction, validation_batch

    model, cfg, _, _ = load_run(run)
    tok = load_tokenizer(run / "tokenizer.json")
    table = contraction(model, *validation_batch(cfg, tok, rows=rows), n_passes=passes)
    table.insert(0, "schedule", cfg.schedule)
    table.insert(0, "run", run.name)
    dest = out or run / "diagnostics"
    _write_table(table, dest / "contraction", run, cfg, force)
    save_figure(fig3(table, trained_passes=cfg.schedule_obj.max_passes), dest, "contraction", force)
    typer.echo(table[["pass", "val_loss", "answer_accuracy", "state_change"]].round(4).to_string(index=False))
    typer.echo(f"wrote {dest}/contraction.{{parquet,csv,json,png,svg}}")


def _write_table(df, stem: Path, run: Path, cfg, force: bool, extra: dict | None = None) -> None:
    from fbt_probe.io import atomic_path, refuse_existing, write_json
    from fbt_probe.model.checkpoint import checkpoint_hash
    from fbt_probe.provenance import provenance

    for suffix in (".parquet", ".csv", ".json"):
        refuse_existing(stem.with_suffix(suffix), force)
    with atomic_path(stem.with_suffix(".parquet")) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(stem.with_suffix(".csv")) as tmp:
        df.to_csv(tmp, index=False)
    write_json(stem.with_suffix(".json"), provenance(run=str(run), checkpoint_sha256=checkpoint_hash(run),
                                                    train_config=cfg.to_dict(), seed=cfg.seed, **(extra or {})))
