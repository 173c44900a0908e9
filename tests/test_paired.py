"""Feedback − baseline as a paired difference: `stats.paired_difference` against a float64 loop over
the same draws, its exact cases (identical models, a constant shift), the paired interval narrower
than the unpaired one on correlated data, its coverage; the probes' per-sample held-out table; the
`paired` stage's table on a small study folder and the rule that words it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fbt_probe.stats import paired_difference


def correlated(seed: int, n_groups: int = 30, per_group: int = 4, shift: float = 0.1, noise: float = 0.2):
    """Two models' values on the same samples: a large group effect both share, a shift, own noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat([f"g{i:02d}" for i in range(n_groups)], per_group)
    effect = np.repeat(rng.normal(0, 1.0, n_groups), per_group)
    a = effect + shift + rng.normal(0, noise, groups.size)
    b = effect + rng.normal(0, noise, groups.size)
    return a, b, groups


def loop_reference(a, ga, b, gb, n_boot: int, seed: int, level: float = 0.95):
    """The same statistic written out: per resample, concatenate the drawn groups' values of each
    model (groups drawn by `rng.integers(0, G, (n_boot, G))` over the sorted shared labels) and take
    the difference of the two plain means."""
    ga, gb = np.asarray(ga).astype(str), np.asarray(gb).astype(str)
    shared = sorted(set(ga) & set(gb))
    by_a = {g: np.asarray(a, np.float64)[ga == g] for g in shared}
    by_b = {g: np.asarray(b, np.float64)[gb == g] for g in shared}
    theta = np.concatenate(list(by_a.values())).mean() - np.concatenate(list(by_b.values())).mean()
    draws = np.random.default_rng(seed).integers(0, len(shared), size=(n_boot, len(shared)))
    diffs = []
    for row in draws:
        picked = [shared[i] for i in row]
        diffs.append(
            np.concatenate([by_a[g] for g in picked]).mean() - np.concatenate([by_b[g] for g in picked]).mean()
        )
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return theta, lo, hi, len(shared)


def test_paired_difference_equals_a_float64_loop_over_the_same_draws():
    a, b, g = correlated(0, n_groups=12, per_group=3)
    # unequal group sizes, a group only one model has, a NaN: the loop sees the shared groups only
    a, ga = np.concatenate([a, [5.0, np.nan]]), np.concatenate([g, ["only-a", "g00"]])
    b, gb = np.concatenate([b[:-1], [7.0]]), np.concatenate([g[:-1], ["only-b"]])
    got = paired_difference(a, ga, b, gb, n_boot=400, seed=3)
    keep = ~np.isnan(a)
    ref = loop_reference(a[keep], ga[keep], b, gb, n_boot=400, seed=3)
    assert got[3] == ref[3] == 12
    assert got[:3] == pytest.approx(ref[:3], abs=1e-12)


def test_identical_models_give_exactly_zero_and_only_they_a_zero_width_interval_at_zero():
    a, _, g = correlated(1)
    assert paired_difference(a, g, a.copy(), g.copy()) == (0.0, 0.0, 0.0, 30)
    for seed in range(5):  # any two different tables: an interval with width
        a, b, g = correlated(seed)
        d, lo, hi, n = paired_difference(a, g, b, g, seed=seed)
        assert lo < d < hi and n == 30
    # both models right on every sample but one: not identical, so not zero width
    ones = np.ones(60)
    other = ones.copy()
    other[7] = 0.0
    g = np.repeat(np.arange(15), 4)
    d, lo, hi, _ = paired_difference(ones, g, other, g)
    assert d == pytest.approx(1 / 60) and lo < hi


def test_a_constant_shift_is_the_difference_and_its_interval():
    a, _, g = correlated(2)
    for c in (0.25, -0.4):
        d, lo, hi, n = paired_difference(a + c, g, a, g)
        assert (d, lo, hi) == pytest.approx((c, c, c), abs=1e-12) and n == 30
        assert lo <= d <= hi or hi - lo < 1e-12


def test_the_sign_and_the_shared_groups():
    a, b, g = correlated(3, shift=0.5)
    d, lo, hi, _ = paired_difference(a, g, b, g)
    d2, lo2, hi2, _ = paired_difference(b, g, a, g)
    assert d > 0 and lo > 0 and (d2, lo2, hi2) == pytest.approx((-d, -hi, -lo), abs=1e-12)
    assert paired_difference([1.0], ["x"], [0.0], ["y"])[3] == 0  # no shared group: NaN, n = 0
    assert paired_difference([1.0, 0.0], ["x", "x"], [0.0], ["x"]) == (0.5, 0.5, 0.5, 1)  # one group


def unpaired_interval(a, b, g, n_boot: int = 1000, seed: int = 0):
    """Each model's mean resampled on its own draw of the groups: the interval two separate
    intervals imply for the difference."""
    from fbt_probe.stats import group_weights

    Wa, Wb = group_weights(g, n_boot, seed), group_weights(g, n_boot, seed + 1)
    diffs = Wa @ a / Wa.sum(1) - Wb @ b / Wb.sum(1)
    return np.quantile(diffs, [0.025, 0.975])


def test_the_paired_interval_is_narrower_than_the_unpaired_one_on_correlated_data():
    for seed in range(5):
        a, b, g = correlated(seed)
        _, lo, hi, _ = paired_difference(a, g, b, g, seed=seed)
        ulo, uhi = unpaired_interval(a, b, g, seed=seed)
        assert hi - lo < 0.5 * (uhi - ulo)
        assert ulo < lo and hi < uhi


def test_the_paired_interval_covers_the_true_difference():
    """Simulated coverage of nominal 95 % intervals on 40 groups with a shared group effect."""
    hits, reps = 0, 300
    for seed in range(reps):
        a, b, g = correlated(1000 + seed, n_groups=40, per_group=3, shift=0.1)
        _, lo, hi, _ = paired_difference(a, g, b, g, n_boot=500, seed=seed)
        hits += lo <= 0.1 <= hi
    assert 0.90 <= hits / reps <= 0.98


# ----------------------------------------------------------------------------- probes per sample
def test_probe_samples_hold_each_samples_held_out_prediction_and_match_the_fold_accuracies():
    from fbt_probe.probes.sweep import SAMPLE_COLUMNS, ProbeConfig, _sample_rows, probe_condition

    rng = np.random.default_rng(0)
    n, d = 48, 6
    y = np.tile([0, 1], n // 2)
    groups = np.repeat(np.arange(n // 4), 4).astype(str)
    X = rng.normal(size=(2, n, d))
    X[1, :, 0] += 1.5 * (2 * y - 1)  # depth 1 reads the label, depth 0 does not
    cfg = ProbeConfig(n_splits=4, backend="sklearn", n_jobs=1)
    samples: list = []
    table, _ = probe_condition(X, y, groups, cfg, key={"task": "t", "mode": "m", "length": 8}, samples=samples)
    s = samples[0]
    assert len(s) == 2 * n and set(s["depth"]) == {0, 1} and s["correct"].isin([0, 1]).all()
    assert (s.groupby("depth")["sample"].apply(sorted).apply(list) == [list(range(n))] * 2).all()
    acc = table[table["metric"] == "accuracy"].set_index(["depth", "fold"])["value"]
    per = s.groupby(["depth", "fold"])["correct"].mean()
    assert np.allclose(per.reindex(acc.index), acc, atol=0)
    # the batched backend gives the same held-out hits where it gives the same fold accuracies
    torch_samples: list = []
    probe_condition(X, y, groups, ProbeConfig(n_splits=4, backend="torch", device="cpu"), samples=torch_samples)
    assert torch_samples[0]["correct"].mean() == pytest.approx(s["correct"].mean(), abs=2 / n)
    assert {"row", "pair_id"} <= set(SAMPLE_COLUMNS) and callable(_sample_rows)


# ----------------------------------------------------------------------------- the stage's table
def write_study(root, diff: float = 0.2, seed: int = 0, baseline_gap: float = 2.0):
    """A study folder with per-sample probe tables and feedback-swap / state-replacement rows for both
    models on the same samples and pairs: feedback right more often than the baseline by ~`diff`. Each
    intervention row has its clean and corrupt logit differences (the normalized effect's gap: about 2
    on the feedback model, about `baseline_gap` on the baseline)."""
    from fbt_probe.probes.sweep import SAMPLES_FILE

    rng = np.random.default_rng(seed)
    groups = [f"completion:g{i}" for i in range(16)]
    base = rng.uniform(0.3, 0.7, len(groups))
    for m, lift, gap in (("feedback", diff, 2.0), ("baseline", 0.0, baseline_gap)):
        rows = []
        for mode, depth in (("recurrent:1", 0), ("recurrent:1", 1), ("carried-state", 4), ("standard", 0)):
            for length in (0, 8):
                for gi, gname in enumerate(groups):
                    for k in range(4):
                        p = base[gi] + lift
                        rows.append(
                            {
                                "task": "completion",
                                "mode": mode,
                                "length": length,
                                "depth": depth,
                                "fold": gi % 4,
                                "row": gi * 4 + k,
                                "pair_id": gi * 2 + k // 2,
                                "group_id": gname,
                                "label": k % 2,
                                "correct": np.int8(rng.random() < p),
                            }
                        )
        d = root / "results" / "probes" / m / "completion"
        d.mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(d / SAMPLES_FILE)
        for exp, condition in (("feedback-swap", "state"), ("state-replacement", "zero")):
            rows = []
            for length in (0, 8):
                for gi, gname in enumerate(groups):
                    for pair in range(2):
                        for label in (0, 1):
                            for metric, value in (
                                ("normalized", base[gi] + lift + rng.normal(0, 0.05)),
                                ("accuracy", float(rng.random() < base[gi] + lift)),
                            ):
                                rows.append(
                                    {
                                        "task": "completion",
                                        "condition": condition,
                                        "metric": metric,
                                        "length_knob": length,
                                        "position": -1,
                                        "pair_id": gi * 2 + pair + 100 * length,
                                        "group_id": gname,
                                        "label": label,
                                        "tiny_gap": False,
                                        "clean_logit_diff": gap + 0.25 * ((gi + pair + label) % 3),
                                        "corrupt_logit_diff": 0.0,
                                        "value": value,
                                    }
                                )
            d = root / "results" / "interventions" / m / exp
            d.mkdir(parents=True)
            pd.DataFrame(rows).to_parquet(d / "rows.parquet")


def test_the_paired_table_recomputes_from_the_per_unit_tables(tmp_path):
    from fbt_probe.reproduce.parts.paired import COLUMNS, paired_table

    write_study(tmp_path)
    t = paired_table(tmp_path, n_boot=300, seed=0)
    assert list(t.columns) == COLUMNS
    assert set(t["what"]) == {
        "depth0-recurrent:1",
        "carried-state",
        "swap-normalized",
        "swap-accuracy",
        "zero-replacement-accuracy",
    }
    assert sorted(set(t["length_knob"])) == [-1, 0, 8] and (t["n_groups"] == 16).all()
    assert ((t["ci_low"] <= t["difference"]) & (t["difference"] <= t["ci_high"]) & (t["ci_low"] < t["ci_high"])).all()
    assert np.allclose(t["difference"], t["feedback"] - t["baseline"], atol=1e-12)
    # the pooled depth-0 row, recomputed from the per-sample tables
    s = {
        m: pd.read_parquet(tmp_path / "results" / "probes" / m / "completion" / "probes_samples.parquet")
        for m in ("feedback", "baseline")
    }
    s = {m: v[(v["mode"] == "recurrent:1") & (v["depth"] == 0)] for m, v in s.items()}
    ref = paired_difference(
        s["feedback"]["correct"], s["feedback"]["group_id"], s["baseline"]["correct"], s["baseline"]["group_id"], 300
    )
    row = t[(t["what"] == "depth0-recurrent:1") & (t["length_knob"] == -1)].iloc[0]
    assert (row["difference"], row["ci_low"], row["ci_high"], row["n_groups"]) == pytest.approx(ref, abs=1e-12)
    # the swap's pooled row: each model's ratio of means over pairs (a pair's numerator and gap the means of
    # its rows), the same draws for both
    swap = t[(t["what"] == "swap-normalized") & (t["length_knob"] == -1)].iloc[0]
    assert swap["unit"] == "pairs" and swap["n_feedback"] == 16 * 2 * 2 and swap["difference"] > 0.1
    sums = {}
    for m in ("feedback", "baseline"):
        r = pd.read_parquet(tmp_path / "results" / "interventions" / m / "feedback-swap" / "rows.parquet")
        r = r[r["metric"] == "normalized"]
        gap = r["clean_logit_diff"] - r["corrupt_logit_diff"]
        per = (
            r.assign(num=r["value"] * gap, den=gap)
            .groupby(["pair_id"])
            .agg(num=("num", "mean"), den=("den", "mean"), group_id=("group_id", "first"))
        )
        sums[m] = per
    f, b = sums["feedback"], sums["baseline"]
    assert swap["feedback"] == pytest.approx(f["num"].sum() / f["den"].sum())
    ref = paired_difference(f["num"], f["group_id"], b["num"], b["group_id"], 300, a_den=f["den"], b_den=b["den"])
    assert (swap["difference"], swap["ci_low"], swap["ci_high"], swap["n_groups"]) == pytest.approx(ref, abs=1e-12)
    assert swap["gap"] == "both" and swap["interval"] == "paired-group-bootstrap-ratio"


def test_a_normalized_effect_is_compared_only_where_both_models_have_the_gap(tmp_path):
    from fbt_probe.reproduce.parts.paired import FOLDER, TABLE, paired_table
    from fbt_probe.reproduce.parts.paired import sections as paired_sections
    from fbt_probe.reproduce.tables import paired_clause

    write_study(tmp_path, baseline_gap=-0.2)  # the baseline's gaps around 0.05: it does not separate the answers
    t = paired_table(tmp_path, n_boot=200)
    swap = t[t["what"] == "swap-normalized"]
    assert swap["difference"].isna().all() and (swap["gap"] == "no gap: baseline").all()
    assert swap["baseline"].isna().all() and swap["feedback"].notna().all()
    acc = t[t["what"] == "swap-accuracy"]  # a proportion needs no gap
    assert acc["difference"].notna().all() and (acc["gap"] == "").all()
    folder = tmp_path.joinpath(*FOLDER)
    folder.mkdir(parents=True)
    t.to_parquet(folder / TABLE)
    said = paired_clause(tmp_path, "completion", (("swap-normalized", "the normalized effect"),))
    assert said.startswith("the normalized effect: not compared (no gap: baseline")
    ((_, text, _),) = paired_sections(None, tmp_path, [])
    assert "not compared (no gap: baseline" in text


def test_a_study_with_the_same_model_twice_reads_the_same_everywhere(tmp_path):
    import shutil

    from fbt_probe.reproduce import rules
    from fbt_probe.reproduce.parts.paired import paired_table

    write_study(tmp_path)
    for sub in ("probes", "interventions"):
        shutil.rmtree(tmp_path / "results" / sub / "baseline")
        shutil.copytree(tmp_path / "results" / sub / "feedback", tmp_path / "results" / sub / "baseline")
    t = paired_table(tmp_path, n_boot=200)
    assert len(t) and (t["difference"] == 0).all() and (t["ci_low"] == 0).all() and (t["ci_high"] == 0).all()
    r = t.iloc[0]
    v = rules.paired("at depth 0", (r["difference"], r["ci_low"], r["ci_high"], int(r["n_groups"])))
    assert v.verdict == "same" and "[" not in v.sentence and "no power" in v.sentence


def test_the_report_table_and_the_findings_quote_the_paired_rows(tmp_path):
    from fbt_probe.reproduce.parts.paired import FOLDER, TABLE, paired_table
    from fbt_probe.reproduce.parts.paired import sections as paired_sections
    from fbt_probe.reproduce.tables import paired_clause

    write_study(tmp_path)
    folder = tmp_path.joinpath(*FOLDER)
    folder.mkdir(parents=True)
    t = paired_table(tmp_path, n_boot=200)
    t.to_parquet(folder / TABLE)
    r = t[(t["what"] == "depth0-recurrent:1") & (t["length_knob"] == -1)].iloc[0]
    said = paired_clause(tmp_path, "completion", (("depth0-recurrent:1", "at depth 0"),))
    assert said == (
        f"at depth 0: feedback − baseline **{r['difference']:+.2f}** [{r['ci_low']:.2f}, {r['ci_high']:.2f}] "
        "(paired, n = 16 groups)"
    )
    assert paired_clause(tmp_path, "memory", (("depth0-recurrent:1", "at depth 0"),)) == ""
    ((head, text, _),) = paired_sections(None, tmp_path, [])
    assert head == "Feedback − baseline, paired" and f"{r['difference']:+.3f} [{r['ci_low']:.3f}" in text


# ----------------------------------------------------------------------------- the rule
def test_the_paired_rule_says_higher_only_when_the_interval_is_above_zero():
    from fbt_probe.reproduce.rules import paired

    assert paired("x", (0.12, 0.08, 0.16, 64)).verdict == "higher"
    assert paired("x", (0.12, 0.08, 0.16, 64)).sentence == (
        "x: feedback − baseline **+0.12** [0.08, 0.16] (paired, n = 64 groups)"
    )
    assert paired("x", (-0.12, -0.16, -0.08, 64)).verdict == "lower"
    opposite = paired("x", (0.12, -0.01, 0.25, 64))  # the same estimate, an interval that holds 0
    assert opposite.verdict == "cannot say" and "holds 0" in opposite.sentence
    assert paired("x", (0.05, 0.05, 0.05, 10)).verdict == "constant"
    assert paired("x", (0.0, 0.0, 0.0, 10)).verdict == "same"
    assert "[0.00, 0.03]" in paired("x", (0.01, -0.001, 0.03, 24)).sentence  # no '-0.00'
    assert paired("x", None).verdict == paired("x", (float("nan"),) * 3 + (0,)).verdict == "not-paired"
    assert paired("x", (float("nan"),) * 3 + (12,), "no gap: baseline").verdict == "no gap"
