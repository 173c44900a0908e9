"""Fig. 7b in the findings: a register task the feedback model answers gets its depth-0 decodability
per mode (pooled over lengths, Wilson at n = groups), the baseline's beside it, and the swap effect
per length; computed from synthetic tables."""

import numpy as np
import pandas as pd

from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.parts.interventions import swap_sentences
from fbt_probe.reproduce.parts.probes import register_findings
from fbt_probe.reproduce.seeds import quote
from fbt_probe.reproduce.tables import depth0_modes


def _probes(folder, model, rows):
    p = folder / "results" / "probes" / model
    p.mkdir(parents=True)
    t = pd.DataFrame(rows, columns=["task", "mode", "depth", "metric", "value"])
    t["length"] = [(2, 4)[i % 2] for i in range(len(t))]  # cells alternate between two lengths
    t["n_test"] = [10 + 2 * (i % 3) for i in range(len(t))]  # folds of unequal size: the pooling weights them
    t.to_parquet(p / "probes.parquet")
    return t


def _data(folder, groups_per_length=8):
    d = folder / "data"
    d.mkdir(exist_ok=True)
    rows = [
        {"group_id": f"registers:g{g}", "length_knob": k}
        for k in (2, 4)
        for g in range(groups_per_length)
        for _ in range(4)
    ]  # the same groups at both lengths
    pd.DataFrame(rows).to_parquet(d / "registers.parquet")


def _wilson(p, n, z=1.959963984540054):  # the closed form, written out independently
    den = 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / den, z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0, mid - half), min(1, mid + half)


def test_register_findings_quote_each_probed_mode_the_baseline_and_the_swap(tmp_path):
    rng = np.random.default_rng(0)
    cells = {
        "standard": rng.uniform(0.45, 0.55, 6),
        "recurrent:1": rng.uniform(0.8, 0.9, 6),
        "jacobi:2": rng.uniform(0.6, 0.7, 6),
    }
    rows = [("registers", m, 0, "accuracy", v) for m, vs in cells.items() for v in vs]
    rows += [
        ("registers", "recurrent:1", 1, "accuracy", 0.99),
        ("registers", "carried-state", -1, "accuracy", 0.97),
        ("registers", "recurrent:1", 0, "auc", 0.1),
        ("completion", "recurrent:2", 0, "accuracy", 0.9),
    ]
    feedback = _probes(tmp_path, "feedback", rows)
    base = rng.uniform(0.5, 0.6, 6)
    baseline = _probes(tmp_path, "baseline", [("registers", "recurrent:1", 0, "accuracy", v) for v in base])
    _data(tmp_path)
    s = tmp_path / "results" / "interventions" / "feedback" / "feedback-swap"
    s.mkdir(parents=True)
    pd.DataFrame(
        [
            {
                "task": "registers",
                "length_knob": k,
                "metric": "normalized",
                "condition": "state",
                "mean": m,
                "ci_low": m - 0.1,
                "ci_high": m + 0.05,
                "n_pairs": 10,
                "n_groups": 8,
            }
            for k, m in ((-1, 0.62), (2, 0.7), (4, 0.54))
        ]
    ).to_parquet(s / "summary.parquet")
    cfg = ReproConfig(modes={"registers": ["standard", "recurrent:1", "recurrent:2", "jacobi:2"]})
    # the study's order; a mode without a depth-0 accuracy row (carried-state, recurrent:2 here) is left out
    assert depth0_modes(cfg, tmp_path, "feedback", "registers") == ["standard", "recurrent:1", "jacobi:2"]
    (line, depth) = register_findings(cfg, tmp_path, "registers", None)
    (swap,) = swap_sentences(cfg, tmp_path, "registers", None)  # the interventions part's sentence on the same task
    # Fig. 7b's verdict over depths 1..L: `full` was not probed here, so no verdict is claimed
    assert depth.startswith("Fig. 7b on registers: `full` was not probed (`standard` ")
    assert depth.endswith("(one training seed's numbers: seed 0).")

    def pooled(table, mode):
        g = table[(table["mode"] == mode) & (table["depth"] == 0) & (table["metric"] == "accuracy")]
        p = (g["value"] * g["n_test"]).sum() / g["n_test"].sum()  # pooled over the cells, weighted by their tests
        return p, *_wilson(p, 8)  # n = the 8 distinct groups

    def q(table, mode):  # without a seeds table every number is said to be one seed's
        p, lo, hi = pooled(table, mode)
        return f"**{p:.2f}** [{lo:.2f}, {hi:.2f}] (one seed's: seed 0, within run)"

    assert line.startswith(
        f"At depth 0, the registers answer is linearly decodable at {q(feedback, 'standard')} under "
        f"`standard`, {q(feedback, 'recurrent:1')} under `recurrent:1`, {q(feedback, 'jacobi:2')} under "
        "`jacobi:2` (pooled over lengths 2, 4: "
    )
    assert "of 8 groups; Wilson 95 % CI with n = groups" in line
    assert f"reads {q(baseline, 'recurrent:1')} under `recurrent:1`" in line and "Fig. 7b" in line
    # pooled first, named as pooled (the seeds table's number), then per length with its groups
    assert swap.startswith(
        "Swapping the carried state at the final position with the partner sample's moves registers's answer by a "
        "normalized **0.62** [0.52, 0.67] (one seed's: seed 0, within run) pooled over lengths; by length, "
        "**0.70** [0.60, 0.75] (one seed's: seed 0, within run) at length 2 (8 groups), **0.54** [0.44, 0.59] "
        "(one seed's: seed 0, within run) at length 4 (8 groups)"
    )
    # with a seeds table a number is the mean over the seeds, with the between-seed t interval, each seed's
    # value and this seed's within-run interval beside it
    p, lo, hi = pooled(feedback, "recurrent:1")
    seeds = pd.DataFrame(
        [
            {
                "model": "feedback",
                "quantity": "depth0-decodability",
                "task": "registers",
                "mode": "recurrent:1",
                "value": v,
                "ci_low": a,
                "ci_high": b,
                "seed": s,
            }
            for s, (v, a, b) in enumerate(((p, lo, hi), (0.9, 0.8, 0.95), (1.0, 0.9, 1.0)))
        ]
    )
    (line, *_) = register_findings(cfg, tmp_path, "registers", seeds)
    vals = np.array([p, 0.9, 1.0])
    half = 4.302652729911275 * vals.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 df)
    want = (
        f"**{vals.mean():.2f}** [{max(vals.mean() - half, 0):.2f}, {min(vals.mean() + half, 1):.2f}] (mean over seeds "
        f"0-2: {p:.2f} / 0.90 / 1.00; seed 0 within run [{lo:.2f}, {hi:.2f}]) under `recurrent:1`"
    )
    assert want in line


def test_findings_quote_seeds_of_their_own_study_kind_only(tmp_path):
    from fbt_probe.reproduce.tables import same_kind

    seeds = pd.DataFrame(
        [
            {
                "model": "feedback",
                "quantity": "answer-accuracy",
                "task": "t",
                "mode": "m",
                "value": v,
                "ci_low": v - 0.1,
                "ci_high": v + 0.1,
                "seed": s,
                "study": k,
            }
            for s, (v, k) in enumerate(((0.3, "demo"), (0.5, "demo"), (0.9, "full")))
        ]
    )
    assert same_kind(seeds, "demo")["seed"].tolist() == [0, 1]
    # one full seed: its number is one seed's
    assert quote(same_kind(seeds, "full"), "feedback", "answer-accuracy", "t", "m", 2) == (
        "**0.90** [0.80, 1.00] (one seed's: seed 2, within run)"
    )
    assert quote(same_kind(seeds, "demo"), "feedback", "answer-accuracy", "t", "m", 0) == (
        "**0.40** [0.00, 1.00] (mean over seeds 0-1: 0.30 / 0.50; seed 0 within run [0.20, 0.40])"
    )


def test_no_probes_no_register_findings(tmp_path):
    assert register_findings(ReproConfig(), tmp_path, "registers", None) == []


def test_quote_keeps_small_ratios_and_says_where_the_seeds_agree():
    """A ratio of 2e-4 is not '0.00' (`spec` ".2g"); seeds that agree to the quoted digits get no
    zero-width interval; a seed without a within-run interval says so."""
    ratios = (1.85e-4, 0.278, 0.0064)
    seeds = pd.DataFrame(
        {
            "model": "feedback",
            "quantity": "state-change-last/pass-2",
            "task": "validation",
            "mode": "full",
            "value": ratios,
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "seed": [0, 1, 2],
        }
    )
    got = quote(seeds, "feedback", "state-change-last/pass-2", "validation", "full", 0, spec=".2g")
    assert got.startswith(f"**{np.mean(ratios):.2g}** [") and "0.00018 / 0.28 / 0.0064" in got
    assert got.endswith("seed 0 no within-run interval)")
    same = seeds.assign(value=[1.0, 0.999, 1.0], ci_low=0.9, ci_high=1.0)
    assert quote(same, "feedback", "state-change-last/pass-2", "validation", "full", 0) == (
        "**1.00** on every seed (seeds 0-2; seed 0 within run [0.90, 1.00])"
    )
    assert quote(None, "feedback", "x", "t", "m", 0) == "n/a"


def test_a_number_over_too_few_groups_is_listed_not_quoted():
    seeds = pd.DataFrame(
        {
            "model": "feedback",
            "quantity": "depth-accuracy-k2",
            "task": "compose-s3",
            "mode": "standard",
            "value": [1.0, 0.5],
            "ci_low": [0.21, 0.05],
            "ci_high": [1.0, 0.95],
            "n_groups": [1, 2],
            "seed": [0, 1],
        }
    )
    assert quote(seeds, "feedback", "depth-accuracy-k2", "compose-s3", "standard", 0) == (
        "too few groups (1; at least 8)"
    )
    # this study's own number, where the table lacks it, is held to the same floor by its groups
    assert quote(None, "feedback", "x", "t", "m", 0, (0.9, 0.8, 0.95, 3)) == "too few groups (3; at least 8)"
    assert quote(None, "feedback", "x", "t", "m", 0, (0.9, 0.8, 0.95, 8)) == (
        "**0.90** [0.80, 0.95] (one seed's: seed 0, within run)"
    )
