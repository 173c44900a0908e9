"""Figures of attribution patching and DAS, drawn from an experiment's `summary.parquet`.

atp-heatmap: the AtP map, (pass ×) hook × position of the mean metric; one panel per task × mode ×
             direction, cropped to the positions that carry an effect (the final one always);
             cells that the parity check patched exactly are ringed.
atp-parity:  AtP against exact patching on the checked cells (means over pairs), one panel per task ×
             mode, with the diagonal; Spearman per length (and pooled, said so) and the worst error in
             the title.
das-iia:     interchange intervention accuracy per subspace dimension k: points with bootstrap CIs per
             hook × method (DAS, random rotation; the full-vector interchange in its own slot), not
             joined across k, and the random-rotation null drawn from the data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.interventions import _check, _modes, _tasks, position_labels
from fbt_probe.figures.style import legend_handles, model_words, paper_style, subplots, titled


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


def signal_columns(values: np.ndarray, base: float, keep: int, min_share: float) -> list[int]:
    """Columns of an AtP map worth drawing: the last (the final position, where the answer is read)
    and, of the others, the `keep` - 1 whose largest |value - base| is largest, if at least
    `min_share` of the map's largest; in position order. `keep` <= 0: every column."""
    n = values.shape[1]
    if keep <= 0 or n <= 1:
        return list(range(n))
    dev = np.abs(values - base)
    col = np.where(np.isnan(dev).all(axis=0), 0.0, np.nanmax(np.where(np.isnan(dev), -np.inf, dev), axis=0))
    top = float(col.max()) if n else 0.0
    ranked = [j for j in np.argsort(-col[:-1], kind="stable") if top > 0 and col[j] >= min_share * top]
    return sorted([n - 1] + [int(j) for j in ranked[: max(keep - 1, 0)]])


def atp_heatmap(
    table: pd.DataFrame,
    metric: str = "normalized",
    length: int | None = None,
    direction: str | None = None,
    mode: str | None = None,
    positions: int = 12,
    min_share: float = 0.1,
    model_label: str | None = None,
):
    """AtP map: rows are (pass, hook) in forward order, columns positions. `direction` / `mode`: only
    those panels (with both samples of every pair in the table, noising is 1 - denoising of the partner).

    Columns: an AtP map spans every position of the context, and the effect sits in a few of them
    (mostly the final one), so drawn whole it is a grey field with a one-pixel signal. Each panel
    therefore shows at most `positions` columns: the final position and those whose largest effect
    is at least `min_share` of the panel's largest (white lines mark skipped positions; ticks give
    each position's index and its offset from the final one). `positions=0` draws every position."""

    t = _atp_rows(table, metric)
    positions, min_share = int(positions), float(min_share)
    atp, exact = t[t["method"] == "atp"], t[t["method"] == "exact"]
    dirs = ("denoising", "noising") if direction is None else (direction,)
    modes = _modes(atp) if mode is None else [m.strip() for m in str(mode).split(",")]
    panels = [
        (task, m, d)
        for task in _tasks(atp)
        for m in modes
        for d in dirs
        if not atp[(atp.task == task) & (atp["mode"] == m) & (atp.direction == d)].empty
    ]
    if not panels:
        raise FbtError(f"atp-heatmap: no AtP rows for direction {direction or 'any'} and mode {mode or 'any'}")
    n_cols = min(len(panels), 2)
    n_rows = -(-len(panels) // n_cols)
    heights = [
        len(atp[(atp.task == p[0]) & (atp["mode"] == p[1])][["condition", "pass_index"]].drop_duplicates())
        for p in panels
    ]
    hidden_checks = 0
    grids = []  # per panel: (knob, grid, values, base)
    for task, mode, d in panels:
        sub = atp[(atp.task == task) & (atp["mode"] == mode) & (atp.direction == d)]
        knob = int(sub["length_knob"].min()) if length is None else int(length)
        sub = sub[sub["length_knob"] == knob]
        grid = sub.pivot_table(index=["pass_index", "condition"], columns="position", values="mean")
        grid = grid.reindex(sorted(grid.index, key=lambda ix: (ix[0], _hook_rank(ix[1]))))
        base = 0.0 if (metric != "normalized" or d == "denoising") else 1.0
        grids.append((knob, grid, grid.to_numpy(float), base))
    # one colour scale for every panel (panels compare by colour): the largest |value - base| of any
    lim = max((float(np.nanmax(np.abs(v - b))) for _, _, v, b in grids if not np.all(np.isnan(v))), default=0.0)
    lim = lim or 1.0
    by_base: dict = {}  # base -> (image, its axes): one colorbar per base (denoising 0, noising 1)
    with paper_style():
        fig, axes = subplots(n_rows, n_cols, panel_height_in=max(1.9, 0.17 * max(heights)))
        for ax, (task, mode, d), (knob, grid, values, base) in zip(axes.flat, panels, grids):
            title = f"{task} · {mode}\n{d}, length {knob}"
            if np.all(np.isnan(values)):
                ax.text(
                    0.5,
                    0.5,
                    "no pair above the clean–corrupt\ngap threshold",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.set_title(title)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            kept = signal_columns(values, base, positions, min_share)
            all_positions = [int(p) for p in grid.columns]
            grid, values = grid.iloc[:, kept], values[:, kept]
            im = ax.imshow(
                values, aspect="auto", cmap="coolwarm", vmin=base - lim, vmax=base + lim, interpolation="nearest"
            )
            rows = {ix: i for i, ix in enumerate(grid.index)}
            cols = {p: j for j, p in enumerate(grid.columns)}
            chk = exact[
                (exact.task == task) & (exact["mode"] == mode) & (exact.direction == d) & (exact.length_knob == knob)
            ]
            for r in chk.itertuples():
                if (r.pass_index, r.condition) in rows and r.position in cols:
                    ax.scatter(
                        cols[r.position],
                        rows[(r.pass_index, r.condition)],
                        s=14,
                        facecolors="none",
                        edgecolors="black",
                        lw=0.7,
                    )
                elif (r.pass_index, r.condition) in rows:
                    hidden_checks += 1
            shown = [int(p) for p in grid.columns]
            for j in range(1, len(shown)):  # a skipped stretch of positions
                if shown[j] - shown[j - 1] > 1:
                    ax.axvline(j - 0.5, color="white", lw=2.0)
            multi = grid.index.get_level_values(0).nunique() > 1
            ax.set_yticks(
                range(len(grid.index)),
                [(f"p{k} " if multi else "") + short_hook(h) for k, h in grid.index],
                fontsize=7,
            )
            ax.set_xticks(
                range(len(shown)), position_labels(shown, final=max(all_positions), offsets=False), fontsize=7
            )
            ax.set_xlabel(
                f"position ({len(shown)} of {len(all_positions)} shown)"
                if len(shown) < len(all_positions)
                else "position"
            )
            ax.grid(False)
            ax.set_title(title)
            by_base.setdefault(base, (im, []))[1].append(ax)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        for base, (im, on) in sorted(by_base.items()):
            fig.colorbar(
                im,
                ax=on,
                shrink=0.5 if len(on) > 2 else 0.85,
                label=f"AtP {metric}" + ("" if len(by_base) == 1 else f" ({'noising' if base else 'denoising'})"),
                location="right",
            )
        what = "attribution patching (first-order); ringed: cells patched exactly by the parity check"
        if positions > 0:
            what += (
                f"\ncolumns: the final position and those with at least {min_share:.0%} of the panel's largest effect;"
                "\nwhite lines: positions skipped"
            )
            if hidden_checks:
                what += f" ({hidden_checks} checked cells lie at positions not shown)"
        fig.suptitle(titled(what, model_words(t, model_label)))
    return fig


def _parity_points(t: pd.DataFrame, metric: str) -> pd.DataFrame:
    keys = ["task", "mode", "direction", "length_knob", "pass_index", "condition", "position"]
    t = t[t["metric"] == metric]
    both = t[t["method"] == "exact"][keys + ["mean"]].merge(
        t[t["method"] == "atp"][keys + ["mean"]], on=keys, suffixes=("_exact", "_atp")
    )
    return both.dropna(subset=["mean_exact", "mean_atp"])


def spearman(a: pd.Series, b: pd.Series) -> float:
    return float(a.rank().corr(b.rank())) if len(a) > 1 else float("nan")


def parity_words(sub: pd.DataFrame) -> str:
    """Spearman of AtP against exact patching, said with what it pools: one length ("length 8"), or
    pooled over the lengths with each length's own value beside it (pooling mixes lengths whose
    effects sit at different scales, so the pooled value can be far from every per-length one)."""
    lengths = sorted(int(k) for k in sub["length_knob"].unique())
    rho = spearman(sub["mean_exact"], sub["mean_atp"])
    if len(lengths) == 1:
        return f"Spearman {rho:.2f} (length {lengths[0]})"
    per = ", ".join(
        f"{k}: {spearman(g['mean_exact'], g['mean_atp']):.2f}" for k, g in sub.groupby("length_knob", sort=True)
    )
    return f"Spearman pooled over lengths {rho:.2f}\nper length {per}"


def atp_parity(table: pd.DataFrame, metric: str = "normalized", model_label: str | None = None):
    """AtP vs exact patching on the checked cells (per-cell means over pairs). A panel without any pair
    above the gap threshold falls back from normalized to logit-difference units. Each panel's title
    gives the Spearman rank correlation per length and, where the panel holds several lengths, pooled
    (`parity_words`); the figure's title names the model (`model_label`, else the checkpoint folder)."""
    t = _check(table, ("attribution",), "atp-parity")
    t = t.assign(pass_index=t["pass_index"] if "pass_index" in t else 1)
    if not (t["method"] == "exact").any():
        raise FbtError("atp-parity: no exact rows (run the attribution experiment with --check K)")
    points = {m: _parity_points(t, m) for m in dict.fromkeys([metric, "logit_diff"])}
    cells = t[t["method"] == "exact"]
    panels = [
        (task, mode)
        for task in _tasks(cells)
        for mode in _modes(cells)
        if not cells[(cells.task == task) & (cells["mode"] == mode)].empty
    ]
    n_cols, fallback = min(3, len(panels)), False
    with paper_style():
        fig, axes = subplots(-(-len(panels) // n_cols), n_cols, panel_height_in=2.5)
        for ax in list(axes.flat)[len(panels) :]:
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
                worst = float((sub["mean_exact"] - sub["mean_atp"]).abs().max())
                units = "" if m == metric else " (LD units)"
                fallback |= m != metric
                said = parity_words(sub)
                sep = "\n" if "\n" in said else " · "  # a pooled panel's title is long: the error on its own line
                ax.set_title(f"{task} · {mode}{units}\n{said}{sep}worst |err| {worst:.2g}", fontsize=7)
            ax.set_xlabel(f"exact patching ({m})")
            ax.set_ylabel(f"AtP ({m})")
        axes.flat[0].legend()
        note = "\nLD units: no pair above the clean–corrupt gap threshold, so no normalized value" if fallback else ""
        fig.suptitle(
            titled(
                "attribution patching against exact patching on the checked cells (mean over pairs)",
                model_words(t, model_label),
            )
            + note
        )
    return fig


def rotation_null(sub: pd.DataFrame) -> float | None:
    """The null of an interchange accuracy, read from the data: the mean IIA of the random-rotation
    interchanges (a random k-dimensional subspace of the same hook) over every k and hook of a panel;
    None without such rows. A swap in a subspace that carries nothing leaves the answer on the base
    sample's label, so this null is near 0, not 1 / the label count: IIA counts the answers that
    follow the source, and an untouched answer never does."""
    r = sub.loc[sub["method"] == "random-rotation", "mean"].dropna()
    return float(r.mean()) if len(r) else None


def das_iia(table: pd.DataFrame, metric: str = "iia", length: int = -1, model_label: str | None = None):
    """IIA per subspace dimension k and hook: one point (bootstrap CI as error bar) per hook ×
    method side by side at each k, DAS filled circles, random rotation open squares, the
    full-vector interchange (diamonds) at its own slot after the largest k. k is a discrete choice of
    subspace size, so points are not joined across k. Dashed: the random-rotation null of the panel
    (`rotation_null`), the level a subspace that carries nothing reaches."""

    t = _check(table, ("das",), "das-iia")
    t = t[(t["metric"] == metric) & (t["length_knob"] == int(length))]
    if t.empty:
        raise FbtError(f"das-iia: no rows for metric '{metric}' at length {length}")
    panels = [
        (task, mode) for task in _tasks(t) for mode in _modes(t) if not t[(t.task == task) & (t["mode"] == mode)].empty
    ]
    hooks = sorted(t["condition"].unique(), key=_hook_rank)
    with paper_style():
        fig, axes = subplots(1, len(panels), panel_height_in=2.5, sharey=True)
        for ax, (task, mode) in zip(axes.flat, panels):
            _iia_panel(ax, t[(t.task == task) & (t["mode"] == mode)], hooks)
            ax.set_title(f"{task} · {mode}")
        axes.flat[0].set_ylabel(f"{metric} on held-out groups")
        handles = legend_handles(axes)
        order = sorted(handles, key=lambda lab: lab.startswith("random-rotation null"))  # the series, then the null
        fig.legend([handles[lab] for lab in order], order, loc="outside lower center", ncols=3, frameon=False)
        shown = model_words(t, model_label)
        fig.suptitle(titled("DAS: interchange intervention accuracy by subspace dimension (Wilson 95 % CI)", shown))
    return fig


def _iia_panel(ax, sub: pd.DataFrame, hooks: list[str]) -> None:
    """One task x mode of `das_iia`: each hook's DAS and random-rotation points side by side at each
    k, its full-vector interchange after the largest k, and the panel's random-rotation null."""
    styles = (("das", "o", True), ("random-rotation", "s", False))
    ks = sorted(int(k) for k in sub.loc[sub.method.isin(["das", "random-rotation"]), "subspace_dim"].unique())
    full = sub[sub.method == "full-interchange"]
    slots = {k: i for i, k in enumerate(ks)}
    n_series = len(hooks) * len(styles)
    step = 0.7 / max(n_series, 1)
    for i, hook in enumerate(hooks):
        color = f"C{i}"
        for m, (method, marker, filled) in enumerate(styles):
            r = sub[(sub.condition == hook) & (sub.method == method)].sort_values("subspace_dim")
            if r.empty:
                continue
            off = (i * len(styles) + m - (n_series - 1) / 2) * step
            x = np.array([slots[int(k)] for k in r["subspace_dim"]]) + off
            y = r["mean"].to_numpy(float)
            ax.errorbar(
                x,
                y,
                yerr=np.nan_to_num(np.vstack([y - r["ci_low"], r["ci_high"] - y])),
                ls="none",
                marker=marker,
                color=color,
                mfc=color if filled else "white",
                capsize=1.5,
                elinewidth=0.8,
                label=f"{short_hook(hook)} · {'DAS' if method == 'das' else 'random rotation'}",
            )
        f = full[full.condition == hook]
        if len(f):
            off = (i - (len(hooks) - 1) / 2) * (0.7 / max(len(hooks), 1))
            y = float(f["mean"].iloc[0])
            ax.errorbar(
                [len(ks) + off],
                [y],
                yerr=[[y - float(f["ci_low"].iloc[0])], [float(f["ci_high"].iloc[0]) - y]],
                ls="none",
                marker="D",
                color=color,
                capsize=1.5,
                elinewidth=0.8,
                label=f"{short_hook(hook)} · full-vector interchange",
            )
    null = rotation_null(sub)
    if null is not None:
        ax.axhline(null, color="0.35", lw=0.8, ls="--", label="random-rotation null (mean over k and hooks)")
        ax.annotate(
            f"null {null:.2f}", (1.0, null), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=6
        )
    ticks = list(range(len(ks))) + ([len(ks)] if len(full) else [])
    ax.set_xticks(ticks, [str(k) for k in ks] + (["full\nvector"] if len(full) else []))
    ax.set_xlim(-0.6, max(ticks) + 0.6)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("subspace dimension k")
