"""Fig. 3-style contraction diagnostic: validation loss (linear) and carried-state change (log)
against the number of feedback passes. Drawn from the table of `fbt-probe diagnose contraction`;
several runs (column `run`) are overlaid, e.g. two schedules side by side. A dotted line marks the
deepest pass a run was trained at; runs trained to different depths each get one, in their colour. A
run trained with one pass only (the no-feedback baseline) has no trained feedback depth and gets no
marker: every pass it is run for lies outside its training."""

from __future__ import annotations

import pandas as pd

from fbt_probe.figures.style import paper_style, subplots


def fig3(table: pd.DataFrame, trained_passes: int | dict | None = None):
    """`trained_passes`: one depth for every run, or {run: its deepest trained pass}."""
    with paper_style():
        fig, axes = subplots(1, 2, panel_height_in=2.4)
        loss_ax, delta_ax = axes[0]
        runs = table["run"].unique() if "run" in table else [None]
        colours = {}
        for run in runs:
            t = table if run is None else table[table["run"] == run]
            label = None if run is None else (f"{run} ({t['schedule'].iloc[0]})" if "schedule" in t else str(run))
            colours[run] = loss_ax.plot(t["pass"], t["val_loss"], marker="o", ms=2.5, label=label)[0].get_color()
            d = t.dropna(subset=["state_change"])
            delta_ax.semilogy(d["pass"], d["state_change"].clip(lower=1e-12), marker="o", ms=2.5, label=label)
        loss_ax.set(
            title="Validation loss after k feedback passes", xlabel="feedback passes k", ylabel="loss (nats per token)"
        )
        delta_ax.set(
            title="Change of the carried state per pass",
            xlabel="feedback passes k",
            ylabel="mean ‖h(k) − h(k−1)‖ (log scale)",
        )
        if not isinstance(trained_passes, dict):
            trained_passes = {None: trained_passes} if trained_passes else {}
        marks = {}  # depth -> the runs trained to it (more than one pass)
        for run, depth in trained_passes.items():
            if depth is not None and int(depth) > 1:
                marks.setdefault(int(depth), []).append(run)
        every = None in trained_passes or set(runs) <= {r for at in marks.values() for r in at}
        for i, (depth, at) in enumerate(sorted(marks.items())):
            one = len(marks) == 1 and every  # one depth for every run drawn: one grey line says it
            colour = "grey" if one else colours.get(at[0], "grey")
            text = " deepest trained pass" if one else f" {', '.join(map(str, at))}: trained to {depth} passes"
            for ax in (loss_ax, delta_ax):  # labels stacked from the top, so two depths never overprint
                ax.axvline(depth, color=colour, ls=":", lw=1)
                ax.text(
                    depth,
                    0.99 - 0.07 * i,
                    text,
                    va="top",
                    fontsize=6.5,
                    color=colour,
                    transform=ax.get_xaxis_transform(),
                )
        if runs[0] is not None:
            loss_ax.legend(frameon=False, fontsize=6.5)
        return fig
