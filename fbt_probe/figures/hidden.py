"""Hidden Decoding figure: where the label becomes decodable along (stream, depth), next to the
feedback model's depth curve for the same task.

Reads the probe table of `fbt_probe.hidden.extract_streams` + `probe_sweep`, whose `depth` column is
stream-major, depth = (k-1)(L+1) + d; the layer depth d is recovered from the `hook` column
(blocks.0.hook_resid_pre -> 0, blocks.{l}.hook_resid_post -> l+1) and L is the largest d present.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.style import paper_style, subplots

FEEDBACK_STYLES = {"standard": ("black", "-"), "recurrent:1": ("tab:red", "--"), "full": ("tab:purple", ":")}


def _layer_depth(hook: str) -> int:
    if hook == "blocks.0.hook_resid_pre":
        return 0
    m = re.fullmatch(r"blocks\.(\d+)\.hook_resid_post", str(hook))
    if m is None:
        raise FbtError(f"hidden figure: hook '{hook}' is not a probe depth (resid_pre of block 0 or a resid_post)")
    return int(m.group(1)) + 1


def _select(table: pd.DataFrame, model: str | None, what: str) -> pd.DataFrame:
    need = {"task", "mode", "length", "depth", "hook", "fold", "metric", "value"}
    if not need <= set(table.columns):
        raise FbtError(f"{what}: not a probe table (missing columns {sorted(need - set(table.columns))})")
    if "model" in table.columns:
        models = sorted(table["model"].astype(str).unique())
        if model is not None:
            table = table[table["model"].astype(str) == model]
        elif len(models) > 1:
            raise FbtError(f"{what}: holds several models ({', '.join(models)}); choose one with model=NAME")
    return table[(table["depth"] >= 0) & (table["metric"] == "accuracy")]


def stream_curves(table: pd.DataFrame, model: str | None = None, length: int | None = None) -> pd.DataFrame:
    """Mean and min/max accuracy (over folds, and over lengths unless `length`) per task, stream, layer depth."""
    t = _select(table, model, "hidden figure").copy()
    if length is not None:  # from the command line it arrives as text
        length = int(length)
        t = t[t["length"] == length]
    if t.empty:
        raise FbtError("hidden figure: no accuracy rows to draw")
    t["layer_depth"] = t["hook"].map(_layer_depth)
    per_stream = int(t["layer_depth"].max()) + 1
    t["stream"] = (t["depth"] - t["layer_depth"]) // per_stream + 1
    return t.groupby(["task", "stream", "layer_depth"])["value"].agg(["mean", "min", "max"]).reset_index()


def _feedback_curves(feedback: pd.DataFrame, task: str, length: int | None) -> pd.DataFrame:
    t = _select(feedback, None, "hidden figure (feedback table)")
    t = t[t["task"] == task]
    if length is not None:
        t = t[t["length"] == int(length)]
    return t.groupby(["mode", "depth"])["value"].mean().reset_index()


def hidden_streams(
    table: pd.DataFrame,
    feedback: pd.DataFrame | None = None,
    tasks: str | None = None,
    length: int | None = None,
    feedback_modes: str = "standard,recurrent:1",
    model: str | None = None,
):
    """Rows = tasks. Left: probe accuracy vs depth, one line per stream of the final token (band: fold
    min-max), with the feedback model's depth curves (`feedback`: its probe table) for the same task.
    Right: the same accuracies as a stream x depth map."""
    curves = stream_curves(table, model, length)
    task_list = tasks.split(",") if tasks else sorted(curves["task"].unique())
    missing = [t for t in task_list if t not in set(curves["task"])]
    if missing:
        raise FbtError(f"hidden figure: the table has no rows for task(s) {missing}")
    n = int(curves["stream"].max())
    depths = sorted(curves["layer_depth"].unique())
    import matplotlib

    colors = [matplotlib.colormaps["viridis"](x) for x in np.linspace(0.0, 0.85, n)]
    with paper_style():
        fig, axes = subplots(len(task_list), 2, panel_height_in=2.2, width_in=7.0)
        for i, task in enumerate(task_list):
            c = curves[curves["task"] == task]
            ax = axes[i, 0]
            for k in range(1, n + 1):
                ck = c[c["stream"] == k].sort_values("layer_depth")
                label = f"stream {k}" + (" (predicts)" if k == n else "")
                ax.plot(ck["layer_depth"], ck["mean"], marker="o", color=colors[k - 1], label=label)
                ax.fill_between(ck["layer_depth"], ck["min"], ck["max"], color=colors[k - 1], alpha=0.12, lw=0)
            if feedback is not None:
                fb = _feedback_curves(feedback, task, length)
                for mode in feedback_modes.split(","):
                    cm = fb[fb["mode"] == mode]
                    if not cm.empty:
                        color, ls = FEEDBACK_STYLES.get(mode, ("0.3", "-."))
                        ax.plot(
                            cm["depth"],
                            cm["value"],
                            color=color,
                            ls=ls,
                            marker="s",
                            lw=1.1,
                            label=f"feedback model, {mode}",
                        )
            ax.axhline(0.5, color="0.5", lw=0.8, ls=":", label="chance (0.5)")
            ax.set_ylim(-0.02, 1.04)
            ax.set_xticks(depths)
            ax.set_title(f"{task.capitalize()}: final token's streams vs feedback model")
            ax.set_ylabel("Held-out probe accuracy")
            ax.set_xlabel("Depth (0 = input, L = top layer)")
            _heatmap(axes[i, 1], c, n, depths, task)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), frameon=False)
        fig.suptitle(
            "Hidden Decoding: where the label becomes decodable along (stream, depth)"
            + ("" if length is None else f", length {length}")
        )
    return fig


def _heatmap(ax, c: pd.DataFrame, n: int, depths, task: str) -> None:
    grid = np.full((n, len(depths)), np.nan)
    for r in c.itertuples():
        grid[int(r.stream) - 1, depths.index(r.layer_depth)] = r.mean
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", origin="lower")
    for (k, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, k, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.6 else "black")
    ax.set_xticks(range(len(depths)), [str(d) for d in depths])
    ax.set_yticks(range(n), [str(k) for k in range(1, n + 1)])
    ax.set_xlabel("Depth")
    ax.set_ylabel("Stream k")
    ax.grid(False)
    ax.set_title(f"{task.capitalize()}: accuracy by stream x depth")
    ax.figure.colorbar(im, ax=ax, shrink=0.8)
