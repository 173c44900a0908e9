"""TransformerLens's model surface: the ActivationCache methods against direct computations in
every mode, weights in TL's shapes, stop_at_layer, return_type, the tokenizer helpers, generate,
and nnsight tracing the analysed pass."""

import pytest
import torch
import torch.nn.functional as F
from nnsight import NNsight
from transformer_lens.ActivationCache import ActivationCache

from fbt_probe.errors import FbtError
from fbt_probe.loading import load_model
from fbt_probe.surface.decoding import generate as greedy
from tests.helpers import make_model, make_nanochat, tokens

MODES = ["standard", "recurrent:1", "recurrent:3", "full", "jacobi:2"]
L = 3


@pytest.fixture(scope="module")
def model():
    return make_model(depth_scaling="1/sqrt(2L)")  # float64, 3 layers, GQA, depth-scaled branches


@pytest.fixture(scope="module")
def ref():
    return load_model("ref:tiny-feedback")


def rms(x, eps):
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_run_with_cache_returns_an_activation_cache(model, mode, serial):
    logits, cache = model.run_with_cache(tokens(2, 9), mode=mode, serial=serial)
    assert isinstance(cache, ActivationCache) and cache.mode == mode
    assert cache.accumulated_resid().shape == (L + 1, 2, 9, 32)


@pytest.mark.parametrize("mode", MODES)
def test_decompositions_sum_to_the_residual_stream(model, mode):
    x = tokens(2, 9)
    _, c = model.run_with_cache(x, mode=mode)
    stack, labels = c.decompose_resid(return_labels=True)
    assert labels[0] == ("embed" if mode == "standard" else "input")
    assert labels[1:] == [f"{l}_{k}_out" for l in range(L) for k in ("attn", "mlp")]
    torch.testing.assert_close(stack.sum(0), c["blocks.2.hook_resid_post"], rtol=0, atol=1e-12)
    for layer in range(L):
        torch.testing.assert_close(
            c.decompose_resid(layer).sum(0), c[f"blocks.{layer}.hook_resid_pre"], rtol=0, atol=1e-12
        )
        torch.testing.assert_close(
            c.decompose_resid(layer, mlp_input=True).sum(0), c[f"blocks.{layer}.hook_resid_mid"], rtol=0, atol=1e-12
        )
    full, flabels = c.get_full_resid_decomposition(return_labels=True)
    assert full.shape[0] == L * 4 + L * 48 + 2 and flabels[-2:] == [labels[0], "bias"]
    torch.testing.assert_close(full.sum(0), c["blocks.2.hook_resid_post"], rtol=0, atol=1e-12)
    heads_only = c.get_full_resid_decomposition(expand_neurons=False)
    torch.testing.assert_close(heads_only.sum(0), c["blocks.2.hook_resid_post"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full"])
def test_head_results_are_z_times_W_O(model, mode):
    _, c = model.run_with_cache(tokens(2, 9), mode=mode)
    heads, labels = c.stack_head_results(return_labels=True)
    assert labels[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]
    for l in range(L):
        z = c[f"blocks.{l}.attn.hook_z"]  # [b, p, h, d]
        attn = model.blocks[l].attn
        direct = attn.o_proj(z.flatten(-2)) * attn.out_scale
        torch.testing.assert_close(heads[4 * l : 4 * l + 4].sum(0), direct, rtol=0, atol=1e-12)
        torch.testing.assert_close(direct, c[f"blocks.{l}.hook_attn_out"], rtol=0, atol=1e-12)
        h1 = z[..., 1, :] @ model.W_O[l, 1]
        torch.testing.assert_close(heads[4 * l + 1], h1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "jacobi:2"])
def test_apply_ln_uses_the_norm_scale_of_the_stream(model, mode):
    _, c = model.run_with_cache(tokens(2, 9), mode=mode)
    eps = model.cfg.rms_eps
    stack = c.decompose_resid(1)
    torch.testing.assert_close(
        c.apply_ln_to_stack(stack, 1), stack / rms(c["blocks.1.hook_resid_pre"], eps), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        c.apply_ln_to_stack(stack, 1, mlp_input=True),
        stack / rms(c["blocks.1.hook_resid_mid"], eps),
        rtol=0,
        atol=1e-12,
    )
    acc = c.accumulated_resid(apply_ln=True)  # the logit lens: each depth through ln_final
    w = model.ln_final.weight
    for d in range(L):
        direct = c[f"blocks.{d}.hook_resid_pre"] / rms(c[f"blocks.{d}.hook_resid_pre"], eps) * w
        torch.testing.assert_close(acc[d], direct, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc[L], c["ln_final.hook_normalized"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full"])
def test_logit_attrs_sum_to_the_logits(model, mode):
    x = tokens(2, 9)
    logits, c = model.run_with_cache(x, mode=mode)
    right, wrong = tokens(2, 9, seed=5), tokens(2, 9, seed=6)
    attrs = c.logit_attrs(c.decompose_resid(), tokens=right, incorrect_tokens=wrong)
    diff = logits.gather(-1, right[..., None])[..., 0] - logits.gather(-1, wrong[..., None])[..., 0]
    torch.testing.assert_close(attrs.sum(0), diff, rtol=0, atol=1e-10)


def test_weights_in_transformer_lens_shapes(model):
    cfg, x = model.cfg, tokens(1, 6)
    assert model.W_U.shape == (32, 128) and torch.equal(
        model.W_U, model.embed.weight.t() * model.ln_final.weight[:, None]
    )
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (L, 4, 32, 8)
    assert model.W_O.shape == (L, 4, 8, 32) and model.W_in.shape == model.W_gate.shape == (L, 32, 48)
    assert model.W_out.shape == (L, 48, 32) and model.OV.shape == (L, 4, 32, 32) and model.QK.shape == (L, 4, 32, 32)
    _, c = model.run_with_cache(x)
    normed = c["blocks.1.hook_resid_pre"] / rms(c["blocks.1.hook_resid_pre"], cfg.rms_eps) * model.blocks[1].ln1.weight
    torch.testing.assert_close(normed @ model.W_Q[1, 2], c["blocks.1.attn.hook_q"][..., 2, :], rtol=0, atol=1e-12)
    # query head 3 reads KV head 3 // (4 / 2) = 1
    torch.testing.assert_close(normed @ model.W_K[1, 3], c["blocks.1.attn.hook_k"][..., 1, :], rtol=0, atol=1e-12)
    torch.testing.assert_close(normed @ model.W_V[1, 3], c["blocks.1.attn.hook_v"][..., 1, :], rtol=0, atol=1e-12)
    torch.testing.assert_close(
        c["blocks.1.mlp.hook_post"] @ model.W_out[1], c["blocks.1.hook_mlp_out"], rtol=0, atol=1e-12
    )
    mid = c["blocks.1.hook_resid_mid"] / rms(c["blocks.1.hook_resid_mid"], cfg.rms_eps) * model.blocks[1].ln2.weight
    torch.testing.assert_close(mid @ model.W_in[1], c["blocks.1.mlp.hook_pre_linear"], rtol=0, atol=1e-12)
    torch.testing.assert_close(mid @ model.W_gate[1], c["blocks.1.mlp.hook_pre"], rtol=0, atol=1e-12)


def test_an_edited_norm_scale_changes_the_norm(model):
    x = tokens(1, 6)
    clean = model(x, mode="recurrent:1")
    cached = model.run_with_cache(x, mode="recurrent:1")[0]
    torch.testing.assert_close(cached, clean, rtol=0, atol=1e-12)  # observing hooks change nothing
    doubled = model.run_with_hooks(
        x, mode="recurrent:1", serial=False, fwd_hooks=[("blocks.2.ln2.hook_scale", lambda s, hook: 2 * s)]
    )  # the one-pass rule: the carried state is the unedited run's
    _, c = model.run_with_cache(x, mode="recurrent:1")
    half = (c["blocks.2.hook_resid_mid"] / (2 * rms(c["blocks.2.hook_resid_mid"], model.cfg.rms_eps))) * model.blocks[
        2
    ].ln2.weight
    resid = c["blocks.2.hook_resid_mid"] + model.blocks[2].mlp(half, lambda hp, v: v)
    direct = model.head(model.ln_final(resid, lambda hp, v: v))
    torch.testing.assert_close(doubled, direct, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_stop_at_layer_returns_the_stream_there(model, mode):
    x = tokens(2, 9)
    _, c = model.run_with_cache(x, mode=mode)
    for stop in range(L + 1):
        want = c[f"blocks.{stop}.hook_resid_pre"] if stop < L else c["blocks.2.hook_resid_post"]
        torch.testing.assert_close(model(x, mode=mode, stop_at_layer=stop), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(model(x, mode=mode, stop_at_layer=-1), c["blocks.2.hook_resid_pre"], rtol=0, atol=1e-12)
    fired = []
    _, partial = model.run_with_cache(x, mode=mode, stop_at_layer=2, names_filter=lambda n: fired.append(n) or True)
    assert "blocks.1.hook_resid_post" in partial.keys() and not any(k.startswith("blocks.2") for k in partial.keys())
    assert "ln_final.hook_normalized" not in partial.keys()


def test_stop_at_layer_refuses_what_it_cannot_mean(model):
    with pytest.raises(FbtError, match="stop_at_layer: expected an integer in"):
        model(tokens(1, 4), stop_at_layer=L + 1)
    with pytest.raises(FbtError, match="serial=True"):
        model(tokens(1, 4), mode="full", stop_at_layer=1, serial=True)


def test_return_type_loss_is_next_token_cross_entropy(model):
    x = tokens(2, 9)
    logits = model(x, mode="full")
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 128), x[:, 1:].reshape(-1))
    torch.testing.assert_close(model(x, mode="full", return_type="loss"), want, rtol=0, atol=1e-12)
    both = model(x, mode="full", return_type="both")
    assert torch.equal(both[0], logits) and model(x, return_type=None) is None
    with pytest.raises(FbtError, match="return_type"):
        model(x, return_type="probs")


def test_decompositions_refuse_models_whose_stream_is_not_a_sum():
    m = make_nanochat(x0_mixing=True)
    _, c = m.run_with_cache(tokens(1, 5))
    with pytest.raises(FbtError, match="x0_mixing"):
        c.decompose_resid()
    assert c.accumulated_resid().shape[0] == L + 1  # stacking the stream needs no sum


def test_tokenizer_helpers(ref):
    text = "r 3 = 1\nquery = r 3\nValue:"
    ids = ref.to_tokens(text)
    assert ids.shape == (1, 12) and ref.to_str_tokens(text) == [
        "r",
        "3",
        "=",
        "1",
        "\n",
        "query",
        "=",
        "r",
        "3",
        "\n",
        "Value",
        ":",
    ]
    assert ref.to_str_tokens(ids) == ref.to_str_tokens(text) and ref.to_str_tokens(
        ids[0].tolist()
    ) == ref.to_str_tokens(text)
    assert ref.to_single_token("Value") == ref.tokenizer.token_to_id("Value")
    batch = ref.to_tokens([text, "r 3"])
    assert batch.shape == (2, 12) and batch[1, 2:].eq(ref.tokenizer.token_to_id("<pad>")).all()
    assert ref.to_tokens([text, "r 3"], padding_side="left")[1, -2:].tolist() == batch[1, :2].tolist()
    assert ref.to_tokens(ref.to_string(ids[0])).tolist() == ids.tolist()
    torch.testing.assert_close(ref(text, mode="recurrent:1"), ref(ids, mode="recurrent:1"), rtol=0, atol=0)
    with pytest.raises(FbtError, match="no BOS"):
        ref.to_tokens(text, prepend_bos=True)
    with pytest.raises(FbtError, match="not one"):
        ref.to_single_token("r 3")
    with pytest.raises(FbtError, match="no tokenizer"):
        make_model().to_tokens("r 3")


@pytest.mark.parametrize("decoding", ["std", "soft", "fused"])
def test_generate_is_our_greedy_decoding(ref, decoding):
    text = "r 3 = 1\nquery = r 3\nValue:"
    ids = ref.to_tokens(text)
    new = greedy(ref, ids, 3, decoding)
    out = ref.generate(ids, max_new_tokens=3, decoding=decoding)
    assert torch.equal(out, torch.cat([ids, new], dim=1))
    assert ref.generate(text, max_new_tokens=3, decoding=decoding) == ref.to_string(out[0])
    with pytest.raises(FbtError, match="greedy"):
        ref.generate(text, do_sample=True)


@pytest.mark.parametrize("mode", ["recurrent:1", "full", "jacobi:2"])
def test_nnsight_traces_the_analysed_pass(model, mode):
    x = tokens(4, 10)
    _, c = model.run_with_cache(x, mode=mode)
    nn_model = NNsight(model)
    with nn_model.trace(x, mode=mode):
        feedback = nn_model.fusion.hook_feedback.output.save()  # accessed in the order the pass runs
        seen = nn_model.blocks[1].output.save()
        resid = nn_model.blocks[2].hook_resid_pre.output.save()
    assert seen.shape == (4, 10, 32)  # the whole sequence, not a hooks-off prefix
    torch.testing.assert_close(seen, c["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)
    torch.testing.assert_close(feedback, c["fusion.hook_feedback"], rtol=0, atol=1e-12)
    torch.testing.assert_close(resid, c["blocks.2.hook_resid_pre"], rtol=0, atol=1e-12)
    assert all("forward" in m.__dict__ for m in model.blocks)  # the wrappers are back after the run


def test_nnsight_patch_equals_our_residual_patch(model):
    x, mode, t = tokens(2, 10), "recurrent:1", 6
    nn_model = NNsight(model)
    with nn_model.trace(x, mode=mode):
        nn_model.blocks[0].hook_resid_post.output[:, t] = 0.0
        patched = nn_model.output.save()

    def zero(resid, hook):
        resid[:, t] = 0.0
        return resid

    ours = model.run_with_hooks(x, mode=mode, serial=False, fwd_hooks=[("blocks.0.hook_resid_post", zero)])
    assert not torch.allclose(ours, model(x, mode=mode))  # nnsight traces the analysed pass: the one-pass rule
    torch.testing.assert_close(patched, ours, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent:3", "full"])
def test_nnsight_serial_steps_through_its_iteration_support(model, mode):
    """Under serial=True the blocks run once for the standard prefix and once per serial step;
    nnsight's `tracer.iter` reaches each call: the chunks stitch to run_with_cache(serial=True)'s
    stream, and a patch inside one step equals our serial residual patch at that position, whose
    change reaches the later positions through the carried state (unlike the same patch in the
    final pass alone)."""
    from fbt_probe.interventions.edits import set_at

    x, T = tokens(2, 8), 8
    n_serial = 3 if mode == "recurrent:3" else T
    P = T - n_serial
    _, c = model.run_with_cache(x, mode=mode, serial=True)
    nn_model = NNsight(model)
    calls = (1 if P else 0) + n_serial  # a bounded loop: an open one (`tracer.iter[:]`) ends with a warning
    with nn_model.trace(x, mode=mode, serial=True) as tracer:
        chunks = list().save()
        for _ in tracer.iter[:calls]:
            chunks.append(nn_model.blocks[1].hook_resid_post.output)
    assert [ch.shape[1] for ch in chunks] == ([P] if P else []) + [1] * n_serial
    torch.testing.assert_close(torch.cat(chunks, 1), c["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)

    t = T - 2  # a serial step's position; its call index: the prefix (if any), then one call per step
    call = (1 if P else 0) + (t - P)
    with nn_model.trace(x, mode=mode, serial=True) as tracer:
        for _ in tracer.iter[call]:
            nn_model.blocks[0].hook_resid_post.output[:] = 0.0
        patched = nn_model.output.save()
    zero = set_at(torch.zeros(model.cfg.d_model, dtype=torch.float64), t, model)
    ours = model.run_with_hooks(x, mode=mode, serial=True, fwd_hooks=[("blocks.0.hook_resid_post", zero)])
    torch.testing.assert_close(patched, ours, rtol=0, atol=1e-12)
    final_only = model.run_with_hooks(x, mode=mode, serial=False, fwd_hooks=[("blocks.0.hook_resid_post", zero)])
    clean = model(x, mode=mode)
    assert (ours[:, T - 1] - clean[:, T - 1]).abs().max() > 1e-6  # the patch reaches the next position
    assert (ours[:, T - 1] - final_only[:, T - 1]).abs().max() > 1e-6  # through the carried state
