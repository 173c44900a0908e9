"""Interventions: hook functions are exact, experiments mean what they say, statistics behave,
no hook outlives an experiment. Random small models (float64) and a few generated pairs."""

import dataclasses

import numpy as np
import pytest
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name, depth_names
from fbt_probe.interventions import (
    bootstrap_ci,
    capture,
    edit_at,
    feedback_swap,
    final_logits,
    gate_ablation,
    label_token_ids,
    pair_batches,
    patch_all,
    patch_rows_at,
    probe_direction,
    rank_one_edit,
    residual_patching,
    set_at,
    soft_answer_logits,
    state_replacement,
    stitch,
    summarize,
    to_long,
)
from fbt_probe.interventions.forwards import Forwards
from fbt_probe.interventions.probe_edits import apply_edit, fold_edits
from fbt_probe.modes import parse_mode
from fbt_probe.probes import fit_binary, grouped_folds
from fbt_probe.tasks import build_tokenizer, generate, load_spec
from tests.helpers import assert_same_rows, make_model, task_pairs, tokens

MODES = ["standard", "recurrent:1"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def data():
    df, tok = task_pairs(groups=4)
    return df, label_token_ids(df, tok)


@pytest.fixture(scope="module")
def batches(data):
    df, ids = data
    return list(pair_batches(df, ids, batch_size=8))


def no_hooks_left(model) -> bool:
    return all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())


def run_cache(model, toks, mode, names, serial):
    store = {}
    with torch.no_grad():
        logits = model.run_with_hooks(
            toks, mode=mode, serial=serial, fwd_hooks=[(n, capture(store, n, model)) for n in names]
        )
    return logits, {n: stitch(store[n]) for n in names}


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize(
    "mode,serial", [("standard", False), ("recurrent:1", False), ("recurrent:1", True), ("recurrent:3", True)]
)
def test_patching_a_run_with_itself_is_bit_identical(model, mode, serial):
    toks = tokens(3, 12)
    names = depth_names(model.cfg.n_layers)
    clean, acts = run_cache(model, toks, mode, names, serial)
    T = toks.shape[1]
    pos = torch.tensor([0, 5, T - 1])
    for n in names:
        for hook in (
            patch_all(acts[n], model),
            patch_rows_at(acts[n], pos, model),
            set_at(acts[n][:, T - 1], T - 1, model),
        ):
            with torch.no_grad():
                out = model.run_with_hooks(toks, mode=mode, serial=serial, fwd_hooks=[(n, hook)])
            assert torch.equal(out, clean), n
    assert no_hooks_left(model)


def test_clean_into_corrupt_at_every_position_of_depth0_reproduces_clean_under_standard(model):
    clean_toks, corrupt_toks = tokens(4, 10, seed=1), tokens(4, 10, seed=2)
    clean, acts = run_cache(model, clean_toks, "standard", [depth_name(0)], False)
    with torch.no_grad():
        corrupt = model(corrupt_toks)
        patched = model.run_with_hooks(corrupt_toks, fwd_hooks=[(depth_name(0), patch_all(acts[depth_name(0)], model))])
    assert not torch.allclose(corrupt, clean)
    assert torch.equal(patched, clean)


def test_zero_state_gives_zero_fused_input(model):
    toks = tokens(3, 9)
    store, last = {}, 8
    hooks = [("fusion.hook_feedback", set_at(torch.zeros(3, model.cfg.d_model), last, model))]
    hooks += [(n, capture(store, n, model, last)) for n in ("fusion.hook_value", "fusion.hook_gate", "fusion.hook_out")]
    with torch.no_grad():
        model.run_with_hooks(toks, mode="recurrent:1", fwd_hooks=hooks)
    assert torch.all(store["fusion.hook_gate"] > 0)  # the gate is untouched ...
    assert torch.equal(store["fusion.hook_value"] * store["fusion.hook_gate"], torch.zeros(3, model.cfg.d_model))
    assert torch.equal(store["fusion.hook_out"], torch.zeros(3, model.cfg.d_model))  # ... the input collapses


def test_feedback_swap_equals_the_kv_step_with_the_partners_state(model, batches):
    b = batches[0]
    T = b.T
    states, _ = model.carried_states(b.tokens, parse_mode("recurrent:1"))
    with torch.no_grad():
        swapped = final_logits(
            model,
            b.tokens,
            parse_mode("recurrent:1"),
            [("fusion.hook_feedback", set_at(states[b.partner, T - 1], T - 1, model))],
        )
        cache, _, _ = model.prefill_cache(b.tokens[:, :-1])
        step, _ = model.step(b.tokens[:, -1], cache, states[b.partner, T - 1])
    torch.testing.assert_close(swapped, step, rtol=0, atol=1e-12)


def test_soft_answer_equals_recurrent1_and_sees_its_hooks(model, batches):
    b = batches[0]
    with torch.no_grad():
        torch.testing.assert_close(
            soft_answer_logits(model, b.tokens),
            final_logits(model, b.tokens, parse_mode("recurrent:1")),
            rtol=0,
            atol=1e-12,
        )
    zero = [("fusion.hook_gate", set_at(torch.zeros(b.n, model.cfg.d_model), b.T - 1, model))]
    torch.testing.assert_close(
        soft_answer_logits(model, b.tokens, zero),
        final_logits(model, b.tokens, parse_mode("recurrent:1"), zero),
        rtol=0,
        atol=1e-12,
    )
    assert no_hooks_left(model)


def test_rank_one_edits():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(6, 5, generator=g, dtype=torch.float64)
    w = torch.nn.functional.normalize(torch.randn(5, generator=g, dtype=torch.float64), dim=0).expand(6, 5)
    mu = X.mean(0).expand(6, 5)
    erased = rank_one_edit(w, w, mu)(X)
    torch.testing.assert_close(((erased - mu) * w).sum(-1), torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(rank_one_edit(w, w, mu)(erased), erased)  # idempotent
    z = torch.zeros(6, 5, dtype=torch.float64)
    torch.testing.assert_close(rank_one_edit(z, z, z, shift=2 * w)(X), X + 2 * w)
    hook = edit_at(rank_one_edit(z, z, z, shift=w[:1].expand(6, 5)), 3)
    out = hook(torch.zeros(6, 4, 5, dtype=torch.float64))
    assert torch.equal(out[:, 3], w) and torch.equal(out[:, :3], torch.zeros(6, 3, 5, dtype=torch.float64))


def test_leace_and_orth_erasure_remove_the_class_mean_difference():
    pytest.importorskip("concept_erasure")
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 20)
    groups = np.arange(40) // 2
    X = rng.standard_normal((40, 6)) + 2.0 * y[:, None] * np.array([1, 0, 0, 1, 0, 0])
    splits = grouped_folds(y, groups, 4, 0)
    edits = fold_edits(X, y, splits, ("leace", "orth"))
    assert np.nanmean(edits["probe_correct"]) > 0.9  # decodable before
    for train, _ in splits[:1]:
        from fbt_probe.interventions.probe_edits import _eraser

        Xe = apply_edit(X[train], *_eraser("leace", X[train], y[train], fit_binary(X[train], y[train]).direction))
        gap = Xe[y[train] == 1].mean(0) - Xe[y[train] == 0].mean(0)
        np.testing.assert_allclose(gap, 0, atol=1e-8)  # LEACE: no linear signal on its fitting data


# ----------------------------------------------------------------------------- experiments
def test_feedback_swap_conditions_and_gate_control(model, batches):
    w = feedback_swap(model, batches[:1], min_gap=0.0)
    assert set(w["condition"]) == {"state", "value", "gate"} and set(w["hook_rule"]) == {"one-pass"}
    gate = w[w.condition == "gate"]  # same final token in a pair: the gate swap changes nothing
    np.testing.assert_allclose(gate["logit_diff"], gate["corrupt_logit_diff"], atol=1e-10)
    np.testing.assert_allclose(gate["normalized"], 0.0, atol=1e-8)
    st, va = w[w.condition == "state"], w[w.condition == "value"]
    np.testing.assert_allclose(st["logit_diff"].to_numpy(), va["logit_diff"].to_numpy(), atol=1e-10)
    with pytest.raises(FbtError, match="feeds no state"):
        feedback_swap(model, batches[:1], mode=parse_mode("standard"))
    assert no_hooks_left(model)


def test_state_replacement_and_gate_ablation(model, batches):
    sr = state_replacement(model, batches, min_gap=0.0)
    assert set(sr["condition"]) == {"none", "zero", "mean", "random", "nonpartner"}
    np.testing.assert_allclose(sr[sr.condition == "none"]["normalized"], 1.0)
    ga = gate_ablation(model, batches, min_gap=0.0)
    assert set(ga["decoding"]) == {"prefill", "std", "soft"}
    zero_state = sr[sr.condition == "zero"].sort_values("row")["logit_diff"].to_numpy()
    for dec in ("prefill", "soft"):  # a zero gate and a zero state both give a zero fused input
        zero_gate = ga[(ga.condition == "zero") & (ga.decoding == dec)].sort_values("row")["logit_diff"].to_numpy()
        np.testing.assert_allclose(zero_gate, zero_state, atol=1e-9)
    assert no_hooks_left(model)


@pytest.mark.parametrize("mode", MODES)
def test_residual_patching_top_of_last_position_is_full_recovery(model, batches, mode):
    L = model.cfg.n_layers
    w = residual_patching(
        model, batches[:1], mode=parse_mode(mode), min_gap=0.0, depths=[0, L], last_k=3, batch_size=24
    )
    assert set(w["hook_rule"]) == {"serial" if mode != "standard" else "one-pass"}
    top = w[(w.depth == L) & (w.position == batches[0].T - 1)]
    np.testing.assert_allclose(top[top.direction == "denoising"]["normalized"], 1.0, atol=1e-8)
    np.testing.assert_allclose(top[top.direction == "noising"]["normalized"], 0.0, atol=1e-8)
    if mode == "standard":  # the last token is shared: its embedding carries no label
        d0 = w[(w.depth == 0) & (w.position == batches[0].T - 1)]
        np.testing.assert_allclose(d0["normalized"], d0["direction"].map({"denoising": 0.0, "noising": 1.0}), atol=1e-8)
    assert no_hooks_left(model)


def test_residual_patching_also_patches_where_the_pair_differs(model, batches):
    """With last_k, the last position where a pair's samples differ is patched too (the token that
    decides the label, before the last k) and marked `differs`; there, at depth 0 under standard, the
    patch swaps in the partner's token: denoising recovers the clean run exactly when that is the
    only difference."""
    from fbt_probe.interventions.experiments import differing_positions

    batch = batches[0]
    T, differs = batch.T, differing_positions(batch)
    assert differs and differs[-1] < T - 3
    w = residual_patching(model, [batch], mode=parse_mode("standard"), min_gap=0.0, depths=[0], last_k=3)
    assert sorted(set(w["position"])) == [differs[-1], T - 3, T - 2, T - 1]
    assert w.loc[w.position == differs[-1], "differs"].all() and not w.loc[w.position >= T - 3, "differs"].any()
    if len(differs) == 1:
        at = w[(w.position == differs[0]) & (w.direction == "denoising")]
        np.testing.assert_allclose(at["normalized"], 1.0, atol=1e-8)
    none = residual_patching(
        model, [batch], mode=parse_mode("standard"), min_gap=0.0, depths=[0], last_k=3, differing=0
    )
    assert sorted(set(none["position"])) == [T - 3, T - 2, T - 1]


def test_probe_direction_rows(model, batches):
    w = probe_direction(model, batches, min_gap=0.0, depths=[0, 1], scales=(0.0, 1.0), n_folds=2, erase="orth")
    assert {"probe", "erase-orth", "steer", "steer-random"} == set(w["condition"])
    steer0 = w[(w.condition == "steer") & (w.scale == 0.0)]
    np.testing.assert_allclose(steer0["normalized"], 1.0, atol=1e-8)  # no step, no movement
    assert w.loc[w.condition == "probe", "probe_accuracy"].notna().all()
    assert set(w["hook_rule"]) == {"one-pass"}
    assert no_hooks_left(model)


REUSE_CASES = [
    (feedback_swap, "recurrent:1", {}),
    (feedback_swap, "recurrent:3", {}),
    (feedback_swap, "full", {}),
    (feedback_swap, "jacobi:2", {}),
    (state_replacement, "recurrent:1", {}),
    (state_replacement, "jacobi:3", {}),
    (gate_ablation, "recurrent:1", {}),
    (gate_ablation, "full", {}),
    (residual_patching, "standard", dict(depths=[0, 2], last_k=5, batch_size=24)),
    (residual_patching, "recurrent:1", dict(depths=[0, 2], last_k=5, batch_size=24)),  # serial rule
    (residual_patching, "recurrent:1", dict(depths=[1], last_k=2, differing=2, batch_size=8)),  # differing ones
    (residual_patching, "recurrent:3", dict(depths=[1], batch_size=16)),  # every position, serial rule
    (residual_patching, "recurrent:3", dict(depths=[1], last_k=4, serial=False)),  # one-pass rule
    (residual_patching, "jacobi:2", dict(depths=[1, 3], last_k=3, batch_size=16)),  # serial: every pass
    (probe_direction, "recurrent:1", dict(depths=[0, 3], scales=(1.0,), n_folds=2, erase="orth")),
    (probe_direction, "standard", dict(depths=[1], scales=(1.0,), n_folds=2, erase="orth")),
]


@pytest.mark.parametrize("experiment,mode,kw", REUSE_CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_prefix_reuse_equals_the_full_rerun(model, batches, experiment, mode, kw):
    """Each condition run from a cached prefix (positions before the first edit, hooks off) gives
    the tables of re-running the whole sequence, for every experiment, mode and hook rule."""
    reused = experiment(Forwards(model), batches, mode=parse_mode(mode), min_gap=0.1, **kw)
    full = experiment(Forwards(model, reuse=False), batches, mode=parse_mode(mode), min_gap=0.1, **kw)
    assert_same_rows(reused, full)
    assert no_hooks_left(model) and model.hook_context is None


def test_hooks_are_removed_when_an_intervention_fails(model, batches):
    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        final_logits(model, batches[0].tokens, parse_mode("recurrent:1"), [("fusion.hook_gate", boom)])
    with pytest.raises(RuntimeError, match="boom"):
        soft_answer_logits(model, batches[0].tokens, [("fusion.hook_gate", boom)])
    fw, tokens = Forwards(model), batches[0].tokens
    with pytest.raises(RuntimeError, match="boom"):
        fw.final_logits(tokens, parse_mode("recurrent:1"), [("fusion.hook_gate", boom)], edit_from=tokens.shape[1] - 1)
    with pytest.raises(RuntimeError, match="boom"):
        fw.soft_answer_logits(tokens, [("fusion.hook_gate", boom)])
    assert no_hooks_left(model) and model.hook_context is None


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_ci_contains_the_mean_and_shrinks_with_more_pairs():
    rng = np.random.default_rng(0)
    widths = []
    for n in (20, 80, 320):
        v = rng.normal(0.7, 0.3, size=n)
        mean, lo, hi = bootstrap_ci(v, n_boot=2000, seed=1)
        assert lo <= mean <= hi and mean == pytest.approx(v.mean())
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert bootstrap_ci([0.5]) == (0.5, 0.5, 0.5)


def test_summary_pools_lengths_and_reports_tiny_gap_exclusions(model, batches):
    w = feedback_swap(model, batches, min_gap=1e9)  # every pair's gap is "tiny"
    s = summarize(to_long(w), n_boot=50)
    norm = s[(s.metric == "normalized") & (s.condition == "state")]
    assert set(norm["length_knob"]) == {8, -1}
    assert (norm["n_pairs"] == 0).all() and norm["mean"].isna().all()
    n_pairs = w.groupby("task")["pair_id"].nunique()
    pooled = norm[norm.length_knob == -1].set_index("task")["n_excluded"]
    assert pooled.to_dict() == n_pairs.to_dict()
    ld = s[(s.metric == "logit_diff") & (s.condition == "state") & (s.length_knob == -1)]
    assert (ld["n_excluded"] == 0).all() and (ld["ci_low"] <= ld["mean"]).all() and (ld["mean"] <= ld["ci_high"]).all()


def test_max_pairs_takes_pairs_round_robin_over_groups():
    """A register group (a schedule, its complement, a query per register) holds several pairs; the
    first pair ids of a cell were all one schedule, so a patching cell measured one context."""
    tok = build_tokenizer()
    df = generate(dataclasses.replace(load_spec("registers"), length_grid=(2,)), groups=5, seed=0, tokenizer=tok)
    per_group = df.groupby("group_id")["pair_id"].nunique()
    assert (per_group > 1).all()  # the premise: several pairs per group
    rows = [r for b in pair_batches(df, label_token_ids(df, tok), batch_size=64, max_pairs=5) for r in b.meta["row"]]
    kept = df.iloc[sorted(rows)]
    assert kept["pair_id"].nunique() == 5 and kept["group_id"].nunique() == 5  # one pair from each of the 5 groups
    rows = [r for b in pair_batches(df, label_token_ids(df, tok), batch_size=64, max_pairs=7) for r in b.meta["row"]]
    counts = df.iloc[sorted(rows)].groupby("group_id")["pair_id"].nunique()
    assert sorted(counts.tolist()) == [1, 1, 1, 2, 2]  # a second round only after every group's first pair


def test_padded_register_counts_never_share_a_batch():
    """registers-count pads every input to one token length, so token length alone would put the
    last pairs of one register count and the first of the next in one batch (whenever the pairs per
    cell are not a multiple of the batch's), and probe-direction, which fits its probes per
    (task, length knob) of a batch, would fit one count's probe on another's samples."""
    tok = build_tokenizer()
    df = generate(
        dataclasses.replace(load_spec("registers-count"), length_grid=(2, 4, 8)), groups=3, seed=0, tokenizer=tok
    )
    assert df["n_tokens"].nunique() == 1  # the premise: one padded length
    batches = list(pair_batches(df, label_token_ids(df, tok), batch_size=16, max_pairs=5))
    assert all(b.meta["length_knob"].nunique() == 1 for b in batches)
    assert sorted(int(b.meta["length_knob"].iloc[0]) for b in batches) == [2, 4, 8]
    assert sum(b.n for b in batches) == 3 * 5 * 2  # 5 kept pairs per count (3 groups x m queries >= 6), both samples
