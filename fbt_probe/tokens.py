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


def check_mask(mask, tokens: torch.Tensor) -> torch.Tensor:
    """`mask` as a bool [batch, pos] attention mask of `tokens`, or a one-line FbtError: the shape of
    the tokens, 0/1 values, and each row's real tokens one contiguous run that touches the left or
    the right edge (left or right padding), at least one per row."""
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(tokens.shape):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise FbtError(f"attention_mask: expected shape {tuple(tokens.shape)} (the tokens'), got {got}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise FbtError("attention_mask: expected 0/1 (or bool) values")
    m = mask.bool().to(tokens.device)
    n = m.sum(-1)
    if bool((n == 0).any()):
        raise FbtError(f"attention_mask: row {int((n == 0).nonzero()[0])} has no real token")
    first = m.int().argmax(-1)
    pos = torch.arange(m.shape[1], device=m.device)
    run = (pos >= first[:, None]) & (pos < (first + n)[:, None])
    edge = (first == 0) | (first + n == m.shape[1])
    if not bool((run == m).all()) or not bool(edge.all()):
        raise FbtError("attention_mask: each row's real tokens must be one run at the left or the right edge")
    return m
