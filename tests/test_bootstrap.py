"""The batched bootstraps (`bootstrap_cis`, the AtP parity table's resamples) against one resample
at a time, written out here as the oracle: same generator, same percentiles, float64; the group
bootstrap's coverage by simulation; Wilson against scipy; BCa's bias correction. Batching may
reorder a sum's last bit (tolerance 1e-12); a wrong index matrix, chunk or NaN handling moves a CI
by ~1e-2."""

import warnings

import numpy as np
from scipy.stats import rankdata

from fbt_probe import stats
from fbt_probe.interventions import atp_parity, metrics
from fbt_probe.interventions.metrics import bootstrap_ci, bootstrap_cis


def _one_at_a_time(values, n_boot, ci, seed, groups=None):
    """The oracle: each resample drawn on its own (groups with replacement, as many as there are),
    its values gathered and averaged."""
    v = np.asarray(values, dtype=np.float64)
    g = np.arange(v.size) if groups is None else np.asarray(groups)
    keep = ~np.isnan(v)
    v, g = v[keep], g[keep]
    if v.size == 0:
        return (np.nan,) * 3
    labels = np.unique(g)
    if labels.size == 1:
        return (v.mean(),) * 3
    draws = np.random.default_rng(seed).integers(0, labels.size, size=(n_boot, labels.size))
    means = np.array([np.concatenate([v[g == labels[k]] for k in row]).mean() for row in draws])
    return (v.mean(), *np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2]))


def test_bootstrap_cis_equal_one_array_at_a_time_across_sizes_nans_and_chunks(monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=rng.integers(0, 9)) for _ in range(300)]
    for a in arrays[::5]:
        if a.size:
            a[rng.integers(0, a.size)] = np.nan
    monkeypatch.setattr(stats, "_BOOT_CELLS", 3 * 200 * 4)  # several chunks per structure
    got = bootstrap_cis(arrays, n_boot=200, ci=0.9, seed=3)
    for values, mine in zip(arrays, got):
        np.testing.assert_allclose(mine, _one_at_a_time(values, 200, 0.9, 3), rtol=0, atol=1e-12)
    assert got[5] == bootstrap_ci(arrays[5], n_boot=200, ci=0.9, seed=3)


def test_group_bootstrap_equals_one_resample_at_a_time():
    rng = np.random.default_rng(4)
    arrays, groups = [], []
    for _ in range(60):
        n = int(rng.integers(1, 12))
        arrays.append(rng.normal(size=n))
        groups.append(rng.integers(0, max(1, n // 2), size=n).astype(str))
    arrays[3][0] = np.nan
    got = bootstrap_cis(arrays, n_boot=150, ci=0.95, seed=7, groups=groups)
    for v, g, mine in zip(arrays, groups, got):
        np.testing.assert_allclose(mine, _one_at_a_time(v, 150, 0.95, 7, g), rtol=0, atol=1e-12)


def _coverage(group_aware: bool, sims: int = 600) -> float:
    """Share of nominal-95 % intervals that contain the true mean 0 on a design with 40 groups of 4
    samples and intra-group correlation 0.5 (group effect and noise both N(0, 1))."""
    rng = np.random.default_rng(11)
    G, m, hits = 40, 4, 0
    labels = np.repeat(np.arange(G), m)
    for s in range(sims):
        v = np.repeat(rng.normal(size=G), m) + rng.normal(size=G * m)
        _, lo, hi = bootstrap_ci(v, n_boot=400, seed=s, groups=labels if group_aware else None)
        hits += lo <= 0 <= hi
    return hits / sims


def test_group_bootstrap_covers_at_its_nominal_level_where_the_pair_bootstrap_does_not():
    assert 0.93 <= _coverage(True) <= 0.97
    assert _coverage(False) < 0.88  # resampling samples as if independent: too narrow


def test_wilson_matches_scipy_and_is_never_zero_width():
    from scipy.stats import binomtest

    for k, n in [(0, 10), (3, 10), (384, 384), (190, 384), (1, 2)]:
        p, lo, hi = stats.wilson(k, n)
        ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert p == k / n and abs(lo - ref.low) < 1e-12 and abs(hi - ref.high) < 1e-12 and hi > lo
    p, lo, hi = stats.group_wilson(1.0, 64)  # 384/384 correct, 64 groups: n is the groups
    ref = binomtest(64, 64).proportion_ci(method="wilson")
    assert (p, lo, hi) == (1.0, ref.low, ref.high) and lo < 0.95


def test_bca_corrects_a_biased_bootstrap_and_matches_percentile_when_unbiased():
    rng = np.random.default_rng(5)
    boots = rng.normal(size=4000)
    jack = rng.normal(scale=0.01, size=50)
    lo, hi = stats.bca(0.0, boots, jack - jack.mean() + 0.0)
    q = np.quantile(boots, [0.025, 0.975])
    assert abs(lo - q[0]) < 0.1 and abs(hi - q[1]) < 0.1  # no bias, ~no skew: the percentile interval
    shifted = boots + 1.0  # resamples biased up by 1 sd: BCa centres on the bias-corrected value -1
    lo, hi = stats.bca(0.0, shifted, np.array([-0.01, 0.0, 0.01]))  # no skew: acceleration 0
    # the corrected upper end is the 2.1 % resample quantile, 1.96 - 1 = 0.96; the lower end lies
    # past the resamples' 0.004 % quantile, i.e. at their far tail (the percentile ends are -0.96, 2.96)
    assert abs(hi - 0.96) < 0.1 and lo < -2.0
    skewed = np.exp(rng.normal(scale=0.5, size=4000))  # skewed resamples, estimate at their median
    j = np.exp(rng.normal(scale=0.5, size=40)) / 10
    lo, hi = stats.bca(1.0, skewed, j)
    assert lo < 1.0 < hi and (lo, hi) != tuple(np.quantile(skewed, [0.025, 0.975]))  # acceleration moves it


def _stats_one_at_a_time(A, E):
    """The parity statistics of one resample, from scratch: Spearman of the cell means over the cells
    both have, and the worst absolute difference."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a, e = np.nanmean(A, 1), np.nanmean(E, 1)
    ok = ~(np.isnan(a) | np.isnan(e))
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(e[ok]) == 0:
        rho = np.nan
    else:
        rho = np.corrcoef(rankdata(a[ok]), rankdata(e[ok]))[0, 1]
    err = np.abs(a - e)
    return rho, (np.nanmax(err) if np.any(~np.isnan(err)) else np.nan)


def test_parity_resamples_equal_one_resample_at_a_time():
    rng = np.random.default_rng(1)
    for trial in range(12):
        cells, pairs = int(rng.integers(2, 8)), int(rng.integers(1, 10))
        A = rng.normal(size=(cells, pairs))
        E = A + 0.3 * rng.normal(size=(cells, pairs))
        A[rng.random(A.shape) < 0.25] = np.nan  # tiny-gap pairs: a cell mean over fewer pairs, or none
        E[rng.random(E.shape) < 0.25] = np.nan
        if trial % 4 == 0:
            E[:] = 1.0  # no spread: Spearman undefined
        idx = np.random.default_rng(2).integers(0, pairs, size=(150, pairs))
        W = np.stack([np.bincount(i, minlength=pairs) for i in idx]).astype(float)  # resample i as weights
        rho, worst = atp_parity._boot_stats(A, E, W)
        ref = np.array([_stats_one_at_a_time(A[:, i], E[:, i]) for i in idx])
        np.testing.assert_allclose(rho, ref[:, 0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(worst, ref[:, 1], rtol=0, atol=1e-12)


def test_the_summary_splits_pairs_by_condition_as_a_pandas_groupby_does():
    """`_split_by_keys` (contiguous runs of the sorted index) against iterating a pandas groupby, the
    oracle, on mixed key types, groups of one and a key that changes while the others do not."""
    import pandas as pd

    rng = np.random.default_rng(3)
    n = 400
    frame = pd.DataFrame(
        {
            "hook": rng.choice(["a.x", "b.y", "c"], n),
            "layer": rng.integers(0, 3, n),
            "mode": rng.choice(["standard", "recurrent:1"], n),
            "pos": rng.integers(-1, 2, n),
            "pair_id": rng.integers(0, 40, n),
            "value": rng.normal(size=n),
        }
    )
    frame.loc[n] = ["b.y", 9, "standard", 0, 3, 0.5]  # a condition with one pair
    keys = ["hook", "layer", "mode", "pos"]
    per_pair = frame.groupby(keys + ["pair_id"], sort=True)["value"].mean()
    want = {k: v.to_numpy() for k, v in per_pair.groupby(level=list(range(len(keys))), sort=True)}
    got = metrics._split_by_keys(per_pair, len(keys))
    assert list(got) == list(want) and len(got) > 20 and any(len(v) == 1 for v in want.values())
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert metrics._split_by_keys(per_pair.iloc[:0], len(keys)) == {}
