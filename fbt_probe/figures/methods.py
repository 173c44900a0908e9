"""Figures of attribution patching and DAS, drawn from an experiment's `summary.parquet`.

atp-heatmap: the AtP map, (pass ×) hook × position of the mean metric; one panel per task × mode ×
             direction; cells that the parity check patched exactly are ringed.
atp-parity:  AtP against exact patching on the checked cells (means over pairs), one panel per task ×
             mode, with the diagonal; Spearman and the worst error in the title.
das-iia:     interchange intervention accuracy against the subspace dimension k, one line per hook
             (DAS solid, random rotation dashed, full-vector interchange dotted), bootstrap CIs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.interventions import _check, _modes, _tasks
from fbt_probe.figures.style import paper_style, subplots


def short_hook(name: str) -> str:
    """blocks.2.hook_resid_mid -> L2 mid; fusion.hook_feedback -> fusion feedback."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return f"L{parts[1]} {parts[-1].replace('hook_resid_', '').replace('hook_', '')}"
    return name.replace(".hook_", " ").replace("hook_", "")


def _hook_rank(name: str) -> tuple:
    """Forward order: fusion hooks, then block 0's resid_pre, then each block's mid and post."""
    fusion = ("feedback", "value", "gate", "out")
    if name.startswith("fusion."):
        return (-1, fusion.index(name.split("hook_")[-1]) if name.split("hook_")[-1] in fusion else 9)
    parts = name.split(".")
    if parts[0] == "blocks":
        sub = {"hook_resid_pre": 0, "hook_attn_out": 1, "hook_resid_mid": 2, "hook_mlp_out": 3, "hook_resid_post": 4}
        return (int(parts[1]), sub.get(parts[-1], 5))
    return (99, 0)


def _atp_rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    t = _check(table, ("attribution",), "attribution figure")
    t = t[t["metric"] == metric]
    if t.empty:
        raise FbtError(f"attribution figure: no rows for metric '{metric}'")
    return t.assign(pass_index=t["pass_index"] if "pass_index" in t else 1)


def atp_heatmap(table: pd.DataFrame, metric: str = "normalized", length: int | None = None,
                direction: str | None = None, mode: str | None = None):
    """AtP map: rows are (pass, hook) in forward order, columns positions. `direction` / `mode`: only
    those panels (with both samples of every pair in the table, noising is 1 - denoising of the partner)."""
    t = _atp_rows(table, metric)
    atp, exact = t[t["method"] == "atp"], t[t["method"] == "exact"]
    dirs = ("denoising", "noising") if direction is None else (direction,)
    modes = _modes(atp) if mode is None else [m.strip() for m in str(mode).split(",")]
    panels = [(task, m, d) for task in _tasks(atp) for m in modes for d in dirs
              if not atp[(atp.task == task) & (atp["mode"] == m) & (atp.direction == d)].empty]
    if not panels:
        raise FbtError(f"atp-heatmap: no AtP rows for direction {direction or 'any'} and mode {mode or 'any'}")
    n_cols = min(len(panels), 2)
    n_rows = -(-len(panels) // n_cols)
    heights = [len(atp[(atp.task == p[0]) & (atp["mode"] == p[1])][["condition", "pass_index"]].drop_duplicates()) for p in panels]
    with paper_style():
        fig, axes = subplots(n_rows, n_cols, panel_height_in=max(1.9, 0.16 * max(heights)))
        for ax, (task, mode, d) in zip(axes.flat, panels):
            sub = atp[(atp.task == task) & (atp["mode"] == mode) & (atp.direction == d)]
            knob = int(sub["length_knob"].min()) if length is None else int(length)
            sub = sub[sub["length_knob"] == knob]
            grid = sub.pivot_table(index=["pass_index", "condition"], columns="position", values="mean")
            grid = grid.reindex(sorted(grid.index, key=lambda ix: (ix[0], _hook_rank(ix[1]))))
            values = grid.to_numpy(float)
            title = f"{task} · {mode}\n{d}, length {knob}"
            if np.all(np.isnan(values)):
                ax.text(0.5, 0.5, "no pair above the clean–corrupt\ngap threshold", ha="center", va="center", transform=ax.transAxes)
                ax.set_title(title)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            base = 0.0 if (metric != "normalized" or d == "denoising") else 1.0
            lim = float(np.nanmax(np.abs(values - base))) or 1.0
            im = ax.imshow(values, aspect="auto", cmap="coolwarm", vmin=base - lim, vmax=base + lim, interpolation="nearest")
            rows = {ix: i for i, ix in enumerate(grid.index)}
            cols = {p: j for j, p in enumerate(grid.columns)}
            chk = exact[(exact.task == task) & (exact["mode"] == mode) & (exact.direction == d) & (exact.length_knob == knob)]
            for r in chk.itertuples():
                if (r.pass_index, r.condition) in rows and r.position in cols:
                    ax.scatter(cols[r.position], rows[(r.pass_index, r.condition)], s=14, facecolors="none", edgecolors="black", lw=0.7)
            multi = grid.index.get_level_values(0).nunique() > 1
            ax.set_yticks(range(len(grid.index)), [(f"p{k} " if multi else "") + short_hook(h) for k, h in grid.index], fontsize=5.5)
            step = max(1, -(-len(grid.columns) // 6))
            ax.set_xticks(range(0, len(grid.columns), step), [str(p) for p in grid.columns[::step]])
            ax.set_xlabel("position")
            ax.grid(False)
            ax.set_title(title)
            fig.colorbar(im, ax=ax, shrink=0.85, label=f"AtP {metric}")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle("attribution patching (first-order); ringed: cells patched exactly by the parity check")
    return fig


def _parity_points(t: pd.DataFrame, metric: str) -> pd.DataFrame:
    keys = ["task", "mode", "direction", "length_knob", "pass_index", "condition", "position"]
    t = t[t["metric"] == metric]
    both = t[t["method"] == "exact"][keys + ["mean"]].merge(t[t["method"] == "atp"][keys + ["mean"]], on=keys,
                                                            suffixes=("_exact", "_atp"))
    return both.dropna(subset=["mean_exact", "mean_atp"])


def atp_parity(table: pd.DataFrame, metric: str = "normalized"):
    """AtP vs exact patching on the checked cells (per-cell means over pairs). A panel without any pair
    above the gap threshold falls back from normalized to logit-difference units."""
    t = _check(table, ("attribution",), "atp-parity")
    t = t.assign(pass_index=t["pass_index"] if "pass_index" in t else 1)
    if not (t["method"] == "exact").any():
        raise FbtError("atp-parity: no exact rows (run the attribution experiment with --check K)")
    points = {m: _parity_points(t, m) for m in dict.fromkeys([metric, "logit_diff"])}
    cells = t[t["method"] == "exact"]
    panels = [(task, mode) for task in _tasks(cells) for mode in _modes(cells)
              if not cells[(cells.task == task) & (cells["mode"] == mode)].empty]
    n_cols, fallback = min(3, len(panels)), False
    with paper_style():
        fig, axes = subplots(-(-len(panels) // n_cols), n_cols, panel_height_in=2.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        for ax, (task, mode) in zip(axes.flat, panels):
            for m, pts in points.items():
                sub = pts[(pts.task == task) & (pts["mode"] == mode)]
                if len(sub):
                    break
            for d, marker in (("denoising", "o"), ("noising", "s")):
                s = sub[sub.direction == d]
                ax.scatter(s["mean_exact"], s["mean_atp"], marker=marker, s=14, label=d, alpha=0.8)
            if len(sub):
                lo = float(min(sub["mean_exact"].min(), sub["mean_atp"].min()))
                hi = float(max(sub["mean_exact"].max(), sub["mean_atp"].max()))
                ax.plot([lo, hi], [lo, hi], color="black", lw=0.6, ls="--")
                rho = sub["mean_exact"].rank().corr(sub["mean_atp"].rank())
                worst = float((sub["mean_exact"] - sub["mean_atp"]).abs().max())
                units = "" if m == metric else " (LD units)"
                fallback |= m != metric
                ax.set_title(f"{task} · {mode}{units}\nSpearman {rho:.2f} · worst |err| {worst:.2g}")
            ax.set_xlabel(f"exact patching ({m})")
            ax.set_ylabel(f"AtP ({m})")
        axes.flat[0].legend()
        note = "\nLD units: no pair above the clean–corrupt gap threshold, so no normalized value" if fallback else ""
        fig.suptitle("attribution patching against exact patching on the checked cells (mean over pairs)" + note)
    return fig


def das_iia(table: pd.DataFrame, metric: str = "iia", length: int = -1):
    """IIA vs k per hook; DAS solid, random rotation dashed, full-vector interchange dotted."""
    t = _check(table, ("das",), "das-iia")
    t = t[(t["metric"] == metric) & (t["length_knob"] == int(length))]
    if t.empty:
        raise FbtError(f"das-iia: no rows for metric '{metric}' at length {length}")
    panels = [(task, mode) for task in _tasks(t) for mode in _modes(t) if not t[(t.task == task) & (t["mode"] == mode)].empty]
    hooks = sorted(t["condition"].unique(), key=_hook_rank)
    with paper_style():
        fig, axes = subplots(1, len(panels), panel_height_in=2.5, sharey=True)
        for ax, (task, mode) in zip(axes.flat, panels):
            sub = t[(t.task == task) & (t["mode"] == mode)]
            for i, hook in enumerate(hooks):
                color = f"C{i}"
                for method, ls, lab in (("das", "-", short_hook(hook)), ("random-rotation", "--", None)):
                    r = sub[(sub.condition == hook) & (sub.method == method)].sort_values("subspace_dim")
                    if r.empty:
                        continue
                    ax.plot(r["subspace_dim"], r["mean"], marker="o", ls=ls, color=color, label=lab)
                    ax.fill_between(r["subspace_dim"], r["ci_low"], r["ci_high"], color=color, alpha=0.12, lw=0)
                full = sub[(sub.condition == hook) & (sub.method == "full-interchange")]
                if len(full):
                    ax.axhline(float(full["mean"].iloc[0]), color=color, ls=":", lw=0.9)
            ax.set_xscale("log", base=2)
            ks = sorted(sub.loc[sub.method == "das", "subspace_dim"].unique())
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("subspace dimension k")
            ax.set_title(f"{task} · {mode}")
        axes.flat[0].set_ylabel(f"{metric} on held-out groups")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, title="DAS (solid) · random rotation (dashed) · full-vector interchange (dotted)",
                   loc="upper center", ncol=max(1, len(labels)), fontsize=7, title_fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))  # under the panels (saved with a tight box), off the curves and labels
    return fig
