"""The feature-swap curve, drawn from `fractions.parquet` (`fbt-probe sae analyze`): the share of the
full-state swap's effect that the top-k label latents carry, against k, with the random-latent
control at the same k; one panel per task; bars are BCa group-bootstrap 95 % intervals."""

from __future__ import annotations

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.figures.style import paper_style, subplots

NEED = {"task", "condition", "k", "fraction", "ci_low", "ci_high"}
LINES = (("features", "top-k label latents", "C0", "o"), ("random", "k random active latents", "0.55", "s"))


def sae_swap(table: pd.DataFrame, model_label: str = ""):
    missing = NEED - set(table.columns)
    if missing:
        raise FbtError(f"sae-swap: not an SAE fractions table (missing columns {sorted(missing)})")
    tasks = sorted(table["task"].unique())
    if not tasks:
        raise FbtError("sae-swap: the table has no rows")
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
