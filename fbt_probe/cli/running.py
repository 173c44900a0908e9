"""`fbt-probe diagnose running`: a compose run's running state, read at every step by a probe and by
the logit lens."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from fbt_probe.cli.tables import table_paths, write_table
from fbt_probe.errors import FbtError
from fbt_probe.lens.running import running_lens
from fbt_probe.marker import refuse_named, writing
from fbt_probe.modes import parse_modes
from fbt_probe.probes.running import activations_by_mode, running_state
from fbt_probe.reference import is_reference
from fbt_probe.tasks import load_spec, load_tokenizer
from fbt_probe.tasks.spec import MAX_GROUPS
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.evaluate import eval_samples

RUNNING_COMMAND = "diagnose running"


def _ints(text: str | None, option: str, low: int) -> list[int] | None:
    """A comma-separated list of integers >= low, or None where the option is not given."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < low or len(set(values)) < len(values):
        raise FbtError(f"{option} {text}: expected distinct comma-separated integers >= {low}")
    return sorted(values)


def running_cmd(
    run: Annotated[Path, typer.Argument(help="A run trained on chain-s3 or chain-a5, or a shipped ref:<name>.")],
    out: Annotated[Path | None, typer.Option(help="Output folder (default RUN/eval).")] = None,
    modes: Annotated[str, typer.Option("--modes", "--mode", help="Comma-separated prefill modes.")] = "standard,full",
    pairs: Annotated[int, typer.Option(help="Held-out minimal pairs per length (one per word).")] = 64,
    folds: Annotated[int, typer.Option(help="Grouped folds (a group is the word).")] = 4,
    lengths: Annotated[
        str | None, typer.Option(help="Comma-separated k (default: the task's training lengths).")
    ] = None,
    depths: Annotated[
        str | None, typer.Option(help="Comma-separated probe depths 0..L (default: every depth).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace this command's earlier table.")] = False,
) -> None:
    """The point after every step of a one-token-a-step compose task (chain-s3, chain-a5), read at
    that step's token by a linear probe per depth under each mode, on words held out of training:
    accuracy with its Wilson interval at n = words, beside chance; and the logit lens at the same
    cells: whether the answer word the lens prefers is the answer after that step (docs/probes.md).

    \b
    Example: fbt-probe diagnose running runs/chain-s3 --modes standard,full
    """

    parsed = parse_modes(modes)  # a bad mode is refused before the model is read
    if isinstance(pairs, bool) or not 4 <= pairs <= MAX_GROUPS:
        raise FbtError(f"--pairs {pairs}: expected an integer 4..{MAX_GROUPS}")
    if not 2 <= folds <= 10:
        raise FbtError(f"--folds {folds}: expected an integer 2..10")
    ks, ds = _ints(lengths, "--lengths", 1), _ints(depths, "--depths", 0)
    if is_reference(str(run)) and out is None:
        raise FbtError(f"diagnose running {run}: a shipped model needs --out (its folder is part of the package)")
    dest = out or run / "eval"
    stem, lens_stem = dest / "running", dest / "running_lens"
    with writing(dest, RUNNING_COMMAND):
        refuse_named(table_paths(stem) + table_paths(lens_stem), force, RUNNING_COMMAND)  # before the model runs
        model, cfg, folder = load_trained(run)
        specs = {t: load_spec(t) for t in cfg.tasks}
        tasks = [t for t, s in specs.items() if s.kind == "compose" and s.inline_steps]
        if not tasks:
            raise FbtError(
                f"{run}: trained on {', '.join(cfg.tasks) or 'a corpus'}: no compose task with one word a step (chain-s3, chain-a5)"
            )
        if ds is not None and max(ds) > model.cfg.n_layers:
            raise FbtError(f"--depths {depths}: expected depths 0..{model.cfg.n_layers} (this model's layers)")
        tok = load_tokenizer(folder / "tokenizer.json")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            knobs = {t: ks for t in tasks} if ks else None
            samples = eval_samples(
                dataclasses.replace(cfg, tasks=tasks), tok, pairs=pairs, knobs=knobs, option="--pairs"
            )
        for w in caught:
            typer.echo(f"note: {w.message}", err=True)
        tables, lenses = [], []
        for t in tasks:  # one forward per task x mode x length: the probes and the lens read the same activations
            sub = samples[samples["task"] == t]
            acts = activations_by_mode(model, sub, specs[t], tok, parsed, ds)
            tables.append(
                running_state(model, sub, specs[t], tok, n_folds=folds, seed=cfg.seed, activations=acts).assign(task=t)
            )
            lenses.append(running_lens(model, sub, specs[t], tok, activations=acts).assign(task=t))
        table, lens = pd.concat(tables, ignore_index=True), pd.concat(lenses, ignore_index=True)
        extra = {"pairs": pairs, "folds": folds, "modes": [str(m) for m in parsed]}
        write_table(table, stem, folder, cfg, force, command=RUNNING_COMMAND, extra=extra)
        write_table(lens, lens_stem, folder, cfg, force, command=RUNNING_COMMAND, extra=extra)
    best = table.loc[table.groupby(["task", "mode", "length_knob", "step"])["accuracy"].idxmax()]
    typer.echo(
        best.pivot_table(index=["task", "length_knob", "step"], columns="mode", values="accuracy").round(3).to_string()
    )
    typer.echo(f"(the best depth's held-out probe accuracy per step; every depth in {stem}.parquet, the logit lens's")
    typer.echo(f"choice of the answer after each step in {lens_stem}.parquet)")
