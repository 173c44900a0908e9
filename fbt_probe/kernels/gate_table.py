"""The gate table G = σ(E W_Gᵀ): the fusion gate depends only on the token, so for inference it is
computed once per model (V×D) and a decode step gathers a row instead of running the W_G product.

Each row is computed with the same ops and dtype as the model's gate (`Fusion.gate`, the one place
the gate is written outside this kernel), so a gathered row equals the gate the model would compute
for that token up to GEMM blocking (bit-equal in practice for float32 on one device;
tests/test_kernels.py holds the table to `Fusion.gate` in float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def build_gate_table(embed_weight: Tensor, w_gate_weight: Tensor, chunk_rows: int = 8192) -> Tensor:
    """G[v] = σ(W_G · E[v]) for every token v. embed_weight: [vocab, D] (E); w_gate_weight: [D, D],
    the `nn.Linear` weight of W_G (out × in). Returns [vocab, D] in the embedding's dtype and device,
    detached. Built `chunk_rows` tokens at a time so the working memory stays one chunk."""
    if embed_weight.dim() != 2 or w_gate_weight.dim() != 2:
        raise ValueError(
            f"build_gate_table: expected E [vocab, D] and W_G [D, D], got {tuple(embed_weight.shape)} "
            f"and {tuple(w_gate_weight.shape)}"
        )
    d = embed_weight.shape[1]
    if tuple(w_gate_weight.shape) != (d, d):
        raise ValueError(f"build_gate_table: W_G shape {tuple(w_gate_weight.shape)}, expected ({d}, {d})")
    if chunk_rows < 1:
        raise ValueError(f"build_gate_table: chunk_rows {chunk_rows}, expected >= 1")
    w = w_gate_weight.detach().to(device=embed_weight.device, dtype=embed_weight.dtype)
    table = torch.empty_like(embed_weight, memory_format=torch.contiguous_format).detach()
    with torch.no_grad():
        for start in range(0, embed_weight.shape[0], chunk_rows):
            rows = embed_weight[start : start + chunk_rows].detach()
            table[start : start + chunk_rows] = torch.sigmoid(F.linear(rows, w))
    return table
