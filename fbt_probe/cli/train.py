"""`fbt-probe train`, `fbt-probe eval`, `fbt-probe diagnose contraction`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from fbt_probe.config import preset as check_preset
from fbt_probe.distributed import world
from fbt_probe.errors import FbtError
from fbt_probe.figures import save_figure
from fbt_probe.figures.contraction import fig3
from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import atomic_path, write_json
from fbt_probe.marker import mark_named, refuse_named
from fbt_probe.provenance import provenance
from fbt_probe.reference import is_reference
from fbt_probe.tasks import load_spec, load_tokenizer
from fbt_probe.training import TrainConfig, parse_schedule, run_training
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.data import validation_batch
from fbt_probe.training.evaluate import answer_accuracy, contraction, eval_samples
from fbt_probe.training.parallel import process_device
from fbt_probe.training.recipes import recipe as recipe_fields
from fbt_probe.training.resume import RunFinished, resume_config

diagnose_app = typer.Typer(help="Diagnostics of a trained run.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("eval")(eval_cmd)
    app.add_typer(diagnose_app, name="diagnose")


def train_cmd(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Run folder to write (checkpoint, tokenizer, metrics.jsonl).")],
    preset: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    recipe: Annotated[
        str | None,
        typer.Option(
            help="A named set of training fields, under the options given here: 'reference' (how the shipped reference models are trained: induction warm-up, register documents with a ramp over the register count; its fields: docs/training.md)."
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Optimizer steps (default: the recipe's, else TrainConfig.steps, 800).")
    ] = None,
    schedule: Annotated[
        str, typer.Option(help="Passes per batch: 'K:p,...' summing to 1, 'constant:K' or 'paper' (1:.75,2:.22,3:.03).")
    ] = "paper",
    baseline: Annotated[
        bool, typer.Option(help="No-feedback baseline: same data and steps, 1 pass only, fusion unused.")
    ] = False,
    one_pass_steps: Annotated[
        int | None,
        typer.Option(
            help="The first N steps train one pass only, then K follows --schedule (default: the training config's)."
        ),
    ] = None,
    init: Annotated[
        Path | None,
        typer.Option(
            help="Start from the weights of a run folder, a checkpoint (ours or Qwen3-format) or a shipped ref:<name> (fresh optimizer; feedback and --baseline: it must have --preset's shapes). Recorded in the run's config."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation, data and noise.")] = 0,
    lam: Annotated[float, typer.Option(help="λ of eq. 12 (weight of the passes k >= 2).")] = 1.0,
    task_shares: Annotated[
        str | None,
        typer.Option(
            help="Share of each step's tokens per task, 'task:share,...' summing to 1 (default: the training config's)."
        ),
    ] = None,
    noise: Annotated[float, typer.Option(help="σ of the uniform noise on carried states.")] = 0.02,
    tasks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated tasks trained and evaluated (default: completion,memory,registers,registers-count)."
        ),
    ] = None,
    tokens_per_step: Annotated[
        int | None, typer.Option(help="Tokens of documents drawn per optimizer step (default 2048).")
    ] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate (default 1e-3).")] = None,
    warmup: Annotated[int | None, typer.Option(help="Linear warm-up steps (default 100).")] = None,
    min_lr_ratio: Annotated[
        float | None,
        typer.Option(help="Cosine decay to this share of --lr; 1 keeps it constant after warm-up (default 0.1)."),
    ] = None,
    decay_steps: Annotated[
        int | None,
        typer.Option(
            help="The cosine decay to --min-lr-ratio runs over the last N steps, the lr constant before them (default 0: over every step after the warm-up)."
        ),
    ] = None,
    answer_share: Annotated[
        float | None,
        typer.Option(
            help="The answers' share of each document's loss weight, in (0, 1]; 1: loss on the answers only (default 0.5)."
        ),
    ] = None,
    register_mix: Annotated[
        str | None,
        typer.Option(
            help="Register documents in place of the register tasks' training cells: space-separated kinds m:wpr:K:S[:weight] (m registers, K writes each, S scratch lines, 0 = none) or m:N:S[:weight] (N assignments); weight: share of the documents; a trailing :vN gives values 0..N-1, answered by the number itself."
        ),
    ] = None,
    register_queries: Annotated[
        int | None, typer.Option(help="Supervised queries at the end of each --register-mix document (default 1).")
    ] = None,
    copy_steps: Annotated[
        int | None,
        typer.Option(
            help="Induction warm-up: the first N of --steps train on copy documents only (random numbers repeated after a random gap), then the tasks (default 0)."
        ),
    ] = None,
    register_steps: Annotated[
        int | None,
        typer.Option(
            help="After the warm-up, the next N steps train the register tasks alone, then all the tasks (default 0)."
        ),
    ] = None,
    register_ramp: Annotated[
        str | None,
        typer.Option(
            help="A curriculum over the register count inside the register phase: 'M:N ...' (the first N register-phase steps draw only --register-mix kinds with at most M registers, then the next window, then every kind); 'none' for no ramp (the default, except under a --recipe that sets one, as 'reference' does)."
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16 (autocast on the training device).")] = "float32",
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in OUT (bit for bit on CPU) to its recorded steps, or to --steps N past them; every other training option is the record's (one given that differs is refused)."
        ),
    ] = False,
    force: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    arch: Annotated[
        str,
        typer.Option(
            help="'feedback' (latent feedback) or 'hidden-decoding' (n streams per token, one pass; fbt_probe.hidden)."
        ),
    ] = "feedback",
    streams: Annotated[int | None, typer.Option(help="hidden-decoding: streams per token n (default 2).")] = None,
    cross_layers: Annotated[
        str | None,
        typer.Option(help="hidden-decoding: comma-separated cross-stream layers (default: the base's global layers)."),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            help="auto (cuda if available, else cpu), cpu or cuda. Under torchrun each process takes its own GPU, cuda:LOCAL_RANK."
        ),
    ] = "auto",
    fsdp: Annotated[
        bool,
        typer.Option(
            "--fsdp",
            help="Under torchrun: shard parameters, gradients and optimizer state with FSDP2 (for paper-1b-sized models; default DDP). No evaluation during training: run fbt-probe eval afterwards.",
        ),
    ] = False,
) -> None:
    """Train a latent-feedback model (or its no-feedback baseline, or a Hidden Decoding model) on the four tasks.

    \b
    Example: fbt-probe train --preset tiny --out runs/tiny ; fbt-probe train --out runs/tiny-base --baseline ;
    fbt-probe train --recipe reference --out runs/ref-feedback  (the shipped models' recipe; add --baseline) ;
    fbt-probe train --arch hidden-decoding --streams 2 --init runs/tiny-base --out runs/tiny-hd2 ;
    fbt-probe train --baseline --tasks registers,registers-count --register-mix "2:wpr:1:0 2:wpr:2:0"
    --register-queries 2 --answer-share 1 --min-lr-ratio 1 --steps 400 --out runs/r12  (a register stage; the next
    stage adds --init runs/r12: docs/training.md) ;
    torchrun --standalone --nproc_per_node 2 -m fbt_probe train --preset tiny --out runs/tiny  (DDP: each
    process takes its rows of every step; same global batch, checkpoint written once)
    """

    check_preset(preset)
    parse_schedule(schedule)
    dev = process_device(device)  # a missing GPU is refused before anything is written
    hidden = _hidden_options(arch, streams, cross_layers)

    extra = {} if recipe is None else recipe_fields(recipe)
    if one_pass_steps is not None:
        extra["one_pass_steps"] = one_pass_steps
    given = {
        "steps": steps,
        "tokens_per_step": tokens_per_step,
        "lr": lr,
        "warmup": warmup,
        "min_lr_ratio": min_lr_ratio,
        "decay_steps": decay_steps,
        "answer_share": answer_share,
        "register_mix": register_mix,
        "register_queries": register_queries,
        "copy_steps": copy_steps,
        "register_steps": register_steps,
    }
    extra.update({k: v for k, v in given.items() if v is not None})
    if register_ramp is not None:
        extra["register_ramp"] = None if register_ramp.strip().lower() == "none" else register_ramp
    if tasks is not None:
        extra["tasks"] = parse_tasks(tasks)
    if task_shares is not None:
        extra["task_shares"] = parse_task_shares(task_shares)
    fields = {
        "preset": preset,
        "schedule": schedule,
        "baseline": baseline,
        "seed": seed,
        "lam": lam,
        "noise": noise,
        "dtype": dtype,
        "arch": arch,
        **hidden,
        **extra,
    }
    if resume:
        try:
            cfg = resume_config(out, _named_fields(ctx, fields, recipe, init), steps)
        except RunFinished as done:
            typer.echo(str(done))
            return
        init = None
    else:
        cfg = TrainConfig(**fields)
    replacing = force and not resume and out.is_dir() and any(out.iterdir())
    try:
        res = run_training(cfg, out, init=init, resume=resume, force=force, fsdp=fsdp, device=dev)
    except KeyboardInterrupt:
        msg = "the earlier run is unchanged" if replacing else "continue from the last checkpoint with --resume"
        typer.echo(f"interrupted: {out}: {msg}", err=True)
        raise typer.Exit(130) from None

    if not world().main:
        return
    if res.get("replaced"):
        typer.echo(f"replaced the earlier run in {out}")
    typer.echo(
        f"trained {res['step']} steps in {res['seconds']:.0f} s ({res['tokens'] / max(res['seconds'], 1e-9):,.0f} tokens/s); run folder: {out}"
    )


# the options of `train` that are not train config fields (a resume may name them freely)
NOT_CONFIG = {"ctx", "out", "resume", "force", "device", "fsdp", "steps", "recipe", "init"}
OPTION_FIELDS = {"cross_layers": "cross_stream_layers"}


def _named_fields(ctx: typer.Context, fields: dict, recipe: str | None, init) -> dict:
    """The train config fields the command line named, with their values (a recipe names its fields)."""
    named = {}
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if name in NOT_CONFIG or source is None or source.name == "DEFAULT":
            continue
        field = OPTION_FIELDS.get(name, name)
        named[field] = fields.get(field)
    if recipe is not None:
        named.update({k: fields[k] for k in recipe_fields(recipe) if k != "steps"})
    if init is not None:
        named["init"] = str(init)
    return named


def parse_tasks(text: str) -> tuple[str, ...]:
    """'registers,registers-count' -> the task names (each a built-in task or a spec file)."""

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names or len(set(names)) < len(names):
        raise FbtError(f"--tasks '{text}': expected distinct comma-separated tasks (e.g. registers,registers-count)")
    for name in names:
        try:
            load_spec(name)
        except FbtError as exc:
            raise FbtError(f"--tasks '{text}': {exc}") from None
    return names


def parse_task_shares(text: str) -> dict:
    """'completion:.5,memory:.25,registers:.25' -> {task: share} (checked by TrainConfig)."""

    shares = {}
    for item in text.split(","):
        name, _, value = item.partition(":")
        try:
            shares[name.strip()] = float(value)
        except ValueError:
            raise FbtError(
                f"--task-shares '{text}': expected 'task:share,...' (e.g. completion:.5,memory:.25,registers:.25)"
            ) from None
    return shares


def _hidden_options(arch: str, streams: int | None, cross_layers: str | None) -> dict:

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
