"""Probe figures drawn from the tidy probe table (`fbt_probe.probes.write_results`).

fig7a: held-out accuracy vs depth, panels task x {standard, recurrent:1}, one colour per length.
fig7b: the register sweeps (count m = 1/2/4/8, writes 2/4/8 at m = 8), one line per prefill mode,
the spread over folds (min-max). Both show the 0.5 chance line and the majority baseline on the same splits;
fig7a shades the fold spread (min-max over folds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.style import model_words, paper_style, subplots, titled

REFERENCE_MODE = "carried-state"
MODE_ORDER = ("standard", "recurrent:1", "recurrent:2", "recurrent:4", "full")
MODE_WORDS = {
    "standard": "standard prefill",
    "recurrent:1": "one-step recurrent prefill (recurrent:1)",
    "full": "full recurrence",
    REFERENCE_MODE: "carried state h(T-1)",
}
LENGTH_WORDS = {"registers": "Writes per register", "registers-count": "Registers"}


def _task_words(task: str) -> str:
    return task.replace("_", " ").capitalize()


def _one_model(table: pd.DataFrame, model: str | None, what: str) -> pd.DataFrame:
    need = {"task", "mode", "length", "depth", "fold", "metric", "value"}
    if not need <= set(table.columns):
        raise FbtError(f"{what}: not a probe table (missing columns {sorted(need - set(table.columns))})")
    if "model" in table.columns:
        models = sorted(table["model"].astype(str).unique())
        if model is not None:
            if model not in models:
                raise FbtError(f"{what}: no rows for model '{model}' (have {', '.join(models)})")
            table = table[table["model"].astype(str) == model]
        elif len(models) > 1:
            raise FbtError(f"{what}: holds several models ({', '.join(models)}); choose one with model=NAME")
    return table[table["depth"] >= 0]


def _curves(table: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Mean and min/max over folds per (length, depth)."""
    t = table[table["metric"] == metric]
    return (
        t.groupby(["length", "depth"])["value"]
        .agg(["mean", "min", "max"])
        .reset_index()
        .sort_values(["length", "depth"])
    )


def _mean(table: pd.DataFrame, metric: str) -> float | None:
    v = table.loc[table["metric"] == metric, "value"]
    return float(v.mean()) if len(v) else None


MAJORITY_STYLE = dict(color="tab:orange", lw=1.4, ls=(0, (1, 1.2)), zorder=1.5)
"""The majority baseline: dense orange dots, drawn over the chance line (for a balanced task the two
coincide at 0.5) and visible as a legend entry."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", (0, (3, 1, 1, 1, 1, 1)), ":", (0, (5, 1)), (0, (1, 1)))
DODGE = 0.08
"""Depth units between neighbouring lines of one panel: lines at the same accuracy (every mode at 1.0)
sit side by side instead of on top of each other."""


def _dodge(i: int, n: int) -> float:
    return DODGE * (i - (n - 1) / 2)


def _decorate(ax, depths, majority: float | None) -> None:
    ax.axhline(0.5, color="black", lw=0.8, ls="--", label="chance (0.5)", zorder=1)
    if majority is not None:
        ax.axhline(majority, label=f"majority baseline, same splits ({majority:.2f})", **MAJORITY_STYLE)
    ax.set_ylim(-0.02, 1.04)
    ax.set_xticks(sorted(depths))
    ax.set_xlim(min(depths) - 0.3, max(depths) + 0.3)


def _band(ax, c: pd.DataFrame, color, label: str, offset: float = 0.0, **kw) -> None:
    x = c["depth"] + offset
    ax.plot(x, c["mean"], color=color, label=label, zorder=3, **{"marker": "o", **kw})
    ax.fill_between(x, c["min"], c["max"], color=color, alpha=0.15, lw=0)


def _legend(fig, axes, skip=()) -> None:
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab in skip:
                continue
            key = lab.split(" (")[0] if lab.startswith("majority") else lab
            handles.setdefault(key, h)
            labels.setdefault(key, lab if not lab.startswith("majority") else "majority baseline, same splits")
    # three columns: four of fig7a's longest labels are wider than the page and were cut off
    fig.legend(
        list(handles.values()),
        list(labels.values()),
        loc="outside lower center",
        ncol=min(len(handles), 3),
        frameon=False,
        handlelength=3.2,  # long enough to show each line's dash pattern
    )


def fig7a(
    table: pd.DataFrame,
    tasks: str | None = None,
    modes: str = "standard,recurrent:1",
    baseline: pd.DataFrame | None = None,
    model: str | None = None,
    model_label: str | None = None,
):
    """Probe accuracy vs depth; rows = tasks (default: completion, memory), columns = modes.

    The title names the model shown: `model_label` (e.g. "feedback model", "no-feedback baseline"),
    else the checkpoint folder in the table's `model` column, since the feedback model's and the
    baseline's figures are otherwise alike.

    `baseline`: a probe table of the no-feedback baseline model; its `recurrent:1` curve (mean over
    lengths) is drawn dashed in the recurrent:1 panels. The carried-state reference (the state that
    recurrent:1 feeds into depth 0) is drawn as a horizontal line in those panels.
    """
    table = _one_model(table, model, "fig7a")
    shown = model_words(table, model_label)
    present = list(dict.fromkeys(table["task"]))
    task_list = (
        tasks.split(",")
        if tasks
        else [t for t in ("completion", "memory") if t in present]
        or [t for t in present if not t.startswith("registers")]
    )
    mode_list = modes.split(",")
    if not task_list or not (table["task"].isin(task_list) & table["mode"].isin(mode_list)).any():
        raise FbtError(f"fig7a: the table has no rows for tasks {task_list or '(none)'} under modes {mode_list}")
    if baseline is not None:
        baseline = _one_model(baseline, None, "fig7a baseline")
    lengths = sorted(table.loc[table["task"].isin(task_list), "length"].unique())
    colors = dict(zip(lengths, _viridis(len(lengths))))
    with paper_style():
        fig, axes = subplots(len(task_list), len(mode_list), panel_height_in=2.1, sharey=True)
        for i, task in enumerate(task_list):
            tt = table[table["task"] == task]
            majority = _mean(tt[tt["mode"].isin(mode_list)], "majority_baseline")
            for j, mode in enumerate(mode_list):
                ax = axes[i, j]
                cell = tt[tt["mode"] == mode]
                curves = _curves(cell)
                for length, c in curves.groupby("length"):
                    k = lengths.index(length)
                    _band(ax, c, colors[length], f"{int(length)}", _dodge(k, len(lengths)), **_length_style(k))
                if mode == "recurrent:1":
                    ref = _mean(tt[tt["mode"] == REFERENCE_MODE], "accuracy")
                    if ref is not None:  # behind the length lines, which often sit at the same accuracy
                        ax.axhline(
                            ref, color="tab:red", lw=2.4, alpha=0.35, zorder=1, label="probe on carried state h(T-1)"
                        )
                    if baseline is not None:
                        b = _curves(baseline[(baseline["task"] == task) & (baseline["mode"] == mode)])
                        b = b.groupby("depth")["mean"].mean().reset_index()
                        ax.plot(
                            b["depth"],
                            b["mean"],
                            color="black",
                            ls="--",
                            marker="s",
                            lw=1.1,
                            label="no-feedback baseline (mean over lengths)",
                        )
                depths = sorted(table.loc[table["task"].isin(task_list), "depth"].unique())
                _decorate(ax, depths, majority)
                ax.set_title(f"{_task_words(task)}: {MODE_WORDS.get(mode, mode)}")
                if curves.empty:
                    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="0.5")
                if i == len(task_list) - 1:
                    ax.set_xlabel("Depth (0 = model input, L = top layer)")
                if j == 0:
                    ax.set_ylabel("Held-out probe accuracy")
        _length_legend(fig, colors, LENGTH_WORDS.get(task_list[0], "Distractor lines"))
        _legend(fig, axes, skip={f"{int(k)}" for k in lengths})
        fig.suptitle(titled("Where the label becomes linearly readable, by depth and prefill mode", shown))
    return fig


def _length_style(k: int) -> dict:
    return {"marker": MARKERS[k % len(MARKERS)], "ls": LINESTYLES[k % len(LINESTYLES)]}


def _length_legend(fig, colors: dict, title: str) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=c, label=str(int(k)), **_length_style(i)) for i, (k, c) in enumerate(colors.items())
    ]
    fig.legend(handles=handles, title=title, loc="outside right center", frameon=False)


def _viridis(n: int):
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.0, 0.85, max(n, 1))][:n]


def fold_spread(table: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Mean over folds and the spread (min, max) over folds per (length, depth): `mean`, `low`,
    `high`. Grouped folds are few and share the probe's training data, so they are not independent
    draws: the band shows their spread, not an interval (the report's intervals: `fbt_probe.stats`)."""
    t = table[table["metric"] == metric]
    g = t.groupby(["length", "depth"])["value"].agg(["mean", "min", "max"]).reset_index()
    g = g.rename(columns={"min": "low", "max": "high"})
    return g.sort_values(["length", "depth"])


SWEEPS = {
    "registers-count": ("registers", "register count m (16 assignments)"),
    "registers": ("writes per register", "writes per register (m = 8)"),
}


def _sweep_title(task: str, length: int) -> str:
    """The panel's task and its point of the sweep: the two sweeps meet at m = 8 with 2 writes each,
    drawn once per task (different data sets), so the task name tells the two panels apart."""
    if task == "registers-count":
        return f"{task}\nm = {length}, {16 // length} writes each"
    return f"{task}\nm = 8, {length} writes each"


def fig7b(
    table: pd.DataFrame,
    tasks: str = "registers-count,registers",
    modes: str | None = None,
    model: str | None = None,
    model_label: str | None = None,
):
    """The register sweeps as the paper draws Fig. 7b: one panel per register count (task
    `registers-count`, first row) and per writes-per-register at m = 8 (task `registers`, second
    row); one line per prefill mode (default: standard, recurrent:1/2/4, full, then any other mode in
    the table) with its spread over folds (min-max band); chance and majority-baseline lines."""
    table = _one_model(table, model, "fig7b")
    shown = model_words(table, model_label)  # the title names the model, as in fig7a
    task_list = [t for t in tasks.split(",") if (table["task"] == t).any()]
    if not task_list:
        raise FbtError(
            f"fig7b: the table has no rows for task(s) {tasks} (has {', '.join(sorted(table['task'].unique()))})"
        )
    tt = table[table["task"].isin(task_list)]
    present = [m for m in dict.fromkeys(tt["mode"]) if m != REFERENCE_MODE]
    mode_list = (
        modes.split(",")
        if modes
        else [m for m in MODE_ORDER if m in present] + [m for m in present if m not in MODE_ORDER]
    )
    rows = {t: sorted(tt.loc[tt["task"] == t, "length"].unique()) for t in task_list}
    depths = sorted(tt["depth"].unique())
    palette = dict(zip(mode_list, ["#222222", "#1f77b4", "#17becf", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]))
    with paper_style():
        fig, axes = subplots(len(task_list), max(map(len, rows.values())), panel_height_in=2.0, sharey=True)
        for i, task in enumerate(task_list):
            cell = tt[tt["task"] == task]
            majority = _mean(cell, "majority_baseline")
            for j in range(axes.shape[1]):
                ax = axes[i, j]
                if j >= len(rows[task]):
                    ax.set_visible(False)
                    continue
                length = rows[task][j]
                for k, mode in enumerate(mode_list):
                    c = fold_spread(cell[(cell["mode"] == mode) & (cell["length"] == length)])
                    if not c.empty:  # a marker, a dash pattern and a small offset each: coincident modes stay visible
                        x = c["depth"] + _dodge(k, len(mode_list))
                        ax.plot(x, c["mean"], color=palette.get(mode), label=mode, zorder=3, ms=3, **_length_style(k))
                        ax.fill_between(x, c["low"], c["high"], color=palette.get(mode), alpha=0.15, lw=0)
                _decorate(ax, depths, majority)
                ax.set_title(_sweep_title(task, int(length)))
                if i == len(task_list) - 1 or j >= len(rows.get(task_list[-1], [])):
                    ax.set_xlabel("Depth (0 = model input)")
                if j == 0:
                    ax.set_ylabel(f"{SWEEPS.get(task, (task,))[0].capitalize()} sweep\nheld-out probe accuracy")
        _legend(fig, axes)
        fig.suptitle(
            titled(
                "Multi-register latest-write tracking: probe accuracy by depth per prefill mode "
                "(bands: min-max over folds)"
                if not shown
                else "Multi-register latest-write tracking by depth per prefill mode (bands: min-max over folds)",
                shown,
            )
        )
    return fig
