"""Normalized effects as a ratio of means over pairs (docs/statistics.md): `stats.group_bootstrap_ratios`
and the ratio form of `stats.paired_difference` against loops written out here over the same draws;
`interventions.metrics.summarize` recomputed by hand; a pair whose gap barely clears the minimum no
longer drives the effect, and where the pairs' mean gap does not clear it there is no effect at all."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from fbt_probe.interventions.metrics import summarize
from fbt_probe.stats import group_bootstrap_ratios, paired_difference

Z = norm.ppf(0.975)


def draws(groups, n_boot: int, seed: int) -> list[list[str]]:
    """The groups each resample draws: `rng.integers(0, G, (n_boot, G))` over the sorted labels."""
    labels = sorted(set(np.asarray(groups).astype(str)))
    rows = np.random.default_rng(seed).integers(0, len(labels), size=(n_boot, len(labels)))
    return [[labels[i] for i in row] for row in rows]


def ratio_loop(num, den, groups, n_boot: int, seed: int):
    """(Σnum/Σden, θ ± z·sd of the resampled ratios, the mean denominator's 2.5 / 97.5 % percentiles)."""
    groups = np.asarray(groups).astype(str)
    theta = num.sum() / den.sum()
    ratios, dens = [], []
    for picked in draws(groups, n_boot, seed):
        n = np.concatenate([num[groups == g] for g in picked])
        d = np.concatenate([den[groups == g] for g in picked])
        ratios.append(n.sum() / d.sum())
        dens.append(d.mean())
    half = Z * np.std(ratios, ddof=1)
    return theta, theta - half, theta + half, den.mean(), *np.quantile(dens, [0.025, 0.975])


def noisy_pairs(seed: int = 0, n_groups: int = 20, small: int = 3):
    """Pairs whose clean-corrupt gap is about 2 logits and whose swap moves the logits by about 1, and
    `small` pairs whose gap is just above the minimum (0.11) while the swap still moves them by about 1:
    each of those has a per-pair ratio near 9."""
    rng = np.random.default_rng(seed)
    groups = np.array([f"g{i:02d}" for i in range(n_groups)])
    den = rng.normal(2.0, 0.3, n_groups)
    den[:small] = 0.11
    num = rng.normal(1.0, 0.2, n_groups)
    return num, den, groups


def test_the_ratio_of_means_and_its_interval_equal_a_loop_over_the_same_draws():
    num, den, groups = noisy_pairs()
    (got,) = group_bootstrap_ratios([num], [den], [groups], n_boot=300, seed=4)
    assert got == pytest.approx(ratio_loop(num, den, groups, 300, 4), rel=1e-9)
    # the mean of per-pair ratios is driven by the three small gaps; the ratio of means is not
    assert np.mean(num / den) > 1.3 and got[0] == pytest.approx(num.sum() / den.sum()) and got[0] < 0.65


def test_no_ratio_where_the_mean_gap_does_not_clear_the_minimum():
    num, den, groups = noisy_pairs(small=20)  # every gap 0.11: the mean gap is 0.11 in every resample
    (clear,) = group_bootstrap_ratios([num], [den], [groups], n_boot=200, min_den=0.1)
    assert clear[0] == pytest.approx(num.sum() / den.sum()) and clear[4] == pytest.approx(0.11)
    rng = np.random.default_rng(2)
    den = rng.normal(0.12, 0.1, 20)  # the mean gap's interval reaches below 0.1
    (none,) = group_bootstrap_ratios([num], [den], [groups], n_boot=200, min_den=0.1)
    assert np.isnan(none[:3]).all() and none[3] == pytest.approx(den.mean()) and none[4] < 0.1 < none[5]
    (free,) = group_bootstrap_ratios([num], [den], [groups], n_boot=200)  # without a stated gap it is computed
    assert free[0] == pytest.approx(num.sum() / den.sum())
    # one group: nothing to resample, and with a stated gap no estimate
    one = group_bootstrap_ratios([num[:3]], [den[:3]], [np.array(["g"] * 3)], min_den=0.0)[0]
    assert np.isnan(one[:3]).all()


def test_the_paired_ratio_difference_equals_a_loop_over_the_same_draws():
    rng = np.random.default_rng(5)
    groups = np.repeat([f"g{i:02d}" for i in range(15)], 2)
    num_a, den_a = rng.normal(1.5, 0.3, 30), rng.normal(2.0, 0.3, 30)
    num_b, den_b = rng.normal(0.5, 0.3, 30), rng.normal(1.8, 0.3, 30)
    got = paired_difference(num_a, groups, num_b, groups, n_boot=300, seed=7, a_den=den_a, b_den=den_b)
    diffs = []
    for picked in draws(groups, 300, 7):
        m = np.concatenate([np.flatnonzero(groups == g) for g in picked])
        diffs.append(num_a[m].sum() / den_a[m].sum() - num_b[m].sum() / den_b[m].sum())
    theta = num_a.sum() / den_a.sum() - num_b.sum() / den_b.sum()
    assert got[0] == pytest.approx(theta) and got[3] == 15
    assert got[1:3] == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), rel=1e-9)


def test_summarize_normalizes_by_the_pairs_mean_gap():
    """Two samples per pair; a pair's numerator and gap are the means of its rows'; the summary is the
    ratio of their means over the kept pairs, the tiny-gap pair left out and counted."""
    rng = np.random.default_rng(0)
    rows = []
    for p in range(12):
        for s in range(2):
            gap = 0.05 if p == 0 else float(rng.normal(2.0, 0.5))  # pair 0: a tiny gap
            moved = float(rng.normal(1.0, 0.3))
            rows.append(
                {
                    "experiment": "feedback-swap",
                    "condition": "state",
                    "task": "t",
                    "length_knob": 8,
                    "position": -1,
                    "pair_id": f"p{p}",
                    "group_id": f"g{p // 2}",
                    "tiny_gap": gap < 0.1,
                    "clean_logit_diff": gap,
                    "corrupt_logit_diff": 0.0,
                    "metric": "normalized",
                    "value": float("nan") if gap < 0.1 else moved / gap,
                }
            )
    long = pd.DataFrame(rows)
    r = summarize(long, n_boot=200).query("length_knob == 8").iloc[0]
    kept = long[~long["tiny_gap"]]
    per = kept.assign(num=kept["value"] * kept["clean_logit_diff"]).groupby("pair_id")[["num", "clean_logit_diff"]]
    per = per.mean()
    assert r["mean"] == pytest.approx(per["num"].sum() / per["clean_logit_diff"].sum())
    assert r["gap"] == pytest.approx(per["clean_logit_diff"].mean()) and r["gap_low"] > 0.1
    assert r["n_excluded"] == 1 and r["n_pairs"] == 11 and r["ci_low"] < r["mean"] < r["ci_high"]
    # the same pairs with every gap near the minimum: the mean gap's interval holds 0.1, so no effect
    near = long.assign(clean_logit_diff=0.1 + rng.normal(0, 0.05, len(long)), tiny_gap=False)
    s = summarize(near, n_boot=200).query("length_knob == 8").iloc[0]
    assert np.isnan(s["mean"]) and s["gap_low"] < 0.1 and s["interval"] == "group-bootstrap-ratio"


def test_ce_recovered_only_where_the_mean_ablation_costs_the_answer():
    """CE recovered = (CE_mean − CE_sae) / (CE_mean − CE_clean) over the samples: where the mean ablation
    costs next to nothing (the model answers without the state) the ratio is noise, so it is not given;
    the logit-difference fraction beside it, whose gap is clear, is."""
    from fbt_probe.sae.metrics import RECOVERED_GAP, loss_recovered

    rng = np.random.default_rng(3)
    n = 40
    rows = pd.DataFrame(
        {
            "task": "t",
            "mode": "recurrent:1",
            "group_id": [f"g{i // 2}" for i in range(n)],
            "ce_clean": rng.normal(0.10, 0.01, n),
            "ce_sae": rng.normal(0.11, 0.01, n),
            "ce_mean": rng.normal(0.11, 0.05, n),  # about 0.01 nats above clean: no gap
            "ld_clean": rng.normal(4.0, 0.5, n),
            "ld_sae": rng.normal(3.5, 0.5, n),
            "ld_mean": rng.normal(1.0, 0.5, n),
        }
    )
    r = loss_recovered(rows, n_boot=200).iloc[0]
    assert np.isnan(r["recovered_ce"]) and np.isnan(r["recovered_ce_low"])
    assert r["ce_gap"] == pytest.approx((rows["ce_mean"] - rows["ce_clean"]).mean()) and r["ce_gap_low"] < RECOVERED_GAP
    num, den = rows["ld_sae"] - rows["ld_mean"], rows["ld_clean"] - rows["ld_mean"]
    assert r["recovered_ld"] == pytest.approx(num.sum() / den.sum()) and r["ld_gap_low"] > RECOVERED_GAP
    assert r["recovered_ld_low"] < r["recovered_ld"] < r["recovered_ld_high"]
