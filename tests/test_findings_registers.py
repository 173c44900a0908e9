"""Fig. 7b in the findings: a register task the feedback model answers gets its depth-0 decodability
per mode (pooled over lengths, Wilson at n = groups), the baseline's beside it, and the swap effect
per length; computed from synthetic tables."""

import numpy as np
import pandas as pd

from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.parts.interventions import swap_sentences
from fbt_probe.reproduce.parts.probes import register_findings
from fbt_probe.reproduce.seeds import spread
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
    (swap,) = swap_sentences(tmp_path, "registers", None)  # the interventions part's sentence on the same task
    # Fig. 7b's verdict over depths 1..L: `full` was not probed here, so no verdict is claimed
    assert depth.startswith("Fig. 7b on registers: `full` was not probed (`standard` ")

    def q(table, mode):
        g = table[(table["mode"] == mode) & (table["depth"] == 0) & (table["metric"] == "accuracy")]
        p = (g["value"] * g["n_test"]).sum() / g["n_test"].sum()  # pooled over the cells, weighted by their tests
        lo, hi = _wilson(p, 8)  # n = the 8 distinct groups
        return f"**{p:.2f}** [{lo:.2f}, {hi:.2f}]"

    assert line.startswith(
        f"At depth 0, the registers answer is linearly decodable at {q(feedback, 'standard')} under "
        f"`standard`, {q(feedback, 'recurrent:1')} under `recurrent:1`, {q(feedback, 'jacobi:2')} under "
        "`jacobi:2` (pooled over lengths 2, 4: "
    )
    assert "of 8 groups; Wilson 95 % CI with n = groups" in line
    assert f"reads {q(baseline, 'recurrent:1')} under `recurrent:1`" in line and "Fig. 7b" in line
    # per length with pairs and groups counted, then the pooled row named as pooled (the seeds table's
    # number), never quoted as if it were a length
    assert (
        "by a normalized **0.70** [0.60, 0.75] at length 2 (10 pairs, 8 groups), **0.54** [0.44, 0.59] "
        "at length 4 (10 pairs, 8 groups); pooled over lengths **0.62** [0.52, 0.67]"
    ) in swap and swap.count("0.62") == 1
    # with a seeds table each number carries its spread over seeds
    seeds = pd.DataFrame(
        [
            {
                "model": "feedback",
                "quantity": "depth0-decodability",
                "task": "registers",
                "mode": "recurrent:1",
                "value": v,
                "seed": s,
            }
            for s, v in enumerate((0.8, 0.9, 1.0))
        ]
    )
    (line, *_) = register_findings(cfg, tmp_path, "registers", seeds)
    assert (
        f"{q(feedback, 'recurrent:1')} under `recurrent:1`{spread(seeds, 'feedback', 'depth0-decodability', 'registers', 'recurrent:1')}"
        in line
    )
    assert "(seeds 0-2: mean 0.90, range 0.80-1.00, between-seed 95 % CI [0.65, 1.00])" in line  # 0.9 ± 4.30·0.1/√3


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
                "seed": s,
                "study": k,
            }
            for s, (v, k) in enumerate(((0.3, "demo"), (0.5, "demo"), (0.9, "full")))
        ]
    )
    assert same_kind(seeds, "demo")["seed"].tolist() == [0, 1]
    assert spread(same_kind(seeds, "full"), "feedback", "answer-accuracy", "t", "m") == ""  # one full seed: no range
    assert (
        spread(same_kind(seeds, "demo"), "feedback", "answer-accuracy", "t", "m")
        == " (seeds 0-1: mean 0.40, range 0.30-0.50, between-seed 95 % CI [0.00, 1.00])"
    )


def test_no_probes_no_register_findings(tmp_path):
    assert register_findings(ReproConfig(), tmp_path, "registers", None) == []


def test_contraction_ratio_spread_keeps_small_ratios_and_counts_contracting_seeds():
    """A ratio of 2e-4 is not '0.00': the contraction spread uses significant digits, and the
    count of contracting seeds (ratio below CONTRACTS_BELOW) is computed from the table."""
    from fbt_probe.reproduce import rules

    ratios = (1.85e-4, 0.278, 0.0064)
    seeds = pd.DataFrame(
        [
            {
                "model": "feedback",
                "quantity": "state-change-last/pass-2",
                "task": "validation",
                "mode": "full",
                "value": v,
                "seed": s,
            }
            for s, v in enumerate(ratios)
        ]
    )
    got = spread(seeds, "feedback", "state-change-last/pass-2", "validation", "full", ".2g")
    assert got.startswith(f" (seeds 0-2: mean {np.mean(ratios):.2g}, range 0.00018-0.28, between-seed 95 % CI [")
    n = sum(r < rules.CONTRACTS_BELOW for r in ratios)
    v = rules.contraction(1.0, ratios[0], 32, list(seeds["value"]))
    assert n == 2 and v.verdict == "contracts on 2 of 3 seeds" and "contracts on 2 of 3" in v.sentence
    assert "over training seeds" not in rules.contraction(1.0, ratios[0], 32, list(seeds["value"])[:1]).sentence
    # the default spec is unchanged for accuracies
    assert (
        spread(seeds, "feedback", "state-change-last/pass-2", "validation", "full")
        .split(", between")[0]
        .endswith("range 0.00-0.28")
    )
