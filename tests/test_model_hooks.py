"""Hook points: names (golden), firing rule in every mode, serial option, TransformerLens tools."""

import pytest
import torch
from transformer_lens import patching

from fbt_probe.config import preset
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.model.transformer import FeedbackTransformer
from tests.helpers import make_model, tokens

GOLDEN_2_LAYERS = [
    "blocks.0.attn.hook_k",
    "blocks.0.attn.hook_pattern",
    "blocks.0.attn.hook_q",
    "blocks.0.attn.hook_v",
    "blocks.0.attn.hook_z",
    "blocks.0.hook_attn_out",
    "blocks.0.hook_mlp_out",
    "blocks.0.hook_resid_mid",
    "blocks.0.hook_resid_post",
    "blocks.0.hook_resid_pre",
    "blocks.0.mlp.hook_post",
    "blocks.0.mlp.hook_pre",
    "blocks.0.mlp.hook_pre_linear",
    "blocks.1.attn.hook_k",
    "blocks.1.attn.hook_pattern",
    "blocks.1.attn.hook_q",
    "blocks.1.attn.hook_v",
    "blocks.1.attn.hook_z",
    "blocks.1.hook_attn_out",
    "blocks.1.hook_mlp_out",
    "blocks.1.hook_resid_mid",
    "blocks.1.hook_resid_post",
    "blocks.1.hook_resid_pre",
    "blocks.1.mlp.hook_post",
    "blocks.1.mlp.hook_pre",
    "blocks.1.mlp.hook_pre_linear",
    "fusion.hook_feedback",
    "fusion.hook_gate",
    "fusion.hook_out",
    "fusion.hook_value",
    "hook_embed",
    "ln_final.hook_normalized",
    # the norms' scales (TransformerLens's `hook_scale`, read by ActivationCache.apply_ln_to_stack)
    "blocks.0.ln1.hook_scale",
    "blocks.0.ln2.hook_scale",
    "blocks.1.ln1.hook_scale",
    "blocks.1.ln2.hook_scale",
    "ln_final.hook_scale",
    # TransformerLens's further hook points (tests/test_tl_idioms.py checks what each holds)
    *[
        f"blocks.{l}.{name}"
        for l in range(2)
        for name in (
            "ln1.hook_normalized",
            "ln2.hook_normalized",
            "hook_mlp_in",
            "attn.hook_rot_q",
            "attn.hook_rot_k",
            "attn.hook_attn_scores",
            "attn.hook_result",
        )
    ],
]
MODES = ["standard", "recurrent:1", "recurrent:3", "full", "jacobi:2", "jacobi:4"]


def test_hook_names_golden():
    assert sorted(make_model(n_layers=2).hook_dict) == sorted(GOLDEN_2_LAYERS)


def test_hook_name_builder_matches_model():
    names = set(make_model(n_layers=2).hook_dict)
    for kind in (
        "resid_pre",
        "resid_mid",
        "resid_post",
        "attn_out",
        "mlp_out",
        "q",
        "k",
        "v",
        "pattern",
        "z",
        "mlp_pre",
        "mlp_post",
    ):
        assert act_name(kind, 1) in names
    for kind in ("embed", "ln_final", "fusion_feedback", "fusion_value", "fusion_gate", "fusion_out"):
        assert act_name(kind) in names
    assert depth_name(0) == "blocks.0.hook_resid_pre" and depth_name(2) == "blocks.1.hook_resid_post"


@pytest.mark.parametrize("mode", MODES)
def test_every_hook_fires_once_with_full_tensors(mode):
    model, toks = make_model(), tokens(2, 10)
    counts = {}

    def count(x, hook):
        counts[hook.name] = counts.get(hook.name, 0) + 1
        assert x.shape[0] == 2 and (x.shape[1] == 10 or hook.name.endswith(("hook_pattern", "hook_attn_scores")))

    with torch.no_grad():
        model.run_with_hooks(toks, mode=mode, serial=False, fwd_hooks=[(lambda n: True, count)])
    fused = mode != "standard"
    expected = {n for n in model.hook_dict if fused or not n.startswith("fusion.")}
    assert set(counts) == expected and set(counts.values()) == {1}


@pytest.mark.parametrize("mode", MODES)
def test_intervening_on_last_position_changes_only_last_logits(mode):
    """A user can cache and intervene on the final position in every mode, fusion hooks included."""
    model, toks = make_model(), tokens(2, 10)
    name = "fusion.hook_out" if mode != "standard" else "blocks.0.hook_resid_pre"

    def zero_last(x, hook):
        x = x.clone()
        x[:, -1] = 0
        return x

    with torch.no_grad():
        clean, cache = model.run_with_cache(toks, mode=mode, names_filter=name)
        patched = model.run_with_hooks(toks, mode=mode, serial=False, fwd_hooks=[(name, zero_last)])
    assert cache[name].shape == (2, 10, model.cfg.d_model)
    assert torch.equal(patched[:, :-1], clean[:, :-1])
    assert not torch.allclose(patched[:, -1], clean[:, -1])
    assert not model.hook_dict[name].fwd_hooks  # nothing leaked


def test_serial_hooks_fire_per_step_and_ripple_forward():
    model, toks = make_model(), tokens(2, 10)
    seen = []

    def record(x, hook):
        seen.append((model.hook_context.phase, tuple(model.hook_context.positions), x.shape[1]))

    with torch.no_grad():
        model.run_with_hooks(toks, mode="recurrent:3", serial=True, fwd_hooks=[("blocks.1.hook_resid_post", record)])
    assert seen == [("prefix", tuple(range(7)), 7), ("step", (7,), 1), ("step", (8,), 1), ("step", (9,), 1)]

    def bump_pos7(x, hook):
        if model.hook_context.positions == range(7, 8):
            return x + 1.0
        return x

    hook = [("blocks.2.hook_resid_post", bump_pos7)]
    with torch.no_grad():
        clean = model(toks, mode="recurrent:3", serial=True)
        patched = model.run_with_hooks(toks, mode="recurrent:3", serial=True, fwd_hooks=hook)
        # serial: the change at position 7 reaches position 8 through the carried state
        assert torch.equal(patched[:, :7], clean[:, :7]) and not torch.allclose(patched[:, 8], clean[:, 8])

        def bump_final(x, hook):
            x = x.clone()
            x[:, 7] += 1.0
            return x

        nonserial = model.run_with_hooks(
            toks, mode="recurrent:3", serial=False, fwd_hooks=[("blocks.2.hook_resid_post", bump_final)]
        )
        # the one-pass rule: carried states were computed before, so position 8 is untouched
        # (the bump is on the top layer, after the last attention, so nothing else can carry it)
        assert torch.equal(nonserial[:, 8], model(toks, mode="recurrent:3")[:, 8])


def test_transformer_lens_patching_helper_runs_and_self_patch_gives_clean_metric():
    model = make_model(dtype=torch.float32)
    toks = tokens(2, 6)

    def metric(logits):
        return logits[:, -1, 3] - logits[:, -1, 4]

    clean_logits, clean_cache = model.run_with_cache(toks)
    out = patching.get_act_patch_resid_pre(model, toks, clean_cache, lambda lg: metric(lg).mean())
    assert out.shape == (model.cfg.n_layers, 6)
    torch.testing.assert_close(out, metric(clean_logits).mean().expand_as(out), rtol=0, atol=1e-6)


def test_paper_1b_on_meta_device_has_2D2_fusion_parameters():
    with torch.device("meta"):
        model = FeedbackTransformer(preset("paper-1b", device="meta"))
    fusion = sum(p.numel() for n, p in model.named_parameters() if n.startswith("fusion.W_"))
    assert fusion == 2 * 1536**2 == 4_718_592
    assert model.cfg.resolved_layer_types.count("full_attention") == 4
    assert sum(p.numel() for p in model.parameters()) < 1.1e9
