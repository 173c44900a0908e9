"""Backbone pieces, numerically matching Hugging Face Qwen3 (eager attention) when scaling is off.

`hk(hook_point, x)` is passed down every forward (`fbt_probe.engine.hooks`): it is `hook_point(x)`
in a hooked pass and the identity in a silent pass (carried-state computations run with hooks off,
docs/modes.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.config import ModelConfig
from fbt_probe.engine import fast as fast_path
from fbt_probe.engine.fast import Hk, KVCache, has_hooks, hooked, silent
from fbt_probe.numerics import is_half, rms_norm, rms_normalize, upcast


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in float32, cast back, then scale. `weight=False`: no gain at all
    (nanochat's norm, `F.rms_norm` in the input's own dtype)."""

    def __init__(self, d: int, eps: float, weight: bool = True):
        super().__init__()
        self.eps = eps
        if weight:
            self.weight = nn.Parameter(torch.ones(d))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return F.rms_norm(x, (x.shape[-1],), None, self.eps)
        return rms_norm(x, self.weight, self.eps)


class ScaledRMSNorm(RMSNorm):
    """An RMSNorm with TransformerLens's `hook_scale` [batch, pos, 1]: sqrt(mean(x²) + eps), the
    divisor of the normalisation (what `ActivationCache.apply_ln_to_stack` reads). The scale is
    computed only while a hook is attached to it; a hook that returns a different scale makes the
    norm divide by that one, and otherwise the norm is computed as without the hook."""

    def __init__(self, d: int, eps: float, weight: bool = True):
        super().__init__(d, eps, weight)
        self.hook_scale = HookPoint()  # [batch, pos, 1]

    def forward(self, x: torch.Tensor, hk: Hk = silent) -> torch.Tensor:
        if hk is silent or not has_hooks(self.hook_scale):
            return super().forward(x)
        normed = self.normalize(x, hk)
        return normed if self.weight is None else self.weight * normed

    def normalize(self, x: torch.Tensor, hk: Hk = silent) -> torch.Tensor:
        """x / scale before the gain, in x's dtype (through `hook_scale` when it has a hook)."""
        if hk is silent or not has_hooks(self.hook_scale):
            return rms_normalize(x, self.eps)
        work = upcast(x)
        scale = (work.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        return (work / hk(self.hook_scale, scale)).to(x.dtype)


class HookedRMSNorm(ScaledRMSNorm):
    """`ScaledRMSNorm` with TransformerLens's `hook_normalized` [batch, pos, d]: x / scale, BEFORE the
    gain (as TransformerLens's RMSNorm, whose fold_ln moves the final gain into W_U); the norm's
    output is gain * hook_normalized."""

    def __init__(self, d: int, eps: float, weight: bool = True):
        super().__init__(d, eps, weight)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor, hk: Hk = hooked) -> torch.Tensor:
        if hk is silent or not has_hooks(self.hook_normalized):
            return super().forward(x, hk)
        normed = hk(self.hook_normalized, self.normalize(x, hk))
        return normed if self.weight is None else self.weight * normed


def rotary(positions: torch.Tensor, d_head: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [pos, d_head] (HF's cat(freqs, freqs) layout)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.int64).to(work) / d_head))
    freqs = positions.to(work)[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RotaryTable:
    """`rotary` for positions 0..n-1 computed once per (dtype, device) and sliced per call (grown
    when a call reaches past it). Plain attribute, not a buffer: not in the state dict. The first
    table covers n_ctx positions up to EAGER positions; a longer context grows it by the inputs'
    lengths, so a large n_ctx costs nothing until an input is that long."""

    EAGER = 8192

    def __init__(self, d_head: int, theta: float, n_ctx: int, sign: int = 1):
        self.d_head, self.theta, self.n_ctx = d_head, theta, n_ctx
        self.sign = sign  # -1: rotate by -θ (sin negated)
        self._tables: dict = {}

    def _table(self, n: int, dtype: torch.dtype, device: torch.device):
        key = (dtype, device)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < n:
            n = max(n, min(self.n_ctx, self.EAGER), 2 * table[0].shape[0] if table is not None else 0)
            with torch.inference_mode(False), torch.no_grad():  # a normal tensor even if first built in inference mode
                cos, sin = rotary(torch.arange(n, device=device), self.d_head, self.theta, dtype)
                sin = sin if self.sign == 1 else -sin
                half = self.d_head // 2
                signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # rotate-half's signs folded in
            table = self._tables[key] = (cos, sin, cos[:, None, :], signed[:, None, :])
        return table

    def __call__(
        self, start: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [length, d_head] of positions start..start+length-1."""
        cos, sin, _, _ = self._table(start + length, dtype, device)
        return cos[start : start + length], sin[start : start + length]

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """RoPE of x [batch, pos, heads, d_head] at positions start..: x·cos + rotate_half(x)·sin
        (HF's), with rotate_half's sign folded into the sin table, so rotate_half(x) is a roll by
        d_head / 2 (elementwise the same products: bitwise HF's)."""
        P = x.shape[1]
        _, _, cos, signed = self._table(start + P, x.dtype, x.device)
        return x * cos[start : start + P] + x.roll(self.d_head // 2, dims=-1) * signed[start : start + P]


class Attention(nn.Module):
    """Grouped-query attention with per-head QK-norm and RoPE.

    Each site (the projections, QK-norm and RoPE, the attention, the output projection) asks
    `fbt_probe.engine.fast` for a faster computation of the same function and otherwise runs the
    reference below it: one GEMM per projection, einsum attention over repeated KV heads, softmax
    in float32 for half types and in the input's dtype otherwise (`path = "explicit"`: always the
    reference; training uses it, see `fbt_probe.training.loop.train`). The materialised pattern
    that `hook_pattern` reads is formed only while a hook is attached to it (TransformerLens-style:
    the HookPoint's registered hooks decide).
    """

    def __init__(self, cfg: ModelConfig, layer_type: str, layer: int = -1):
        super().__init__()
        self.cfg = cfg
        self.window = cfg.window if layer_type == "sliding_attention" else None
        self.path = "auto"
        D, H, KV, dh = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        self.out_scale = cfg.residual_scale  # depth scaling of the branch output (hook_attn_out is after it)
        self.q_proj = nn.Linear(D, H * dh, bias=False)
        self.k_proj = nn.Linear(D, KV * dh, bias=False)
        self.v_proj = nn.Linear(D, KV * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, D, bias=False)
        self.q_norm = RMSNorm(dh, cfg.rms_eps)
        self.k_norm = RMSNorm(dh, cfg.rms_eps)
        with torch.no_grad():  # QK-norm gains: Qwen3 starts them at 1 (see ModelConfig.qk_norm_init)
            self.q_norm.weight.fill_(cfg.qk_norm_init)
            self.k_norm.weight.fill_(cfg.qk_norm_init)
        self.rope = RotaryTable(dh, cfg.rope_theta, cfg.n_ctx)
        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head]  (projection, before QK-norm and RoPE)
        self.hook_k = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_v = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        self.hook_rot_q = HookPoint()  # [batch, pos, n_heads, d_head]  after QK-norm and RoPE
        self.hook_rot_k = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, key_pos]  scaled, masked (-inf)
        self.hook_result = HookPoint()  # [batch, pos, n_heads, d_model]  each head's write (computed only while hooked)

    def mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        allowed = k_pos[None, :] <= q_pos[:, None]  # [q, k]
        if self.window is not None:
            allowed &= (q_pos[:, None] - k_pos[None, :]) < self.window
        return allowed

    @property
    def plain_mask(self) -> bool:
        """Whether this layer's mask is the causal (and window) rule above, not a subclass's own
        (Hidden Decoding's streams)."""
        return type(self).mask is Attention.mask

    # TransformerLens's weight shapes (read-only views; W_O includes the depth scaling, so z @ W_O
    # summed over heads is `hook_attn_out`; the K/V weights are per KV head, `_W_K` / `_W_V` in TL).
    @property
    def W_Q(self) -> torch.Tensor:  # [n_heads, d_model, d_head]
        return self.q_proj.weight.t().reshape(self.cfg.d_model, self.cfg.n_heads, self.cfg.d_head).transpose(0, 1)

    @property
    def _W_K(self) -> torch.Tensor:  # [n_kv_heads, d_model, d_head]
        return (
            self.k_proj.weight.t()
            .reshape(self.cfg.d_model, self.cfg.n_key_value_heads, self.cfg.d_head)
            .transpose(0, 1)
        )

    @property
    def _W_V(self) -> torch.Tensor:  # [n_kv_heads, d_model, d_head]
        return (
            self.v_proj.weight.t()
            .reshape(self.cfg.d_model, self.cfg.n_key_value_heads, self.cfg.d_head)
            .transpose(0, 1)
        )

    @property
    def W_O(self) -> torch.Tensor:  # [n_heads, d_head, d_model]
        return (self.o_proj.weight.t() * self.out_scale).reshape(self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model)

    def forward(
        self, x: torch.Tensor, start: int, cache: KVCache | None, layer: int, hk: Hk, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: [batch, pos, d_model] at positions start..start+pos-1; with a cache, the keys are the
        cache's positions 0..start-1 followed by these. `tokens` [batch, pos]: only read by a layer
        with a value embedding."""
        B, P, _ = x.shape
        H, KV, dh = self.cfg.n_heads, self.cfg.n_key_value_heads, self.cfg.d_head
        fast = fast_path.projections(self, x, hk)  # (q, k, v, q and k together)
        if fast is not None:
            q, k, v, qk = fast
        else:
            q = hk(self.hook_q, self.q_proj(x).view(B, P, H, dh))
            k = hk(self.hook_k, self.k_proj(x).view(B, P, KV, dh))
            v = hk(self.hook_v, self.v_proj(x).view(B, P, KV, dh))
            qk = None
        v = self.values(v, x, tokens, layer, hk)
        q, k = self.position(q, k, qk, start)
        if hk is not silent:
            q, k = hk(self.hook_rot_q, q), hk(self.hook_rot_k, k)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # [batch, n_kv_heads, key_pos, d_head]
            k_start = 0
        else:
            k, v, k_start = k.transpose(1, 2), v.transpose(1, 2), start
        z = self._attend(q, k, v, start, k_start, hk)
        z = hk(self.hook_z, z)
        if hk is not silent and has_hooks(self.hook_result):  # per head: z_h @ W_O[h], then the sum
            return hk(self.hook_result, torch.einsum("bphd,hdm->bphm", z, self.W_O)).sum(2)
        z = z.reshape(B, P, H * dh)
        fast = fast_path.output(self, z, self.o_proj)
        if fast is not None:
            return fast
        return self.o_proj(z) * self.out_scale

    def values(self, v: torch.Tensor, x: torch.Tensor, tokens: torch.Tensor | None, layer: int, hk: Hk) -> torch.Tensor:
        """The values attention reads: the projection (a model family may add to it; `tokens` are
        passed for that)."""
        return v

    def position(self, q: torch.Tensor, k: torch.Tensor, qk: torch.Tensor | None, start: int):
        """QK-norm, then RoPE at positions start.. (q [batch, pos, n_heads, d_head], k [batch, pos,
        n_kv_heads, d_head]; `qk` their concatenation over heads where the projections formed it,
        else None)."""
        fast = fast_path.position(self, q, k, qk, start)
        if fast is not None:
            return fast
        return self.rope.apply(self.q_norm(q), start), self.rope.apply(self.k_norm(k), start)

    def _attend(self, q, k, v, start: int, k_start: int, hk: Hk) -> torch.Tensor:
        """z [batch, pos, n_heads, d_head]: one of `fbt_probe.engine.attention`'s paths where the
        engine takes the call (the same function), else the reference."""
        fast = fast_path.attend(self, q, k, v, start, k_start, hk)
        if fast is not None:
            return fast
        return self.reference(q, k, v, start, k_start, hk)

    def reference(self, q, k, v, start: int, k_start: int, hk: Hk) -> torch.Tensor:
        """The reference arithmetic (every score materialised); q: [batch, pos, n_heads, d_head],
        k, v: [batch, n_kv_heads, key_pos, d_head] -> z [batch, pos, n_heads, d_head]."""
        rep = self.cfg.n_heads // self.cfg.n_key_value_heads
        k = k.transpose(1, 2).repeat_interleave(rep, dim=2)  # [batch, key_pos, n_heads, d_head]
        v = v.transpose(1, 2).repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.cfg.d_head**-0.5
        q_pos = torch.arange(start, start + q.shape[1], device=q.device)
        k_pos = torch.arange(k_start, k_start + k.shape[1], device=q.device)
        scores = hk(self.hook_attn_scores, scores.masked_fill(~self.mask(q_pos, k_pos), float("-inf")))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32 if is_half(q.dtype) else None)
        pattern = hk(self.hook_pattern, probs.to(q.dtype))
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


class MLP(nn.Module):
    """SiLU-GLU (`fbt_probe.engine.fast` may compute the gate and up projections in one GEMM)."""

    def __init__(self, cfg: ModelConfig, gated: bool = True):
        super().__init__()
        self.path = "auto"
        self.gated = gated  # False: no gate projection (a family's MLP overrides `post`)
        self.out_scale = cfg.residual_scale  # depth scaling of the branch output (hook_mlp_out is after it)
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False) if self.gated else None
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]  gate pre-activation
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]  linear (up) branch
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]  silu(pre) * pre_linear

    # TransformerLens's shapes: W_in (the linear branch) / W_gate [d_model, d_mlp]; W_out
    # [d_mlp, d_model] includes the depth scaling, so hook_post @ W_out is `hook_mlp_out`.
    @property
    def W_in(self) -> torch.Tensor:
        return self.up_proj.weight.t()

    @property
    def W_gate(self) -> torch.Tensor | None:
        return None if self.gate_proj is None else self.gate_proj.weight.t()

    @property
    def W_out(self) -> torch.Tensor:
        return self.down_proj.weight.t() * self.out_scale

    def post(self, x: torch.Tensor, hk: Hk) -> torch.Tensor:
        """[batch, pos, d_mlp] silu(gate x) * (up x): what `hook_post` holds."""
        fast = fast_path.gate_up(self, x, hk)
        if fast is not None:
            pre, lin = fast
        else:
            pre = hk(self.hook_pre, self.gate_proj(x))
            lin = hk(self.hook_pre_linear, self.up_proj(x))
        return hk(self.hook_post, F.silu(pre) * lin)

    def forward(self, x: torch.Tensor, hk: Hk) -> torch.Tensor:
        post = self.post(x, hk)
        fast = fast_path.output(self, post, self.down_proj)
        if fast is not None:
            return fast
        return self.down_proj(post) * self.out_scale


class Block(nn.Module):
    """Pre-norm block: resid_mid = x + attn(ln1 x), resid_post = resid_mid + mlp(ln2 resid_mid).
    A model family changes its pieces through the class attributes (`fbt_probe.formats.nanochat`)."""

    attention_cls = Attention
    mlp_cls = MLP
    hook_out_is_single_residual_stream = True  # TransformerLens's logit lens reads hook_resid_post as the stream

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.ln1 = self.norm(cfg)
        self.attn = self.attention_cls(cfg, cfg.resolved_layer_types[layer], layer)
        self.ln2 = self.norm(cfg)
        self.mlp = self.mlp_cls(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]  (after depth scaling)
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]  (after depth scaling)
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_in = HookPoint()  # [batch, pos, d_model]  the MLP branch's input (before ln2)

    @staticmethod
    def norm(cfg: ModelConfig) -> ScaledRMSNorm:
        return HookedRMSNorm(cfg.d_model, cfg.rms_eps)

    def forward(
        self, x: torch.Tensor, start: int, cache: KVCache | None, hk: Hk, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: [batch, pos, d_model] at positions start..start+pos-1."""
        return self.sublayers(hk(self.hook_resid_pre, x), start, cache, hk, tokens)

    def sublayers(self, resid_pre: torch.Tensor, start: int, cache: KVCache | None, hk: Hk, tokens) -> torch.Tensor:
        attn_out = hk(self.hook_attn_out, self.attn(self.ln1(resid_pre, hk), start, cache, self.layer, hk, tokens))
        resid_mid = hk(self.hook_resid_mid, resid_pre + attn_out)
        mlp_out = hk(self.hook_mlp_out, self.mlp(self.ln2(hk(self.hook_mlp_in, resid_mid), hk), hk))
        return hk(self.hook_resid_post, resid_mid + mlp_out)
