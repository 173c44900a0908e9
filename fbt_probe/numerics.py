"""The arithmetic every layer shares, written once: the half-precision upcast and the fusion's
reference (eq. 3-4 after the projections). The model, the engine, the kernel and the benchmarks
import these; nothing here imports the rest of the package."""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


def is_half(dtype: torch.dtype) -> bool:
    """Whether `dtype` is a half type, whose statistics are computed in float32 (Qwen3's convention)."""
    return dtype in HALF_DTYPES


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is a half type, else x itself."""
    return x.float() if is_half(x.dtype) else x


def fusion_reference(value: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(value ⊙ gate) · weight, Qwen3-style (float32 statistics for half types): the fusion's
    one formula, the pure-PyTorch reference every fast path (the Triton kernel, the lean step's
    epilogue) is checked against."""
    dtype = value.dtype
    x = upcast(value * gate)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)
