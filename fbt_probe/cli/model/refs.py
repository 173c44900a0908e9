"""`fbt-probe model refs`: the reference models shipped with the package."""

from __future__ import annotations

import re

import typer

from fbt_probe import reference


def _took(rec: dict) -> str:
    """The card's time measured alone (its first "(N min)"), else the optimizer steps' summed time,
    which is an upper bound when the model trained beside other jobs."""

    m = re.search(r"\(([\d.]+) min\)", rec.get("timing") or "")
    if m:
        return f"{m.group(1)} min to retrain alone (card)"
    return f"{rec['train_seconds'] / 60:.1f} min of optimizer steps (an upper bound: timed beside other jobs)"


def refs() -> None:
    """The reference models shipped with the package (load them as ref:<name> wherever a model is read).

    \b
    Example: fbt-probe model refs
    """

    records = {
        name: reference.record(name) for name in reference.names()
    }  # every record checked before a line is written
    for name, rec in records.items():
        std = [r for r in rec["accuracy"]["rows"] if r["mode"] == "standard"]
        per_task = {}
        for r in std:
            c, n = per_task.get(r["task"], (0, 0))
            per_task[r["task"]] = (c + r["correct"], n + r["n"])
        accs = ", ".join(f"{t} {c / n:.2f}" for t, (c, n) in per_task.items())
        typer.echo(
            f"ref:{name:<16} {rec['arch']}{' baseline' if rec['baseline'] else ''}, seed {rec['seed']}, "
            f"{rec['steps']} steps, {_took(rec)}; held-out standard accuracy: {accs}"
        )
    typer.echo(f"cards: {reference.ROOT}/<name>/card.md")


def register(app: typer.Typer) -> None:
    app.command("refs")(refs)
