"""Fig. 3-style contraction diagnostic: validation loss (linear) and carried-state change (log)
against the number of feedback passes. Drawn from the table of `fbt-probe diagnose contraction`;
several runs (column `run`) are overlaid, e.g. two schedules side by side."""
from __future__ import annotations

import pandas as pd

from fbt_probe.figures.style import paper_style, subplots


def fig3(table: pd.DataFrame, trained_passes: int | None = None):
    with paper_style():
        fig, axes = subplots(1, 2, panel_height_in=2.4)
        loss_ax, delta_ax = axes[0]
        runs = table["run"].unique() if "run" in table else [None]
        for run in runs:
            t = table if run is None else table[table["run"] == run]
            label = None if run is None else (f"{run} ({t['schedule'].iloc[0]})" if "schedule" in t else str(run))
            loss_ax.plot(t["pass"], t["val_loss"], marker="o", ms=2.5, label=label)
            d = t.dropna(subset=["state_change"])
            delta_ax.semilogy(d["pass"], d["state_change"].clip(lower=1e-12), marker="o", ms=2.5, label=label)
        loss_ax.set(title="Validation loss after k feedback passes", xlabel="feedback passes k", ylabel="loss (nats per token)")
        delta_ax.set(title="Change of the carried state per pass", xlabel="feedback passes k",
                     ylabel="mean ‖h(k) − h(k−1)‖ (log scale)")
        if trained_passes:
            for ax in (loss_ax, delta_ax):
                ax.axvline(trained_passes, color="grey", ls=":", lw=1)
                ax.text(trained_passes, ax.get_ylim()[1], " deepest trained pass", va="top", fontsize=6.5, color="grey")
        if runs[0] is not None:
            loss_ax.legend(frameon=False, fontsize=6.5)
        return fig
