"""Exact identities between prefill modes (float64), DESIGN.md §2."""

import pytest
import torch

from fbt_probe.errors import FbtError
from fbt_probe.modes import parse_mode
from fbt_probe.surface.decoding import generate
from tests.helpers import make_model, tokens

T = 12
TOL = dict(rtol=0, atol=1e-12)  # float64 throughout (the softmax too): a real difference is >> 1e-12


@pytest.fixture(scope="module", params=["post_norm", "pre_norm"])
def model(request):
    return make_model(feedback_source=request.param)


@pytest.fixture(scope="module")
def toks():
    return tokens(3, T)


@torch.no_grad()
def test_jacobi_K_equals_full_on_first_K_positions(model, toks):
    full = model(toks, mode="full")
    for K in (1, 2, 3, 5):
        torch.testing.assert_close(model(toks, mode=f"jacobi:{K}")[:, :K], full[:, :K], **TOL)
    # and not beyond: jacobi:2 differs from full at position 3 (a real check that the test can fail)
    assert not torch.allclose(model(toks, mode="jacobi:2")[:, 2], full[:, 2])


@torch.no_grad()
def test_jacobi_T_and_recurrent_T_minus_1_equal_full(model, toks):
    full = model(toks, mode="full")
    torch.testing.assert_close(model(toks, mode=f"jacobi:{T}"), full, **TOL)
    torch.testing.assert_close(model(toks, mode=f"recurrent:{T - 1}"), full, **TOL)


@torch.no_grad()
def test_recurrent_k_is_standard_before_the_last_k(model, toks):
    std = model(toks, mode="standard")
    for k in (1, 2, 4):
        rec = model(toks, mode=f"recurrent:{k}")
        torch.testing.assert_close(rec[:, : T - k], std[:, : T - k], **TOL)
        assert not torch.allclose(rec[:, T - k], std[:, T - k])


@torch.no_grad()
def test_kv_cache_steps_equal_rerunning_the_prefix(model, toks):
    std = model(toks)
    cache, _, logits = model.prefill_cache(toks[:, :5])
    steps = [logits]
    for t in range(5, T):
        lg, _ = model.step(toks[:, t], cache, None)
        steps.append(lg[:, None])
    torch.testing.assert_close(torch.cat(steps, 1), std, **TOL)
    # [batch, n_kv_heads, capacity, d_head]; a prefill of 5 positions grew (doubling) to hold T
    assert cache.length == T and cache.keys[0].shape[:2] == (3, model.cfg.n_key_value_heads)
    assert cache.keys[0].shape[2] >= T and cache.keys[0].shape[3] == model.cfg.d_head


@torch.no_grad()
def test_kv_cache_with_capacity_is_written_in_place(model, toks):
    """Capacity known up front: every step writes into the same buffers (no per-step reallocation),
    and the cached keys equal those of a prefill of the whole sequence."""
    cache, _, _ = model.prefill_cache(toks[:, :5], capacity=T)
    ptrs = [k.data_ptr() for k in cache.keys]
    for t in range(5, T):
        model.step(toks[:, t], cache, None)
    assert [k.data_ptr() for k in cache.keys] == ptrs and cache.keys[0].shape[2] == T
    whole, _, _ = model.prefill_cache(toks)
    for a, b in zip(cache.keys + cache.values, whole.keys + whole.values):
        torch.testing.assert_close(a[:, :, :T], b[:, :, :T], **TOL)


@torch.no_grad()
def test_serial_run_equals_final_pass_and_final_pass_is_exact(model, toks):
    """The hooked final pass reproduces the serial computation: its top states at fed-back
    positions equal the carried states it was given."""
    for mode in ("recurrent:3", "full", "jacobi:3"):
        serial = model(toks, mode=mode, serial=True)
        torch.testing.assert_close(model(toks, mode=mode), serial, **TOL)
    src = "ln_final.hook_normalized" if model.cfg.feedback_source == "post_norm" else "blocks.2.hook_resid_post"
    _, cache = model.run_with_cache(toks, mode="full", names_filter=[src, "fusion.hook_feedback"])
    torch.testing.assert_close(cache["fusion.hook_feedback"][:, 1:], cache[src][:, :-1], **TOL)
    assert torch.count_nonzero(cache["fusion.hook_feedback"][:, 0]) == 0


@torch.no_grad()
def test_standard_depth0_identical_for_same_final_token(model):
    a, b = tokens(4, T, seed=5), tokens(4, T, seed=6)
    b[:, -1] = a[:, -1] = 7
    batch = torch.cat([a, b])
    _, cache = model.run_with_cache(batch, names_filter="blocks.0.hook_resid_pre")
    last = cache["blocks.0.hook_resid_pre"][:, -1]
    assert torch.equal(last, last[:1].expand_as(last))  # an embedding row: a lookup, no arithmetic


@torch.no_grad()
def test_soft_decoding_first_token_equals_recurrent_1(model, toks):
    first = generate(model, toks, 2, "soft")[:, 0]
    extended = torch.cat([toks, first[:, None]], dim=1)
    cache, state, logits = model.prefill_cache(toks)
    soft_logits, _ = model.step(first, cache, state[:, -1])
    torch.testing.assert_close(soft_logits, model(extended, mode="recurrent:1")[:, -1], **TOL)
    # generate() runs the same prefill and step, on the same shapes: exact
    assert torch.equal(generate(model, toks, 2, "soft")[:, 1], soft_logits.argmax(-1))


@torch.no_grad()
def test_std_and_fused_decoding_match_their_prefill_modes(model, toks):
    # decoding steps through the KV cache ([batch, 1] products) and a forward over the whole sequence
    # differ in shape, so compare logits with a tolerance, not argmaxes bit for bit: each generated
    # token's logit is the maximum of the forward's logits to 1e-12 (float64)
    def is_argmax(logits, ids):
        torch.testing.assert_close(logits.gather(-1, ids[..., None])[..., 0], logits.max(-1).values, rtol=0, atol=1e-12)

    std = generate(model, toks, 3, "std")
    extended = torch.cat([toks, std[:, :2]], 1)
    is_argmax(model(extended)[:, -3:], std)
    fused_first = generate(model, toks, 1, "fused")[:, 0]
    is_argmax(model(toks, mode="jacobi:2")[:, -1], fused_first)


@pytest.mark.parametrize("bad", ["recurrent:0", "jacobi:x", "jacobi:0", "recurrent", "fulll", "", "standard:1"])
def test_bad_mode_strings(bad):
    with pytest.raises(FbtError, match="mode"):
        parse_mode(bad)


def test_recurrent_k_at_least_T_is_refused(model, toks):
    with pytest.raises(FbtError, match="must be < the sequence length"):
        model(toks, mode=f"recurrent:{T}")


def test_noise_only_in_training_mode(model, toks):
    with torch.no_grad():
        a, b = model(toks, mode="jacobi:2"), model(toks, mode="jacobi:2")
        assert torch.equal(a, b)
        model.train()
        try:
            c = model(toks, mode="jacobi:2")
        finally:
            model.eval()
    assert not torch.allclose(a, c)
    torch.testing.assert_close(c[:, 0], a[:, 0], **TOL)  # position 0 carries no state: no noise
