"""How far to trust an attribution map: exact patching on the K cells AtP ranks highest plus K random
others (`fbt-probe patch --experiment attribution --check K`), then Spearman rank correlation and the
worst absolute error of AtP against exact patching, with BCa group-bootstrap CIs (groups of pairs
resampled together; `fbt_probe.stats`).

A cell is (hook, pass, position) within one task × length × mode × direction. AtP ranks cells by the
size of their estimated effect |mean over pairs of (LD − LD without patch)| (LD units, defined even
when a model does not separate a pair). Both metrics are compared: `logit_diff` (always defined) and
`normalized` (tiny-gap pairs excluded, as everywhere).
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from fbt_probe.interventions.attribution import exact_cells, traced_attribution
from fbt_probe.interventions.forwards import forwards
from fbt_probe.modes import Mode
from fbt_probe.stats import bca, group_weights

GROUP = ["task", "length_knob", "mode", "hook_rule", "direction"]
PARQUET_ONLY = ("atp_rows",)  # every sample × cell: ~200 bytes a row as CSV, a million rows in the tiny study
CELL = ["hook", "pass_index", "position"]
DIRECTIONS = ("denoising", "noising")


def _base(rows: pd.DataFrame, metric: str) -> pd.Series:
    """The metric's value with no patch: corrupt LD / 0 for denoising, clean LD / 1 for noising."""
    den = rows["direction"] == "denoising"
    if metric == "normalized":
        return pd.Series(np.where(den, 0.0, 1.0), index=rows.index)
    return pd.Series(np.where(den, rows["corrupt_logit_diff"], rows["clean_logit_diff"]), index=rows.index)


def ranked_cells(atp: pd.DataFrame) -> list[tuple]:
    """One group's cells, largest AtP effect first (pair-averaged, LD units); ties in cell order."""
    eff = atp.assign(effect=atp["logit_diff"] - _base(atp, "logit_diff"))
    per_pair = eff.groupby(CELL + ["pair_id"], sort=True)["effect"].mean()
    cell = per_pair.groupby(level=[0, 1, 2], sort=True).mean().abs()
    order = np.argsort(-cell.to_numpy(), kind="stable")
    return [tuple(cell.index[i]) for i in order]


def choose_cells(atp: pd.DataFrame, k: int, seed: int) -> dict[tuple, str]:
    """{cell: 'top' | 'random'}: the k cells AtP ranks highest and k random cells of the rest."""
    ranked = ranked_cells(atp)
    chosen = {c: "top" for c in ranked[:k]}
    rest = ranked[k:]
    if rest:
        g = atp.iloc[0]
        key = [seed, zlib.crc32(f"{g['task']}|{g['mode']}|{g['direction']}".encode()), int(g["length_knob"])]
        pick = np.random.default_rng(key).choice(len(rest), size=min(k, len(rest)), replace=False)
        chosen.update({rest[i]: "random" for i in sorted(pick)})
    return chosen


def attribution(
    fw,
    batches,
    mode: Mode = Mode("standard"),
    min_gap: float = 0.1,
    hooks=None,
    last_k: int | None = None,
    check: int = 0,
    seed: int = 0,
    batch_size: int = 64,
    directions=DIRECTIONS,
) -> pd.DataFrame:
    """AtP rows (method `atp`) and, with `check` = K > 0, exact rows (method `exact`, column
    `check_cell` = top | random) for the K top and K random cells of each task × length × direction."""
    fw = forwards(fw)
    batches = list(batches)
    atp, traces = traced_attribution(fw.model, batches, mode, min_gap, hooks, last_k, directions, None, keep=check > 0)
    if check <= 0:
        return atp
    out = [atp]
    for (task, knob, direction), g in atp.groupby(["task", "length_knob", "direction"], sort=True):
        chosen = choose_cells(g, check, seed)
        cells = [(c[0], int(c[1]), int(c[2])) for c in chosen]
        for batch, tr, serial in traces:
            if (str(batch.meta["task"].iloc[0]), int(batch.meta["length_knob"].iloc[0])) != (task, knob):
                continue
            rows = exact_cells(fw, batch, tr, mode, cells, direction, serial, min_gap, batch_size)
            rows["check_cell"] = [
                chosen[(h, k, p)] for h, k, p in zip(rows["hook"], rows["pass_index"], rows["position"])
            ]
            out.append(rows)
    return pd.concat(out, ignore_index=True)


# ----------------------------------------------------------------------------- the parity table
def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(rankdata(a), rankdata(b))[0, 1])


def _stats(A: np.ndarray, E: np.ndarray) -> tuple[float, float]:
    """Spearman and worst absolute error of the cell means (mean over the pairs that have a value)."""
    a, e = _nanmean(A), _nanmean(E)
    err = np.abs(a - e)
    return _spearman(a, e), float(np.nanmax(err)) if np.any(~np.isnan(err)) else float("nan")


def _nanmean(M: np.ndarray, axis: int = 1) -> np.ndarray:
    counts = (~np.isnan(M)).sum(axis)
    sums = np.nansum(M, axis)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _weighted_means(M: np.ndarray, W: np.ndarray) -> np.ndarray:
    """[cells, samples]: each cell's mean over the pairs that have a value, pairs weighted by W's rows
    (NaN where no weighted pair has one)."""
    have = ~np.isnan(M)
    counts = have @ W.T
    return (np.where(have, M, 0.0) @ W.T) / np.where(counts > 0, counts, np.nan)


def _boot_stats(A: np.ndarray, E: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_stats` of every reweighted sample: row i of W [n_resamples, pairs] weights the pairs (a group
    bootstrap resample, or a leave-one-group-out jackknife sample); the cell means of all samples in
    one product, ranks of every NaN-free sample in one `rankdata`, the correlation per sample as
    `_spearman` computes it. -> (Spearman [n], worst [n])."""
    a, e = _weighted_means(A, W), _weighted_means(E, W)
    err = np.abs(a - e)
    some = np.any(~np.isnan(err), axis=0)
    worst = np.full(W.shape[0], np.nan)
    worst[some] = np.nanmax(err[:, some], axis=0)
    rho = np.full(W.shape[0], np.nan)
    clean = ~np.any(np.isnan(a) | np.isnan(e), axis=0)
    if a.shape[0] >= 3:
        ra, re = rankdata(a[:, clean], axis=0), rankdata(e[:, clean], axis=0)
        flat = (np.ptp(a[:, clean], axis=0) == 0) | (np.ptp(e[:, clean], axis=0) == 0)
        rho[np.flatnonzero(clean)] = [
            np.nan if f else float(np.corrcoef(x, y)[0, 1]) for x, y, f in zip(ra.T, re.T, flat)
        ]
    for j in np.flatnonzero(~clean):  # cells without a value in this sample: dropped, as _spearman drops them
        rho[j] = _spearman(a[:, j], e[:, j])
    return rho, worst


def _jackknife_weights(groups: np.ndarray) -> np.ndarray:
    """[groups, pairs]: sample g leaves group g out."""
    codes = np.unique(groups, return_inverse=True)[1].reshape(-1)
    return (codes[None, :] != np.arange(codes.max() + 1)[:, None]).astype(float)


def _matrices(ex: pd.DataFrame, at: pd.DataFrame, metric: str):
    """[cells, pairs] of pair-averaged values for AtP and exact, on the cells exact patching ran."""
    keys = CELL + ["row"]
    merged = ex[keys + ["pair_id", "check_cell", metric]].merge(
        at[keys + [metric]], on=keys, suffixes=("_exact", "_atp")
    )
    per_pair = merged.groupby(CELL + ["pair_id"], sort=True)[[f"{metric}_exact", f"{metric}_atp"]].mean()
    E = per_pair[f"{metric}_exact"].unstack("pair_id")
    A = per_pair[f"{metric}_atp"].unstack("pair_id").reindex(index=E.index, columns=E.columns)
    reasons = merged.drop_duplicates(CELL).set_index(CELL)["check_cell"].reindex(E.index)
    diff = (merged[f"{metric}_exact"] - merged[f"{metric}_atp"]).abs()
    worst_rows = float(diff.max()) if diff.notna().any() else float("nan")  # NaN: no pair above the gap
    return A.to_numpy(float), E.to_numpy(float), reasons.to_numpy(), E.index, E.columns.to_numpy(), worst_rows


def parity_table(wide: pd.DataFrame, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """One row per task × length × mode × direction × metric with the parity of AtP and exact patching
    on the checked cells; empty when no check ran."""
    if "method" not in wide or not (wide["method"] == "exact").any():
        return pd.DataFrame()
    rows = []
    for key, ex in wide[wide["method"] == "exact"].groupby(GROUP, sort=True):
        at = wide[(wide["method"] == "atp")].merge(pd.DataFrame([dict(zip(GROUP, key))]), on=GROUP)
        groups_of = ex.groupby("pair_id")["group_id"].first() if "group_id" in ex.columns else None
        for metric in ("logit_diff", "normalized"):
            A, E, reasons, cells, pairs, worst_rows = _matrices(ex, at, metric)
            keep = ~np.all(np.isnan(E), axis=0)  # pairs with a value (normalized: above the gap)
            A, E, pairs = A[:, keep], E[:, keep], pairs[keep]
            rec = dict(
                zip(GROUP, key),
                metric=metric,
                n_cells=len(cells),
                n_top=int((reasons == "top").sum()),
                n_pairs=int(keep.sum()),
            )
            if keep.sum() == 0:
                rows.append({**rec, "spearman": np.nan, "worst_abs_error": np.nan, "worst_abs_error_rows": np.nan})
                continue
            rho, worst = _stats(A, E)
            groups = groups_of.reindex(pairs).to_numpy() if groups_of is not None else pairs
            b_rho, b_worst = _boot_stats(A, E, group_weights(groups, n_boot, seed))
            j_rho, j_worst = _boot_stats(A, E, _jackknife_weights(groups))
            rho_lo, rho_hi = bca(rho, b_rho, j_rho, ci)
            worst_lo, worst_hi = bca(worst, b_worst, j_worst, ci)
            a, e = _nanmean(A), _nanmean(E)
            if metric == "normalized":
                base = 0.0 if key[-1] == "denoising" else 1.0
            else:  # LD units: the unpatched LD is the same for every cell of a pair
                col = "corrupt_logit_diff" if key[-1] == "denoising" else "clean_logit_diff"
                base = float(ex.groupby("pair_id")[col].mean().reindex(pairs).mean())
            top = reasons == "top"
            agree = np.sign(a[top] - base) == np.sign(e[top] - base)
            worst_i = int(np.nanargmax(np.abs(a - e)))
            rows.append(
                {
                    **rec,
                    "spearman": rho,
                    "spearman_ci_low": rho_lo,
                    "spearman_ci_high": rho_hi,
                    "worst_abs_error": worst,
                    "worst_ci_low": worst_lo,
                    "worst_ci_high": worst_hi,
                    "worst_abs_error_rows": worst_rows,
                    "worst_cell": "{}@pass{}:pos{}".format(*cells[worst_i]),
                    "sign_agreement_top": float(np.mean(agree)) if agree.size else np.nan,
                    "exact_range": float(np.nanmax(e) - np.nanmin(e)),
                }
            )
    return pd.DataFrame(rows)


def split_rows(long: pd.DataFrame, tables: dict) -> tuple[pd.DataFrame, dict]:
    """(rows of the checked cells, both methods, for `rows.*`; tables + `atp_rows`: every AtP row)."""
    checked = long[long["method"] == "exact"][GROUP + CELL].drop_duplicates()
    small = long.merge(checked, on=GROUP + CELL) if len(checked) else long.iloc[:0]
    return small.reset_index(drop=True), {**tables, "atp_rows": long[long["method"] == "atp"].reset_index(drop=True)}
