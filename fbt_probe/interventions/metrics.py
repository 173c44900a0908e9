"""Metrics over minimal pairs, tidy rows, and bootstrap summaries.

Each result row is one sample of a pair (its *clean* run) under one intervention. Its logit
difference is oriented to that sample's label: LD = logit[own label word] - logit[other label word]
at the final position. `clean_logit_diff` is LD of the sample's own unpatched run,
`corrupt_logit_diff` LD (same orientation) of its partner's unpatched run, and

    normalized = (patched - corrupt) / (clean - corrupt)

so 1 = behaves like the clean sample, 0 = like its partner. For denoising-style patches (feedback
swap, residual denoising) the patched run is the partner's tokens with the clean sample's values
patched in: 1 = full recovery. For ablations and noising the patched run is the clean sample's own
tokens: 1 = no effect, 0 = as if it were its partner. Rows whose |clean - corrupt| < min_gap are
flagged `tiny_gap` and left out of every `normalized` summary (the count is reported).

A row's `normalized` is that ratio for one sample; a summary's is a **ratio of means over pairs**,
mean(patched - corrupt) / mean(clean - corrupt) over the kept pairs (`summarize`), so that no pair
whose gap barely clears min_gap can blow the mean up (a mean of per-pair ratios of 8.75 [1.35,
20.14] where the ratio of means reads about 1). It is reported only where the pairs' mean gap has
its group-bootstrap interval above min_gap (columns `gap`, `gap_low`, `gap_high`); elsewhere the
summary's `normalized` is NaN: the model does not separate the pair's answers, so there is nothing
to normalize by.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.stats import group_bootstrap_means, group_bootstrap_ratios, group_proportion

METRICS = ("logit_diff", "normalized", "kl", "accuracy", "choice", "probe_accuracy", "iia", "iia_choice")
METRIC_HELP = {
    "logit_diff": "logit[own label word] - logit[other label word] at the final position",
    "normalized": (
        "(patched - corrupt) / (clean - corrupt) of logit_diff; tiny-gap pairs excluded; a summary's is the ratio "
        "of the means over pairs, reported where the mean gap's interval is above min_gap"
    ),
    "kl": "KL(clean || patched) of the next-token distribution at the final position (nats)",
    "accuracy": "top-1 over the whole vocabulary is the clean sample's label word",
    "choice": "the clean sample's label word beats the other label word (logit_diff > 0)",
    "probe_accuracy": "held-out (cross-fitted) linear probe predicts the sample's label",
    "iia": "DAS: after the interchange, top-1 over the whole vocabulary is the source sample's label word",
    "iia_choice": "DAS: after the interchange, the source sample's label word beats the other label word",
}
# metrics whose value per sample is 0/1: their summaries are proportions with a Wilson interval at
# n = distinct groups (the pairs of a group share a context, so the group is the independent unit);
# every other metric is continuous and gets the group bootstrap of its mean (docs/statistics.md)
PROPORTIONS = frozenset({"accuracy", "choice", "probe_accuracy", "iia", "iia_choice"})
# columns every row carries (defaults where an experiment has no such axis)
AXES = {
    "experiment": "",
    "condition": "",
    "mode": "",
    "hook_rule": "",
    "decoding": "prefill",
    "direction": "",
    "method": "",
    "depth": -1,
    "position": -1,
    "scale": 0.0,
}
SUMMARY_KEYS = (
    "experiment",
    "condition",
    "mode",
    "hook_rule",
    "decoding",
    "direction",
    "method",
    "task",
    "length_knob",
    "depth",
    "position",
    "differs",
    "scale",
    "pass_index",
    "subspace_dim",
    "metric",
)


def logit_diff(logits: torch.Tensor, target: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """logits: [N, d_vocab] at the final position -> [N]."""
    idx = torch.arange(logits.shape[0], device=logits.device)
    return logits[idx, target] - logits[idx, other]


def kl_div(clean: torch.Tensor, patched: torch.Tensor) -> torch.Tensor:
    """KL(P_clean || P_patched) per row (float64 log-softmax). [N, d_vocab] x2 -> [N]."""
    lp = torch.log_softmax(clean.double(), -1)
    lq = torch.log_softmax(patched.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def score(batch, ref: torch.Tensor, patched: torch.Tensor, min_gap: float, **axes) -> pd.DataFrame:
    """Wide rows for one intervention of a batch.

    ref: [N, d_vocab] the batch's unpatched final-position logits; patched: [N, d_vocab] the
    intervened logits of row i's *clean* sample (whatever tokens the patched run used)."""
    tgt, oth = batch.target.to(ref.device), batch.other.to(ref.device)
    partner = batch.partner.to(ref.device)
    clean = logit_diff(ref, tgt, oth)
    corrupt = logit_diff(ref[partner], tgt, oth)
    ld = logit_diff(patched, tgt, oth)
    gap = clean - corrupt
    tiny = gap.abs() < min_gap
    safe = torch.where(tiny, torch.ones_like(gap), gap)
    cols = {
        "clean_logit_diff": clean,
        "corrupt_logit_diff": corrupt,
        "tiny_gap": tiny,
        "logit_diff": ld,
        "normalized": torch.where(tiny, torch.full_like(gap, float("nan")), (ld - corrupt) / safe),
        "kl": kl_div(ref, patched),
        "accuracy": (patched.argmax(-1) == tgt).double(),
        "choice": (ld > 0).double(),
    }
    data = {c: batch.meta[c].to_numpy() for c in batch.meta.columns}
    data.update({k: np.full(len(batch.meta), v) for k, v in {**AXES, **axes}.items()})
    data.update(
        {k: v.cpu().numpy() if v.dtype == torch.bool else v.detach().double().cpu().numpy() for k, v in cols.items()}
    )
    return pd.DataFrame(data)


def to_long(wide: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """One row per sample × condition × metric (column `metric`, value in `value`)."""
    metrics = [m for m in metrics if m in wide.columns]
    ids = [c for c in wide.columns if c not in metrics]
    long = wide.melt(id_vars=ids, value_vars=metrics, var_name="metric", value_name="value")
    # a metric a row does not have is NaN; keep NaN only where it means "tiny gap" (normalized)
    return long[long["value"].notna() | (long["metric"] == "normalized")].reset_index(drop=True)


def bootstrap_ci(
    values, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None
) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap of the mean over the given units, NaN dropped; with
    `groups` (one label per value) the groups are resampled, not the units (`fbt_probe.stats`)."""
    return bootstrap_cis([values], n_boot, ci, seed, None if groups is None else [groups])[0]


def bootstrap_cis(
    arrays, n_boot: int = 1000, ci: float = 0.95, seed: int = 0, groups=None
) -> list[tuple[float, float, float]]:
    """`bootstrap_ci` of each array, computed together (arrays with one group structure share their
    resamples; `fbt_probe.stats.group_bootstrap_means`)."""
    return group_bootstrap_means(arrays, groups, n_boot, ci, seed)


def _lengths(seen, at: int) -> dict[tuple, str]:
    """{condition key: the lengths its row covers}: its own length, or for a pooled key
    (length_knob = -1) every length of the keys that differ from it only there."""
    by_rest: dict[tuple, set] = {}
    for key in seen:
        if key[at] != -1:
            by_rest.setdefault(key[:at] + key[at + 1 :], set()).add(int(key[at]))
    return {
        key: ",".join(map(str, sorted(by_rest.get(key[:at] + key[at + 1 :], ()))))
        if key[at] == -1
        else str(int(key[at]))
        for key in seen
    }


def _split_by_keys(per_pair: pd.Series, n_keys: int) -> dict[tuple, np.ndarray]:
    """{condition key: its pairs' values} of a Series indexed (sorted) by the keys + pair_id: the
    groups are contiguous runs of the index, cut at the rows where any key changes (iterating a
    groupby over tens of thousands of AtP cells was most of a summary's time)."""
    if per_pair.empty:
        return {}
    levels = [per_pair.index.get_level_values(i).to_numpy() for i in range(n_keys)]
    change = np.zeros(len(per_pair), dtype=bool)
    change[0] = True
    for lv in levels:
        change[1:] |= lv[1:] != lv[:-1]
    starts = np.flatnonzero(change)
    chunks = np.split(per_pair.to_numpy(), starts[1:])
    return {tuple(lv[i] for lv in levels): v for i, v in zip(starts, chunks)}


def summarize(
    long: pd.DataFrame,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    pool_lengths: bool = True,
    min_gap: float = 0.1,
) -> pd.DataFrame:
    """Mean and 95 % CI for every condition × metric (per length knob, and pooled over lengths as
    length_knob = -1 for final-position experiments; `lengths` names what a row pools).

    A pair's value is the mean over its rows (its two orientations, both samples). The independent
    unit is the group (`group_id`: the pairs of one group share a context; without the column, the
    pair). A proportion (`PROPORTIONS`: a 0/1 value per sample) gets the Wilson interval at n =
    `n_groups` (`fbt_probe.stats.group_proportion`); a continuous metric the percentile group
    bootstrap of its mean (pairs of one group resampled together). `interval` names which. Tiny-gap
    rows are dropped from `normalized` first and counted in `n_excluded`; `normalized` is then the
    ratio of means over the kept pairs, mean(patched - corrupt) / mean(clean - corrupt), with the
    normal group bootstrap (`fbt_probe.stats.group_bootstrap_ratios`), NaN where the mean gap's
    interval does not lie above `min_gap` (its `gap`, `gap_low`, `gap_high` say so). A table
    without the logit-difference columns takes every gap as 1 (the mean of the values)."""
    keys = [k for k in SUMMARY_KEYS if k in long.columns]
    frames = [long]
    if pool_lengths:
        final = long[long["position"] == -1]
        if len(final):
            frames.append(final.assign(length_knob=-1))
    data = pd.concat(frames, ignore_index=True)
    excluded = (data["metric"] == "normalized") & data["tiny_gap"].astype(bool)
    n_excl = data[excluded].groupby(keys, sort=True)["pair_id"].nunique()
    n_excl = {
        (k if isinstance(k, tuple) else (k,)): int(v) for k, v in n_excl.items()
    }  # Series.get per key: most of the time
    kept = data[~excluded]
    if {"clean_logit_diff", "corrupt_logit_diff"} <= set(kept.columns):
        gap = (kept["clean_logit_diff"] - kept["corrupt_logit_diff"]).astype(np.float64)
    else:
        gap = pd.Series(1.0, index=kept.index)
    is_norm = (kept["metric"] == "normalized").to_numpy()
    kept = kept.assign(_num=np.where(is_norm, kept["value"] * gap, np.nan), _den=np.where(is_norm, gap, np.nan))
    per_pair = kept.groupby(keys + ["pair_id"], sort=True)["value"].mean()
    values = _split_by_keys(per_pair, len(keys))
    norm_rows = kept[is_norm & kept["value"].notna().to_numpy()]
    per_norm = norm_rows.groupby(keys + ["pair_id"], sort=True)[["_num", "_den"]].mean()
    nums = _split_by_keys(per_norm["_num"], len(keys))
    dens = _split_by_keys(per_norm["_den"], len(keys))
    if "group_id" in kept.columns:  # pairs of one group share a context: the group is the resampling unit
        groups = _split_by_keys(kept.groupby(keys + ["pair_id"], sort=True)["group_id"].first(), len(keys))
    else:
        groups = {}
    lengths = _lengths(set(values) | set(n_excl), keys.index("length_knob")) if "length_knob" in keys else {}
    out = []
    order = sorted(set(values) | set(n_excl), key=str)
    empty = np.array([])
    at = keys.index("metric")
    proportion = [key[at] in PROPORTIONS for key in order]
    ratio = [key for key, prop in zip(order, proportion) if not prop and key[at] == "normalized"]
    continuous = [key for key, prop in zip(order, proportion) if not prop and key[at] != "normalized"]
    boot = bootstrap_cis(
        [values.get(key, empty) for key in continuous],
        n_boot,
        ci,
        seed,
        [groups.get(key) for key in continuous] if groups else None,
    )
    boot = dict(zip(continuous, boot))
    norm_groups = (
        _split_by_keys(norm_rows.groupby(keys + ["pair_id"], sort=True)["group_id"].first(), len(keys))
        if ("group_id" in norm_rows.columns)
        else {}
    )
    ratios = group_bootstrap_ratios(
        [nums.get(key, empty) for key in ratio],
        [dens.get(key, empty) for key in ratio],
        [norm_groups.get(key) for key in ratio] if norm_groups else None,
        n_boot,
        ci,
        seed,
        min_den=min_gap,
    )
    ratios = dict(zip(ratio, ratios))
    for key, prop in zip(order, proportion):
        row = dict(zip(keys, key))
        v = values.get(key, empty)
        g = groups.get(key)
        gaps = (float("nan"),) * 3
        if prop:
            mean, lo, hi, n_groups = group_proportion(v, g, ci)
        elif key in ratios:
            mean, lo, hi, *gaps = ratios[key]
            n_groups = int(len(set(np.asarray(g)[~np.isnan(v)]))) if g is not None else int(np.sum(~np.isnan(v)))
        else:
            mean, lo, hi = boot[key]
            n_groups = int(len(set(np.asarray(g)[~np.isnan(v)]))) if g is not None else int(np.sum(~np.isnan(v)))
        row.update(
            mean=mean,
            ci_low=lo,
            ci_high=hi,
            interval="wilson" if prop else "group-bootstrap-ratio" if key in ratios else "group-bootstrap",
            gap=gaps[0],
            gap_low=gaps[1],
            gap_high=gaps[2],
            n_pairs=int(np.sum(~np.isnan(v))),
            n_groups=n_groups,
            lengths=lengths.get(key, ""),
            n_excluded=n_excl.get(key, 0),
        )
        out.append(row)
    return pd.DataFrame(out).sort_values(keys, kind="stable").reset_index(drop=True)
