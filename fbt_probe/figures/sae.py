"""The feature-swap curve, drawn from `fractions.parquet` (`fbt-probe sae analyze`): the share of the
full-state swap's effect that the top-k label latents carry, against k, with the random-latent
control at the same k; one panel per task; bars are normal group-bootstrap 95 % intervals. From a
grid's `sparsity.parquet` (a `sae` column: one SAE per id) it draws one line per SAE, the label
latents solid and each SAE's random control dashed in its colour."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.methods import rotation_null
from fbt_probe.figures.style import legend_handles, paper_style, subplots

NEED = {"task", "condition", "k", "fraction", "ci_low", "ci_high"}
LINES = (("features", "top-k label latents", "C0", "o"), ("random", "k random active latents", "0.55", "s"))


def sae_swap(table: pd.DataFrame, model_label: str = ""):
    missing = NEED - set(table.columns)
    if missing:
        raise FbtError(f"sae-swap: not an SAE fractions table (missing columns {sorted(missing)})")
    tasks = sorted(table["task"].unique())
    if not tasks:
        raise FbtError("sae-swap: the table has no rows")
    if "sae" in table.columns:
        return sae_swap_grid(table, tasks, model_label)
    with paper_style():
        fig, axes = subplots(1, len(tasks), panel_height_in=2.2, sharey=True)
        for j, task in enumerate(tasks):
            ax = axes[0, j]
            t = table[table["task"] == task]
            for cond, label, colour, marker in LINES:
                s = t[t["condition"] == cond].sort_values("k")
                if s.empty:
                    continue
                err = [s["fraction"] - s["ci_low"], s["ci_high"] - s["fraction"]]
                ax.errorbar(s["k"], s["fraction"], yerr=err, color=colour, marker=marker, capsize=2, label=label)
            full = t[t["condition"] == "all"]
            if len(full):
                ax.axhline(
                    float(full["fraction"].iloc[0]), color="C3", ls="--", lw=1, label="every latent (error kept)"
                )
            ax.axhline(1.0, color="black", lw=0.6)
            ax.set_xscale("log", base=2)
            ax.set_title(task)
            ax.set_xlabel("k latents swapped")
            if j == 0:
                ax.set_ylabel("share of the full-state swap")
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=3)
        fig.suptitle(f"Feature swap on the carried state{' — ' + model_label if model_label else ''}")
    return fig


def sae_swap_grid(table: pd.DataFrame, tasks: list, model_label: str = ""):
    """One panel per task, one colour per SAE (the first drawn thickest): the top-k label latents'
    share (solid, filled) and k random active latents' (dashed, open), with their intervals, each SAE
    nudged along k so that the bars do not cover one another; a dotted line at the most latents a pair
    can have active."""
    table = table[table["condition"].isin(["features", "random"])]  # not `all` (every latent, k = d_sae)
    saes = list(dict.fromkeys(table["sae"]))
    bounds: set = set()
    nudge = {s: 2 ** (0.06 * (i - (len(saes) - 1) / 2)) for i, s in enumerate(saes)}
    with paper_style():
        fig, axes = subplots(1, len(tasks), panel_height_in=2.4, sharey=True)
        for j, task in enumerate(tasks):
            ax = axes[0, j]
            t = table[table["task"] == task]
            for i, sae in enumerate(saes):
                colour = f"C{i % 10}"
                for cond, ls, face in (("features", "-", colour), ("random", "--", "white")):
                    s = t[(t["sae"] == sae) & (t["condition"] == cond)].sort_values("k")
                    if s.empty:
                        continue
                    err = [(s["fraction"] - s["ci_low"]).clip(lower=0), (s["ci_high"] - s["fraction"]).clip(lower=0)]
                    ax.errorbar(
                        s["k"] * nudge[sae],
                        s["fraction"],
                        yerr=err,
                        color=colour,
                        ls=ls,
                        lw=1.6 if i == 0 else 0.9,
                        marker="o" if cond == "features" else "s",
                        ms=3.5 if i == 0 else 2.5,
                        mfc=face,
                        capsize=1.5,
                        elinewidth=0.6,
                        label=sae if cond == "features" else None,
                    )
            bound = sorted(set(t["max_active"].dropna().astype(int))) if "max_active" in t else []
            bounds.update(bound)
            for m in bound:
                ax.axvline(m, color="0.4", ls=":", lw=0.8)
            ax.axhline(1.0, color="black", lw=0.6)
            ax.axhline(0.8, color="0.6", lw=0.5, ls="-.")
            ax.set_xscale("log", base=2)
            ks = sorted(t["k"].unique())
            ax.set_xticks(ks, [str(int(k)) for k in ks])
            ax.set_title(task)
            ax.set_xlabel("k latents swapped")
            if j == 0:
                ax.set_ylabel("share of the full-state swap")
        from matplotlib.lines import Line2D

        handles, labels = axes[0, 0].get_legend_handles_labels()
        handles += [
            Line2D([], [], color="0.2", ls="-", marker="o", ms=3, label="top-k label latents"),
            Line2D([], [], color="0.2", ls="--", marker="s", mfc="white", ms=3, label="k random active latents"),
            Line2D([], [], color="0.6", ls="-.", lw=0.5, label="0.8: the claim's threshold"),
        ]
        if bounds:
            most = ", ".join(str(m) for m in sorted(bounds))
            handles.append(
                Line2D([], [], color="0.4", ls=":", lw=0.8, label=f"at most {most} latents active in a pair")
            )
        fig.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncol=4)
        fig.suptitle(
            f"Feature swap on the carried state over {len(saes)} SAEs{' — ' + model_label if model_label else ''}"
        )
    return fig


ACT_NEED = {"task", "rank", "latent", "label", "activation"}


def sae_features(table: pd.DataFrame, model_label: str = "", bins: int = 20):
    """The feature browser's histograms: each task's top label latents (columns by rank), the latent's
    activation at every sample's final position, one histogram per label (`activations.parquet`)."""
    missing = ACT_NEED - set(table.columns)
    if missing:
        raise FbtError(f"sae-features: not an SAE activations table (missing columns {sorted(missing)})")
    tasks = sorted(table["task"].unique())
    if not tasks:
        raise FbtError("sae-features: the table has no rows")
    ranks = sorted(int(r) for r in table["rank"].unique())
    with paper_style():
        fig, axes = subplots(len(tasks), len(ranks), panel_height_in=1.5)
        for i, task in enumerate(tasks):
            for j, rank in enumerate(ranks):
                ax = axes[i, j]
                t = table[(table["task"] == task) & (table["rank"] == rank)]
                if t.empty:
                    ax.set_axis_off()
                    continue
                a = t["activation"].to_numpy(float)
                edges = np.linspace(0.0, max(float(a.max()), 1e-6), bins + 1)
                for lab, colour in ((0, "C0"), (1, "C1")):
                    v = t.loc[t["label"] == lab, "activation"].to_numpy(float)
                    if len(v):
                        ax.hist(v, bins=edges, color=colour, alpha=0.6, label=f"label {lab}")
                ax.set_title(f"{task}: latent {int(t['latent'].iloc[0])} (#{rank})", fontsize=7)
                if j == 0:
                    ax.set_ylabel("samples")
        for ax in axes[-1]:  # the x label on the bottom row, the legend below it
            ax.set_xlabel("activation at the final position", fontsize=7)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=2)
        fig.suptitle(f"Top label latents of the carried state{' — ' + model_label if model_label else ''}")
    return fig


DAS_NEED = {"task", "method", "subspace_dim", "metric", "mean", "ci_low", "ci_high"}


def sae_vs_das(
    table: pd.DataFrame,
    das: pd.DataFrame | None = None,
    probe: pd.DataFrame | None = None,
    hook: str = "fusion.hook_feedback",
    model_label: str = "",
):
    """One question three ways, one column per task: (top) the share of the full-state swap's effect
    that the top-k SAE label latents carry (`fractions.parquet`, random latents beside it); (bottom)
    DAS's held-out interchange accuracy in a learned k-dimensional subspace of the same hook (a DAS
    `summary.parquet`: random rotation and the full-vector swap beside it) and the depth-0 probe's
    accuracy under recurrent:1 (`probe`: task, accuracy). k is latents on top, dimensions below."""
    missing = NEED - set(table.columns)
    if missing:
        raise FbtError(f"sae-vs-das: not an SAE fractions table (missing columns {sorted(missing)})")
    if das is not None and DAS_NEED - set(das.columns):
        raise FbtError(f"sae-vs-das: das is not a DAS summary (missing columns {sorted(DAS_NEED - set(das.columns))})")
    tasks = sorted(table["task"].unique())
    if not tasks:
        raise FbtError("sae-vs-das: the table has no rows")
    if das is not None:
        das = das[(das["metric"] == "iia") & (das["length_knob"] == -1)]
        if "condition" in das:
            das = das[das["condition"] == hook]
        if "mode" in das:
            das = das[das["mode"] == "recurrent:1"]
    with paper_style():
        fig, axes = subplots(2, len(tasks), panel_height_in=2.0, sharex="col")
        for j, task in enumerate(tasks):
            top, bottom = axes[0, j], axes[1, j]
            _fraction_panel(top, table[table["task"] == task])
            top.set_title(task)
            top.set_xlabel("k latents", fontsize=7)
            top.tick_params(labelbottom=True)
            if j == 0:
                top.set_ylabel("feature swap:\nshare of full-state swap")
                bottom.set_ylabel(f"DAS on {hook.split('.')[-1]}:\nheld-out IIA")
            d = das[das["task"] == task] if das is not None else None
            _das_panel(bottom, d, None if probe is None else probe[probe["task"] == task])
        handles = legend_handles(axes)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=4)
        fig.suptitle(
            f"How much of what the model uses lies in k features / k dimensions{' — ' + model_label if model_label else ''}"
        )
    return fig


def _fraction_panel(ax, t) -> None:
    """One task's share of the full-state swap per k: top-k label latents, random latents, every latent."""
    for cond, label, colour, marker in LINES:
        s = t[t["condition"] == cond].sort_values("k")
        if len(s):
            err = [s["fraction"] - s["ci_low"], s["ci_high"] - s["fraction"]]
            ax.errorbar(s["k"], s["fraction"], yerr=err, color=colour, marker=marker, capsize=2, label=label)
    full = t[t["condition"] == "all"]
    if len(full):
        ax.axhline(float(full["fraction"].iloc[0]), color="C3", ls="--", lw=1, label="every latent (error kept)")
    ax.axhline(1.0, color="black", lw=0.6)
    shown = t[t["condition"].isin(["features", "random"])]
    lo = min([float(shown["ci_low"].min())] + [float(v) for v in full["fraction"]])
    hi = max([float(shown["ci_high"].max())] + [float(v) for v in full["fraction"]])
    ax.set_ylim(min(-0.05, lo - 0.05), max(1.1, hi + 0.05))


def _das_panel(ax, d, p) -> None:
    """One task's DAS IIA per k (random rotation and the full-vector swap beside it, "DAS not run"
    without `d`), the depth-0 probe's accuracy `p` and the random-rotation null."""
    if d is not None and len(d):
        for method, label, colour, marker in (
            ("das", "DAS k-dim subspace", "C2", "o"),
            ("random-rotation", "random k-dim subspace", "0.55", "s"),
        ):
            s = d[d["method"] == method].sort_values("subspace_dim")
            if len(s):
                err = [(s["mean"] - s["ci_low"]).clip(lower=0), (s["ci_high"] - s["mean"]).clip(lower=0)]
                ax.errorbar(s["subspace_dim"], s["mean"], yerr=err, color=colour, marker=marker, capsize=2, label=label)
        full = d[d["method"] == "full-interchange"]
        if len(full):
            ax.axhline(float(full["mean"].iloc[0]), color="C1", ls="--", lw=1, label="DAS: full-vector swap")
    else:
        ax.text(0.5, 0.5, "DAS not run", ha="center", va="center", transform=ax.transAxes)
    if p is not None and len(p):
        ax.axhline(float(p["accuracy"].iloc[0]), color="C4", ls=":", lw=1.2, label="depth-0 probe accuracy")
    null = rotation_null(d) if d is not None and len(d) else None
    if null is not None:
        ax.axhline(null, color="0.35", lw=0.8, ls="--", label="random-rotation null (mean over k)")
    ax.set_ylim(0, 1.05)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k dimensions", fontsize=7)
