"""The batched bootstraps (`bootstrap_cis`, the AtP parity table's resamples) against one resample
at a time, written out here as the oracle: same generator, same percentiles, float64. Batching may
reorder a sum's last bit (tolerance 1e-12); a wrong index matrix, chunk or NaN handling moves a CI
by ~1e-2."""
import warnings

import numpy as np
from scipy.stats import rankdata

from fbt_probe.interventions import atp_parity
from fbt_probe.interventions import metrics
from fbt_probe.interventions.metrics import bootstrap_ci, bootstrap_cis


def _one_at_a_time(values, n_boot, ci, seed):
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return (np.nan,) * 3
    means = np.array([v[i].mean() for i in np.random.default_rng(seed).integers(0, v.size, size=(n_boot, v.size))])
    return (v.mean(), *np.quantile(means, [(1 - ci) / 2, 1 - (1 - ci) / 2]))


def test_bootstrap_cis_equal_one_array_at_a_time_across_sizes_nans_and_chunks(monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=rng.integers(0, 9)) for _ in range(300)]
    for a in arrays[::5]:
        if a.size:
            a[rng.integers(0, a.size)] = np.nan
    monkeypatch.setattr(metrics, "_BOOT_CELLS", 3 * 200 * 4)  # several chunks per size
    got = bootstrap_cis(arrays, n_boot=200, ci=0.9, seed=3)
    for values, mine in zip(arrays, got):
        np.testing.assert_allclose(mine, _one_at_a_time(values, 200, 0.9, 3), rtol=0, atol=1e-12)
    assert got[5] == bootstrap_ci(arrays[5], n_boot=200, ci=0.9, seed=3)


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
        rho, worst = atp_parity._boot_stats(A, E, idx)
        ref = np.array([_stats_one_at_a_time(A[:, i], E[:, i]) for i in idx])
        np.testing.assert_allclose(rho, ref[:, 0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(worst, ref[:, 1], rtol=0, atol=1e-12)


def test_the_summary_splits_pairs_by_condition_as_a_pandas_groupby_does():
    """`_split_by_keys` (contiguous runs of the sorted index) against iterating a pandas groupby, the
    oracle, on mixed key types, groups of one and a key that changes while the others do not."""
    import pandas as pd

    rng = np.random.default_rng(3)
    n = 400
    frame = pd.DataFrame({"hook": rng.choice(["a.x", "b.y", "c"], n), "layer": rng.integers(0, 3, n),
                          "mode": rng.choice(["standard", "recurrent:1"], n), "pos": rng.integers(-1, 2, n),
                          "pair_id": rng.integers(0, 40, n), "value": rng.normal(size=n)})
    frame.loc[n] = ["b.y", 9, "standard", 0, 3, 0.5]  # a condition with one pair
    keys = ["hook", "layer", "mode", "pos"]
    per_pair = frame.groupby(keys + ["pair_id"], sort=True)["value"].mean()
    want = {k: v.to_numpy() for k, v in per_pair.groupby(level=list(range(len(keys))), sort=True)}
    got = metrics._split_by_keys(per_pair, len(keys))
    assert list(got) == list(want) and len(got) > 20 and any(len(v) == 1 for v in want.values())
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert metrics._split_by_keys(per_pair.iloc[:0], len(keys)) == {}
