"""Intervention figures drawn from an experiment's `summary.parquet` (`fbt_probe.interventions`).

patching-heatmap:  residual patching, depth × position, one panel per task × mode × direction.
ablation-bars:     mean (bootstrap CI over pairs) per condition, for feedback-swap, state-replacement
                   and gate-ablation (gate ablation: prefill mode and Std / Soft decoding side by side).
decodable-vs-used: probe-direction, per task: held-out probe accuracy and causal effect of erasing
                   the probe direction (1 - normalized) per depth on one axis.
steering-sweep:    probe-direction, the answer's movement (1 - normalized) vs steering scale, probe
                   direction against a random direction, the cell's probe accuracy in the title.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from fbt_probe.errors import FbtError
from fbt_probe.figures import get_figure
from fbt_probe.figures.style import model_words, paper_style, subplots, titled

NEED = {"experiment", "condition", "mode", "task", "length_knob", "metric", "mean", "ci_low", "ci_high"}
POOLED = -1  # length_knob of rows pooled over lengths
CONDITION_ORDER = ("none", "state", "value", "gate", "zero", "mean", "random", "nonpartner", "ones", "bypass")
# what an intervention does, as the ablation bars name it: the fused input RMSNorm((W_U h) ⊙ σ(W_G e))
# replaces the token embedding, so a zero state or a zero gate sets it to zero and erases the token too
CONDITION_WORDS = {
    ("state-replacement", "zero"): "zero input (token erased)",
    ("state-replacement", "mean"): "mean state",
    ("gate-ablation", "zero"): "gate 0 = zero input",
    ("gate-ablation", "ones"): "gate 1 (token erased)",
    ("gate-ablation", "bypass"): "bypass (plain input)",
    ("gate-ablation", "mean"): "mean gate",
}


def same_as_zero_input(t: pd.DataFrame) -> pd.Series:
    """Rows of the gate ablation's `zero` that a state replacement's `zero` already draws: a zero gate and a
    zero state both set the fused input to zero, so under the same mode and decoding they are one
    intervention, drawn once."""
    zero = t[(t["experiment"] == "state-replacement") & (t["condition"] == "zero")]
    have = set(zip(zero["mode"].astype(str), zero["decoding"] if "decoding" in zero else ["prefill"] * len(zero)))
    dec = t["decoding"] if "decoding" in t else pd.Series("prefill", index=t.index)
    return (
        (t["experiment"] == "gate-ablation")
        & (t["condition"] == "zero")
        & pd.Series([(str(m), d) in have for m, d in zip(t["mode"], dec)], index=t.index)
    )


def _check(table: pd.DataFrame, experiments: tuple[str, ...], what: str) -> pd.DataFrame:
    missing = NEED - set(table.columns)
    if missing:
        raise FbtError(f"{what}: not an interventions summary table (missing columns {sorted(missing)})")
    t = table[table["experiment"].isin(experiments)]
    if t.empty:
        raise FbtError(f"{what}: no rows of experiment {' / '.join(experiments)} in this table")
    return t


def _tasks(t: pd.DataFrame) -> list[str]:
    return sorted(t["task"].astype(str).unique())


def _modes(t: pd.DataFrame) -> list[str]:
    """standard first, then the feedback modes in name order."""
    return sorted(t["mode"].astype(str).unique(), key=lambda m: (m != "standard", m))


# ----------------------------------------------------------------------------- heatmap
def position_labels(positions, final: int | None = None, offsets: bool = True) -> list[str]:
    """Tick labels of sequence positions: the index, and under it its place relative to the final
    position (the answer is read there): 'final', and with `offsets` 'final−1', 'final−2', ... The
    summary tables carry position indices only (no tokens), and a length knob is one token length,
    so its largest position is the final one."""
    positions = [int(p) for p in positions]
    final = max(positions) if final is None else int(final)
    return [f"{p}\nfinal" if p == final else (f"{p}\nfinal−{final - p}" if offsets else str(p)) for p in positions]


OUTSIDE_TOL = 0.02
"""How far past [0, 1] a normalized mean may lie and still count as inside (float noise of an exact
recovery, e.g. −0.006 or 1.006): such a value widens the scale but neither turns the map diverging
nor is written out."""


def patching_scale(values: np.ndarray, metric: str):
    """(norm, colormap) of a patching map covering every value. `normalized`: [0, 1] (0 = corrupt,
    1 = clean) widened to the data; viridis unless a value lies below −`OUTSIDE_TOL`, then a diverging
    map centred at 0. Other metrics: a diverging map symmetric about 0."""
    from matplotlib.colors import Normalize, TwoSlopeNorm

    finite = values[np.isfinite(values)]
    if metric != "normalized":
        lim = float(np.abs(finite).max()) if finite.size else 1.0
        return Normalize(-(lim or 1.0), lim or 1.0), "coolwarm"
    lo = min(0.0, float(finite.min())) if finite.size else 0.0
    hi = max(1.0, float(finite.max())) if finite.size else 1.0
    if lo < -OUTSIDE_TOL:
        return TwoSlopeNorm(0.0, lo, hi), "RdBu_r"
    return Normalize(lo, hi), "viridis"


def patching_heatmap(
    table: pd.DataFrame, metric: str = "normalized", length: int | None = None, model_label: str | None = None
):
    """Residual patching: depth (rows) × position (columns) of the mean `metric`; one panel per
    task × mode × direction, at one length knob per task (`length`, default the shortest). Columns
    are the patched positions (white lines: positions skipped), labelled with the position index,
    its offset from the final position, and "differs" where a pair's two samples differ (column
    `differs`: the residual experiment patches the last such position beside the last k).

    One colour scale for every panel (`patching_scale`), covering every value: a normalized map
    reaching past [0, 1] (a mean of 3.6 where a pair's clean–corrupt gap is small) widens the scale
    and the cells outside [0, 1] carry their value in text."""
    t = _check(table, ("residual",), "patching-heatmap")
    length = None if length is None else int(length)  # options may arrive as strings from the CLI
    t = t[(t["metric"] == metric) & (t["position"] >= 0)]
    panels = [
        (task, mode, d)
        for task in _tasks(t)
        for mode in _modes(t)
        for d in ("denoising", "noising")
        if not t[(t.task == task) & (t["mode"] == mode) & (t.direction == d)].empty
    ]
    if not panels:
        raise FbtError(f"patching-heatmap: no residual rows for metric '{metric}'")
    cells = []
    for task, mode, d in panels:
        sub = t[(t.task == task) & (t["mode"] == mode) & (t.direction == d)]
        knob = length if length is not None else int(sub["length_knob"].min())
        sub = sub[sub["length_knob"] == knob]
        cells.append((knob, sub, sub.pivot_table(index="depth", columns="position", values="mean")))
    every = np.concatenate([g.to_numpy(float).ravel() for *_, g in cells] + [np.array([])])
    norm, cmap = patching_scale(every, metric)
    n_cols = 2 if len(panels) > 1 else 1
    n_rows = -(-len(panels) // n_cols)
    im = None
    with paper_style():
        fig, axes = subplots(n_rows, n_cols, panel_height_in=2.0)
        for ax, (task, mode, d), (knob, sub, grid) in zip(axes.flat, panels, cells):
            rule = sub["hook_rule"].iloc[0] if "hook_rule" in sub and len(sub) else ""
            ax.set_title(f"{task} · {mode} · {d}\nlength {knob}" + (f", {rule}" if rule else ""))
            if grid.empty:  # every pair below the min-gap threshold: nothing to normalise
                ax.text(
                    0.5,
                    0.5,
                    "no pair above the clean–corrupt\ngap threshold",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                continue
            values = grid.to_numpy(float)
            cols = [int(p) for p in grid.columns]
            im = ax.imshow(
                values,
                aspect="auto",
                origin="lower",
                cmap=cmap,
                norm=norm,
                interpolation="nearest",
                extent=(-0.5, len(cols) - 0.5, grid.index.min() - 0.5, grid.index.max() + 0.5),
            )
            if metric == "normalized":  # values the [0, 1] reading does not cover, written out
                for (i, j), v in np.ndenumerate(values):
                    if np.isfinite(v) and not -OUTSIDE_TOL <= v <= 1 + OUTSIDE_TOL:
                        at = float(norm(v))  # white text on the map's dark end(s)
                        dark = abs(at - 0.5) > 0.3 if cmap == "RdBu_r" else at < 0.4
                        ax.text(
                            j,
                            grid.index[i],
                            f"{v:.2f}",
                            ha="center",
                            va="center",
                            fontsize=5.5,
                            color="white" if dark else "black",
                        )
            for j in range(1, len(cols)):  # a skipped stretch of positions
                if cols[j] - cols[j - 1] > 1:
                    ax.axvline(j - 0.5, color="white", lw=2.0)
            differ = set()
            if "differs" in sub.columns:
                differ = {int(p) for p in sub.loc[sub["differs"].astype(bool), "position"]}
            step = max(1, -(-len(cols) // 8))  # at most 8 labels; the final and differing positions always have one
            shown = sorted(set(cols[::-1][::step]) | (differ & set(cols)))
            labels = [
                lab + ("\ndiffers" if p in differ else "")
                for p, lab in zip(shown, position_labels(shown, final=cols[-1]))
            ]
            ax.set_xticks([cols.index(p) for p in shown], labels, fontsize=6)
            ax.set_yticks(sorted(grid.index))
            ax.set_xlabel("position")
            ax.set_ylabel("depth")
            ax.grid(False)
        for ax in list(axes.flat)[len(panels) :]:
            ax.set_visible(False)
        if im is not None:
            extra = " (cells outside [0, 1] carry their value)" if metric == "normalized" else ""
            fig.colorbar(im, ax=axes, shrink=0.5, label=f"{metric}{extra}")
        shown_model = model_words(t, model_label)
        if shown_model:
            fig.suptitle(titled("Residual patching by depth and position", shown_model))
    return fig


# ----------------------------------------------------------------------------- bars
UNSTABLE_CI_WIDTH = 1.0
"""A normalized bar whose 95 % CI is wider than this is left out of ablation-bars (see there)."""


def ablation_bars(
    table: pd.DataFrame,
    metric: str = "normalized",
    length: int = POOLED,
    tasks: str | None = None,
    model_label: str | None = None,
    max_ci_width: float = UNSTABLE_CI_WIDTH,
):
    """Mean `metric` per condition with its bootstrap CI; bars grouped by task. One panel per
    experiment × mode × decoding. `length`: a length knob, or -1 = pooled over lengths.

    `tasks`: comma-separated tasks the figure accounts for (default: those in the table); one with
    no rows in the table is still listed in the legend, marked "not in this table", so a task the
    experiments were not run on reads as such instead of silently missing. `model_label` names
    the model in the title.

    Interventions are named for what they do (`CONDITION_WORDS`): the fused input replaces the token
    embedding, so a state replaced by zeros sets it to zero and erases the token as well, and the
    gate ablation's `zero` is that same intervention; it is drawn once (`same_as_zero_input`).

    Bars left out: the normalized effect is a ratio, (patched − corrupt)/(clean − corrupt), whose
    denominator is each pair's clean–corrupt logit-difference gap. A gap can pass the min-gap rule
    (0.1) and still be small next to the change the intervention makes, and a few such pairs blow
    the mean and its bootstrap CI up (a mean of 3.6 with CI [−1.4, 9.2]). A CI wider than
    `max_ci_width` (default 1, the whole span from 0 = behaves like the corrupt run to 1 = like the
    clean one) cannot tell no effect from a full one; drawn, such a bar also rescales the axis and
    flattens every other bar. It is therefore replaced by a × at 0 and named in a note under the
    panels (its numbers stay in the tables); other metrics are not ratios and are always drawn.
    """
    t = _check(table, ("feedback-swap", "state-replacement", "gate-ablation"), "ablation-bars")
    length = int(length)
    shown_model = model_words(t, model_label)
    t = t[(t["metric"] == metric) & (t["length_knob"] == length)]
    t = t[~same_as_zero_input(t)]  # one intervention, one bar: the zero gate is the zero fused input
    if t.empty:
        raise FbtError(f"ablation-bars: no rows for metric '{metric}' at length {length}")
    decoding = t["decoding"] if "decoding" in t else pd.Series("prefill", index=t.index)
    t = t.assign(decoding=decoding)
    panels = list(t.groupby(["experiment", "mode", "decoding"], sort=True))
    present = _tasks(t)
    wanted = [x.strip() for x in str(tasks).split(",") if x.strip()] if tasks else []
    task_list = list(dict.fromkeys(wanted + present)) if wanted else present
    missing = [x for x in task_list if x not in present]
    colors = {task: f"C{i}" for i, task in enumerate(task_list)}
    max_ci_width = float(max_ci_width)
    conds_of = [
        sorted(
            dict.fromkeys(sub["condition"]),
            key=lambda c: (CONDITION_ORDER.index(c) if c in CONDITION_ORDER else len(CONDITION_ORDER), c),
        )
        for _, sub in panels
    ]
    left_out: dict = {}  # task -> experiment -> condition -> the panels (mode / decoding) it was left out of
    with paper_style():
        # panel widths follow their condition counts, so a one-condition panel has bars as narrow as the others
        any_wide = metric == "normalized" and bool(((t["ci_high"] - t["ci_low"]) > max_ci_width).any())
        fig, axes = subplots(
            1,
            len(panels),
            panel_height_in=2.4 + 0.5 * any_wide,
            sharey=True,  # room for the note
            gridspec_kw={"width_ratios": [max(len(c), 1.5) for c in conds_of]},
        )
        for ax, ((exp, mode, dec), sub), conds in zip(axes.flat, panels, conds_of):
            width = 0.8 / max(len(present), 1)
            where = mode if dec == "prefill" else dec + " decoding"
            for j, task in enumerate(present):
                s = sub[sub.task == task].set_index("condition").reindex(conds)
                x = np.arange(len(conds)) + (j - (len(present) - 1) / 2) * width
                wide = (
                    ((s["ci_high"] - s["ci_low"]) > max_ci_width).to_numpy()
                    if metric == "normalized"
                    else np.zeros(len(conds), bool)
                )
                keep = ~wide
                mean = s["mean"].to_numpy(float)
                err = np.vstack([s["mean"] - s["ci_low"], s["ci_high"] - s["mean"]])
                ax.bar(
                    x[keep],
                    mean[keep],
                    width,
                    yerr=np.nan_to_num(err[:, keep]),
                    capsize=2,
                    color=colors[task],
                    label=task,
                )
                if wide.any():
                    ax.plot(
                        x[wide], np.zeros(int(wide.sum())), ls="none", marker="x", ms=5, mew=1.2, color=colors[task]
                    )
                    for c in np.array(conds)[wide]:
                        left_out.setdefault(task, {}).setdefault(exp, {}).setdefault(str(c), []).append(where)
            ax.set_xticks(
                np.arange(len(conds)), [CONDITION_WORDS.get((exp, c), c) for c in conds], rotation=30, ha="right"
            )
            ax.axhline(0, color="black", lw=0.6)
            if metric == "normalized":
                ax.axhline(1, color="0.4", lw=0.6, ls="--")
            ax.set_title(f"{exp}\n{mode if dec == 'prefill' else dec + ' decoding'}")
        axes.flat[0].set_ylabel(f"{metric}\n(mean, 95 % CI over groups)")
        from matplotlib.patches import Patch

        handles = [Patch(facecolor=colors[x], label=x) for x in present]
        handles += [
            Patch(facecolor="white", edgecolor=colors[x], hatch="///", label=f"{x}: not run (no rows)") for x in missing
        ]
        note = None
        if left_out:
            handles.append(
                Line2D(
                    [],
                    [],
                    ls="none",
                    marker="x",
                    ms=5,
                    mew=1.2,
                    color="0.3",
                    label=f"left out: CI wider than {max_ci_width:g} (above)",
                )
            )
            which = "; ".join(
                f"{task} — "
                + ", ".join(
                    f"{exp}: {', '.join(f'{c} ({chr(47).join(dict.fromkeys(w))})' for c, w in conds.items())}"
                    for exp, conds in exps.items()
                )
                for task, exps in left_out.items()
            )
            note = textwrap.fill(
                f"×: bar left out, its 95 % CI is wider than {max_ci_width:g}, the span from corrupt (0) to clean (1): the "
                "normalized effect divides by each pair's clean–corrupt gap, and pairs with a small gap blow it up "
                f"(values in the summary table). Left out: {which}.",
                160,
            )
        # under the panels, outside them (inside a panel the legend covers bars wherever it goes); the note
        # on left-out bars is its title, so that the layout makes room for both
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncols=min(len(handles), 5),
            frameon=False,
            title=note,
            title_fontsize=6,
        )
        where = ""
        if "lengths" in t.columns and int(length) == POOLED:  # say what a pooled bar pools
            pooled = sorted({x for v in t["lengths"].dropna() for x in str(v).split(",") if x}, key=int)
            where = f" (pooled over length{'s' if len(pooled) > 1 else ''} {', '.join(pooled)})" if pooled else ""
        elif int(length) != POOLED:
            where = f" (length {int(length)})"
        if shown_model:
            fig.suptitle(titled("Ablations of the feedback path" + where, shown_model))
        elif where:
            fig.suptitle("Ablations of the feedback path" + where)
    return fig


# ----------------------------------------------------------------------------- decodable vs used
def decodable_vs_used(
    table: pd.DataFrame, length: int = POOLED, mode: str | None = None, model_label: str | None = None
):
    """Per task: probe accuracy (held-out, cross-fitted) and the causal effect of erasing its
    direction, 1 - normalized (0 = the answer did not move, 1 = it moved as far as the partner's),
    against depth; dotted: probe accuracy re-fitted after erasure. The title names the model
    (`model_label`, else the table's checkpoint folder).

    The y axis covers [0, 1] and every mean; a bootstrap band reaching beyond that (the normalized
    effect is a ratio, and a few pairs with a small clean–corrupt gap can stretch its CI to ±4) is cut
    at the axis, and its far end is written at the edge, so that no value is hidden."""
    t = _check(table, ("probe-direction",), "decodable-vs-used")
    shown_model = model_words(t, model_label)
    t = t[(t["length_knob"] == int(length)) & (t["depth"] >= 0)]  # depth -1, the carried state: steering-sweep
    modes = _modes(t) if mode is None else [mode]
    panels = [(task, m) for task in _tasks(t) for m in modes if not t[(t.task == task) & (t["mode"] == m)].empty]
    if not panels:
        raise FbtError(f"decodable-vs-used: no rows at length {length}" + (f" for mode {mode}" if mode else ""))
    with paper_style():
        fig, axes = subplots(1, len(panels), panel_height_in=2.4, sharey=True)
        drawn = []  # (ax, x, mean, low, high, colour) of every line
        for ax, (task, m) in zip(axes.flat, panels):
            sub = t[(t.task == task) & (t["mode"] == m)]
            drawn.append(
                (
                    ax,
                    *_line(
                        ax,
                        sub[(sub.condition == "probe") & (sub.metric == "probe_accuracy")],
                        "probe accuracy (decodable)",
                        "C0",
                    ),
                )
            )
            for k, cond in enumerate(sorted(c for c in sub.condition.unique() if c.startswith("erase-"))):
                eff = sub[(sub.condition == cond) & (sub.metric == "normalized")]
                drawn.append((ax, *_line(ax, eff, f"effect of {cond} (used)", f"C{k + 1}", flip=True)))
                drawn.append(
                    (
                        ax,
                        *_line(
                            ax,
                            sub[(sub.condition == cond) & (sub.metric == "probe_accuracy")],
                            f"probe accuracy after {cond}",
                            f"C{k + 1}",
                            ls=":",
                        ),
                    )
                )
            ax.axhline(0.5, color="black", lw=0.6, ls="--")
            ax.set_xlabel("depth")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # depths are layer indices
            ax.set_title(f"{task}\n{m}")
        cut = _clip_bands(drawn)
        axes.flat[0].set_ylabel("accuracy / 1 - normalized")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        note = (
            f"y axis: [0, 1] and every mean; bands beyond it are cut at the edge, their far end written there ({cut} cut)"
            if cut
            else None
        )
        fig.legend(handles, labels, loc="outside lower center", ncols=3, title=note, title_fontsize=6.5)
        fig.suptitle(
            titled(
                "Decodable vs used: probe accuracy and the effect of erasing the probe direction, by depth", shown_model
            )
        )
    return fig


def _clip_bands(drawn: list, pad: float = 0.08) -> int:
    """Set the (shared) y range to [0, 1] and every mean, padded; write the far end of each band
    that reaches past it at the edge. Returns how many band ends were cut."""
    means = [v for d in drawn if d[1] is not None for v in d[2]]
    finite = [float(v) for v in means if np.isfinite(v)]
    lo, hi = min([0.0] + finite) - pad, max([1.0] + finite) + pad
    cut = 0
    for ax, x, mean, low, high, colour in drawn:
        ax.set_ylim(lo, hi)
        if x is None:
            continue
        for xi, a, b in zip(x, low, high):
            for v, edge, va in ((b, hi, "top"), (a, lo, "bottom")):
                if np.isfinite(v) and (v > edge if va == "top" else v < edge):
                    cut += 1
                    ax.annotate(
                        f"{v:.1f}",
                        (xi, edge),
                        ha="center",
                        va=va,
                        fontsize=5.5,
                        color=colour,
                        annotation_clip=False,
                    )
    return cut


def _line(ax, rows: pd.DataFrame, label: str, color: str, flip: bool = False, ls: str = "-", x: str = "depth"):
    """Mean with its CI band; returns (x, mean, low, high, colour) as drawn (all None without rows)."""
    if rows.empty:
        return None, None, None, None, color
    rows = rows.sort_values(x)
    mean, lo, hi = rows["mean"].to_numpy(), rows["ci_low"].to_numpy(), rows["ci_high"].to_numpy()
    if flip:
        mean, lo, hi = 1 - mean, 1 - hi, 1 - lo
    ax.plot(rows[x], mean, marker="o", color=color, ls=ls, label=label)
    ax.fill_between(rows[x], lo, hi, color=color, alpha=0.15, lw=0)
    return rows[x].to_numpy(), mean, lo, hi, color


def steering_sweep(table: pd.DataFrame, depth: int = 0, length: int = POOLED):
    """Answer movement 1 - normalized vs steering scale α at one depth (-1: the carried state,
    `probe_direction(feedback=True)`), probe direction vs random."""
    t = _check(table, ("probe-direction",), "steering-sweep")
    depth = int(depth)
    t = t[(t["length_knob"] == int(length)) & (t["depth"] == depth)]
    panels = [
        (task, m)
        for task in _tasks(t)
        for m in _modes(t)
        if not t[(t.task == task) & (t["mode"] == m) & t.condition.str.startswith("steer")].empty
    ]
    if not panels:
        raise FbtError(f"steering-sweep: no steering rows at depth {depth}, length {length}")
    with paper_style():
        fig, axes = subplots(1, len(panels), panel_height_in=2.3, sharey=True)
        for ax, (task, m) in zip(axes.flat, panels):
            sub = t[(t.task == task) & (t["mode"] == m)]
            for cond, color in (("steer", "C3"), ("steer-random", "0.5")):
                _line(
                    ax, sub[(sub.condition == cond) & (sub.metric == "normalized")], cond, color, flip=True, x="scale"
                )
            acc = sub[(sub.condition == "probe") & (sub.metric == "probe_accuracy")]["mean"]
            where = "carried state" if depth < 0 else f"depth {depth}"
            ax.set_title(f"{task} · {m}\n{where}" + (f", probe accuracy {acc.iloc[0]:.2f}" if len(acc) else ""))
            ax.set_xlabel("steering scale α")
        axes.flat[0].set_ylabel("answer moved (1 - normalized)")
        axes.flat[0].legend()
        fig.suptitle("steering along the probe direction by α class-mean gaps toward the other label")
    return fig


# ----------------------------------------------------------------------------- per experiment
BY_EXPERIMENT = {
    "residual": ("patching-heatmap",),
    "feedback-swap": ("ablation-bars",),
    "state-replacement": ("ablation-bars",),
    "gate-ablation": ("ablation-bars",),
    "probe-direction": ("decodable-vs-used", "steering-sweep"),
    "attribution": ("atp-heatmap", "atp-parity"),
    "das": ("das-iia",),
}


def draw_for(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Draw the figures of the experiment(s) in `summary` into `out_dir` as PNG; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = dict.fromkeys(n for e in summary["experiment"].unique() for n in BY_EXPERIMENT.get(e, ()))
    paths = []
    for name in names:
        if name == "atp-parity" and not (summary["method"] == "exact").any():
            continue  # no --check: nothing to compare
        fig = get_figure(name)(summary)
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=150, bbox_inches="tight")
        paths.append(path)
    return paths
