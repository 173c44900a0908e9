"""The general language model's Fig. 3 and Fig. 4, drawn from `fbt-probe diagnose passes`'s summary
table (one row per run x pass: `loss`, `loss_low`, `loss_high`, `change`, `change_low`,
`change_high`, with `schedule`, `seed` and `baseline`).

Fig. 3: held-out loss and the carried state's change against feedback passes, one colour per
schedule, one line per seed, a band for the interval over held-out documents. Fig. 4: held-out
loss against the feedback passes at prefill (0 = standard), the feedback models per schedule and
the no-feedback baseline's standard loss as a dashed line (its fusion was never trained, so its
passes are not drawn)."""

from __future__ import annotations

import pandas as pd

from fbt_probe.figures.style import paper_style, subplots

COLOURS = {"1:0.75,2:0.22,3:0.03": "tab:purple", "1:0.75,2:0.25": "tab:green"}
STYLES = ("-", "--", ":", "-.")


def _label(schedule: str) -> str:
    names = {"1:0.75,2:0.22,3:0.03": "75/22/3", "1:0.75,2:0.25": "75/25"}
    return names.get(schedule, schedule)


def fig3_lm(table: pd.DataFrame, max_pass: int | None = None):
    """Two panels over passes k: held-out loss (linear) and mean ‖s(k) − s(k−1)‖ (log)."""
    t = table[~table["baseline"].astype(bool)]
    if max_pass is not None:
        t = t[t["pass"] <= max_pass]
    with paper_style():
        fig, axes = subplots(1, 2, panel_height_in=2.4)
        loss_ax, delta_ax = axes[0]
        seeds = sorted(t["seed"].unique())
        for schedule, by in t.groupby("schedule", sort=True):
            colour = COLOURS.get(schedule)
            for i, seed in enumerate(seeds):
                r = by[by["seed"] == seed].sort_values("pass")
                if r.empty:
                    continue
                label = f"{_label(schedule)}, seed {seed}"
                line = loss_ax.plot(r["pass"], r["loss"], ls=STYLES[i % len(STYLES)], color=colour, lw=1, label=label)
                colour = line[0].get_color()
                loss_ax.fill_between(r["pass"], r["loss_low"], r["loss_high"], color=colour, alpha=0.12, lw=0)
                d = r.dropna(subset=["change"])
                delta_ax.semilogy(
                    d["pass"], d["change"].clip(lower=1e-12), ls=STYLES[i % len(STYLES)], color=colour, lw=1
                )
                delta_ax.fill_between(
                    d["pass"], d["change_low"].clip(lower=1e-12), d["change_high"], color=colour, alpha=0.12, lw=0
                )
        for ax in (loss_ax, delta_ax):
            ax.axvline(3, color="grey", ls=":", lw=1)
            ax.text(
                3,
                0.99,
                " deepest trained pass",
                va="top",
                fontsize=6.5,
                color="grey",
                transform=ax.get_xaxis_transform(),
            )
        loss_ax.set(title="Held-out loss after k passes", xlabel="passes k", ylabel="loss (nats per token)")
        delta_ax.set(
            title="Change of the carried state per pass", xlabel="passes k", ylabel="mean ‖s(k) − s(k−1)‖ (log)"
        )
        loss_ax.legend(frameon=False, fontsize=6)
        return fig


def fig4_lm(table: pd.DataFrame, max_prefill: int = 4):
    """Held-out loss against feedback passes at prefill p = 0..max_prefill (pass p + 1)."""
    with paper_style():
        fig, axes = subplots(1, 1, panel_height_in=2.6)
        ax = axes[0][0]
        fb = table[~table["baseline"].astype(bool) & (table["pass"] <= max_prefill + 1)]
        seeds = sorted(table["seed"].unique())
        for schedule, by in fb.groupby("schedule", sort=True):
            colour = COLOURS.get(schedule)
            for i, seed in enumerate(seeds):
                r = by[by["seed"] == seed].sort_values("pass")
                if r.empty:
                    continue
                x = r["pass"] - 1
                line = ax.plot(
                    x,
                    r["loss"],
                    marker="o",
                    ms=3,
                    ls=STYLES[i % len(STYLES)],
                    color=colour,
                    lw=1,
                    label=f"{_label(schedule)}, seed {seed}",
                )
                colour = line[0].get_color()
                ax.errorbar(
                    x,
                    r["loss"],
                    yerr=[r["loss"] - r["loss_low"], r["loss_high"] - r["loss"]],
                    fmt="none",
                    color=colour,
                    lw=0.8,
                )
        base = table[table["baseline"].astype(bool) & (table["pass"] == 1)]
        for i, (_, r) in enumerate(base.sort_values("seed").iterrows()):
            ax.axhline(
                r["loss"],
                color="black",
                ls=STYLES[i % len(STYLES)],
                lw=0.8,
                label=f"no-feedback baseline, seed {r['seed']} (standard)",
            )
        ax.set(
            title="Held-out loss against feedback passes at prefill",
            xlabel="feedback passes at prefill (0 = standard)",
            ylabel="loss (nats per token)",
            xticks=range(max_prefill + 1),
        )
        ax.legend(frameon=False, fontsize=6)
        return fig
