"""Attribution patching: equal to exact patching where the model is linear in the patched activation
(every mode, through carried states and Jacobi passes), the same cells and metric as residual
patching, sign agreement with exact patching on the top cells of a nonlinear model, and the parity
table of `--check K`."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import fbt_probe as fp
from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name
from fbt_probe.interventions import label_token_ids, pair_batches, residual_patching
from fbt_probe.interventions.atp_parity import attribution, choose_cells, parity_table
from fbt_probe.interventions.attribution import FUSION_HOOKS, default_hooks, exact_cells, trace
from fbt_probe.modes import parse_mode
from fbt_probe.tasks import build_tokenizer, generate, load_spec
from tests.helpers import make_model

pytestmark = pytest.mark.usefixtures("one_thread")
KEYS = ["row", "hook", "pass_index", "position", "direction"]


def linear_model(seed: int = 0):
    """A model that is linear in every activation it has (so AtP must equal exact patching):
    - every RMSNorm is made linear: with eps = 1e16 and gain 1e8, RMSNorm(x) = x·(1 + mean(x²)/1e16)^-1/2,
      which is x to float64 precision for the O(1)-O(100) activations here;
    - attention is uniform (QK-norm gains 0, so every score is 0): a fixed average of the values;
    - the MLPs are off (down_proj = 0);
    - the fusion is value ⊙ gate with a gate that depends on the token only: linear in the carried state
      and in the gate. W_U is scaled down so that the feedback loop contracts over T serial steps."""
    m = make_model(seed, rms_eps=1e16, init_std=0.5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight", "fusion.norm.weight")):
                p.fill_(1e8)
            elif name.endswith(("q_norm.weight", "k_norm.weight", "down_proj.weight")):
                p.zero_()
            elif name == "fusion.W_U.weight":
                p.mul_(0.05)
    return m


@pytest.fixture(scope="module")
def pairs():
    tok = build_tokenizer()
    frames = [
        generate(dataclasses.replace(load_spec(t), length_grid=(k,)), groups=3, seed=0, tokenizer=tok)
        for t, k in (("completion", 0), ("memory", 8))
    ]
    df = pd.concat(frames, ignore_index=True)
    return list(pair_batches(df, label_token_ids(df, tok), batch_size=6))


def _matched(w: pd.DataFrame) -> pd.DataFrame:
    return w[w.method == "exact"].merge(w[w.method == "atp"], on=KEYS, suffixes=("_exact", "_atp"))


@pytest.mark.parametrize("mode", ["standard", "recurrent:3", "jacobi:3", "full"])
def test_atp_equals_exact_patching_on_a_model_linear_in_the_activation(pairs, mode):
    model = linear_model()
    # completion (14 tokens); K larger than the grid: every cell is also patched exactly
    w = attribution(model, pairs[:1], parse_mode(mode), min_gap=0.0, check=10_000, batch_size=600)
    m = _matched(w)
    n_cells = len(w[w.method == "atp"])
    assert len(m) == n_cells and len(m) > 0  # every AtP cell was also patched exactly
    scale = m["logit_diff_exact"].abs().max()
    effect = (m["logit_diff_exact"] - m["clean_logit_diff_exact"]).abs().max()
    assert effect > 0.1 * scale  # patches do move the answer ...
    # ... and the first-order estimate is exact (float64 rounding, relative to the LD scale); a wrong sign,
    # partner, orientation, position or pass would be off by the size of the effect
    np.testing.assert_allclose(m["logit_diff_atp"], m["logit_diff_exact"], rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(m["normalized_atp"], m["normalized_exact"], rtol=0, atol=1e-7)
    if mode != "standard":  # gradients crossed the feedback: cells before the fed positions matter
        assert set(m["hook"]) >= set(FUSION_HOOKS)
    if mode == "jacobi:3":
        assert set(m["pass_index"]) == {1, 2, 3}
        early = m[(m.pass_index == 1) & (m.position < m.position.max())]
        assert (early["logit_diff_exact"] - early["clean_logit_diff_exact"]).abs().max() > 1e-3


def test_atp_is_only_approximate_on_a_nonlinear_model(pairs):
    """The control for the test above: the same comparison on an ordinary random model fails it."""
    model = make_model()
    m = _matched(
        attribution(model, pairs, parse_mode("recurrent:1"), min_gap=0.0, check=10_000, last_k=4, batch_size=600)
    )
    scale = m["logit_diff_exact"].abs().max()
    assert (m["logit_diff_atp"] - m["logit_diff_exact"]).abs().max() > 1e-6 * scale


@pytest.mark.parametrize("mode", ["standard", "recurrent:1"])
def test_exact_cells_are_residual_patching(pairs, mode):
    """The check patches exactly what `residual_patching` patches and scores it the same way."""
    model = make_model()
    batch = pairs[0]
    L = model.cfg.n_layers
    names = [depth_name(d) for d in (0, L)]
    serial = mode != "standard"
    tr = trace(model, batch, parse_mode(mode), names, serial)
    cells = [(n, 1, p) for n in names for p in (batch.T - 3, batch.T - 1)]
    for direction in ("denoising", "noising"):
        ours = exact_cells(model, batch, tr, parse_mode(mode), cells, direction, serial, 0.0)
        ref = residual_patching(
            model, [batch], mode=parse_mode(mode), min_gap=0.0, depths=[0, L], last_k=3, directions=(direction,)
        )
        ref = ref[ref.position.isin([batch.T - 3, batch.T - 1])].assign(hook=lambda d: d.depth.map(depth_name))
        both = ours.merge(ref, on=["row", "hook", "position"], suffixes=("", "_ref"))
        assert len(both) == len(ours) == len(ref)
        # different batch shapes (replicas): float64 agreement, not bitwise
        np.testing.assert_allclose(both["logit_diff"], both["logit_diff_ref"], rtol=0, atol=1e-10)
        np.testing.assert_allclose(both["normalized"], both["normalized_ref"], rtol=0, atol=1e-8)
        assert (both["hook_rule"] == both["hook_rule_ref"]).all()


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "jacobi:2", "full"])
def test_exact_cells_from_a_reused_prefix_are_the_whole_sequence_rerun(pairs, mode):
    """A forward of the check reruns from its first cell's position on (the cells taken by position);
    oracle: every cell patched over the whole sequence (`Forwards(reuse=False)`), float64. Cells at
    early, middle and final positions, on the fused input and the top block, in every pass the mode
    runs, given out of position order (the rows come back in the given order)."""
    from fbt_probe.interventions.forwards import Forwards

    model = make_model()
    batch = pairs[0]
    L, T = model.cfg.n_layers, batch.T
    serial = mode != "standard"
    names = [depth_name(0), depth_name(L)] + (["fusion.hook_out"] if serial else [])
    tr = trace(model, batch, parse_mode(mode), names, serial)
    cells = [(n, k, p) for p in (T - 1, 1, T // 2, T - 2) for (n, k) in sorted(tr.acts) if tr.covered[(n, k)][p]]
    assert len({c[2] for c in cells}) == 4 and len(cells) >= 8
    for direction in ("denoising", "noising"):
        per = 3 * batch.n  # three cells a forward: a chunk holds cells at several positions
        reused = exact_cells(Forwards(model), batch, tr, parse_mode(mode), cells, direction, serial, 0.0, per)
        whole = exact_cells(
            Forwards(model, reuse=False), batch, tr, parse_mode(mode), cells, direction, serial, 0.0, per
        )
        assert list(zip(reused["hook"], reused["pass_index"], reused["position"])) == [
            c for c in cells for _ in range(batch.n)
        ]
        np.testing.assert_allclose(reused["logit_diff"], whole["logit_diff"], rtol=0, atol=1e-10)
        assert (reused["logit_diff"] - reused["clean_logit_diff"]).abs().max() > 1e-6  # the patches move the answer


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "jacobi:2"])
def test_atp_sign_matches_exact_on_the_tiny_models_top_cells(pairs, mode):
    model = fp.load_model("tiny", d_vocab=128).double()
    w = attribution(model, pairs, parse_mode(mode), min_gap=0.0, check=8, last_k=6)
    par = parity_table(w, n_boot=50)
    assert len(par) == 2 * 2 * 2  # tasks × directions × metrics
    assert (par["n_top"] == 8).all() and (par["n_cells"] == 16).all()
    # AtP is first order: on a top cell whose exact effect is ~0 (here 0.001 LD against AtP's -0.04 on
    # completion) the signs can differ. Every top cell with a real exact effect (>= 10% of the largest)
    # must agree; a wrong sign convention, direction or partner flips all of them.
    cells = ["task", "direction", "hook", "pass_index", "position"]
    top = w.merge(w.loc[w["check_cell"] == "top", cells].drop_duplicates(), on=cells)
    top["base"] = np.where(top["direction"] == "denoising", top["corrupt_logit_diff"], top["clean_logit_diff"])
    top["effect"] = top["logit_diff"] - top["base"]
    eff = (
        top.groupby(["task", "direction", "hook", "pass_index", "position", "method"])["effect"]
        .mean()
        .unstack("method")
    )
    for (task, direction), g in eff.groupby(level=["task", "direction"]):
        big = g[g["exact"].abs() >= 0.1 * g["exact"].abs().max()]
        assert len(big) >= 2 and (np.sign(big["atp"]) == np.sign(big["exact"])).all(), (task, direction, g)
    assert (par["sign_agreement_top"] >= 0.5).all(), par
    assert (par["spearman"] > 0).all(), par[
        ["task", "direction", "metric", "spearman"]
    ]  # random cells: ~0 effects, noisy ranks
    assert (par["spearman_ci_low"] <= par["spearman"] + 1e-12).all() and (
        par["spearman"] <= par["spearman_ci_high"] + 1e-12
    ).all()


def test_cell_choice_is_top_k_then_seeded_random(pairs):
    model = make_model()
    w = attribution(model, pairs[:1], parse_mode("standard"), min_gap=0.0, directions=("noising",))
    chosen = choose_cells(w, 3, seed=0)
    assert list(chosen.values()).count("top") == 3 and list(chosen.values()).count("random") == 3
    eff = (w["logit_diff"] - w["clean_logit_diff"]).groupby([w.hook, w.pass_index, w.position]).mean().abs()
    top = {c for c, r in chosen.items() if r == "top"}
    assert min(eff[c] for c in top) >= max(eff[c] for c in chosen if c not in top)
    assert choose_cells(w, 3, seed=0) == chosen and choose_cells(w, 3, seed=1) != chosen


def test_default_hooks_and_refusals(pairs):
    model = make_model()
    T = pairs[0].T
    assert not set(FUSION_HOOKS) & set(default_hooks(model, parse_mode("standard"), T))
    assert set(FUSION_HOOKS) <= set(default_hooks(model, parse_mode("recurrent:1"), T))
    with pytest.raises(FbtError, match="does not fire"):
        attribution(model, pairs[:1], parse_mode("standard"), hooks=["fusion.hook_feedback"])
    with pytest.raises(FbtError, match="not \\[batch, pos"):
        attribution(model, pairs[:1], parse_mode("standard"), hooks=["blocks.0.attn.hook_pattern"])
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
