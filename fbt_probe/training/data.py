"""Packed training batches, a pure function of (config, step): resuming needs no data-loader state."""
from __future__ import annotations

import hashlib

import torch

from fbt_probe.tasks import heldout_groups, training_documents
from fbt_probe.tasks.streams import HeldOut
from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig


def step_seed(seed: int, step: int, what: str) -> int:
    digest = hashlib.sha256(f"fbt-probe.train:{what}:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def heldout(cfg: TrainConfig):
    return heldout_groups(list(cfg.tasks), cfg.heldout_fraction, cfg.seed)


def pack(docs, rows: int, ctx: int, answer_weight: float, pad_id: int = 0):
    """Whole documents packed greedily into `rows` rows of `ctx` tokens (never split; pad the rest).
    Returns tokens [rows, ctx], targets [rows, ctx] (next token), loss weights [rows, ctx]
    (0 on padding and on the last position, `answer_weight` on answer tokens, 1 elsewhere)."""
    tokens = torch.full((rows, ctx), pad_id, dtype=torch.long)
    weights = torch.zeros(rows, ctx)
    r, col = 0, 0
    for doc in docs:
        ids = doc["token_ids"]
        if len(ids) > ctx:
            continue
        if col + len(ids) > ctx:
            r, col = r + 1, 0
            if r == rows:
                break
        tokens[r, col: col + len(ids)] = torch.tensor(ids)
        # the target of position p is token p+1: weight the positions that predict real tokens
        weights[r, col: col + len(ids) - 1] = 1.0
        weights[r, col + doc["answer_pos"] - 1] = answer_weight
        col += len(ids)
    targets = torch.cat([tokens[:, 1:], torch.full((rows, 1), pad_id, dtype=torch.long)], dim=1)
    return tokens, targets, weights


def batch_for_step(cfg: TrainConfig, tokenizer, step: int, split: str = "train"):
    """The batch of `step` (split 'train': held-out contexts excluded; 'val': only held-out ones)."""
    ho = heldout(cfg)
    knobs = cfg.knobs or {t: TRAIN_KNOBS[t] for t in cfg.tasks}
    exclude = ho if split == "train" else _OnlyHeldOut(ho.fraction, ho.seed, ho.tasks)
    docs = training_documents(list(cfg.tasks), tokenizer, n=10_000, seed=step_seed(cfg.seed, step, split),
                              knobs=knobs, exclude_groups=exclude)
    return pack(docs, cfg.rows, cfg.ctx, cfg.answer_weight)


class _OnlyHeldOut(HeldOut):
    """Excludes every context that is NOT held out: validation draws only held-out contexts."""

    def __contains__(self, context_id) -> bool:
        return not HeldOut.__contains__(self, context_id)
