"""One-line summaries of the experiments for the command line: the pooled normalized effects, the
attribution parity check, DAS, and the pairs left out for a tiny gap."""

from __future__ import annotations

import pandas as pd


def _ci(mean, lo, hi) -> str:
    return "n/a" if pd.isna(mean) else f"{mean:.2f} [{lo:.2f}, {hi:.2f}]"


def parity_lines(parity: pd.DataFrame) -> list[str]:
    """Per mode × task × direction: the normalized comparison, or LD units where no pair has a gap."""
    out = []
    if parity is None or parity.empty:
        return ["attribution: no parity check (pass --check K to patch the top-K and K random cells exactly)"]
    for key, g in parity.groupby(["mode", "task", "length_knob", "direction"], sort=True):
        r = g.set_index("metric")
        m = "normalized" if "normalized" in r.index and not pd.isna(r.loc["normalized", "spearman"]) else "logit_diff"
        r = r.loc[m]
        out.append(
            f"{key[0]:<12} {key[1]:<11} length {key[2]:<3} {key[3]:<9} AtP vs exact on {int(r.n_cells)} cells ({m}): Spearman "
            f"{_ci(r.spearman, r.get('spearman_ci_low'), r.get('spearman_ci_high'))}, worst |error| "
            f"{r.worst_abs_error:.3g} at {r.get('worst_cell', '?')}, top-{int(r.n_top)} sign agreement "
            f"{r.get('sign_agreement_top', float('nan')):.2f}"
        )
    return out


def das_lines(summary: pd.DataFrame, folds: pd.DataFrame | None) -> list[str]:
    """Per mode × task × hook: held-out IIA for each k (DAS / random rotation), full interchange, cosine."""
    s = summary[(summary["metric"] == "iia") & (summary["length_knob"] == -1)]
    out = []
    for (mode, task, hook), g in s.groupby(["mode", "task", "condition"], sort=True):
        das = g[g.method == "das"].sort_values("subspace_dim")
        rnd = g[g.method == "random-rotation"].set_index("subspace_dim")
        full = g[g.method == "full-interchange"]
        parts = [
            f"k={int(r.subspace_dim)} {_ci(r.mean, r.ci_low, r.ci_high)} (random {rnd.loc[r.subspace_dim, 'mean']:.2f})"
            for r in das.itertuples()
            if r.subspace_dim in rnd.index
        ]
        cos = ""
        if folds is not None and len(folds):
            f = folds[
                (folds["mode"] == mode) & (folds["task"] == task) & (folds["hook"] == hook) & (folds["method"] == "das")
            ]
            if len(f):
                cos = " · cos(probe) " + ", ".join(
                    f"k={k} {v:.2f}" for k, v in f.groupby("subspace_dim")["probe_cosine"].mean().items()
                )
        head = f"full {full['mean'].iloc[0]:.2f}" if len(full) else ""
        out.append(f"{mode:<12} {task:<11} {hook}: IIA {head}; " + "; ".join(parts) + cos)
    return out


def report_lines(res) -> list[str]:
    exp = res.manifest.get("experiment")
    if exp == "attribution":
        return parity_lines(res.tables.get("parity"))
    if exp == "das":
        return das_lines(res.summary, res.tables.get("das_folds"))
    return []


def summary_lines(res) -> list[str]:
    """What `fbt-probe patch` prints of one experiment's results (before its notes)."""
    s = res.summary
    head = s[(s["metric"] == "normalized") & (s["length_knob"] == -1) & ~s["experiment"].isin(["attribution", "das"])]
    out = []
    for r in head.itertuples():
        dec = "" if r.decoding == "prefill" else f" [{r.decoding}]"
        depth = f" depth {r.depth}" if r.depth >= 0 else ""
        scale = f" α={r.scale:g}" if r.condition.startswith("steer") else ""
        out.append(
            f"{r.mode:<12} {r.task:<11} {r.condition:<13}{depth}{scale}{dec}: normalized {r.mean:+.3f} "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] over {r.n_pairs} pairs ({r.n_excluded} tiny-gap excluded)"
        )
    gap = res.manifest["tiny_gap"]
    out += report_lines(res)
    out += [
        f"{mode}: {e['excluded']} of {e['pairs']} pairs have |clean - corrupt| < {gap['min_gap']}"
        for mode, e in gap["by_mode"].items()
    ]
    return out
