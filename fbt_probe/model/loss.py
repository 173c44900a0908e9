"""The token-weighted cross-entropy every training objective is built from."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fbt_probe.numerics import upcast


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `logits` [batch, pos, vocab] against `targets` [batch, pos], averaged with
    `weights` [batch, pos] (0 drops a position); half-precision logits are upcast first."""
    logits = upcast(logits)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    w = weights.reshape(-1).to(ce.dtype)
    return (ce * w).sum() / w.sum()
