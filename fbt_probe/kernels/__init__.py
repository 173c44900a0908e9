"""fbt_probe.kernels: the CUDA fast path for the latent-feedback fusion (docs/kernels.md).

    fast_fusion_available(device) -> bool    the Triton kernel (not the eager reference) runs there
    glu_fusion(value, gate, weight, eps)     RMSNorm(value ⊙ gate) · weight, fused
    glu_fusion_direct(value, gate, weight, eps)
                                             the same launched without the custom-op dispatch (inference only)
    glu_fusion_table(value, token_ids, gate_table, weight, eps)
                                             the same with gate = gate_table[token_ids], gathered in-kernel
    build_gate_table(embed_weight, w_gate_weight) -> G = σ(E W_Gᵀ), [vocab, D]

The ops are `torch.ops.fbt_probe.glu_fusion{,_table}` (fake kernels and autograd registered). Where
the kernel cannot run they compute the eager reference, so they are always safe to call. Triton is
optional: without it everything here still imports and runs the reference.
"""

from fbt_probe.kernels.gate_table import build_gate_table
from fbt_probe.kernels.glu_fusion import (
    fast_fusion_available,
    glu_fusion,
    glu_fusion_direct,
    glu_fusion_table,
)

__all__ = [
    "build_gate_table",
    "fast_fusion_available",
    "glu_fusion",
    "glu_fusion_direct",
    "glu_fusion_table",
]
