"""The one seam between the reference (`fbt_probe.model`) and the engine's fast paths.

Each function here is one site of the model. It returns the site's result computed by a fast path
when `dispatch`'s rules let one run, or None: the model then runs its own arithmetic, the
reference, on the next lines. So every site of the model reads

    fast = fast_path.<site>(self, ...)
    if fast is not None:
        return fast
    ... the paper's arithmetic ...

and the route choices, the weights fused and cached from parameters, the chunking of long silent
passes and the lean serial step all live here and in the modules these functions call. The
functions read the module attributes they need (the engine does not import the model).

    site                 fast result                                      rule
    projections          q, k, v (and their q/k concatenation), one GEMM  dispatch.fused_projection
    position             QK-norm and RoPE of query and key heads at once  path "auto"
    attend               an SDPA variant or the materialised pattern      dispatch.attention
    output               the output GEMM with the depth scale folded in   dispatch.fused_projection
    gate_up              the MLP's gate and up projections, one GEMM      dispatch.fused_projection
    fusion               the Triton fusion kernel                         dispatch.fusion
    extend               a long silent pass in chunks through the cache   SILENT_CHUNK_TOKENS
    step                 the lean serial step (`step.DecodePlan`)         dispatch.step
    scan                 the serial scan on the lean step, CUDA-graphed   dispatch.step, dispatch.scan
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from fbt_probe.engine import attention as fast_attention
from fbt_probe.engine import dispatch, fused
from fbt_probe.engine.graph_scan import GraphedScan
from fbt_probe.engine.hooks import Hk, has_hooks, silent
from fbt_probe.engine.step import DecodePlan
from fbt_probe.numerics import rms_norm

SILENT_CHUNK_TOKENS = 8192  # batch x positions per chunk of a silent pass through the KV cache (memory bound)


# ----------------------------------------------------------------- attention
def projections(attn, x: torch.Tensor, hk: Hk):
    """(q, k, v, qk) through `hook_q|k|v` from one GEMM: q, k, v are views of its output and qk the
    query and key heads together (a view, or their concatenation where a hook replaced one); None
    where `dispatch.fused_projection` sends the call to the reference. Module hooks on q_proj,
    k_proj, v_proj do not fire here; the HookPoints do."""
    if not dispatch.fused_projection(attn):
        return None
    B, P, _ = x.shape
    H, KV, dh = attn.cfg.n_heads, attn.cfg.n_key_value_heads, attn.cfg.d_head
    qk, v = F.linear(x, fused.qkv(attn)).view(B, P, H + 2 * KV, dh).split((H + KV, KV), dim=2)
    q0, k0 = qk.split((H, KV), dim=2)
    q, k, v = hk(attn.hook_q, q0), hk(attn.hook_k, k0), hk(attn.hook_v, v)
    if q is not q0 or k is not k0:  # a hook replaced one
        qk = torch.cat((q, k), dim=2)
    return q, k, v, qk


def position(attn, q: torch.Tensor, k: torch.Tensor, qk: torch.Tensor | None, start: int):
    """QK-norm then RoPE of the query and key heads together (`qk`, their concatenation over heads,
    or None to form it): the same arithmetic per row in fewer ops. None on path "explicit"."""
    if attn.path == "explicit":
        return None
    qk = torch.cat((q, k), dim=2) if qk is None else qk
    H, KV = attn.cfg.n_heads, attn.cfg.n_key_value_heads
    if torch.is_grad_enabled():  # gains with autograd: built per call
        w = fused.expand_cat(attn.q_norm.weight, attn.k_norm.weight, rows=(H, KV))
    else:
        w = fused.qk_gain(attn)
    return attn.rope.apply(rms_norm(qk, w, attn.q_norm.eps), start).split((H, KV), dim=2)


def attend(attn, q, k, v, start: int, k_start: int, hk: Hk):
    """z [batch, pos, n_heads, d_head] by the path `dispatch.attention` picks, or None for the
    reference (also the one path that forms the scores `hook_attn_scores` reads)."""
    if hk is not silent and has_hooks(attn.hook_attn_scores):
        return None
    plain = attn.plain_mask
    hooked_pattern = hk is not silent and has_hooks(attn.hook_pattern)
    route = dispatch.attention(attn.path, plain, attn.window, q.shape[1], k.shape[2], start, k_start, hooked_pattern)
    if route == "explicit":
        return None
    if route == "materialized":
        return fast_attention.materialized(q, k, v, start, k_start, attn.mask, partial(hk, attn.hook_pattern))
    if route == "sdpa-decode":
        return fast_attention.sdpa_decode(q, k, v, attn.window)
    if route == "sdpa-windowed":
        return fast_attention.sdpa_windowed(q, k, v, start, k_start, attn.mask, attn.window)
    return fast_attention.sdpa(q, k, v, start, k_start, attn.mask, plain, attn.window)


# ----------------------------------------------------------------- projections out, MLP
def output(module, x: torch.Tensor, proj: torch.nn.Linear):
    """`proj(x) * module.out_scale` with the scale folded away: the projection alone at scale 1 (exact),
    and one GEMM on the scaled weight (cached) where `dispatch.fused_projection` allows; else None."""
    if module.out_scale == 1.0:
        return proj(x)
    if not dispatch.fused_projection(module):
        return None
    return F.linear(x, fused.out_scaled(module, proj))


def gate_up(mlp, x: torch.Tensor, hk: Hk):
    """(pre, pre_linear) through `hook_pre|pre_linear` from one GEMM, or None (`dispatch.fused_projection`)."""
    if not dispatch.fused_projection(mlp):
        return None
    pre, lin = F.linear(x, fused.gate_up(mlp)).chunk(2, dim=-1)
    return hk(mlp.hook_pre, pre), hk(mlp.hook_pre_linear, lin)


# ----------------------------------------------------------------- fusion
def fusion(module, value: torch.Tensor, gate: torch.Tensor):
    """RMSNorm_f(value ⊙ gate) by the Triton kernel where `cfg.fast_fusion` and `dispatch.fusion` let
    it run, else None."""
    if not module.cfg.fast_fusion:
        return None
    kernel = dispatch.fusion(value, gate, module.norm.weight)
    return None if kernel is None else kernel(value, gate, module.norm.weight, module.norm.eps)


# ----------------------------------------------------------------- passes through the cache, serial steps
def extend(model, tokens: torch.Tensor, cache, states, has_state, hk: Hk):
    """`model.extend` of a long silent `tokens` [batch, pos] in chunks of about SILENT_CHUNK_TOKENS
    tokens through the cache: the same function (up to float rounding), with activations held for
    one chunk. None where one call runs (hooks on, or short enough)."""
    B, P = tokens.shape
    size = max(1, SILENT_CHUNK_TOKENS // max(B, 1))
    if hk is not silent or P <= size:
        return None
    parts = [
        model.extend(
            tokens[:, a : a + size],
            cache,
            None if states is None else states[:, a : a + size],
            None if has_state is None else has_state[..., a : a + size],
            hk,
        )
        for a in range(0, P, size)
    ]
    return torch.cat([s for s, _ in parts], dim=1), torch.cat([lg for _, lg in parts], dim=1)


def decode_plan(model) -> DecodePlan | None:
    """The lean serial step for silent steps of `model` as its weights are now, or None where the
    module path must run (`dispatch.step`)."""
    return DecodePlan(model) if dispatch.step(model) == "plan" else None


def step(model, token: torch.Tensor, cache, state, hk: Hk):
    """`model.step` on the lean step: (logits, state), or None where the module's step runs (hooks
    on, or no plan applies)."""
    if hk is not silent:
        return None
    plan = decode_plan(model)
    return None if plan is None else plan.step(token, cache, state)


def scan(model, tokens: torch.Tensor, cache, carried, out, prev, start: int, stop: int):
    """Silent serial steps start..stop-1 of `model.serial_scan` on the lean step (one plan for the
    whole scan: the weights are fixed), replayed from a captured CUDA graph where `dispatch.scan`
    says so; writes `carried` and `out` like the module's steps and returns the state out of
    position stop-1. None where the module's steps run (no plan applies)."""
    plan = decode_plan(model)
    if plan is None:
        return None
    if dispatch.scan(True, model.cuda_graphs, cache, tokens, start, stop - start) == "graphed":
        graphed = GraphedScan(plan, cache, tokens, carried, out, prev, start, fused_epilogue=model.cfg.fast_fusion)
        return graphed.run(stop - start)
    for t in range(start, stop):
        carried[:, t] = prev
        out[:, t], prev = plan.step(tokens[:, t], cache, prev)
    return prev
