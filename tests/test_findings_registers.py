"""Fig. 7b in the findings: a register task the feedback model answers gets its depth-0 decodability
per mode, the baseline's beside it, and the swap effect (issue 15); computed from synthetic tables."""
import numpy as np
import pandas as pd

from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.findings import depth0_modes, register_findings
from fbt_probe.reproduce.seeds import spread


def _probes(folder, model, rows):
    p = folder / "results" / "probes" / model
    p.mkdir(parents=True)
    pd.DataFrame(rows, columns=["task", "mode", "depth", "metric", "value"]).to_parquet(p / "probes.parquet")


def test_register_findings_quote_each_probed_mode_the_baseline_and_the_swap(tmp_path):
    rng = np.random.default_rng(0)
    cells = {"standard": rng.uniform(0.45, 0.55, 6), "recurrent:1": rng.uniform(0.8, 0.9, 6), "jacobi:2": rng.uniform(0.6, 0.7, 6)}
    rows = [("registers", m, 0, "accuracy", v) for m, vs in cells.items() for v in vs]
    rows += [("registers", "recurrent:1", 1, "accuracy", 0.99), ("registers", "carried-state", -1, "accuracy", 0.97),
             ("registers", "recurrent:1", 0, "auc", 0.1), ("completion", "recurrent:2", 0, "accuracy", 0.9)]
    _probes(tmp_path, "feedback", rows)
    base = rng.uniform(0.5, 0.6, 6)
    _probes(tmp_path, "baseline", [("registers", "recurrent:1", 0, "accuracy", v) for v in base])
    s = tmp_path / "results" / "interventions" / "feedback" / "feedback-swap"
    s.mkdir(parents=True)
    pd.DataFrame([{"task": "registers", "length_knob": -1, "metric": "normalized", "condition": "state", "mean": 0.62,
                   "ci_low": 0.5, "ci_high": 0.7}]).to_parquet(s / "summary.parquet")
    cfg = ReproConfig(modes={"registers": ["standard", "recurrent:1", "recurrent:2", "jacobi:2"]})
    # the study's order; a mode without a depth-0 accuracy row (carried-state, recurrent:2 here) is left out
    assert depth0_modes(cfg, tmp_path, "feedback", "registers") == ["standard", "recurrent:1", "jacobi:2"]
    (line, swap) = register_findings(cfg, tmp_path, "registers", None)

    def q(v):
        v = np.asarray(v)
        half = 1.96 * v.std(ddof=1) / np.sqrt(len(v))
        return f"**{v.mean():.2f}** [{max(0, v.mean() - half):.2f}, {min(1, v.mean() + half):.2f}]"

    assert line.startswith(f"At depth 0, the registers answer is linearly decodable at {q(cells['standard'])} under `standard`, "
                           f"{q(cells['recurrent:1'])} under `recurrent:1`, {q(cells['jacobi:2'])} under `jacobi:2`;")
    assert f"reads {q(base)} under `recurrent:1`" in line and "Fig. 7b" in line
    assert "by a normalized **0.62** [0.50, 0.70]" in swap
    # with a seeds table each number carries its spread over seeds
    seeds = pd.DataFrame([{"model": "feedback", "quantity": "depth0-decodability", "task": "registers", "mode": "recurrent:1",
                           "value": v, "seed": s} for s, v in enumerate((0.8, 0.9, 1.0))])
    (line, _) = register_findings(cfg, tmp_path, "registers", seeds)
    assert f"{q(cells['recurrent:1'])} under `recurrent:1`{spread(seeds, 'feedback', 'depth0-decodability', 'registers', 'recurrent:1')}" in line
    assert "(seeds 0-2: mean 0.90, range 0.80-1.00)" in line


def test_no_probes_no_register_findings(tmp_path):
    assert register_findings(ReproConfig(), tmp_path, "registers", None) == []


def test_contraction_ratio_spread_keeps_small_ratios_and_counts_contracting_seeds():
    """A ratio of 2e-4 is not '0.00': the contraction spread uses significant digits, and the
    count of contracting seeds (ratio below CONTRACTS_BELOW) is computed from the table."""
    from fbt_probe.reproduce.findings import CONTRACTS_BELOW, contracting_seeds
    ratios = (1.85e-4, 0.278, 0.0064)
    seeds = pd.DataFrame([{"model": "feedback", "quantity": "state-change-last/pass-2", "task": "validation", "mode": "full",
                           "value": v, "seed": s} for s, v in enumerate(ratios)])
    got = spread(seeds, "feedback", "state-change-last/pass-2", "validation", "full", ".2g")
    assert got == f" (seeds 0-2: mean {np.mean(ratios):.2g}, range 0.00018-0.28)"
    n = sum(r < CONTRACTS_BELOW for r in ratios)
    assert n == 2 and contracting_seeds(seeds) == "; it contracts on 2 of 3 seeds"
    assert contracting_seeds(seeds.iloc[:1]) == "" and contracting_seeds(None) == ""
    # the default spec is unchanged for accuracies
    assert spread(seeds, "feedback", "state-change-last/pass-2", "validation", "full").endswith("range 0.00-0.28)")
