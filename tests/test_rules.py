"""Each findings rule gives its verdict from its table, and the opposite verdict from a table where the
opposite is true (fbt_probe/reproduce/rules.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fbt_probe.reproduce import rules


def per_pair(means: dict[int, float], groups: int = 40, noise: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Pairs of `groups` groups at every length (a group recurs at each length, as completion's do)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        offset = rng.normal(0, noise)
        for k, m in means.items():
            rows.append({"group_id": f"g{g}", "length_knob": k, "value": m + offset + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_trend_words_only_where_the_slope_excludes_zero_and_the_means_are_monotone():
    falls = rules.trend(per_pair({0: 0.7, 8: 0.5, 32: 0.3}), "the swap effect")
    assert falls.verdict == "falls" and "falls with length" in falls.sentence
    rises = rules.trend(per_pair({0: 0.3, 8: 0.5, 32: 0.7}), "the swap effect")
    assert rises.verdict == "rises"
    # the committed study's completion swap: 0.49, 0.33, 0.40 — below at 8, back up at 32
    table = per_pair({0: 0.49, 8: 0.33, 32: 0.40})
    dip = rules.trend(table, "the swap effect")
    assert dip.verdict == "not-monotone" and "does not vary monotonically" in dip.sentence
    means = table.groupby("length_knob")["value"].mean()
    assert ", ".join(f"{m:.2f}" for m in means) + " at lengths 0, 8, 32" in dip.sentence
    # a small fall inside the noise: the slope's interval holds 0
    flat = rules.trend(per_pair({0: 0.50, 8: 0.49, 32: 0.48}, groups=8, noise=0.2), "x")
    assert flat.verdict == "not-monotone"


def test_trend_slope_is_the_ordinary_least_squares_slope_of_the_means():
    t = per_pair({0: 0.2, 8: 0.5, 32: 0.65}, noise=0.0)
    s, lo, hi = rules.trend_slope_ci(t, n_boot=200)
    assert s == pytest.approx(np.polyfit([0, 1, 2], [0.2, 0.5, 0.65], 1)[0]) and lo - 1e-12 <= s <= hi + 1e-12


def directions_table(rate1: float, rate0: float, groups: int = 20) -> pd.DataFrame:
    rows = []
    for g in range(groups):
        rows.append({"group_id": f"g{g}", "label": 1, "value": float(g < rate1 * groups)})
        rows.append({"group_id": f"g{g}", "label": 0, "value": float(g < rate0 * groups)})
    return pd.DataFrame(rows)


def test_directions_name_a_swap_that_flips_one_way_only():
    one = rules.directions(directions_table(1.0, 0.0))
    assert one.verdict == "one-direction" and "into label-1" in one.sentence
    both = rules.directions(directions_table(1.0, 1.0))
    assert both.verdict == "both"
    neither = rules.directions(directions_table(0.0, 0.05))
    assert neither.verdict == "neither"
    assert rules.directions(directions_table(0.6, 0.4)).verdict == "partial"
    # the intervals are Wilson at n = groups: never zero width
    assert "[0.84, 1.00]" in one.sentence


def test_redundancy_and_recomputable_follow_their_bounds():
    assert rules.redundancy((0.99, 0.93, 1.0), 0.49, "completion").verdict == "redundant"
    # 10 of 10 groups: Wilson [0.72, 1.00] is above chance: redundant, not "lost in part"
    assert rules.redundancy((1.0, 0.72, 1.0), 0.34, "completion").verdict == "redundant"
    assert rules.redundancy((0.60, 0.45, 0.74), 0.49, "memory").verdict == "needed"
    assert rules.redundancy((0.85, 0.55, 0.96), 0.49, "registers").verdict == "unresolved"
    ok = rules.recomputable("The feedback model", {"completion": (1.0, 0.68, 1.0), "memory": (0.99, 0.9, 1.0)})
    assert ok.verdict == "recomputable"
    no = rules.recomputable("The feedback model", {"completion": (1.0, 0.68, 1.0), "compose": (0.85, 0.6, 0.95)})
    assert no.verdict == "not-recomputable" and "compose" in no.sentence
    random = rules.recomputable("The feedback model", {"completion": (0.0, 0.0, 0.32), "memory": (0.55, 0.43, 0.66)})
    assert random.verdict == "not-answered" and "completion, memory" in random.sentence


def test_readout_needs_both_models_to_match_their_carried_state():
    yes = rules.readout("completion", {"feedback": (0.998, 0.998), "baseline": (0.877, 0.886)})
    assert yes.verdict == "readout"
    no = rules.readout("completion", {"feedback": (0.998, 0.80), "baseline": (0.877, 0.886)})
    assert no.verdict == "transformed"


def test_replication_verdicts_against_the_papers_numbers():
    assert rules.fig7a("completion", (1.0, 0.95, 1.0), (0.5, 0.4, 0.6), 0.996).verdict == "replicates"
    assert rules.fig7a("completion", (0.7, 0.6, 0.8), (0.5, 0.4, 0.6), 0.996).verdict == "does not replicate"
    assert rules.fig7a("completion", (1.0, 0.95, 1.0), (0.9, 0.8, 0.95), 0.996).verdict == "does not replicate"
    best = {"standard": 0.7, "recurrent:1": 0.8, "full": 0.85}
    assert rules.fig7b("memory", best, (0.9, 0.8, 0.95)).verdict == "replicates"
    worst = {"standard": 0.7, "recurrent:1": 0.8, "full": 0.5}
    assert rules.fig7b("memory", worst, (0.9, 0.8, 0.95)).verdict == "does not replicate"
    broken = rules.fig7b("memory", best, (0.0, 0.0, 0.1))
    assert broken.verdict == "does not replicate" and "does not answer" in broken.sentence
    flat = pd.Series([0.30, 0.30, 0.31, 0.32], index=[1, 2, 4, 32])
    assert rules.fig3(flat).verdict == "replicates"
    diverging = pd.Series([0.30, 0.0004, 2.83, 6.78], index=[1, 4, 8, 32])
    assert rules.fig3(diverging).verdict == "does not replicate"


def test_contraction_wording_follows_the_curve_and_the_seeds():
    falls = rules.contraction(1.0, 0.16, 32)
    assert falls.verdict == "does not contract" and "falls from 1 at pass 2 to 0.16" in falls.sentence
    assert "below 0.1 counts as contracting" in falls.sentence
    assert rules.contraction(1.0, 0.03, 32).verdict == "contracts"
    grows = rules.contraction(1.0, 2.0, 32)
    assert grows.verdict == "does not contract" and "grows" in grows.sentence
    mixed = rules.contraction(1.0, 0.16, 32, [0.16, 0.25, 0.03])
    assert mixed.verdict == "contracts on 1 of 3 seeds" and "contracts on 1 of 3" in mixed.sentence


def test_every_rule_states_its_criterion():
    assert set(rules.CRITERIA) >= {"trend", "directions", "redundancy", "recomputable", "readout", "fig7a", "fig7b"}
    assert {"fig3", "contraction"} <= set(rules.CRITERIA)


def test_a_model_near_chance_on_one_task_is_not_called_recomputable():
    # 0.96 on 8 groups has a Wilson interval [0.6x, 1.0] above chance; 0.75 on 8 groups holds chance
    assert rules.recomputable("m", {"a": (0.96, 0.62, 1.0), "b": (0.75, 0.41, 0.93)}).verdict == "not-answered"


def test_the_contraction_verdict_needs_its_interval_on_one_side_of_the_threshold():
    assert rules.contraction(1.0, 0.05, 32, ci=(0.03, 0.08), documents=400).verdict == "contracts"
    v = rules.contraction(1.0, 0.16, 32, ci=(0.12, 0.21), documents=400)
    assert v.verdict == "does not contract" and "[0.12, 0.21] over 400 documents" in v.sentence
    assert rules.contraction(1.0, 0.09, 32, ci=(0.06, 0.13)).verdict.startswith("is not resolved")


def test_das_above_the_full_swap_is_named_the_illusion_pattern_with_its_control():
    ex = rules.das_illusion("memory", (1.0, 0.72, 1.0), 0.5, ((0.8, 0.55, 0.93), 0.1))
    assert ex.verdict == "exceeds" and "illusion" in ex.sentence and "the control shows the same excess" in ex.sentence
    within = rules.das_illusion("memory", (0.6, 0.4, 0.77), 0.76, ((0.2, 0.1, 0.4), 0.3))
    assert within.verdict == "within" and "illusion" not in within.sentence and "same excess" not in within.sentence


def sae_table(feats: dict, rand: dict, width: float = 0.05) -> pd.DataFrame:
    rows = [
        {"condition": c, "k": k, "fraction": v, "ci_low": v - width, "ci_high": v + width}
        for c, d in (("features", feats), ("random", rand))
        for k, v in d.items()
    ]
    return pd.DataFrame(rows)


def test_sae_sparsity_needs_the_random_active_control_below_the_label_latents():
    # completion in the committed study: 4 label latents 0.97 against 4 random active latents 0.22
    yes = rules.sae_sparsity("completion", sae_table({1: 0.5, 4: 0.97, 16: 1.0}, {1: 0.1, 4: 0.22, 16: 0.9}), 16)
    assert yes.verdict == "sparse at 4" and "4 label latents of at most 16 active latents" in yes.sentence
    # memory: top-16 0.97 against random-16 1.01 — the label latents are no better than any active ones
    no = rules.sae_sparsity("memory", sae_table({4: 0.6, 16: 0.97}, {4: 0.55, 16: 1.01}), 16)
    assert no.verdict == "not sparse" and "k = 16: 0.97 vs random 1.01" in no.sentence


def grid_table(per_sae: dict[str, tuple[dict, dict]], max_active: int = 16, width: float = 0.05) -> pd.DataFrame:
    """The sparsity table of a grid of SAEs: sae -> (label-latent shares by k, random-active shares by k)."""
    return pd.concat(
        [sae_table(f, r, width).assign(sae=s, max_active=max_active) for s, (f, r) in per_sae.items()],
        ignore_index=True,
    )


SPARSE = ({1: 0.5, 4: 0.97, 16: 1.0}, {1: 0.1, 4: 0.22, 16: 0.95})  # completion's shape: 4 latents
DENSE = ({4: 0.6, 16: 0.97}, {4: 0.55, 16: 1.01})  # memory's: the random active latents catch up
LATE = ({1: 0.3, 4: 0.6, 16: 0.97}, {1: 0.1, 4: 0.2, 16: 0.5})  # sparse only at 16


def test_sae_grid_says_on_how_many_sparse_autoencoders_the_claim_holds():
    ids = ["topk-x4-s0", "topk-x4-s1", "topk-x8-s0", "topk-x8-s1", "topk-x4-s0-demo"]
    every = rules.sae_sparsity_grid("completion", grid_table({s: SPARSE for s in ids}))
    assert every.verdict == "sparse at 4 on all SAEs"
    assert every.sentence.startswith(
        "completion: on all 5 SAEs, 4 label latents of at most 16 active carry most of the full-state swap's effect "
        "(topk-x4-s0: **0.97** [0.92, 1.02], 4 random active latents **0.22** [0.17, 0.27]; over the 5 SAEs 0.97 "
        "against 0.22)"
    )
    assert "not on" not in every.sentence and "fewer" not in every.sentence
    # the opposite on one SAE: the demo-data SAE needs 16 latents
    some = rules.sae_sparsity_grid("completion", grid_table({**{s: SPARSE for s in ids[:4]}, ids[4]: LATE}))
    assert some.verdict == "sparse at 4 on 4 of 5 SAEs"
    assert some.sentence.startswith("completion: on 4 of 5 SAEs, 4 label latents of at most 16 active")
    assert "over the 5 SAEs 0.60–0.97 against 0.20–0.22" in some.sentence
    assert some.sentence.endswith("; not on topk-x4-s0-demo (there first at k = 16)")
    # the k quoted is where it holds on the most SAEs, and the first SAE that holds there is quoted
    late = rules.sae_sparsity_grid("completion", grid_table({ids[0]: SPARSE, ids[1]: LATE, ids[2]: LATE}))
    assert late.verdict == "sparse at 16 on 2 of 3 SAEs" and "16 label latents" in late.sentence
    assert "(topk-x4-s1: **0.97**" in late.sentence and "with fewer latents at k = 4 on 1 of 3" in late.sentence
    assert "not on topk-x4-s0 (there first at k = 4)" in late.sentence
    # the opposite of all: on none (memory's: top-16 0.97 against random-16 1.01 on every SAE)
    none = rules.sae_sparsity_grid("memory", grid_table({s: DENSE for s in ids}))
    assert none.verdict == "not sparse" and none.sentence.startswith("memory: not sparse on any of the 5 SAEs")
    assert "topk-x4-s0: top-16 0.97 vs random-16 1.01; over the 5 SAEs top-16 0.97, random-16 1.01" in none.sentence
    assert "a pair has at most 16 active latents" in none.sentence


def test_sae_grid_counts_an_sae_only_with_its_random_control_below():
    # label latents at 0.97 on both SAEs, but on the second its random control's interval reaches them
    near = ({4: 0.97}, {4: 0.9})
    t = grid_table({"a": SPARSE, "b": near})
    v = rules.sae_sparsity_grid("completion", t)
    assert v.verdict == "sparse at 4 on 1 of 2 SAEs" and "not on b (at no k)" in v.sentence
    assert "over the 2 SAEs 0.97 against 0.22–0.90" in v.sentence
    # one SAE (the quick study): no count of SAEs beside the quoted one
    one = rules.sae_sparsity_grid("completion", grid_table({"topk-x2-s0": SPARSE}, max_active=8))
    assert (
        one.verdict == "sparse at 4 on all SAEs"
        and "of at most 8 active" in one.sentence
        and "SAEs" not in one.sentence
    )
    assert rules.sae_sparsity_grid("memory", grid_table({"topk-x2-s0": DENSE})).sentence.startswith(
        "memory: not sparse on the one SAE"
    )
    assert "sae-grid" in rules.CRITERIA
