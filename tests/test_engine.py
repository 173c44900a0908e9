"""Every fast path of `fbt_probe.engine` against the reference model, over one grid of configs.

The reference is the model on `path = "explicit"`: einsum attention over repeated KV heads, one GEMM
per projection, the module's own serial step, eager scans. Each engine path computes the same
function; float64 differs from it in summation order only (~1e-15), so ATOL = 1e-12 while a wrong
mask edge, rotation sign or cache slot moves logits at order 1e-2. float32 (SDPA's blocked softmax,
fused GEMMs): 1e-5 (tests/test_attention.py). `test_planted_bugs_fail_the_suite` plants one bug in
each path and checks the suite catches it: the grid reaches every path where it matters.

Grid: GQA with a window that bites, MHA with a wider window, MQA without one, a pre-norm feedback
model with depth scaling, a nanochat-family model with every extra; every prefill mode; Hidden Decoding's
stream masks for the attention paths that take a layer's own mask.
"""

from __future__ import annotations

import pytest
import torch

from fbt_probe.engine import attention as fast
from fbt_probe.engine import dispatch, step, walk
from fbt_probe.engine.dispatch import use_path
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.model.components import Attention
from fbt_probe.modes import parse_mode
from tests.helpers import make_cfg, make_model, make_nanochat, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-12
T = 13
CONFIGS = {
    "gqa-window5": dict(),  # window 5 bites within T; layers 0, 1 sliding, 2 global
    "mha-window7": dict(n_key_value_heads=4, window=7),
    "mqa-global": dict(n_key_value_heads=1, window=None),
    "prenorm-scaled": dict(feedback_source="pre_norm", depth_scaling="1/sqrt(2L)"),
    "nanochat": dict(  # a family subclass: every extra on, its scalars away from the identity
        fusion="gate_product",
        norm_weights=False,
        embed_scale=2.0,
        embed_norm=True,
        smear=True,
        x0_mixing=True,
        value_embed_layers=(1,),
        backout_layer=1,
        mlp_act="relu2",
        rope_sign=-1,
        qk_norm_after_rope=True,
        qk_scale=1.2,
        logit_softcap=3.0,
        tie_embeddings=False,
    ),
}
MODES = ("standard", "recurrent:3", "full", "jacobi:2", "jacobi:13")


def model_for(name: str):
    if name != "nanochat":
        return make_model(**CONFIGS[name])
    model = make_nanochat(**CONFIGS[name])
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in (model.smear_lambda, model.resid_lambdas, model.x0_lambdas, model.backout_lambda):
            p.copy_(p + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def reference(model, fn):
    with use_path(model, "explicit"):
        return fn()


# ----------------------------------------------------------------- model-level paths
def _auto(model, x, mode):
    """The rules as they are: fused projections, every SDPA variant, the lean step, eager scans."""
    with torch.no_grad():
        return model(x, mode=mode)


def _autograd(model, x, mode):
    """Under autograd: split projections, query/key heads normed together, the module step."""
    with torch.enable_grad():
        return model(x, mode=mode).detach()


def _materialized(model, x, mode):
    """hook_pattern hooked in every layer: the materialised scores."""
    with torch.no_grad():
        return model.run_with_hooks(x, mode=mode, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda a, hook: a)])


def _graph_scan(model, x, mode, monkeypatch):
    """The static-buffer scan a CUDA graph captures, its body run eagerly on CPU."""
    monkeypatch.setattr(
        dispatch,
        "scan",
        lambda plan, graphs, cache, toks, start, n: (
            "graphed" if plan and n >= 1 and dispatch.buffers_ready(cache, start, n) else "eager"
        ),
    )
    with torch.no_grad():
        return model(x, mode=mode)


def _serial_hooks(model, x, mode):
    """serial=True: hooks in every chunk, the module step with hooks on (plan off)."""
    with torch.no_grad():
        return model(x, mode=mode, serial=True)


MODEL_PATHS = {
    "auto": _auto,
    "autograd": _autograd,
    "materialized": _materialized,
    "graph-scan": _graph_scan,
    "serial-hooks": _serial_hooks,
}


def check_model_path(path: str, name: str, monkeypatch) -> None:
    model, x = model_for(name), tokens(2, T)
    for mode in MODES:
        with torch.no_grad():
            ref = reference(model, lambda: model(x, mode=mode))
        fn = MODEL_PATHS[path]
        got = fn(model, x, mode, monkeypatch) if path == "graph-scan" else fn(model, x, mode)
        torch.testing.assert_close(got, ref, rtol=0, atol=ATOL, msg=lambda m: f"{path} {name} {mode}: {m}")


def check_prefix(name: str, monkeypatch=None) -> None:
    """Prefix reuse: positions >= start on the silent prefix's caches equal the full reference run."""
    model, x = model_for(name), tokens(2, T)
    for mode in MODES:
        for serial in (False, True):
            with torch.no_grad():
                ref = reference(model, lambda: model(x, mode=mode, serial=serial))
                for start in (4, T - 1):
                    got = build_prefix(model, x, parse_mode(mode), upto=start, serial=serial).run(start)
                    torch.testing.assert_close(got, ref[:, start:], rtol=0, atol=ATOL)


def check_step(name: str, monkeypatch=None) -> None:
    """The lean step (`model.step` with hooks off) against the module step, position by position."""
    model, x = model_for(name), tokens(2, T)
    with torch.no_grad():
        assert walk.decode_plan(model) is not None
        for P in (1, 6):
            caches, outs = [], []
            for use_plan in (True, False):
                cache, state, _ = model.prefill_cache(x[:, :P], capacity=T)
                prev, logits = state[:, -1], []
                for t in range(P, T):
                    if use_plan:
                        lg, prev = model.step(x[:, t], cache, prev)
                    else:
                        lg, prev = reference(model, lambda: model.step(x[:, t], cache, prev))
                    logits.append(lg)
                caches.append(cache)
                outs.append(torch.stack(logits, 1))
            torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=ATOL)
            for a, b in zip(caches[0].values + caches[0].keys, caches[1].values + caches[1].keys):
                torch.testing.assert_close(a[:, :, :T], b[:, :, :T], rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("path", MODEL_PATHS)
def test_model_path_equals_the_reference(path, name, monkeypatch):
    check_model_path(path, name, monkeypatch)


@pytest.mark.parametrize("name", CONFIGS)
def test_prefix_reuse_equals_the_reference(name):
    check_prefix(name)


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "nanochat"])  # the lean step is the paper's model only
def test_lean_step_equals_the_module_step(name):
    check_step(name)


def test_the_grid_reaches_every_attention_path(monkeypatch):
    """The model-level grid takes each SDPA variant and the materialised path (so a bug in any
    of them moves a result above)."""
    seen = set()
    real = dispatch.attention

    def recorded(*a):
        seen.add(real(*a))
        return real(*a)

    monkeypatch.setattr(dispatch, "attention", recorded)
    for path in ("auto", "materialized"):
        check_model_path(path, "gqa-window5", monkeypatch)
    check_prefix("gqa-window5")
    assert seen == set(dispatch.ATTENTION_PATHS)


# ----------------------------------------------------------------- attention calls, path by path
# (P queries at start.., K keys at k_start..) as the model makes them: a prefill, a decode step, a
# chunk over a cache (the offset mask), a long chunk with a biting window.
CALLS = [(T, T, 0, 0), (1, 9, 8, 0), (4, 9, 5, 0), (9, 12, 3, 0), (12, 12, 0, 0)]
HEADS = [(4, 2), (4, 4), (4, 1)]


def attention_case(H: int, KV: int, window):
    cfg = make_cfg(n_heads=H, n_key_value_heads=KV, window=window or 5, n_ctx=64)
    return Attention(cfg, "sliding_attention" if window else "full_attention").double()


def stream_attentions() -> list:
    """Hidden Decoding's attentions (3 streams): intra-stream sliding, intra-stream global, cross."""
    from fbt_probe.hidden import HiddenDecodingTransformer

    hd = HiddenDecodingTransformer.from_base(make_model(), n_streams=3, cross_stream_layers=(2,))
    return [block.attn for block in hd.blocks]


def check_attention(path: str, custom: bool = False) -> int:
    """Every call of CALLS x HEADS x windows the path can compute, against `Attention.reference`;
    returns how many it computed."""
    g = torch.Generator().manual_seed(0)
    n = 0
    cases = [attention_case(H, KV, w) for H, KV in HEADS for w in (None, 3, 5)]
    for attn in stream_attentions() if custom else cases:
        H, KV, window = attn.cfg.n_heads, attn.cfg.n_key_value_heads, attn.window
        for P, K, start, k_start in CALLS:
            if dispatch.attention_refusal(path, not custom, attn.window, P, K, start, k_start, False):
                continue
            q = torch.randn(2, P, H, 8, generator=g, dtype=torch.float64)
            k, v = (torch.randn(2, KV, K, 8, generator=g, dtype=torch.float64) for _ in range(2))
            ref = attn.reference(q, k, v, start, k_start, lambda hp, t: t)
            attn.path = path
            got = attn._attend(q, k, v, start, k_start, lambda hp, t: t)
            attn.path = "auto"
            torch.testing.assert_close(got, ref, rtol=0, atol=ATOL, msg=lambda m: f"{path} {H}/{KV} w{window}: {m}")
            n += 1
    return n


@pytest.mark.parametrize("path", [p for p in dispatch.ATTENTION_PATHS if p != "explicit"])
def test_attention_path_equals_the_reference(path):
    assert check_attention(path) > 0


@pytest.mark.parametrize("path", ["materialized", "sdpa"])
def test_attention_path_with_hidden_decodings_stream_mask(path):
    assert check_attention(path, custom=True) > 0


def test_forced_paths_refuse_what_they_cannot_compute():
    """A forced path that cannot compute a call says so (a test then never checks the wrong one)."""
    assert dispatch.attention_refusal("sdpa-decode", True, None, 4, 4, 0, 0, False)
    assert dispatch.attention_refusal("sdpa-decode", False, None, 1, 5, 4, 0, False)  # a layer's own mask
    assert dispatch.attention_refusal("sdpa-windowed", True, None, 4, 4, 0, 0, False)
    assert dispatch.attention_refusal("sdpa", True, 3, 4, 4, 0, 0, True)  # the pattern is hooked
    attn = attention_case(4, 2, None)
    attn.path = "sdpa-decode"
    q, k = torch.zeros(1, 3, 4, 8, dtype=torch.float64), torch.zeros(1, 2, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="cannot compute this call"):
        attn._attend(q, k, k, 0, 0, lambda hp, t: t)


# ----------------------------------------------------------------- planted bugs
def _decode_window_off_by_one(q, k, v, window):
    return _real["sdpa_decode"](q, k, v, None if window is None else window + 1)


def _materialized_unmasked(q, k, v, start, k_start, mask, pattern_hook):
    return _real["materialized"](
        q, k, v, start, k_start, lambda a, b: torch.ones(len(a), len(b), dtype=torch.bool), pattern_hook
    )


def _windowed_one_block_late(q, k, v, start, k_start, mask, window):
    return _real["sdpa_windowed"](q, k, v, start + 1, k_start, mask, window)


def _step_rotation_sign(self, qk, rope):
    _, _, cos, signed = rope._table(self.t + 1, qk.dtype, qk.device)
    return qk * cos[self.t] - qk.roll(qk.shape[-1] // 2, dims=-1) * signed[self.t]


def _step_window_off_by_one(self, layer, q, k, v, window):
    return _real["AtLength.attend"](self, layer, q, k, v, None if window is None else window - 1)


def _scan_stale_value_row(self, layer, q, k, v, window):
    self.keys[layer].index_copy_(2, self.pos, k.transpose(1, 2))  # the value row is not written
    return torch.nn.functional.scaled_dot_product_attention(
        q, self.keys[layer], self.values[layer], attn_mask=self.mask(window)
    )


_real = {
    "sdpa_decode": fast.sdpa_decode,
    "materialized": fast.materialized,
    "sdpa_windowed": fast.sdpa_windowed,
    "AtLength.attend": step.AtLength.attend,
}
BUGS = {  # bug: (object, attribute, planted, the check that must catch it)
    "decode-window-off-by-one": (fast, "sdpa_decode", _decode_window_off_by_one, ("model", "serial-hooks")),
    "materialized-unmasked": (fast, "materialized", _materialized_unmasked, ("model", "materialized")),
    "windowed-block-offset": (fast, "sdpa_windowed", _windowed_one_block_late, ("model", "auto")),
    "step-rotation-sign": (step.AtLength, "rotate", _step_rotation_sign, ("step", None)),
    "step-window-off-by-one": (step.AtLength, "attend", _step_window_off_by_one, ("step", None)),
    "scan-stale-value-row": (step.AtTensor, "attend", _scan_stale_value_row, ("model", "graph-scan")),
    "prefix-decode-window": (fast, "sdpa_decode", _decode_window_off_by_one, ("prefix", None)),
}


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bugs_fail_the_suite(bug, monkeypatch):
    obj, attr, planted, (kind, path) = BUGS[bug]
    monkeypatch.setattr(obj, attr, planted)
    caught = 0
    for name in CONFIGS:
        try:
            if kind == "model":
                check_model_path(path, name, monkeypatch)
            elif kind == "step":
                check_step(name)
            else:
                check_prefix(name)
        except AssertionError:
            caught += 1
    assert caught > 0, f"planted bug {bug} passed every config"
