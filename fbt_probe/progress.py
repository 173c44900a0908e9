"""The rich progress bar of the long commands (`train`, `extract`): a label, the bar, the command's
own columns, then elapsed time and ETA. Light to import (rich only): no torch here."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def bar(label: str, total: float, completed: float = 0, *columns, console=None, **fields):
    """A started `Progress` with one task: `label`, the bar, `columns`, elapsed time, ETA. Returns
    (progress, task id); the caller updates the task and stops the progress. `console`: where it
    is drawn (rich's default, stdout, if None); `fields`: the task's fields the columns read."""
    prog = Progress(
        TextColumn(label),
        BarColumn(),
        *columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    prog.start()
    return prog, prog.add_task(label, total=total, completed=completed, **fields)
