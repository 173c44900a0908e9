"""The one seam between the reference (`fbt_probe.model`) and the engine's fast paths.

Each function here is one site of the model. It returns the site's result computed by a fast path
when `dispatch`'s rules let one run, or None: the model then runs its own arithmetic, the
reference, on the next lines. So every site of the model reads

    fast = fast_path.<site>(self, ...)
    if fast is not None:
        return fast
    ... the paper's arithmetic ...

and the route choices and the weights fused and cached from parameters live here and in the
modules these functions call. The functions read the module attributes they need (the engine does
not import the model).

    site                 fast result                                      rule
    projections          q, k, v (and their q/k concatenation), one GEMM  dispatch.fused_projection
    position             QK-norm and RoPE of query and key heads at once  path "auto"
    attend               an SDPA variant or the materialised pattern      dispatch.attention
    output               the output GEMM with the depth scale folded in   dispatch.fused_projection
    gate_up              the MLP's gate and up projections, one GEMM      dispatch.fused_projection
    fusion               the Triton fusion kernel                         dispatch.fusion

The model imports nothing else of the engine: the rest of what it uses is re-exported here, each
piece in the module that owns it: `walk` (a mode's chunks run, with the passes through the KV cache,
the lean serial step and the CUDA-graphed scan), `schedule` (the chunks), `hooks` (how a pass calls
its hook points) and `cache` (the KV cache). The `one-seam` import-linter contract holds the model
to this module.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from fbt_probe.engine import attention as fast_attention
from fbt_probe.engine import dispatch, fused, walk  # noqa: F401 (walk: re-exported for the model)
from fbt_probe.engine.cache import KVCache  # noqa: F401 (re-exported for the model)
from fbt_probe.engine.hooks import GradTaps, Hk, HookContext, has_hooks, hooked, silent  # noqa: F401 (ditto)
from fbt_probe.engine.schedule import Schedule  # noqa: F401 (re-exported for the model)
from fbt_probe.numerics import rms_norm


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
