"""Backbone pieces, numerically matching Hugging Face Qwen3 (eager attention) when scaling is off.

`hk(hook_point, x)` is passed down every forward: it is `hook_point(x)` in a hooked pass and the
identity in a silent pass (carried-state computations run with hooks off, DESIGN.md §2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.config import ModelConfig

Hk = Callable[[HookPoint, torch.Tensor], torch.Tensor]


def hooked(hp: HookPoint, x: torch.Tensor) -> torch.Tensor:
    return hp(x)


def silent(hp: HookPoint, x: torch.Tensor) -> torch.Tensor:
    return x


class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in float32, cast back, then scale."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class HookedRMSNorm(RMSNorm):
    def __init__(self, d: int, eps: float):
        super().__init__(d, eps)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor, hk: Hk = hooked) -> torch.Tensor:
        return hk(self.hook_normalized, super().forward(x))


def rotary(positions: torch.Tensor, d_head: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [pos, d_head] (HF's cat(freqs, freqs) layout)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.int64).to(work) / d_head))
    freqs = positions.to(work)[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, pos, heads, d_head]; cos/sin: [pos, d_head]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


@dataclass
class KVCache:
    """Keys (after QK-norm and RoPE) and values per layer, [batch, pos, n_kv_heads, d_head].
    The layout is the same with or without feedback: only the inputs that produced them differ."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> "KVCache":
        return cls([None] * n_layers, [None] * n_layers)

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=1)
            v = torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str):
        super().__init__()
        self.cfg = cfg
        self.window = cfg.window if layer_type == "sliding_attention" else None
        D, H, KV, dh = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        self.q_proj = nn.Linear(D, H * dh, bias=False)
        self.k_proj = nn.Linear(D, KV * dh, bias=False)
        self.v_proj = nn.Linear(D, KV * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, D, bias=False)
        self.q_norm = RMSNorm(dh, cfg.rms_eps)
        self.k_norm = RMSNorm(dh, cfg.rms_eps)
        with torch.no_grad():  # QK-norm gains: Qwen3 starts them at 1 (see ModelConfig.qk_norm_init)
            self.q_norm.weight.fill_(cfg.qk_norm_init)
            self.k_norm.weight.fill_(cfg.qk_norm_init)
        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head]  (projection, before QK-norm and RoPE)
        self.hook_k = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_v = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]

    def mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        allowed = k_pos[None, :] <= q_pos[:, None]  # [q, k]
        if self.window is not None:
            allowed &= (q_pos[:, None] - k_pos[None, :]) < self.window
        return allowed

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, layer: int, hk: Hk) -> torch.Tensor:
        B, P, _ = x.shape
        H, KV, dh = self.cfg.n_heads, self.cfg.n_key_value_heads, self.cfg.d_head
        q = hk(self.hook_q, self.q_proj(x).view(B, P, H, dh))
        k = hk(self.hook_k, self.k_proj(x).view(B, P, KV, dh))
        v = hk(self.hook_v, self.v_proj(x).view(B, P, KV, dh))
        cos, sin = rotary(positions, dh, self.cfg.rope_theta, x.dtype)
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(self.k_norm(k), cos, sin)
        k_pos = positions
        if cache is not None:
            k, v = cache.append(layer, k, v)
            k_pos = torch.arange(k.shape[1], device=x.device)
        rep = H // KV
        k = k.repeat_interleave(rep, dim=2)  # [batch, key_pos, n_heads, d_head]
        v = v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * dh**-0.5
        scores = scores.masked_fill(~self.mask(positions, k_pos), float("-inf"))
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # upcast half types only
        pattern = hk(self.hook_pattern, torch.softmax(scores, dim=-1, dtype=work).to(q.dtype))
        z = hk(self.hook_z, torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        return self.o_proj(z.reshape(B, P, H * dh))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.down_proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]  gate pre-activation
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]  linear (up) branch
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]  silu(pre) * pre_linear

    def forward(self, x: torch.Tensor, hk: Hk) -> torch.Tensor:
        pre = hk(self.hook_pre, self.gate_proj(x))
        lin = hk(self.hook_pre_linear, self.up_proj(x))
        return self.down_proj(hk(self.hook_post, F.silu(pre) * lin))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.scale = cfg.residual_scale
        self.ln1 = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.attn = Attention(cfg, cfg.resolved_layer_types[layer])
        self.ln2 = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]  (after depth scaling)
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]  (after depth scaling)
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, hk: Hk) -> torch.Tensor:
        resid_pre = hk(self.hook_resid_pre, x)
        attn_out = self.attn(self.ln1(resid_pre), positions, cache, self.layer, hk)
        attn_out = hk(self.hook_attn_out, attn_out * self.scale if self.scale != 1.0 else attn_out)
        resid_mid = hk(self.hook_resid_mid, resid_pre + attn_out)
        mlp_out = self.mlp(self.ln2(resid_mid), hk)
        mlp_out = hk(self.hook_mlp_out, mlp_out * self.scale if self.scale != 1.0 else mlp_out)
        return hk(self.hook_resid_post, resid_mid + mlp_out)
