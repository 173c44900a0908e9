"""Every findings rule can fail (fbt_probe/reproduce/rules.py): each is fed a table that gives its
verdict, a table that gives the opposite, and a table of noise around its threshold or at the floor
(0 of n, n of n, n <= 3 groups) that must give "cannot say". The intervals in these tables are
computed here (Wilson at n = groups written out, a bootstrap over synthetic groups), never copied
from a run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fbt_probe.reproduce import rules
from fbt_probe.reproduce.rules import CANNOT

Z = 1.959963984540054


def wilson(p: float, n: int) -> tuple[float, float, float, int]:
    """(p, low, high, n): the Wilson score interval at n = groups, written out."""
    den = 1 + Z * Z / n
    mid, half = (p + Z * Z / (2 * n)) / den, Z * np.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / den
    return p, max(0.0, mid - half), min(1.0, mid + half), n


def per_pair(means: dict[int, float], groups: int = 40, noise: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Pairs of `groups` groups at every length (a group recurs at each length, as completion's do)."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        offset = rng.normal(0, noise)
        for k, m in means.items():
            rows.append({"group_id": f"g{g}", "length_knob": k, "value": m + offset + rng.normal(0, noise)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- trend
def test_trend_falls_rises_and_cannot_say_on_noise_or_few_groups():
    falls = rules.trend(per_pair({0: 0.7, 8: 0.5, 32: 0.3}), "the swap effect")
    assert falls.verdict == "falls" and "falls with length" in falls.sentence
    assert rules.trend(per_pair({0: 0.3, 8: 0.5, 32: 0.7}), "the swap effect").verdict == "rises"
    # noise around a zero slope: the slope's interval holds 0, no trend word
    flat = rules.trend(per_pair({0: 0.50, 8: 0.49, 32: 0.48}, groups=8, noise=0.2), "x")
    assert flat.verdict == CANNOT and "interval holds 0" in flat.sentence
    # a resolved slope with a step back (the committed study's completion: 0.49, 0.33, 0.40): no trend word
    table = per_pair({0: 0.49, 8: 0.33, 32: 0.40})
    dip = rules.trend(table, "the swap effect")
    assert dip.verdict == CANNOT and "do not move the same way at every step" in dip.sentence
    means = table.groupby("length_knob")["value"].mean()
    assert ", ".join(f"{m:.2f}" for m in means) + " at lengths 0, 8, 32" in dip.sentence
    # means that move the same way at every step while the groups disagree (6 of 10 rise, 4 fall, or the
    # mirror): the slope's interval holds 0, so neither trend word
    split = lambda up: pd.DataFrame(  # noqa: E731
        [
            {"group_id": f"g{g}", "length_knob": k, "value": v if g < up else 1.0 - v}
            for g in range(10)
            for k, v in ((0, 0.0), (8, 0.5), (32, 1.0))
        ]
    )
    for up, means in ((6, [0.4, 0.5, 0.6]), (4, [0.6, 0.5, 0.4])):
        v = rules.trend(split(up), "x")
        assert (
            v.verdict == CANNOT
            and "interval holds 0" in v.sentence
            and v.short.startswith(" / ".join(f"{m:.2f}" for m in means))
        )
    # the floor: three groups falling steeply say nothing
    few = rules.trend(per_pair({0: 0.9, 8: 0.5, 32: 0.1}, groups=3), "x")
    assert few.verdict == CANNOT and "too few groups" in few.sentence
    # a seed without a slope interval (a seeds table without the slope row) is not judged
    assert rules.trend_verdict("x", {"means": {0: 0.9, 8: 0.5}, "slope": None, "groups": 40}).verdict == CANNOT


def test_trend_slope_is_the_least_squares_slope_of_the_means_or_of_the_ratio_of_means():
    t = per_pair({0: 0.2, 8: 0.5, 32: 0.65}, noise=0.0)
    s, lo, hi = rules.trend_slope_ci(t, n_boot=200)
    assert s == pytest.approx(np.polyfit([0, 1, 2], [0.2, 0.5, 0.65], 1)[0]) and lo - 1e-12 <= s <= hi + 1e-12
    # with `den` (a normalized effect's gap) each length's number is Σvalue / Σden
    rng = np.random.default_rng(1)
    r = per_pair({0: 1.0, 8: 0.8, 32: 0.6}, noise=0.1).assign(den=lambda d: rng.uniform(0.5, 3.0, len(d)))
    n = rules.trend_numbers(r, n_boot=100)
    by = r.groupby("length_knob")
    ratio = (by["value"].sum() / by["den"].sum()).to_numpy()
    assert list(n["means"].values()) == pytest.approx(ratio) and n["groups"] == 40
    assert n["slope"][0] == pytest.approx(np.polyfit([0, 1, 2], ratio, 1)[0])


# ----------------------------------------------------------------------------- directions
def test_directions_one_way_its_opposites_and_cannot_say():
    one = rules.directions_verdict({1: wilson(1.0, 20), 0: wilson(0.0, 20)})
    assert one.verdict == "one direction" and "into label-1" in one.sentence and "[0.84, 1.00]" in one.sentence
    assert rules.directions_verdict({1: wilson(1.0, 20), 0: wilson(1.0, 20)}).verdict == "both"
    assert rules.directions_verdict({1: wilson(0.0, 20), 0: wilson(0.05, 20)}).verdict == "neither"
    assert rules.directions_verdict({1: wilson(0.5, 40), 0: wilson(0.45, 40)}).verdict == "partial"
    # 0.20 of 40 groups ([0.11, 0.35]) neither follows nor ignores: in part, so not "one direction"
    assert rules.directions_verdict({1: wilson(1.0, 40), 0: wilson(0.2, 40)}).verdict == "partial"
    # n of n and 0 of n on three groups: the floor
    assert rules.directions_verdict({1: wilson(1.0, 3), 0: wilson(0.0, 3)}).verdict == CANNOT
    # the committed study's completion: 0.78 [0.57, 0.91] reaches 0.9, so it cannot say it is only partial
    assert rules.directions_verdict({0: wilson(0.78, 20), 1: wilson(0.07, 20)}).verdict == CANNOT
    # from pairs: the rates are Wilson at n = groups
    rows = [{"group_id": f"g{g}", "label": lab, "value": float(lab == 1)} for g in range(20) for lab in (0, 1)]
    assert rules.direction_rates(pd.DataFrame(rows))[1] == pytest.approx(wilson(1.0, 20))


# ----------------------------------------------------------------------------- is the state needed
def test_redundancy_is_read_from_the_bypass_and_the_mean_state_not_from_zero():
    # registers in the committed study: zero input 0.40 (the token erased too), bypass 1.00: redundant
    v = rules.redundancy("registers", wilson(1.0, 60), wilson(0.91, 60), zero=wilson(0.40, 60))
    assert v.verdict == "redundant" and "fused input set to zero (the token erased as well)" in v.sentence
    assert "lost in part" not in v.sentence
    needed = rules.redundancy("memory", wilson(0.40, 40), wilson(0.55, 40), zero=wilson(1.0, 40))
    assert needed.verdict == "needed"  # the zero input answering does not count either way
    # noise: at the threshold (0.85 on 20 groups reaches 0.9 but is not at it) and at the floor (3 of 3)
    assert rules.redundancy("x", wilson(0.85, 20), wilson(0.80, 20)).verdict == CANNOT
    assert rules.redundancy("x", wilson(1.0, 3), None).verdict == CANNOT
    assert rules.redundancy("x", None, None, zero=wilson(1.0, 40)).verdict == CANNOT


# ----------------------------------------------------------------------------- recomputable
def test_recomputable_its_opposites_and_cannot_say():
    ok = rules.recomputable("The feedback model", {"completion": wilson(1.0, 20), "memory": wilson(1.0, 40)})
    assert ok.verdict == "recomputable"
    weak = rules.recomputable("The feedback model", {"completion": wilson(1.0, 20), "compose": wilson(0.80, 60)})
    assert weak.verdict == "not-recomputable" and "compose" in weak.sentence
    chance = rules.recomputable("m", {"a": wilson(0.0, 20), "b": wilson(0.55, 40)})
    assert chance.verdict == "not-answered" and "a, b" in chance.sentence
    # noise: 0.92 on 20 groups has an interval reaching 0.95; and n of n on three groups
    assert rules.recomputable("m", {"a": wilson(1.0, 20), "b": wilson(0.92, 20)}).verdict == CANNOT
    assert rules.recomputable("m", {"a": wilson(1.0, 3)}).verdict == CANNOT


# ----------------------------------------------------------------------------- read-out
def test_readout_transformed_and_cannot_say():
    yes = rules.readout(
        "completion",
        {"feedback": (wilson(0.998, 80), wilson(0.998, 80)), "baseline": (wilson(0.877, 80), wilson(0.886, 80))},
    )
    assert yes.verdict == "readout"
    no = rules.readout("completion", {"feedback": (wilson(1.0, 80), wilson(0.6, 80))})
    assert no.verdict == "transformed"
    near = rules.readout("completion", {"feedback": (wilson(0.90, 40), wilson(0.85, 40))})  # apart by 0.05, overlapping
    assert near.verdict == CANNOT
    assert rules.readout("completion", {"feedback": (wilson(1.0, 3), wilson(1.0, 3))}).verdict == CANNOT


# ----------------------------------------------------------------------------- Fig. 7a against the control
def test_fig7a_is_a_contrast_with_the_untrained_fusion_control():
    rec = wilson(1.0, 80)
    assert rules.fig7a("completion", rec, (0.12, 0.10, 0.14, 80), 0.996).verdict == "replicates"
    # the control reads the same (memory in the committed study): no replication as a contrast
    same = rules.fig7a("memory", wilson(1.0, 128), (0.0, 0.0, 0.01, 128), 1.0)
    assert same.verdict == "does not replicate" and "control reads the same" in same.sentence
    # fed the control's own numbers (its reading against itself) it does not say "replicates" either
    assert rules.fig7a("completion", wilson(0.88, 80), (0.0, 0.0, 0.0, 80), 0.996).verdict == "does not replicate"
    assert rules.fig7a("completion", wilson(0.7, 80), (0.2, 0.1, 0.3, 80), 0.996).verdict == "does not replicate"
    # noise: a difference whose interval holds 0 and leaves the ±0.02 band; the floor; no control
    assert rules.fig7a("completion", rec, (0.03, -0.01, 0.07, 80), 0.996).verdict == CANNOT
    assert rules.fig7a("completion", wilson(1.0, 3), (0.5, 0.3, 0.7, 3), 0.996).verdict == CANNOT
    assert rules.fig7a("completion", rec, None, 0.996).verdict == CANNOT


def test_fig7b_replicates_does_not_is_untestable_or_cannot_say():
    best = {"standard": wilson(0.7, 96), "recurrent:1": wilson(0.8, 96), "full": wilson(0.85, 96)}
    assert rules.fig7b("registers", best, wilson(0.9, 60)).verdict == "replicates"
    worst = {"standard": wilson(0.7, 96), "recurrent:1": wilson(1.0, 96), "full": wilson(0.55, 96)}
    assert rules.fig7b("registers", worst, wilson(0.9, 60)).verdict == "does not replicate"
    # the model does not answer under `full` (0 of 20): untestable, not a non-replication
    v = rules.fig7b("registers", worst, wilson(0.0, 20))
    assert v.verdict == "untestable" and "does not answer" in v.sentence
    # answered at 0.60 on 20 groups, an interval that holds chance: not shown to answer, so untestable too
    assert rules.fig7b("registers", best, wilson(0.6, 20)).verdict == "untestable"
    near = {"recurrent:1": wilson(0.95, 40), "full": wilson(0.90, 40)}  # 0.05 below, intervals overlapping
    assert rules.fig7b("registers", near, wilson(0.9, 40)).verdict == CANNOT
    assert rules.fig7b("registers", {"recurrent:1": wilson(0.5, 3), "full": wilson(1.0, 3)}, None).verdict == CANNOT
    assert rules.fig7b("registers", {"recurrent:1": wilson(0.5, 30)}, None).verdict == "not-run"


def test_fig3_reads_the_rise_and_its_interval():
    assert rules.fig3((0.01, -0.01, 0.03), 400).verdict == "replicates"
    assert rules.fig3((4.3, 4.1, 4.5), 400).verdict == "does not replicate"
    assert rules.fig3((0.1, 0.05, 0.15), 400).verdict == CANNOT
    assert rules.fig3((0.08, 0.03, 0.13), 400).verdict == CANNOT  # below 0.1, its interval not
    assert rules.fig3((4.3, 4.1, 4.5), 3).verdict == CANNOT


# ----------------------------------------------------------------------------- contraction: the tail
def test_contraction_names_a_plateau_a_plateau():
    w = rules.contraction_windows(32)
    assert w == {"early": (2, 4), "middle": (9, 16), "tail": (25, 32)}
    # the committed study's curve: 11.6 at pass 2, 1.66 at 16 and 1.72 at 32 — a fall, then a plateau
    plateau = rules.contraction((0.16, 0.15, 0.17), (1.02, 0.99, 1.05), 406, w)
    assert plateau.verdict == "falls to a plateau" and "does not converge" in plateau.sentence
    assert rules.contraction((0.01, 0.008, 0.012), (0.1, 0.08, 0.12), 406, w).verdict == "contracts, still decaying"
    assert rules.contraction((0.9, 0.8, 1.0), (1.0, 0.9, 1.1), 406, w).verdict == "does not contract"
    # noise: the tail's ratio to the early passes straddles 0.5, or to the middle ones straddles 0.5
    assert rules.contraction((0.5, 0.3, 0.7), (0.9, 0.8, 1.0), 406, w).verdict == CANNOT
    assert rules.contraction((0.1, 0.08, 0.12), (0.5, 0.3, 0.7), 406, w).verdict == CANNOT
    assert rules.contraction((0.01, 0.008, 0.012), (0.1, 0.08, 0.12), 3, w).verdict == CANNOT


def test_contraction_windows_scale_with_the_passes():
    assert rules.contraction_windows(6) == {"early": (2, 2), "middle": (2, 3), "tail": (5, 6)}
    from fbt_probe.reproduce import passes_rules as R

    w = rules.contraction_windows(32)
    assert (w["early"], w["middle"], w["tail"]) == (R.EARLY, R.MIDDLE, R.TAIL)


# ----------------------------------------------------------------------------- DAS
def test_das_exceeds_the_swap_only_by_a_margin_its_interval_clears():
    ex = rules.das_illusion("memory", wilson(1.0, 20), 0.5, (wilson(0.8, 20), 0.1))
    assert ex.verdict == "exceeds" and "illusion" in ex.sentence and "the control shows the same excess" in ex.sentence
    within = rules.das_illusion("memory", wilson(0.6, 20), 0.76, (wilson(0.2, 20), 0.3))
    assert within.verdict == "within" and "illusion" not in within.sentence and "same excess" not in within.sentence
    # the floor that fired in the committed study: DAS 0.01 [0.00, 0.17] against a swap of 0.00
    floor = (0.01, 0.0004, 0.17, 20)
    v = rules.das_illusion("memory", floor, 0.0, (floor, 0.0))
    assert v.verdict == CANNOT and "same excess" not in v.sentence
    assert rules.das_illusion("memory", wilson(1.0, 3), 0.0).verdict == CANNOT


# ----------------------------------------------------------------------------- SAE
def sae_table(feats: dict, rand: dict, width: float = 0.05, groups: int | None = None) -> pd.DataFrame:
    rows = [
        {"condition": c, "k": k, "fraction": v, "ci_low": v - width, "ci_high": v + width}
        for c, d in (("features", feats), ("random", rand))
        for k, v in d.items()
    ]
    t = pd.DataFrame(rows)
    return t if groups is None else t.assign(groups=groups)


def test_sae_sparsity_its_opposite_and_cannot_say():
    # completion in the committed study: 4 label latents 0.97 against 4 random active latents 0.22
    yes = rules.sae_sparsity("completion", sae_table({1: 0.5, 4: 0.97, 16: 1.0}, {1: 0.1, 4: 0.22, 16: 0.9}), 16)
    assert yes.verdict == "sparse at 4" and "4 label latents of at most 16 active latents" in yes.sentence
    # memory: the label latents' share below 0.8 at 4, and at 16 no better than the random active ones
    no = rules.sae_sparsity("memory", sae_table({4: 0.6, 16: 0.97}, {4: 0.55, 16: 1.01}), 16)
    assert no.verdict == "not sparse" and "k = 16: 0.97 vs random 1.01" in no.sentence
    # noise: a share whose interval straddles 0.8; the floor of groups
    near = rules.sae_sparsity("x", sae_table({4: 0.8}, {4: 0.2}, width=0.1), 16)
    assert near.verdict == CANNOT
    assert rules.sae_sparsity("x", sae_table({4: 0.97}, {4: 0.1}, groups=3), 16).verdict == CANNOT


def grid_table(per_sae: dict[str, tuple[dict, dict]], max_active: int = 16, width: float = 0.05) -> pd.DataFrame:
    """The sparsity table of a grid of SAEs: sae -> (label-latent shares by k, random-active shares by k)."""
    return pd.concat(
        [sae_table(f, r, width).assign(sae=s, max_active=max_active) for s, (f, r) in per_sae.items()],
        ignore_index=True,
    )


SPARSE = ({1: 0.5, 4: 0.97, 16: 1.0}, {1: 0.1, 4: 0.22, 16: 0.95})  # completion's shape: 4 latents
DENSE = ({4: 0.6, 16: 0.97}, {4: 0.55, 16: 1.01})  # memory's: the random active latents catch up
LATE = ({1: 0.3, 4: 0.6, 16: 0.97}, {1: 0.1, 4: 0.2, 16: 0.5})  # sparse only at 16
NEAR = ({4: 0.8, 16: 0.8}, {4: 0.2, 16: 0.3})  # at the threshold: the label latents' intervals straddle 0.8


def test_sae_grid_says_on_how_many_sparse_autoencoders_the_claim_holds():
    ids = ["topk-x4-s0", "topk-x4-s1", "topk-x8-s0", "topk-x8-s1", "topk-x4-s0-demo"]
    every = rules.sae_sparsity_grid("completion", grid_table({s: SPARSE for s in ids}))
    assert every.verdict == "sparse at 4 on all SAEs"
    assert every.sentence.startswith(
        "completion: on all 5 SAEs, 4 label latents of at most 16 active carry most of the full-state swap's effect "
        "(topk-x4-s0: **0.97** [0.92, 1.02], 4 random active latents **0.22** [0.17, 0.27]; over the 5 SAEs 0.97 "
        "against 0.22)"
    )
    some = rules.sae_sparsity_grid("completion", grid_table({**{s: SPARSE for s in ids[:4]}, ids[4]: LATE}))
    assert some.verdict == "sparse at 4 on 4 of 5 SAEs"
    assert some.sentence.endswith("; not on topk-x4-s0-demo (there first at k = 16)")
    late = rules.sae_sparsity_grid("completion", grid_table({ids[0]: SPARSE, ids[1]: LATE, ids[2]: LATE}))
    assert late.verdict == "sparse at 16 on 2 of 3 SAEs" and "with fewer latents at k = 4 on 1 of 3" in late.sentence
    # the opposite on every SAE, and noise on every SAE
    none = rules.sae_sparsity_grid("memory", grid_table({s: DENSE for s in ids}))
    assert none.verdict == "not sparse" and none.sentence.startswith("memory: not sparse on any of the 5 SAEs")
    assert "a pair has at most 16 active latents" in none.sentence
    assert rules.sae_sparsity_grid("x", grid_table({s: NEAR for s in ids}, width=0.1)).verdict == CANNOT
    one = rules.sae_sparsity_grid("completion", grid_table({"topk-x2-s0": SPARSE}, max_active=8))
    assert one.verdict == "sparse at 4 on all SAEs" and "SAEs" not in one.sentence


# ----------------------------------------------------------------------------- paired
def test_paired_higher_lower_and_cannot_say():
    assert rules.paired("d", (0.12, 0.10, 0.14, 80)).verdict == "higher"
    assert rules.paired("d", (-0.12, -0.14, -0.10, 80)).verdict == "lower"
    v = rules.paired("d", (-0.29, -2.28, 0.84, 20))
    assert v.verdict == CANNOT and "holds 0" in v.sentence
    assert rules.paired("d", (0.5, 0.4, 0.6, 3)).verdict == CANNOT  # three groups
    assert rules.paired("d", (0.0, 0.0, 0.0, 30)).verdict == "same"
    assert rules.paired("d", (1.0, 1.0, 1.0, 30)).verdict == "constant"
    assert rules.paired("d", (float("nan"),) * 3 + (20,), "no gap: baseline").verdict == "no gap"
    assert rules.paired("d", None).verdict == "not-paired"


# ----------------------------------------------------------------------------- serial depth
def depth_table(cells: dict) -> pd.DataFrame:
    """{(model, k, mode): (accuracy, groups)} with Wilson intervals at n = groups."""
    rows = []
    for (model, k, mode), (p, g) in cells.items():
        _, lo, hi, _ = wilson(p, g)
        rows.append({"model": model, "k": k, "mode": mode, "accuracy": p, "ci_low": lo, "ci_high": hi, "groups": g})
    return pd.DataFrame(rows)


def test_depth_separates_does_not_and_cannot_say_below_the_floor():
    sep = {("feedback", 16, "standard"): (0.5, 64), ("feedback", 16, "jacobi:2"): (0.97, 64)}
    sep |= {("baseline", 16, m): (0.5, 64) for m in ("standard", "jacobi:2")}
    assert rules.depth_separation(depth_table(sep)).verdict == "separates at k = 16"
    none = {**sep, ("feedback", 16, "jacobi:2"): (0.52, 64)}
    assert rules.depth_separation(depth_table(none)).verdict == "does not separate"
    # the feedback model separates, but the baseline answers under `standard` (0.90 on 64 groups): not a
    # separation; at 0.70 on 64 groups ([0.58, 0.80], across 0.65) the table cannot say
    baseline_answers = {**sep, ("baseline", 16, "standard"): (0.9, 64)}
    assert rules.depth_separation(depth_table(baseline_answers)).verdict == "does not separate"
    baseline_near = {**sep, ("baseline", 16, "standard"): (0.7, 64)}
    assert rules.depth_separation(depth_table(baseline_near)).verdict == CANNOT
    # the same separation on three groups per cell (k = 4 in the study): too few groups, read for nothing
    few = {(m, 4, mode): (p, 3) for (m, _, mode), (p, _) in sep.items()}
    v = rules.depth_separation(depth_table(few))
    assert v.verdict == CANNOT and "too few groups" in v.sentence
    # noise at a k with enough groups: a feedback mode at 0.85 whose interval reaches 0.9
    near = {**sep, ("feedback", 16, "jacobi:2"): (0.85, 40)}
    assert rules.depth_separation(depth_table(near)).verdict == CANNOT


def test_depth_over_seeds_every_some_none_and_cannot_say():
    s, n, c = (rules.Verdict("depth", v, "") for v in ("separates at k = 16", "does not separate", CANNOT))
    assert rules.depth_over_seeds({0: s, 1: s, 2: s}).verdict == "on every seed"
    assert rules.depth_over_seeds({0: s, 1: n, 2: n}).verdict == "on 1 of 3 seeds"
    assert rules.depth_over_seeds({0: n, 1: n, 2: n}).verdict == "on no seed"
    assert rules.depth_over_seeds({0: n, 1: c, 2: n}).verdict == CANNOT


# ----------------------------------------------------------------------------- probe variants
def test_probe_dependence_depends_does_not_and_cannot_say():
    assert rules.probe_dependence((0.72, 0.90), (1.0, 1.0), 80).verdict == "depends"
    assert rules.probe_dependence((0.99, 1.0), (1.0, 1.0), 80).verdict == "does not depend"
    # a spread of 0.05 on 20 groups is within the Wilson half-width there
    assert rules.probe_dependence((0.85, 0.90), (1.0, 1.0), 20).verdict == CANNOT
    assert rules.probe_dependence((0.5, 0.9), (1.0, 1.0), 3).verdict == CANNOT


# ----------------------------------------------------------------------------- over training seeds
def test_a_verdict_is_stated_only_where_it_holds_on_every_seed():
    falls = {"means": {0: 0.7, 8: 0.5, 32: 0.3}, "slope": (-0.2, -0.25, -0.15), "groups": 40}
    flat = {"means": {0: 0.78, 8: 0.52, 32: 0.75}, "slope": (-0.01, -0.05, 0.03), "groups": 40}
    every = {s: rules.trend_verdict("the effect", falls) for s in range(3)}
    v = rules.stated(every, 0, "With length, the effect")
    assert v.verdict == "falls on every seed" and "falls, on every one of the 3 training seeds" in v.sentence
    mixed = {0: every[0], 1: rules.trend_verdict("the effect", flat), 2: None}
    v = rules.stated(mixed, 0, "With length, the effect")
    assert v.verdict == "falls on 1 of 3 seeds, cannot say on 1 of 3 seeds"
    assert "seed 1: cannot say (0.78 / 0.52 / 0.75" in v.sentence and "seed 2: not in the seeds table" in v.sentence
    # a seed without the numbers is not read as agreeing
    v = rules.stated({**every, 2: None}, 0, "With length, the effect")
    assert v.verdict == "falls on 2 of 3 seeds" and "seed 2: not in the seeds table" in v.sentence
    one = rules.stated({0: every[0]}, 0, "With length, the effect")
    assert one.verdict == "falls" and one.sentence.endswith("(one training seed's numbers: seed 0)")
    assert rules.over_seeds({0: None}).verdict == CANNOT


def test_every_rule_states_its_criterion():
    names = {"trend", "directions", "redundancy", "recomputable", "readout", "fig7a", "fig7b", "fig3", "contraction"}
    assert names | {"das", "sae", "sae-grid", "paired", "depth", "depth-seeds", "probe-variants", "seeds"} <= set(
        rules.CRITERIA
    )
    assert "untrained-fusion control" in rules.CRITERIA["fig7a"] and "untestable" in rules.CRITERIA["fig7b"]


def test_numbers_print_without_a_zero_width_interval():
    assert rules.fmt(1.05, 1.05, 1.05) == "**1.05** (no spread over groups)"
    assert rules.fmt(0.552, 0.551, 0.554) == "**0.552** [0.551, 0.554]"
    assert rules.fmt(0.5, 0.4, 0.6) == "**0.50** [0.40, 0.60]" and rules.fmt(float("nan"), 0, 0) == "n/a"
    # the per-seed lists and the paired differences print their intervals the same way
    assert rules.plain((0.5, 0.5, 0.5)) == "0.50 (no spread over groups)"
    assert rules.plain((0.5, 0.499, 0.503)) == "0.50 [0.499, 0.503]"
    near = rules.paired("d", (0.001, 0.0004, 0.0016, 30))
    assert "**0.00** [0.000, 0.002]" in near.sentence and near.short == "0.00 [0.000, 0.002]"
    flat = rules.fig7a("memory", wilson(1.0, 128), (0.0, 0.0, 0.0, 128))
    assert (
        "**0.00** (no spread over groups) (paired, n = 128 groups)" in flat.sentence
        and "[0.00, 0.00]" not in flat.sentence
    )
