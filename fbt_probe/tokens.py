"""The token ids every model entry point takes, checked once."""

from __future__ import annotations

import torch

from fbt_probe.errors import FbtError


def check_tokens(tokens, cfg) -> torch.Tensor:
    """`tokens` as a LongTensor [batch, pos], or a one-line FbtError: integer ids in [0, d_vocab),
    2-D, 1 <= pos <= n_ctx."""
    if not isinstance(tokens, torch.Tensor):
        raise FbtError(
            f"tokens: expected a LongTensor [batch, pos], got {type(tokens).__name__} (wrap it: torch.tensor([ids]))"
        )
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise FbtError(f"tokens: expected integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        hint = " (add a batch dimension: tokens[None])" if tokens.dim() == 1 else ""
        raise FbtError(f"tokens: expected shape [batch, pos], got {tuple(tokens.shape)}{hint}")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise FbtError(f"tokens: expected at least one sample and one position, got shape {tuple(tokens.shape)}")
    if tokens.shape[1] > cfg.n_ctx:
        raise FbtError(f"tokens: {tokens.shape[1]} positions exceed the model's context n_ctx = {cfg.n_ctx}")
    if tokens.device.type != "meta":
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= cfg.d_vocab:
            raise FbtError(f"tokens: id {lo if lo < 0 else hi} is outside the vocabulary 0..{cfg.d_vocab - 1}")
    return tokens.long()
