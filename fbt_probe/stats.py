"""The intervals every table, figure and finding reports, in one place (docs/statistics.md states
each resampling unit; this table is its summary).

| quantity | interval | n / resampling unit |
|---|---|---|
| a proportion over samples or pairs (answer accuracy, "choice", IIA, probe accuracy, lens top-1) | Wilson score | n = distinct groups (the samples of a group share a context: one draw) |
| pooled probe accuracy (length x fold cells) | Wilson at the pooled accuracy | n = distinct groups: every sample of a group, at every length, counts as one draw |
| a continuous mean over pairs (logit difference, KL, probability) | percentile group bootstrap | groups (pairs of one group resampled together) |
| a ratio of means over pairs (normalized effect, SAE recovered fractions and shares) | normal group bootstrap, centred on the estimate; none where the denominator's interval does not clear its gap | groups |
| a rank correlation over cells (AtP against exact patching) | BCa group bootstrap | groups |
| a paired difference of two models' means (feedback - baseline) | percentile paired group bootstrap | the groups both models share, one draw applied to both |

Resamples: `N_BOOT` (1000) draws from `numpy.random.default_rng(seed)` (seed 0 unless a command
sets it). A group bootstrap draws the groups with replacement; a pair's weight in a resample is the
number of times its group was drawn, so a resample's mean is a weighted mean and arrays that share a
group structure are resampled together in one matrix product. Fold-level spread is reported as a
spread (min-max over folds), never as an interval over independent draws. No interval is widened
to contain its estimate: a Wilson interval contains its proportion and has positive width for every
n >= 1, and a normal bootstrap interval is centred on its estimate.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

N_BOOT = 1000
LEVEL = 0.95
MIN_GROUPS = 8  # no verdict, figure line or finding rests on a cell with fewer groups (docs/statistics.md)
_BOOT_CELLS = 4_000_000  # values x resamples held at once (32 MB of float64)


def z_of(level: float = LEVEL) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(correct: float, n: float, level: float = LEVEL) -> tuple[float, float, float]:
    """Proportion correct / n and its Wilson score interval (closed form; sane at 0 and 1)."""
    if n <= 0:
        return float("nan"), float("nan"), float("nan")
    z = z_of(level)
    p = correct / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / den
    # at p = 0 (p = 1) the closed form's lower (upper) end is exactly 0 (1); rounding in mid - half
    # would otherwise leave it a few ulp inside, off its own estimate
    lo = 0.0 if p <= 0 else max(0.0, mid - half)
    hi = 1.0 if p >= 1 else min(1.0, mid + half)
    return p, lo, hi


def group_wilson(p: float, n_groups: int, level: float = LEVEL) -> tuple[float, float, float]:
    """A pooled proportion p over samples that share groups: the Wilson interval with n = the number
    of distinct groups (the largest design effect: samples of a group count as one draw)."""
    if n_groups <= 0 or p != p:
        return float("nan"), float("nan"), float("nan")
    _, lo, hi = wilson(p * n_groups, n_groups, level)
    return p, lo, hi


def group_proportion(values, groups=None, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(p, low, high, n) of a proportion over units: p = the mean of `values` (each in [0, 1]: a
    sample's 0/1, or a pair's share of its samples), NaN dropped, with the Wilson interval at n = the
    distinct `groups` of the kept values (`group_wilson`; None: every value its own unit, n = the
    values). With n >= 1 the interval has positive width and contains p."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    keep = ~np.isnan(v)
    if groups is None:
        n = int(keep.sum())
    else:
        n = len(np.unique(np.asarray(groups).reshape(-1)[keep]))
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    p, lo, hi = group_wilson(float(v[keep].mean()), n, level)
    return p, lo, hi, n


def group_weights(groups, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot, n] weights of n units in group-bootstrap resamples: unit i's weight is how many times
    its group was drawn (groups drawn with replacement, as many draws as groups)."""
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    G = int(codes.max()) + 1 if codes.size else 0
    draws = np.random.default_rng(seed).integers(0, G, size=(n_boot, G))
    counts = np.zeros((n_boot, G))
    np.add.at(counts, (np.repeat(np.arange(n_boot), G), draws.reshape(-1)), 1.0)
    return counts[:, codes]


def group_bootstrap_means(
    arrays, groups=None, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> list[tuple[float, float, float]]:
    """(mean, low, high) of each array: the percentile group bootstrap of its mean, NaN dropped.

    `groups`: one label array per array (None: every value its own group, the plain bootstrap).
    Arrays with the same group structure share their resamples (computed in one product)."""
    out: list = [None] * len(arrays)
    by_structure: dict[tuple, list] = {}
    for i, values in enumerate(arrays):
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        keep = ~np.isnan(v)
        g = np.arange(v.size) if groups is None or groups[i] is None else np.asarray(groups[i]).reshape(-1)
        v, g = v[keep], g[keep]
        if v.size == 0:
            out[i] = (float("nan"),) * 3
            continue
        codes = np.unique(g, return_inverse=True)[1].reshape(-1)
        if codes.max() == 0:  # one group: nothing to resample
            out[i] = (float(v.mean()),) * 3
            continue
        by_structure.setdefault(tuple(codes), []).append((i, v))
    a = (1 - level) / 2
    for codes, items in by_structure.items():
        W = group_weights(np.array(codes), n_boot, seed)  # [n_boot, n]
        total = W.sum(1)
        step = max(1, _BOOT_CELLS // (n_boot * len(codes)))
        for c in range(0, len(items), step):
            chunk = items[c : c + step]
            means = np.stack([v for _, v in chunk]) @ W.T / total  # [arrays, n_boot]
            lo, hi = np.quantile(means, [a, 1 - a], axis=1)
            for j, (i, v) in enumerate(chunk):
                out[i] = (float(v.mean()), float(lo[j]), float(hi[j]))
    return out


def group_bootstrap_ratios(
    nums, dens, groups=None, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0, min_den: float | None = None
) -> list[tuple[float, float, float, float, float, float]]:
    """(Σnum/Σden, low, high, mean den, den low, den high) of each (num, den) array pair: a ratio of
    means over units (never a mean of ratios, so no unit's near-zero denominator drives it), with the
    normal group bootstrap θ ± z·sd of the ratio (centred on the estimate, as `ratio_ci`) and the
    percentile interval of the mean denominator, NaN pairs dropped.

    `min_den`: the ratio is reported only where the denominator's interval lies above it (the pairs'
    mean clean-corrupt gap clears the stated gap); elsewhere the ratio and its bounds are NaN (the
    denominator columns say why). With one group there is nothing to resample: the bounds are NaN,
    and with `min_den` so is the ratio. Arrays with one group structure share their resamples."""
    out: list = [None] * len(nums)
    by_structure: dict[tuple, list] = {}
    nan = float("nan")
    for i, (num, den) in enumerate(zip(nums, dens)):
        n = np.asarray(num, dtype=np.float64).reshape(-1)
        d = np.asarray(den, dtype=np.float64).reshape(-1)
        keep = ~(np.isnan(n) | np.isnan(d))
        g = np.arange(n.size) if groups is None or groups[i] is None else np.asarray(groups[i]).reshape(-1)
        n, d, g = n[keep], d[keep], g[keep]
        if n.size == 0:
            out[i] = (nan,) * 6
            continue
        theta = float(n.sum() / d.sum()) if d.sum() != 0 else nan
        codes = np.unique(g, return_inverse=True)[1].reshape(-1)
        if codes.max() == 0:  # one group: nothing to resample
            out[i] = (nan if min_den is not None else theta, nan, nan, float(d.mean()), nan, nan)
            continue
        by_structure.setdefault(tuple(codes), []).append((i, n, d, theta))
    a, z = (1 - level) / 2, z_of(level)
    for codes, items in by_structure.items():
        W = group_weights(np.array(codes), n_boot, seed)  # [n_boot, n]
        total = W.sum(1)
        step = max(1, _BOOT_CELLS // (2 * n_boot * len(codes)))
        for c in range(0, len(items), step):
            chunk = items[c : c + step]
            num_w = np.stack([n for _, n, _, _ in chunk]) @ W.T  # [arrays, n_boot]
            den_w = np.stack([d for _, _, d, _ in chunk]) @ W.T
            den_lo, den_hi = np.quantile(den_w / total, [a, 1 - a], axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                boots = num_w / den_w
            for j, (i, n, d, theta) in enumerate(chunk):
                gap = (float(d.mean()), float(den_lo[j]), float(den_hi[j]))
                if (min_den is not None and not den_lo[j] > min_den) or theta != theta:
                    out[i] = (nan, nan, nan, *gap)
                    continue
                b = boots[j]
                if not np.isfinite(b).all():
                    out[i] = (theta, nan, nan, *gap)
                    continue
                half = z * float(np.std(b, ddof=1))
                out[i] = (theta, theta - half, theta + half, *gap)
    return out


def paired_difference(
    a,
    a_groups,
    b,
    b_groups,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
    a_den=None,
    b_den=None,
) -> tuple[float, float, float, int]:
    """(mean(a) - mean(b), low, high, n_groups): the difference of two models' means over the groups
    both have values in (NaN dropped; a group the other model lacks is left out of both), with the
    percentile paired group bootstrap. Each resample draws the shared groups with replacement (as
    many draws as groups, `rng.integers(0, G, (n_boot, G))` over the sorted shared labels, as
    `group_weights`) and applies the same draw to both models: a value's weight is the number of
    times its group was drawn, each model's resampled mean a weighted mean. Drawing the groups once
    for both is what makes it paired: what a group shifts in both models cancels in the difference.

    Identical inputs give exactly 0 with the zero-width interval [0, 0]; otherwise the interval has
    zero width only when every resample gives the same difference (e.g. b = a + c) or with one group.

    `a_den`, `b_den` (one per value): each model's number is then a ratio of means, Σa / Σa_den over
    its values (a normalized effect: Σ(patched − corrupt) / Σ(clean − corrupt)), resampled with the
    same draws; a value whose denominator is NaN is dropped."""
    a, ga = _kept(a, a_groups, a_den)
    b, gb = _kept(b, b_groups, b_den)
    if a_den is not None:
        a, a_den = a
    if b_den is not None:
        b, b_den = b
    shared = np.intersect1d(ga, gb)
    G = len(shared)
    if G == 0:
        return float("nan"), float("nan"), float("nan"), 0
    ia, ib = np.isin(ga, shared), np.isin(gb, shared)
    codes_a, codes_b = np.searchsorted(shared, ga[ia]), np.searchsorted(shared, gb[ib])
    sum_a, n_a = np.bincount(codes_a, a[ia], G), np.bincount(codes_a, minlength=G).astype(np.float64)
    sum_b, n_b = np.bincount(codes_b, b[ib], G), np.bincount(codes_b, minlength=G).astype(np.float64)
    if a_den is not None:  # a ratio of means: the weights' denominators are the summed gaps
        n_a = np.bincount(codes_a, a_den[ia], G)
    if b_den is not None:
        n_b = np.bincount(codes_b, b_den[ib], G)

    def diff(counts):  # [..., G] draws of each group -> the difference of the weighted means
        return counts @ sum_a / (counts @ n_a) - counts @ sum_b / (counts @ n_b)

    theta = float(diff(np.ones(G)))
    if G == 1:  # one group: nothing to resample
        return theta, theta, theta, 1
    draws = np.random.default_rng(seed).integers(0, G, size=(n_boot, G))
    counts = np.zeros((n_boot, G))
    np.add.at(counts, (np.repeat(np.arange(n_boot), G), draws.reshape(-1)), 1.0)
    lo, hi = np.quantile(diff(counts), [(1 - level) / 2, (1 + level) / 2])
    return theta, float(lo), float(hi), G


def _kept(values, groups, den=None):
    """Values as float64 and their group labels as strings, NaN values dropped; with `den` (one per
    value), ((values, den), groups) with the units where either is NaN dropped."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    g = np.asarray(groups).astype(str).reshape(-1)
    keep = ~np.isnan(v)
    if den is None:
        return v[keep], g[keep]
    d = np.asarray(den, dtype=np.float64).reshape(-1)
    keep &= ~np.isnan(d)
    return (v[keep], d[keep]), g[keep]


def bca(theta: float, boots: np.ndarray, jack: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The BCa interval (Efron 1987) of a statistic theta from its bootstrap values and its
    leave-one-group-out (jackknife) values: percentiles moved by the bias z0 (the share of resamples
    below theta) and the acceleration (the jackknife's skewness). Corrects the upward bias a rank
    correlation of resampled means has (duplicated groups make the cell means smoother)."""
    b = np.asarray(boots, float)
    b = b[~np.isnan(b)]
    j = np.asarray(jack, float)
    j = j[~np.isnan(j)]
    if b.size < 2 or theta != theta:
        return float("nan"), float("nan")
    nd = NormalDist()
    share = (np.sum(b < theta) + 0.5 * np.sum(b == theta)) / b.size
    share = min(max(share, 1 / (b.size + 1)), b.size / (b.size + 1))
    z0 = nd.inv_cdf(share)
    d = j.mean() - j if j.size >= 2 else np.zeros(1)
    den = 6 * (np.sum(d**2) ** 1.5)
    acc = float(np.sum(d**3) / den) if den > 0 else 0.0
    ends = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        zq = nd.inv_cdf(q)
        ends.append(float(np.quantile(b, nd.cdf(z0 + (z0 + zq) / (1 - acc * (z0 + zq))))))
    return ends[0], ends[1]


def fold_spread(values) -> tuple[float, float, float]:
    """(mean, min, max) over folds: a spread, not an interval."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    return float(v.mean()), float(v.min()), float(v.max())
