"""Serial depth: answer accuracy against the number of dependent steps k the answer needs, one panel
per model (the feedback model, the no-feedback baseline), one line per prefill mode with Wilson
error bars (n = groups) and a chance line; beside them the carried-state swap's normalized effect
against k for both models, with its group-bootstrap interval. Drawn from the study's
results/depth/accuracy.parquet (`swap`: results/depth/swap.parquet). A cell with fewer held-out
groups than `min_groups` is no evidence: it is drawn as a hollow marker with its n, joined to no
line and without an interval."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.style import paper_style, subplots
from fbt_probe.stats import MIN_GROUPS

MODES = ("standard", "recurrent:1", "jacobi:2", "jacobi:3", "full")
STYLE = {  # colour, marker, line style: distinguishable in grey print too
    "standard": ("#222222", "o", "-"),
    "recurrent:1": ("#1f77b4", "s", "-"),
    "jacobi:2": ("#2ca02c", "^", "--"),
    "jacobi:3": ("#9467bd", "v", "--"),
    "full": ("#d62728", "D", ":"),
}
MODEL_WORDS = {"feedback": "feedback model", "baseline": "no-feedback baseline"}
MAX_K = 2**16  # serial steps k: far past any a task spec asks for (256), and a point on a log2 axis
MAX_PANELS = 400  # a figure of more panels is no figure (and takes minutes to lay out)
INT, TEXT, SHARE, NUMBER = "int", "text", "share", "number"
# column -> (kind, low, high, NaN allowed): what each column of the figures' tables must hold
COLUMNS = {
    "design": (TEXT, None, None, False),
    "schedule": (TEXT, None, None, False),
    "model": (TEXT, None, None, False),
    "mode": (TEXT, None, None, False),
    "seed": (INT, 0, 2**63 - 1, False),
    "k": (INT, 1, MAX_K, False),
    "groups": (INT, 0, 2**53, False),
    "accuracy": (SHARE, 0.0, 1.0, False),
    "ci_low": (SHARE, 0.0, 1.0, True),  # no interval where a cell has no groups
    "ci_high": (SHARE, 0.0, 1.0, True),
    "normalized": (NUMBER, None, None, False),
}
SWAP_COLUMNS = {  # an effect and its interval: empty at a k whose pairs' mean gap does not clear the minimum
    "normalized": (NUMBER, None, None, True),
    "ci_low": (NUMBER, None, None, True),
    "ci_high": (NUMBER, None, None, True),
}


def check_table(
    table: pd.DataFrame, figure: str, need: tuple[str, ...], optional: tuple[str, ...] = (), kinds: dict | None = None
) -> pd.DataFrame:
    """`table` with the columns `need` (and `optional` where present), each checked value by value (`COLUMNS`: integers, shares in
    [0, 1], finite numbers, text) and converted to its kind; else a one-line FbtError naming the
    column, the row and the value. A table without rows is refused too."""
    kinds = {**COLUMNS, **(kinds or {})}
    missing = sorted(set(need) - set(table.columns))
    if missing:
        raise FbtError(f"figure '{figure}': the table has no column {missing}")
    if len(table) == 0:
        raise FbtError(f"figure '{figure}': the table has no rows (a header only?); nothing to draw")
    out = table.reset_index(drop=True).copy()
    for col in [c for c in (*need, *optional) if c in out.columns]:
        kind, lo, hi, nan_ok = kinds[col]
        values = out[col]
        if kind == TEXT:
            ok = values.map(
                lambda v: isinstance(v, (str, int, np.integer)) and not isinstance(v, bool) and str(v) != ""
            )
            what = "a text"
        else:
            num = pd.to_numeric(values.map(lambda v: np.nan if isinstance(v, bool) else v), errors="coerce")
            num = num.astype(float)
            finite = np.isfinite(num)
            ok = finite & (num >= (-np.inf if lo is None else lo)) & (num <= (np.inf if hi is None else hi))
            if kind == INT:
                ok &= num == np.floor(num)
            if nan_ok:
                ok |= values.isna()
            if kind == INT:
                what = f"an integer {lo}..{hi:,}"
            else:
                what = ("a number in [0, 1]" if kind == SHARE else "a finite number") + (
                    " (or empty)" if nan_ok else ""
                )
        if not ok.all():
            row = int(np.flatnonzero(~ok.to_numpy())[0])
            raise FbtError(f"figure '{figure}': column '{col}', row {row}: {_shown(values.iloc[row])}: expected {what}")
        if kind == TEXT:
            out[col] = values.map(str)
        elif kind == INT:
            out[col] = num.astype("int64")
        else:
            out[col] = num
    return out


def _shown(value) -> str:
    """A table's value as the message quotes it: an empty field as such, a number as Python writes it."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "an empty field"
    return repr(value.item() if isinstance(value, np.generic) else value)


def check_panels(n: int, figure: str, what: str) -> None:
    if n > MAX_PANELS:
        raise FbtError(f"figure '{figure}': {n:,} panels ({what}); expected at most {MAX_PANELS} (draw a subset)")


MODEL_COLOURS = {"feedback": "#1f77b4", "baseline": "#7f7f7f"}


def _dodge(i: int, n: int, width: float = 0.28) -> float:
    """A mode's offset on the log2 axis, so that equal values and their bars do not hide each other."""
    return (i - (n - 1) / 2) * width / max(n - 1, 1)


def depth(
    table: pd.DataFrame,
    swap: pd.DataFrame | None = None,
    task: str = "compose-s3",
    chance: float = 0.5,
    min_groups: int = MIN_GROUPS,
):
    """`table`: model, k, mode, accuracy, ci_low, ci_high (groups optional: written above each k);
    `swap`: model, k, normalized, ci_low, ci_high (groups optional; the feedback swap per k). One legend
    under the panels names the modes, the chance line and the swap's models. A cell with fewer than
    `min_groups` groups is a hollow, unconnected marker without error bars (too few groups)."""
    import matplotlib.lines as mlines

    table = check_table(table, "depth", ("model", "k", "mode", "accuracy", "ci_low", "ci_high"), ("groups",))
    if swap is not None and len(swap) > 0:
        swap = check_table(swap, "depth", ("model", "k", "normalized", "ci_low", "ci_high"), kinds=SWAP_COLUMNS)
    check_panels(table["model"].nunique() + 1, "depth", "one per model and the swap")
    models = [m for m in ("feedback", "baseline") if m in set(table["model"])] + sorted(
        set(table["model"]) - {"feedback", "baseline"}
    )
    has_swap = swap is not None and len(swap) > 0
    ks = sorted(int(k) for k in table["k"].unique())
    with paper_style():
        fig, axes = subplots(1, len(models) + has_swap, panel_height_in=2.9)
        modes = [m for m in MODES if m in set(table["mode"])] + sorted(set(table["mode"]) - set(MODES))
        handles, labels = [], []
        for ax, model in zip(axes[0], models):
            t = table[table["model"] == model]
            _mode_lines(ax, t, modes, handles, labels, min_groups=int(min_groups))
            ax.axhline(chance, color="grey", ls=(0, (4, 3)), lw=0.9, zorder=0)
            ax.set(
                title=f"{task}, {MODEL_WORDS.get(model, model)}\nanswer accuracy per prefill mode",
                xlabel="serial steps needed k",
                ylabel="answer accuracy (held-out)",
                ylim=(-0.04, 1.12),
                yticks=[0, 0.25, 0.5, 0.75, 1.0],
            )
            _k_axis(ax, ks)
            if "groups" in t.columns:  # how many held-out groups each k rests on, above the data
                n = t.groupby("k")["groups"].max()
                for k in ks:
                    if k in n.index:
                        ax.text(
                            np.log2(k), 1.065, f"n = {int(n[k])}", ha="center", va="center", fontsize=6, color="dimgrey"
                        )
        handles.append(mlines.Line2D([], [], color="grey", ls=(0, (4, 3)), lw=0.9))
        labels.append(f"chance ({chance:g})")
        if has_swap:
            ax = axes[0][len(models)]
            for j, (model, g) in enumerate(swap.groupby("model", sort=False)):
                g = g.sort_values("k")
                few = _few(g, int(min_groups))
                x = np.log2(g["k"].to_numpy(dtype=float)) + _dodge(j, swap["model"].nunique(), 0.1)
                y = g["normalized"].to_numpy(dtype=float)
                err = np.vstack([y - g["ci_low"].to_numpy(dtype=float), g["ci_high"].to_numpy(dtype=float) - y])
                colour, marker = MODEL_COLOURS.get(model), "o" if model == "feedback" else "s"
                h = ax.errorbar(
                    x[~few],
                    y[~few],
                    yerr=np.clip(np.nan_to_num(err[:, ~few]), 0, None),
                    color=colour,
                    marker=marker,
                    capsize=2,
                    lw=1.1,
                )
                _hollow(ax, x[few], y[few], g["groups"].to_numpy()[few] if few.any() else [], colour, marker)
                handles.append(h)
                labels.append(f"swap, {MODEL_WORDS.get(model, model)}")
            if swap["normalized"].isna().all():  # a ratio of means needs the pairs' mean gap: none cleared it
                ax.text(
                    0.5,
                    0.5,
                    "no normalized effect at any k:\nthe pairs' mean clean–corrupt gap\ndoes not clear the minimum",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="dimgrey",
                    transform=ax.transAxes,
                )
            for level in (0, 1):
                ax.axhline(level, color="grey", ls=":", lw=0.8, zorder=0)
            ax.set(
                title=f"{task}, both models\ncarried-state swap under recurrent:1",
                xlabel="serial steps needed k",
                ylabel="normalized swap effect",
            )
            _k_axis(ax, sorted(int(k) for k in swap["k"].unique()))
        hollow = bool((table["groups"] < int(min_groups)).any()) if "groups" in table.columns else False
        if has_swap and "groups" in swap.columns:
            hollow |= bool((swap["groups"] < int(min_groups)).any())
        if hollow:
            handles.append(mlines.Line2D([], [], ls="none", marker="o", mfc="none", color="grey"))
            labels.append(f"too few groups (n < {int(min_groups)}): no interval, no line")
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncol=4,
            frameon=False,
            title="bars: Wilson 95 % CI with n = groups (above each k); swap: group-bootstrap 95 % CI",
        )
        return fig


def _few(g: pd.DataFrame, min_groups: int) -> np.ndarray:
    """Which rows of `g` rest on fewer than `min_groups` groups (none without a `groups` column)."""
    if "groups" not in g.columns:
        return np.zeros(len(g), dtype=bool)
    return g["groups"].to_numpy(dtype=float) < min_groups


def _hollow(ax, x, y, n, colour, marker, ms: float = 4.0) -> None:
    """Cells with too few groups: hollow markers, joined to nothing, each with its n beside it."""
    for xi, yi, ni in zip(x, y, n):
        if yi != yi:
            continue
        ax.plot([xi], [yi], ls="none", marker=marker, mfc="none", mec=colour, ms=ms, zorder=3)
        ax.annotate(f"n={int(ni)}", (xi, yi), xytext=(3, 3), textcoords="offset points", fontsize=5.5, color=colour)


def _mode_lines(
    ax, t: pd.DataFrame, modes, handles: list, labels: list, capsize: float = 2, ms: float = 3.5, min_groups: int = 0
) -> None:
    """One line per prefill mode (accuracy against log2 k, Wilson bars), dodged so that equal values
    stay visible; a mode's first handle goes into the legend lists. Cells with fewer than `min_groups`
    groups are hollow markers outside the line (`_hollow`)."""
    for i, mode in enumerate(modes):
        g = t[t["mode"] == mode].sort_values("k")
        if g.empty:
            continue
        colour, marker, ls = STYLE.get(mode, (None, "o", "-"))
        few = _few(g, min_groups)
        x = np.log2(g["k"].to_numpy(dtype=float)) + _dodge(i, len(modes))
        y = g["accuracy"].to_numpy(dtype=float)
        err = np.vstack([y - g["ci_low"].to_numpy(dtype=float), g["ci_high"].to_numpy(dtype=float) - y])
        _hollow(ax, x[few], y[few], g["groups"].to_numpy()[few] if few.any() else [], colour, marker, ms + 0.5)
        x, y, err = x[~few], y[~few], err[:, ~few]
        h = ax.errorbar(
            x, y, yerr=np.clip(err, 0, None), color=colour, marker=marker, ls=ls, capsize=capsize, lw=1.1, ms=ms
        )
        h.lines[0].set_gid(f"mode:{mode}")
        if mode not in labels:
            handles.append(h)
            labels.append(mode)


GRID_KEYS = ("design", "schedule", "model")


def depth_grid(table: pd.DataFrame, chance: float = 0.5, min_groups: int = 0):
    """A grid of training runs: one row of panels per design × pass schedule × model, one column per
    seed, one line per prefill mode (answer accuracy against k, Wilson bars with n = groups). `table`:
    design, schedule, model, seed, k, mode, accuracy, ci_low, ci_high, groups (the research grid of
    docs/research/serial-depth.md). `min_groups`: leave out the k whose held-out groups are fewer (a
    cell of 1-4 words says nothing); the figure's legend title says how many were left out."""
    import matplotlib.lines as mlines

    table = check_table(
        table, "depth-grid", (*GRID_KEYS, "seed", "k", "mode", "accuracy", "ci_low", "ci_high", "groups")
    )
    kept = table[table["groups"] >= min_groups]
    dropped = table.loc[table["groups"] < min_groups, [*GRID_KEYS, "seed", "k"]].drop_duplicates()
    settings = list(kept[list(GRID_KEYS)].drop_duplicates().itertuples(index=False, name=None))
    seeds = sorted(int(s) for s in kept["seed"].unique())
    ks = sorted(int(k) for k in kept["k"].unique())
    modes = [m for m in MODES if m in set(kept["mode"])] + sorted(set(kept["mode"]) - set(MODES))
    check_panels(len(settings) * len(seeds), "depth-grid", f"{len(settings)} runs x {len(seeds)} seeds")
    if not settings:
        raise FbtError(f"figure 'depth-grid': no cell has {min_groups} or more held-out groups; nothing to draw")
    with paper_style():
        fig, axes = subplots(len(settings), len(seeds), panel_height_in=1.55, sharey=True)
        handles, labels = [], []
        for r, (design, schedule, model) in enumerate(settings):
            run = kept[(kept["design"] == design) & (kept["schedule"] == schedule) & (kept["model"] == model)]
            for c, seed in enumerate(seeds):
                ax = axes[r][c]
                t = run[run["seed"] == seed]
                if t.empty:
                    ax.set_axis_off()
                    ax.text(0.5, 0.5, f"seed {seed}: not trained", ha="center", va="center", fontsize=7,
                            color="dimgrey", transform=ax.transAxes)  # fmt: skip
                    continue
                _mode_lines(ax, t, modes, handles, labels, capsize=1.5, ms=2.5)
                ax.axhline(chance, color="grey", ls=(0, (4, 3)), lw=0.9, zorder=0)
                ax.set(ylim=(-0.04, 1.06), yticks=[0, 0.5, 1.0])
                _k_axis(ax, ks)
                ax.set_title(f"{design}, {MODEL_WORDS.get(model, model)}, seed {seed}\n{schedule}", fontsize=7)
                if r == len(settings) - 1:
                    ax.set_xlabel("serial steps needed k")
                if c == 0:
                    ax.set_ylabel("answer accuracy")
        handles.append(mlines.Line2D([], [], color="grey", ls=(0, (4, 3)), lw=0.9))
        labels.append(f"chance ({chance:g})")
        note = (
            f"; {len(dropped)} run × k cells with fewer than {min_groups} held-out groups left out"
            if len(dropped)
            else ""
        )
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncol=6,
            frameon=False,
            title=f"held-out answer accuracy; bars: Wilson 95 % CI with n = groups{note}",
        )
        return fig


def _k_axis(ax, ks) -> None:
    xs = [np.log2(k) for k in ks]
    ax.set_xticks(xs, [str(k) for k in ks])
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
