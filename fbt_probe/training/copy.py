"""Copy documents: the induction warm-up of `TrainConfig.copy_steps` (after 500 such steps the
register documents bind within a few hundred steps; docs/research/register-binding.md).

A row is COPY_LEN random numbers (the task vocabulary's words 0-99), then 0..COPY_GAP random filler
numbers, then the same COPY_LEN numbers again, then filler to the fixed row length. The loss is on
the second copy only, from its second token on: each of those tokens is the one that followed the
previous occurrence of the token before it. The random gap means no fixed-offset head can copy; only
content-based lookup (an induction head: a previous-token head composed with a matching head) can.
That lookup is the circuit the register tasks need, and on the register documents alone the `tiny`
model does not find it within the training budget (R0-R21, V1-V5).
"""

from __future__ import annotations

import numpy as np
import torch

COPY_LEN = 20
COPY_GAP = 10
ROW_LEN = 2 * COPY_LEN + COPY_GAP


def copy_batch(tokenizer, rows: int, seed: int):
    """(tokens, targets, weights) [rows, ROW_LEN]; every row's weights sum to 1, on the positions
    that predict the second copy's tokens 2..COPY_LEN. `tokenizer` is the task tokenizer (training
    always uses it), whose fixed vocabulary has the numbers 0-99 as words."""
    vocab = tokenizer.get_vocab()
    numbers = torch.tensor([vocab[str(d)] for d in range(100)])
    rng = np.random.default_rng(seed)
    tokens = numbers[torch.from_numpy(rng.integers(0, 100, (rows, ROW_LEN)))]
    weights = torch.zeros(rows, ROW_LEN)
    for r, gap in enumerate(rng.integers(0, COPY_GAP + 1, rows).tolist()):
        start = COPY_LEN + gap
        tokens[r, start : start + COPY_LEN] = tokens[r, :COPY_LEN]
        weights[r, start : start + COPY_LEN - 1] = 1.0 / (COPY_LEN - 1)
    targets = torch.cat([tokens[:, 1:], torch.zeros(rows, 1, dtype=torch.long)], dim=1)
    return tokens, targets, weights


def copy_rows(tokens_per_step: int) -> int:
    return max(1, tokens_per_step // ROW_LEN)
