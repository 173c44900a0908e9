"""The attention paths (scaled_dot_product_attention; the materialised scores hook_pattern reads;
the explicit reference einsum) compute the same function; the materialised one runs only when a
hook needs the pattern, the explicit one only when asked for (training)."""

import pickle

import pytest
import torch

from fbt_probe.engine import dispatch
from fbt_probe.engine.dispatch import use_path
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.model.components import MLP, Attention, RotaryTable, rotary
from fbt_probe.modes import parse_mode
from tests.helpers import make_model, tokens

T = 20
# float64: the two paths differ only in summation order (~1e-16); float32: ~1e-7 (SDPA's blocked
# online softmax). A wrong mask, window or KV-head mapping moves logits at order 1e-2.
TOL = {torch.float64: dict(rtol=0, atol=1e-12), torch.float32: dict(rtol=0, atol=1e-5)}
SHAPES = {  # heads / kv heads / window: GQA, MHA, MQA, with and without sliding windows
    "gqa-window": dict(n_heads=4, n_key_value_heads=2, window=5),
    "mha-window": dict(n_heads=4, n_key_value_heads=4, window=7),
    "mqa-global": dict(n_heads=4, n_key_value_heads=1, window=None),
    "gqa-wide-window": dict(n_heads=4, n_key_value_heads=2, window=64),  # wider than T: causal only
}

pytestmark = pytest.mark.usefixtures("one_thread")


def both(model, fn):
    with use_path(model, "explicit"):
        ref = fn()
    return fn(), ref


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_sdpa_equals_explicit_in_every_mode_and_with_the_kv_cache(shape, dtype):
    model = make_model(dtype=dtype, **SHAPES[shape])
    x = tokens(3, T)
    patterns = [(lambda n: n.endswith("hook_pattern"), lambda a, hook: a)]  # the materialised path
    for mode in ("standard", "recurrent:2", "full", "jacobi:2"):
        fast, ref = both(model, lambda: model(x, mode=mode))
        torch.testing.assert_close(fast, ref, **TOL[dtype])
        torch.testing.assert_close(model.run_with_hooks(x, mode=mode, fwd_hooks=patterns), ref, **TOL[dtype])
    pre = build_prefix(model, x, parse_mode("standard"), upto=9)  # queries 9.. over a cache of 0..8: the offset mask
    fast, ref = both(model, lambda: pre.run(9))
    torch.testing.assert_close(fast, ref, **TOL[dtype])


@torch.no_grad()
def test_sdpa_path_is_taken_unless_the_pattern_is_hooked(monkeypatch):
    model, x = make_model(), tokens(2, T)
    calls = []
    real = dispatch.attention

    def recorded(*a):  # every SDPA variant (decode step, window, general mask) counted as "sdpa"
        route = real(*a)
        calls.append("sdpa" if route.startswith("sdpa") else route)
        return route

    monkeypatch.setattr(dispatch, "attention", recorded)
    L = model.cfg.n_layers
    plain = model(x)
    assert calls == ["sdpa"] * L
    calls.clear()
    logits, cache = model.run_with_cache(x, names_filter=lambda n: "resid" in n)
    assert calls == ["sdpa"] * L and torch.equal(logits, plain)
    calls.clear()
    logits, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    assert calls == ["materialized"] * L  # the pattern is hooked in every layer
    torch.testing.assert_close(logits, plain, **TOL[torch.float64])
    p = cache["blocks.0.attn.hook_pattern"]  # [batch, heads, q, k]: rows sum to 1, causal, windowed (5)
    assert p.shape == (2, 4, T, T)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, T, dtype=p.dtype))
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert (p[..., (k > q) | (q - k >= 5)] == 0).all()
    calls.clear()
    model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda a, hook: a)])
    assert calls == ["sdpa", "materialized", "sdpa"]  # only the hooked layer materialises its scores
    calls.clear()
    with use_path(model, "explicit"):
        model(x)
    assert calls == ["explicit"] * L
    calls.clear()
    model(x, mode="recurrent:2")  # silent carried-state passes never need the pattern
    assert set(calls) == {"sdpa"}


@torch.no_grad()
def test_softmax_stays_float64_and_half_types_upcast():
    """float64 attention is float64 throughout (a float32 softmax would cost ~1e-8 here)."""
    model, x = make_model(), tokens(2, T)
    with use_path(model, "explicit"):
        _, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    assert cache["blocks.0.attn.hook_pattern"].dtype == torch.float64
    half = make_model(dtype=torch.bfloat16)
    fast, ref = both(half, lambda: half(x))
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), ref.float(), rtol=0, atol=5e-2)  # bf16 has 8 mantissa bits


@torch.no_grad()
def test_hidden_decoding_stream_mask_through_sdpa():
    from fbt_probe.hidden import HiddenDecodingTransformer

    hd = HiddenDecodingTransformer.from_base(make_model(), n_streams=3, cross_stream_layers=(1,)).eval()
    x = tokens(2, 7)
    fast, ref = both(hd, lambda: hd(x))
    torch.testing.assert_close(fast, ref, **TOL[torch.float64])
    cache, logits = hd.prefill_cache(x[:, :4])  # steps through the cache with the stream mask
    fast = torch.stack([hd.step(x[:, t], cache) for t in range(4, 7)], 1)
    torch.testing.assert_close(fast, ref[:, 4:], **TOL[torch.float64])


def test_rotary_table_equals_the_direct_computation():
    table = RotaryTable(8, 10000.0, n_ctx=16)
    for dtype in (torch.float64, torch.float32):
        for start, n in ((0, 16), (5, 3), (30, 10)):  # the last grows the table past n_ctx
            cos, sin = table(start, n, dtype, torch.device("cpu"))
            ref = rotary(torch.arange(start, start + n), 8, 10000.0, dtype)
            torch.testing.assert_close(cos, ref[0], rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-15)
            torch.testing.assert_close(sin, ref[1], rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-15)
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    cos, sin = table(7, 5, torch.float64, torch.device("cpu"))
    # HF's x·cos + rotate_half(x)·sin; the table folds rotate_half's signs into sin: elementwise the
    # same products, so bitwise equal
    rotated = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)
    assert torch.equal(table.apply(x, 7), x * cos[None, :, None, :] + rotated * sin[None, :, None, :])
    with torch.inference_mode():
        fresh = RotaryTable(8, 10000.0, n_ctx=16)
        cos, _ = fresh(0, 4, torch.float32, torch.device("cpu"))
    assert not cos.is_inference()  # usable later in a pass that records gradients


def test_use_path_restores_and_refuses_unknown():
    model = make_model()
    paths = lambda: {m.path for m in model.modules() if isinstance(m, (Attention, MLP))}  # noqa: E731
    with use_path(model, "explicit"):
        assert paths() == {"explicit"}
    assert paths() == {"auto"}
    with pytest.raises(ValueError, match="path"):
        with use_path(model, "flash"):
            pass


@torch.no_grad()
def test_fused_projections_follow_weight_updates_and_hooks():
    """The one-GEMM q/k/v and gate/up weights are rebuilt when a parameter changes in place, and a
    hook that replaces q still reaches the attention."""
    model, x = make_model(), tokens(2, T)
    before = model(x)
    model.blocks[1].attn.k_proj.weight.mul_(1.5)
    model.blocks[2].mlp.up_proj.weight.add_(0.01)
    after = model(x)
    with use_path(model, "explicit"):
        torch.testing.assert_close(after, model(x), **TOL[torch.float64])
    assert not torch.allclose(after, before)
    zero_q = [("blocks.0.attn.hook_q", lambda q, hook: torch.zeros_like(q))]
    edited = model.run_with_hooks(x, fwd_hooks=zero_q)
    with use_path(model, "explicit"):
        torch.testing.assert_close(edited, model.run_with_hooks(x, fwd_hooks=zero_q), **TOL[torch.float64])
    assert not torch.allclose(edited, after)
    again = pickle.loads(pickle.dumps(model))  # the cached fused weights do not stop pickling
    assert torch.equal(again(x), after)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_in_one_call_is_bitwise_the_qwen3_ops(dtype):
    """F.rms_norm runs these very ops (same shapes, same kernels), so equality is exact; were a
    torch release to change that, training checkpoints would change too, and this test says so."""
    from fbt_probe.model.components import rms_norm

    g = torch.Generator().manual_seed(0)
    for shape in [(8, 1, 128), (4, 300, 128), (3, 7, 6, 32)]:
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
        w = torch.randn(shape[-1], generator=g, dtype=torch.float64).to(dtype)
        assert torch.equal(rms_norm(x, w, 1e-6), w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)))
