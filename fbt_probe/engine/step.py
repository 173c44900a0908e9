"""The serial step with hooks off, in as few tensor ops as the arithmetic allows.

A serial scan (`recurrent:k`, `full`, greedy decoding) runs one position at a time, so on a CPU its
cost is the number of tensor ops per step, not their size: ~19 GEMMs, 14 norms and 4 attentions on
[batch, 1, ...] tensors for `tiny`, each a few microseconds of work behind tens of microseconds of
module dispatch, `F.rms_norm`'s composite kernel and per-call weight checks. `DecodePlan` takes
the model's fused weights once (the same cached tensors the module fast path multiplies by) and
computes one step on [batch, d_model] tensors: one GEMM for q/k/v, one norm and one rotation for
the query and key heads together, the residual adds folded into the output GEMMs (`addmm`), keys
and values written in place into the KV cache.

Where the step is is an object: `AtLength` (a `KVCache` whose length is the position, known to the
host: appends, exact slices) or `AtTensor` (a device-side position over static buffers: what
`graph_scan.GraphedScan` captures as a CUDA graph).

It computes the module path's function on the same weights (float64: equal to 1e-12, tested in
tests/test_engine.py and tests/test_decode_step.py; float32: rounding only) and is taken only where
nothing can observe the difference (`dispatch.step`: hooks off, no autograd, path "auto",
float32/float64, a backbone without an imported family's extras). Everything else takes the module
path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fbt_probe.engine import fused
from fbt_probe.numerics import fusion_reference


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm without its gain, op for op (x * rsqrt(mean(x²) + eps))."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class DecodePlan:
    """One model's weights arranged for `step`; build it per scan (`fast.decode_plan(model)`), not
    once for ever: it holds the weights as they were when it was built."""

    def __init__(self, model):
        cfg = model.cfg
        self.cfg = cfg
        self.H, self.KV, self.dh = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        self.eps = cfg.rms_eps
        self.pre_norm = cfg.feedback_source == "pre_norm"
        with torch.no_grad():
            fusion = model.fusion
            self.E = model.embed.weight
            self.W_U, self.gate = fusion.W_U.weight, fusion.gate  # the gate: the reference's own
            self.fusion_w, self.fusion_eps = fusion.norm.weight, fusion.norm.eps
            self.layers = [self._layer(block) for block in model.blocks]
            self.final_w = model.ln_final.weight
            self.head_w = model.head_weight

    @staticmethod
    def _layer(block) -> tuple:
        attn, mlp = block.attn, block.mlp
        w_qkv, gains, w_gu = fused.qkv(attn), fused.qk_gain(attn), fused.gate_up(mlp)  # gains: [H + KV, d_head]
        w_o = attn.o_proj.weight if attn.out_scale == 1.0 else fused.out_scaled(attn, attn.o_proj)
        w_down = mlp.down_proj.weight if mlp.out_scale == 1.0 else fused.out_scaled(mlp, mlp.down_proj)
        # weights as [in, out] views for addmm (no copies)
        return (block.ln1.weight, w_qkv, gains, attn.rope, attn.window, w_o.t(), block.ln2.weight, w_gu, w_down.t())

    def step(self, token: torch.Tensor, cache, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`FeedbackTransformer.step` with hooks off: token [batch], state [batch, d_model] or None
        (plain embedding) -> (logits [batch, d_vocab], carried state [batch, d_model])."""
        return self.run(token, state, AtLength(cache))

    def run(self, token: torch.Tensor, state: torch.Tensor | None, at) -> tuple[torch.Tensor, torch.Tensor]:
        """The step at the position `at` stands for: `AtLength` (a KVCache, the host knows the
        position) or `AtTensor` (static buffers and a device position: what a CUDA graph captures)."""
        H, KV, dh, eps = self.H, self.KV, self.dh, self.eps
        B = token.shape[0]
        e = F.embedding(token, self.E)
        if state is None:
            x = e
        else:  # u = RMSNorm_f((W_U h) ⊙ σ(W_G e))
            x = at.epilogue(F.linear(state, self.W_U), self.gate(e), self.fusion_w, self.fusion_eps)
        for layer, (w1, w_qkv, gains, rope, window, w_o, w2, w_gu, w_down) in enumerate(self.layers):
            proj = F.linear(_rms(x, eps) * w1, w_qkv)  # [batch, (H + 2 KV) d_head]
            qk = at.rotate(_rms(proj[:, : (H + KV) * dh].view(B, H + KV, dh), eps) * gains, rope)
            # the heads of a KV group are its queries: no repeated keys
            z = at.attend(
                layer,
                qk[:, :H].reshape(B, KV, H // KV, dh),
                qk[:, None, H:],
                proj[:, None, (H + KV) * dh :].view(B, 1, KV, dh),
                window,
            )
            x = torch.addmm(x, z.reshape(B, H * dh), w_o)
            gate, up = F.linear(_rms(x, eps) * w2, w_gu).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate) * up, w_down)
        normed = _rms(x, eps) * self.final_w
        logits = F.linear(normed, self.head_w)
        return logits, x if self.pre_norm else normed


class AtLength:
    """The step at position t = cache.length of a `KVCache`: the new key and value appended, the
    attention over the valid (and in-window) keys only."""

    epilogue = staticmethod(fusion_reference)

    def __init__(self, cache):
        self.cache, self.t = cache, cache.length

    def rotate(self, qk: torch.Tensor, rope) -> torch.Tensor:
        t = self.t
        _, _, cos, signed = rope._table(t + 1, qk.dtype, qk.device)  # [n, 1, d_head]
        return qk * cos[t] + qk.roll(qk.shape[-1] // 2, dims=-1) * signed[t]

    def attend(self, layer: int, q, k, v, window) -> torch.Tensor:
        keys, values = self.cache.append(layer, k, v)
        t = self.t
        lo = 0 if window is None or t + 1 <= window else t + 1 - window
        # every key <= t: no mask
        return F.scaled_dot_product_attention(q, keys[:, :, lo:], values[:, :, lo:])


class AtTensor:
    """The step at the device position `pos` ([1] int64) over static KV buffers [batch, n_kv_heads,
    width, d_head] (views of the cache's first `width` slots, width > pos): keys and values written
    with `index_copy_`, the attention over all `width` slots with a mask (key <= pos, and inside the
    window). No host-side position, no allocation
    that depends on it: the same kernels at every position, so a CUDA graph of one step replays
    for all of them. Slots past `pos` must hold finite numbers (a masked weight is 0, and 0 × NaN
    is NaN): `GraphedScan` zeroes them."""

    def __init__(self, keys: list, values: list, pos: torch.Tensor, epilogue=fusion_reference):
        self.keys, self.values, self.pos, self.epilogue = keys, values, pos, epilogue
        self.slots = torch.arange(keys[0].shape[2], device=pos.device)
        self._masks: dict = {}

    def rotate(self, qk: torch.Tensor, rope) -> torch.Tensor:
        _, _, cos, signed = rope._table(self.slots.shape[0], qk.dtype, qk.device)
        return qk * cos.index_select(0, self.pos) + qk.roll(qk.shape[-1] // 2, dims=-1) * signed.index_select(
            0, self.pos
        )

    def mask(self, window) -> torch.Tensor:
        if window not in self._masks:
            keep = self.slots <= self.pos
            if window is not None:
                keep = keep & (self.slots > self.pos - window)
            self._masks[window] = keep[None, None, None, :]  # [1, 1, 1, capacity]
        return self._masks[window]

    def attend(self, layer: int, q, k, v, window) -> torch.Tensor:
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, self.pos, k.transpose(1, 2))
        values.index_copy_(2, self.pos, v.transpose(1, 2))
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask(window))
