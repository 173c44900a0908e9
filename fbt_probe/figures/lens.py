"""The lens figure, drawn from `lens_summary.parquet` (`fbt-probe lens`): probability of the correct
label word at the final position against depth, one line per prefill mode and per Jacobi pass; one
panel per task × lens (logit lens, tuned lens)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.style import model_words, paper_style, subplots, titled

NEED = {"task", "length_knob", "mode", "pass_index", "lens", "depth", "metric", "mean", "ci_low", "ci_high"}
LENS_WORDS = {"logit": "logit lens", "tuned": "tuned lens"}
MARKERS = ("o", "s", "D", "^", "v", "P", "X")
DODGE = 0.05  # depth units between neighbouring lines


def _line_key(mode: str) -> tuple:
    return (mode != "standard", mode.startswith("jacobi"), mode)


def lens_depth(table: pd.DataFrame, metric: str = "p_correct", length: int = -1, model_label: str | None = None):
    """`metric` (default p_correct) vs depth; colour = mode, Jacobi passes in lighter shades of one colour.
    The title names the model (`model_label`, else the checkpoint folder of the table's `model`)."""
    missing = NEED - set(table.columns)
    if missing:
        raise FbtError(f"lens: not a lens summary table (missing columns {sorted(missing)})")
    t = table[(table["metric"] == metric) & (table["length_knob"] == int(length))]
    if t.empty:
        raise FbtError(f"lens: no rows for metric '{metric}' at length {length}")
    tasks = sorted(t["task"].unique())
    kinds = [k for k in ("logit", "tuned") if k in set(t["lens"])]
    modes = sorted(t["mode"].unique(), key=_line_key)
    with paper_style():
        fig, axes = subplots(len(tasks), len(kinds), panel_height_in=2.3, sharey=True)
        for i, task in enumerate(tasks):
            for j, kind in enumerate(kinds):
                ax = axes[i, j]
                sub = t[(t.task == task) & (t.lens == kind)]
                lines = [
                    (c, mode, n, k, len(passes))
                    for c, mode in enumerate(modes)
                    for passes in [sorted(sub.loc[sub["mode"] == mode, "pass_index"].unique())]
                    for n, k in enumerate(passes)
                ]
                for j, (c, mode, n, k, n_passes) in enumerate(lines):
                    r = sub[(sub["mode"] == mode) & (sub.pass_index == k)].sort_values("depth")
                    x = r["depth"] + DODGE * (
                        j - (len(lines) - 1) / 2
                    )  # coincident lines (e.g. jacobi pass 1 = standard) stay visible
                    alpha = 1.0 if n_passes == 1 else 0.35 + 0.65 * (n + 1) / n_passes
                    label = mode if n_passes == 1 else f"{mode} pass {k}"
                    ls = "-" if n == n_passes - 1 else "--"
                    ax.plot(
                        x, r["mean"], marker=MARKERS[j % len(MARKERS)], color=f"C{c}", alpha=alpha, ls=ls, label=label
                    )
                    ax.fill_between(x, r["ci_low"], r["ci_high"], color=f"C{c}", alpha=0.1 * alpha, lw=0)
                depths = np.sort(sub["depth"].unique())
                ax.set_xticks(depths)
                ax.set_xlabel("depth (0 = model input)")
                ax.set_title(f"{task} · {LENS_WORDS.get(kind, kind)}")
                if metric in ("p_correct", "top1"):
                    ax.set_ylim(-0.02, 1.02)
            axes[i, 0].set_ylabel("P(correct label word)" if metric == "p_correct" else metric)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
        where = "pooled over lengths" if int(length) == -1 else f"length {length}"
        fig.suptitle(
            titled(
                f"what each depth predicts at the final position (held-out pairs, {where}; 95 % CIs with groups as the unit)",
                model_words(table, model_label),
            )
        )
    return fig
