"""Greedy generation under the paper's three decoding modes (same weights):

- Std:   standard prefill, plain embeddings while generating;
- Soft:  standard prefill, then every generated token is fused with the previous position's state;
- Fused: `jacobi:2` prefill (the KV cache holds pass 2), then as Soft.
"""

from __future__ import annotations

import torch

from fbt_probe.errors import FbtError
from fbt_probe.modes import Mode
from fbt_probe.tokens import check_tokens

DECODINGS = ("std", "soft", "fused")


@torch.no_grad()
def generate(model, tokens: torch.Tensor, n_new: int, decoding: str = "std") -> torch.Tensor:
    """Greedy continuation. tokens: [batch, pos] -> [batch, n_new] new token ids."""
    decoding = str(decoding).lower()
    if decoding not in DECODINGS:
        raise FbtError(f"decoding '{decoding}': expected one of {DECODINGS}")
    tokens = check_tokens(tokens, model.cfg)
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 0:
        raise FbtError(f"n_new: expected an integer >= 0, got {n_new!r}")
    if tokens.shape[1] + n_new - 1 > model.cfg.n_ctx:  # the last new token is never fed back
        raise FbtError(
            f"n_new: {tokens.shape[1]} prompt + {n_new} new tokens exceed the model's context n_ctx = {model.cfg.n_ctx}"
        )
    if n_new == 0:
        return tokens.new_zeros(tokens.shape[0], 0)
    cache, state, logits = _prefill(model, tokens, decoding, capacity=tokens.shape[1] + n_new)
    state, logits = state[:, -1], logits[:, -1]
    out = []
    for _ in range(n_new):
        nxt = logits.argmax(-1)
        out.append(nxt)
        if len(out) == n_new:
            break
        logits, state = model.step(nxt, cache, None if decoding == "std" else state)
    return torch.stack(out, dim=1)


def _prefill(model, tokens: torch.Tensor, decoding: str, capacity: int):
    if decoding != "fused" or tokens.shape[1] < 2:
        return model.prefill_cache(tokens, capacity=capacity)
    states, has = model.carried_states(tokens, Mode("jacobi", 2))
    return model.prefill_cache(tokens, states, has, capacity=capacity)
