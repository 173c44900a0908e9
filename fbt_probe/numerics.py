"""The arithmetic every layer shares, written once: the half-precision upcast, Qwen3's RMSNorm and
the fusion's reference (eq. 3-4 after the projections). The model, the engine, the kernel and the
benchmarks import these; nothing here imports the rest of the package."""

from __future__ import annotations

import torch
import torch.nn.functional as F

HALF_DTYPES = (torch.float16, torch.bfloat16)


def is_half(dtype: torch.dtype) -> bool:
    """Whether `dtype` is a half type, whose statistics are computed in float32 (Qwen3's convention)."""
    return dtype in HALF_DTYPES


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is a half type, else x itself."""
    return x.float() if is_half(x.dtype) else x


def rms_normalize(x: torch.Tensor, eps: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x * rsqrt(mean(x²) + eps) over the last dim (in float32 for half types), cast to `dtype`
    (default: x's): Qwen3RMSNorm before its gain.

    For float32 / float64 `F.rms_norm` computes these very ops in one call: bitwise the same
    (tested), fewer dispatches. Half types keep the explicit form (its casts differ from F.rms_norm's)."""
    dtype = x.dtype if dtype is None else dtype
    if dtype in (torch.float32, torch.float64) and x.dtype == dtype:
        return F.rms_norm(x, (x.shape[-1],), None, eps)
    h = upcast(x)
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Qwen3RMSNorm: `rms_normalize`, then times `weight` ([d], or a gain per head [heads, d_head]);
    a [d] weight of x's float32 / float64 dtype goes into the one `F.rms_norm` call."""
    dtype = x.dtype if dtype is None else dtype
    if dtype in (torch.float32, torch.float64) and x.dtype == dtype == weight.dtype and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * rms_normalize(x, eps, dtype)


def fusion_reference(value: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(value ⊙ gate) · weight, Qwen3-style, cast back to value's dtype before the gain: the
    fusion's one formula. The model's fusion computes it, and every fast path (the Triton kernel,
    the lean step's epilogue) is checked against it."""
    return rms_norm(value * gate, weight, eps, value.dtype)
