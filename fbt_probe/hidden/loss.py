"""The training objective of a Hidden Decoding model (eq. 2 of its paper)."""

from __future__ import annotations

import torch

from fbt_probe.model.loss import weighted_ce


def hidden_loss(model, tokens: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Eq. 2: next-token cross-entropy read only at each token's last stream (`model(tokens)` is
    already those logits), with the base model's targets and loss weights."""
    return weighted_ce(model(tokens), targets, weights)
