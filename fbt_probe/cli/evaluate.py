"""`fbt-probe eval` and `fbt-probe diagnose contraction`: measurements of a trained run."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from fbt_probe.cli.running import running_cmd  # its own module, in the diagnose group
from fbt_probe.cli.tables import table_paths, write_table
from fbt_probe.errors import FbtError
from fbt_probe.figures import save_figure
from fbt_probe.figures.contraction import fig3
from fbt_probe.figures.passes import fig3_lm, fig4_lm
from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import write_json
from fbt_probe.marker import output_dir, refuse_named, refuse_unowned, writing
from fbt_probe.provenance import provenance
from fbt_probe.reference import is_reference
from fbt_probe.reproduce.passes_rules import passes_verdicts
from fbt_probe.tasks import load_tokenizer
from fbt_probe.tasks.fewshot import check_shots, with_shots
from fbt_probe.tasks.spec import MAX_GROUPS
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.curriculum import Trained
from fbt_probe.training.data import heldout, validation_batch
from fbt_probe.training.evaluate import answer_accuracy, contraction, eval_samples, task_config
from fbt_probe.training.passes import BASELINE_PASSES, pass_table, summarize

EVAL_COMMAND, CONTRACTION_COMMAND = "eval", "diagnose contraction"  # their tables' writers in the marker
EVAL_CONTEXTS = ("held-out", "trained")
diagnose_app = typer.Typer(help="Diagnostics of a trained run.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    diagnose_app.command("running")(running_cmd)
    app.command("eval")(eval_cmd)
    app.add_typer(diagnose_app, name="diagnose")


def eval_cmd(
    run: Annotated[Path, typer.Argument(help="Run folder, or a shipped ref:<name> (then --out is required).")],
    pairs: Annotated[int, typer.Option(help="Held-out minimal pairs per task × length cell.")] = 64,
    out: Annotated[Path | None, typer.Option(help="Output folder (default RUN/eval).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
    shots: Annotated[
        int,
        typer.Option(
            help="Solved examples of each task written before every sample (few-shot: for a model that never trained on the tasks, such as a general LM reading them in context; 0: zero-shot)."
        ),
    ] = 0,
    contexts: Annotated[
        str,
        typer.Option(
            help="held-out: contexts the run's split keeps out of training; trained: the contexts it trains on (a model that fits its training words but not the held-out ones memorised them; one that fits neither did not learn the cell)."
        ),
    ] = "held-out",
) -> None:
    """Answer accuracy and answer loss per task × length under Std/Soft, Fused, recurrent:1, jacobi:3
    and full, on contexts held out of training (or, with --contexts trained, on those it trains on),
    plus validation loss per pass.

    \b
    Example: fbt-probe eval runs/tiny ;  fbt-probe eval ref:small-lm-feedback --shots 4 --out runs/lm-eval
    """

    if isinstance(pairs, bool) or not 1 <= pairs <= MAX_GROUPS:
        raise FbtError(
            f"--pairs {pairs}: expected an integer 1..{MAX_GROUPS} (held-out minimal pairs per task x length cell)"
        )
    check_shots(shots)  # before the model is read
    if contexts not in EVAL_CONTEXTS:
        raise FbtError(f"--contexts {contexts}: expected one of {', '.join(EVAL_CONTEXTS)}")
    if is_reference(str(run)) and out is None:
        raise FbtError(f"eval {run}: a shipped model needs --out (its folder is part of the package)")
    dest = out or run / "eval"
    with writing(dest, EVAL_COMMAND):  # one writer of the folder from its check to the last file
        refuse_named(table_paths(dest / "accuracy"), force, EVAL_COMMAND)  # before the model runs
        model, cfg, folder = load_trained(run)
        if contexts == "trained" and cfg.corpus is not None:
            raise FbtError(
                f"--contexts trained: {run} trained on a corpus, never on a task's words; "
                "its task accuracy is in context (--contexts held-out)"
            )
        tok = load_tokenizer(folder / "tokenizer.json")
        arch = ARCHS[cfg.arch]  # a Hidden Decoding run has one pass only: no feedback modes, no per-pass losses
        modes = {} if arch.eval_modes is None else {"modes": arch.eval_modes}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # a corpus run never trained on a task: its accuracy is in context, its losses on held-out corpus files
            drawn = None if contexts == "held-out" else Trained(heldout(cfg))
            samples = eval_samples(task_config(cfg), tok, pairs=pairs, option="--pairs", contexts=drawn)
            samples = with_shots(samples, tok, shots)
        for w in caught:
            typer.echo(f"note: {w.message}", err=True)
        acc = answer_accuracy(model, samples, tok, **modes).assign(shots=shots, contexts=contexts)
        losses = arch.val_losses(model, cfg, tok, max_passes=4, **({"corpus": True} if cfg.corpus else {}))
        extra = {"val_loss_per_pass": losses, "shots": shots, "contexts": contexts}
        write_table(acc, dest / "accuracy", folder, cfg, force, extra=extra, command=EVAL_COMMAND)
    if shots:
        typer.echo(f"{shots}-shot: {shots} solved examples of each task before every sample")
    typer.echo(
        acc.pivot_table(index=["task", "length_knob"], columns="decoding", values="accuracy").round(3).to_string()
    )
    typer.echo(f"answer loss (nats; {contexts} contexts):")
    typer.echo(
        acc.pivot_table(index=["task", "length_knob"], columns="decoding", values="answer_loss").round(3).to_string()
    )
    if shots or cfg.corpus:  # a model reading the tasks in context may answer other words: the label choice too
        typer.echo("label choice (the answer word's logit above the other's; chance 0.5):")
        typer.echo(
            acc.pivot_table(index=["task", "length_knob"], columns="decoding", values="choice_accuracy")
            .round(3)
            .to_string()
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
    dest = out or runs[0] / "diagnostics"
    names = [dest / f"contraction.{s}" for s in ("parquet", "csv", "json", "png", "svg")]
    with writing(dest, CONTRACTION_COMMAND):  # one writer of the folder from its check to the last file
        refuse_named(names, force, CONTRACTION_COMMAND)  # before the passes run
        table, loaded, folders = _contraction(runs, passes, rows)
        cfgs = [c for _, _, c in loaded]
        many = len(runs) > 1  # several runs in one table: every provenance field becomes a list
        stem = dest / "contraction"
        write_table(
            table, stem, folders if many else folders[0], cfgs if many else cfgs[0], force, command=CONTRACTION_COMMAND
        )
        # a dotted line per trained depth (none for the `full` schedule: it trains every depth)
        depths = {run.name: c.pass_mix.max_passes for run, c in zip(runs, cfgs) if not c.pass_mix.serial}
        fig = fig3(table, trained_passes=depths)
        save_figure(fig, dest, "contraction", force, mark=True, command=CONTRACTION_COMMAND)
    typer.echo(table[["run", "pass", "val_loss", "answer_accuracy", "state_change"]].round(4).to_string(index=False))
    typer.echo(f"wrote {dest}/contraction.{{parquet,csv,json,png,svg}}")


def _contraction(runs: list[Path], passes: int, rows: int):
    """The contraction table of `runs`, each on the first run's held-out validation rows: (table,
    [(run, model, cfg)], checkpoint folders)."""
    trained = [load_trained(run) for run in runs]  # (model, cfg, folder); a ref:<name> resolves to its verified folder
    folders = [folder for _, _, folder in trained]
    tok = load_tokenizer(folders[0] / "tokenizer.json")
    for folder in folders[1:]:
        if load_tokenizer(folder / "tokenizer.json").get_vocab() != tok.get_vocab():
            raise FbtError(f"{folder / 'tokenizer.json'}: tokenizer differs from {folders[0] / 'tokenizer.json'}")
    loaded = [(run, model, cfg) for run, (model, cfg, _) in zip(runs, trained)]
    for run, _, cfg in loaded:
        if cfg.corpus is not None:  # no task validation documents: its held-out documents are corpus files
            raise FbtError(
                f"{run}: a general language model (trained on a corpus) has no task validation rows; "
                f"its contraction is on the corpus's held-out files: fbt-probe diagnose passes {run} --out DIR"
            )
    batch = validation_batch(loaded[0][2], tok, rows=rows)
    tables = []
    for run, model, cfg in loaded:
        t = contraction(model, *batch, n_passes=passes)
        t.insert(0, "schedule", "constant:1 (baseline)" if cfg.baseline else str(cfg.pass_mix))
        t.insert(0, "run", run.name)
        tables.append(t)
    return pd.concat(tables, ignore_index=True), loaded, folders


PASSES_COMMAND, PASSES_KIND = "diagnose passes", "a folder written by fbt-probe diagnose passes"


@diagnose_app.command("passes")
def passes_cmd(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Corpus runs (fbt-probe train --corpus) or shipped ref:<name>: the seeds and schedules to compare."
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="Output folder: passes.parquet (per held-out file), passes_summary.csv, figures.")
    ],
    passes: Annotated[
        int, typer.Option(help="Feedback passes N of each feedback run (a baseline runs 5: Fig. 4's range).")
    ] = 100,
    force: Annotated[bool, typer.Option(help="Replace OUT if it is a folder of this command.")] = False,
) -> None:
    """Fig. 3 and Fig. 4 of a general language model: held-out loss and carried-state change per pass, per file.

    Every run is read on the same held-out files (one window of its seq_len per file); the verdicts
    are the rules of fbt_probe/reproduce/passes_rules.py.

    \b
    Example: fbt-probe diagnose passes runs/lm-s0 runs/lm-7525-s0 runs/lm-base-s0 --out runs/lm-passes
    """

    if not 5 <= passes <= MAX_DIAGNOSE_PASSES:
        raise FbtError(f"--passes {passes}: expected an integer 5..{MAX_DIAGNOSE_PASSES}")
    if len({str(r) for r in runs}) < len(runs):
        raise FbtError("diagnose passes: a run is named twice")
    trained = [load_trained(run) for run in runs]
    shas = {cfg.corpus_sha256 for _, cfg, _ in trained}
    if None in shas or len(shas) > 1:
        raise FbtError("diagnose passes: every run must be a corpus run of the same corpus build (train --corpus)")
    with writing(out, PASSES_COMMAND):  # one writer of OUT from its check to the swap
        refuse_unowned(out, PASSES_COMMAND, force, PASSES_KIND)  # before the minutes of passes
        tables = []
        for run, (model, cfg, _) in zip(runs, trained):
            typer.echo(
                f"{run}: {min(passes, BASELINE_PASSES) if cfg.baseline else passes} passes over the held-out files"
            )
            tables.append(pass_table(str(run), model, cfg, passes))
        table = pd.concat(tables, ignore_index=True)
        summary = summarize(table)
        verdicts = passes_verdicts(table)
        with output_dir(out, PASSES_COMMAND, force=force, kind=PASSES_KIND) as tmp:
            table.to_parquet(tmp / "passes.parquet", index=False)
            summary.to_csv(tmp / "passes_summary.csv", index=False)
            summary.to_parquet(tmp / "passes_summary.parquet", index=False)
            write_json(
                tmp / "passes.json",
                provenance(
                    runs=[str(r) for r in runs],
                    checkpoint_sha256=[checkpoint_hash(f) for _, _, f in trained],
                    train_config=[c.to_dict() for _, c, _ in trained],
                    verdicts=[v.__dict__ for v in verdicts],
                ),
            )
            save_figure(fig3_lm(summary), tmp, "fig3-lm", False)
            save_figure(fig4_lm(summary), tmp, "fig4-lm", False)
    for v in verdicts:
        typer.echo(f"[{v.rule}] {v.sentence}")
    typer.echo(f"wrote {out}/passes.parquet, passes_summary.csv, fig3-lm.png, fig4-lm.png")
