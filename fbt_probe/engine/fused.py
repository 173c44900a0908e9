"""Weights derived from parameters for the fused projections (`dispatch.fused_projection`)."""

from __future__ import annotations

import torch


class FusedWeight:
    """A weight derived from parameters (default: cat along the output dim, one GEMM instead of
    several), rebuilt whenever one of them changes (data pointer or in-place version). Detached:
    for passes without autograd only."""

    def __init__(self, build=None):
        self.build = build or cat  # module-level functions and partials: the model stays picklable
        self.key, self.weight = None, None

    def __call__(self, *weights: torch.Tensor) -> torch.Tensor:
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
        if key != self.key:
            with torch.no_grad():
                self.weight, self.key = self.build(*(w.detach() for w in weights)), key
        return self.weight


def cat(*weights: torch.Tensor) -> torch.Tensor:
    return torch.cat(weights)


def expand_cat(*weights: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """[d] gains -> [sum(rows), d]: gain i repeated rows[i] times (one per head)."""
    return torch.cat([w.expand(n, w.shape[-1]) for w, n in zip(weights, rows)])
