"""Packed training batches, a pure function of (config, step): resuming needs no data-loader state."""
from __future__ import annotations

import hashlib

import numpy as np

import torch

from fbt_probe.tasks import heldout_groups, load_spec, training_documents
from fbt_probe.tasks.streams import HeldOut
from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig


def step_seed(seed: int, step: int, what: str) -> int:
    digest = hashlib.sha256(f"fbt-probe.train:{what}:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


_HELDOUT: dict = {}
_SPECS: dict = {}


def heldout(cfg: TrainConfig):
    key = (tuple(cfg.tasks), cfg.heldout_fraction, cfg.seed)
    if key not in _HELDOUT:  # a frozen HeldOut, drawn for every micro-batch: computed once per process
        _HELDOUT[key] = heldout_groups(list(cfg.tasks), cfg.heldout_fraction, cfg.seed)
    return _HELDOUT[key]


def _spec(task: str):
    """The built-in spec of `task`, read once per process (documents are drawn every step)."""
    if task not in _SPECS:
        _SPECS[task] = load_spec(task)
    return _SPECS[task]


def one_per_row(docs, answer_weight: float, pad_id: int = 0, length: int | None = None, answer_share: float | None = None):
    """One document per row, starting at position 0 and right-padded to `length` (default the
    longest): the shape of the probe-time inputs. Returns tokens [rows, length], targets (the next
    token) and loss weights (0 on padding and on the last token, `answer_weight` on the position that
    predicts the answer word, 1 elsewhere; each row then normalised to sum to 1, so a 259-token
    register history does not outweigh a 14-token completion sample). `answer_share` instead gives
    the answer that fixed share of every document's weight, whatever its length."""
    docs = list(docs)
    length = length or max(len(d["token_ids"]) for d in docs)
    tokens = torch.full((len(docs), length), pad_id, dtype=torch.long)
    weights = torch.zeros(len(docs), length)
    for r, doc in enumerate(docs):
        ids = doc["token_ids"]
        tokens[r, : len(ids)] = torch.tensor(ids)
        weights[r, : len(ids) - 1] = 1.0
        n_text = len(ids) - 2  # weighted positions other than the answer's
        w = answer_weight if answer_share is None else answer_share / (1 - answer_share) * max(n_text, 1)
        weights[r, doc["answer_pos"] - 1] = w
        weights[r] /= weights[r].sum()  # every document counts the same, whatever its length
    targets = torch.cat([tokens[:, 1:], torch.full((len(docs), 1), pad_id, dtype=torch.long)], dim=1)
    return tokens, targets, weights


def _cells(cfg: TrainConfig) -> list[tuple[str, int]]:
    knobs = cfg.knobs or {t: TRAIN_KNOBS[t] for t in cfg.tasks}
    return [(t, k) for t in cfg.tasks for k in knobs[t]]


def _token_shares(cfg: TrainConfig, cells: list[tuple[str, int]]) -> np.ndarray:
    """Expected share of a step's tokens per cell: `task_shares[task]` split equally over the task's cells."""
    per_task = {t: sum(1 for c, _ in cells if c == t) for t, _ in cells}
    return np.array([cfg.task_shares[t] / per_task[t] for t, _ in cells])


def _exclusion(cfg: TrainConfig, split: str) -> HeldOut:
    ho = heldout(cfg)
    return ho if split == "train" else _OnlyHeldOut(ho.fraction, ho.seed, ho.tasks)


_LENGTHS: dict = {}


def cell_length(task: str, knob: int, tokenizer) -> int:
    """Tokens of a training document of a cell (every document of a cell has the same length)."""
    key = (task, knob, id(tokenizer))
    if key not in _LENGTHS:
        _LENGTHS[key] = len(next(iter(training_documents([task], tokenizer, n=1, seed=0, knobs={task: [knob]})))["token_ids"])
    return _LENGTHS[key]


def cell_probabilities(cfg: TrainConfig, tokenizer):
    """(cells, their document lengths, the probability a drawn document comes from each): ∝ the
    cell's token share / its length, so a cell's expected share of the tokens is its token share."""
    cells = _cells(cfg)
    lengths = np.array([cell_length(t, k, tokenizer) for t, k in cells], dtype=float)
    p = _token_shares(cfg, cells) / lengths
    return cells, lengths, p / p.sum()


def batches_for_step(cfg: TrainConfig, tokenizer, step: int, split: str = "train") -> list:
    """The micro-batches of `step`: documents drawn one by one, each from a (task, length) cell chosen
    with probability ∝ token share / length (`task_shares`: a task's expected share of the tokens,
    split equally over its cells), until `tokens_per_step` is reached; grouped by cell
    into one-document-per-row micro-batches (a cell's documents all have the same length: no padding).
    Their gradients are accumulated into one optimizer step, so every step mixes tasks, and short
    documents come many to a step. Split 'train' excludes the held-out contexts; 'val' draws only
    from them."""
    cells, lengths, p = cell_probabilities(cfg, tokenizer)
    rng = np.random.default_rng(step_seed(cfg.seed, step, split + "-cells"))
    counts, used = np.zeros(len(cells), dtype=int), 0
    while used < cfg.tokens_per_step:
        i = int(rng.choice(len(cells), p=p))
        counts[i] += 1
        used += int(lengths[i])
    out = []
    for i, n in enumerate(counts):
        if n:
            task, knob = cells[i]
            docs = training_documents([_spec(task)], tokenizer, n=int(n), seed=step_seed(cfg.seed, step * 1000 + i, split),
                                      knobs={task: [knob]}, exclude_groups=_exclusion(cfg, split))
            out.append(one_per_row(docs, cfg.answer_weight, answer_share=cfg.answer_share))
    return out


def validation_batch(cfg: TrainConfig, tokenizer, rows: int = 16):
    """About `rows` held-out documents spread over every training cell, one per row (right-padded)."""
    cells = _cells(cfg)
    per = max(1, rows // len(cells))
    docs = []
    for i, (task, knob) in enumerate(cells):
        docs += list(training_documents([_spec(task)], tokenizer, n=per, seed=step_seed(cfg.seed, i, "val"), knobs={task: [knob]},
                                        exclude_groups=_exclusion(cfg, "val")))
    return one_per_row(docs, cfg.answer_weight, answer_share=cfg.answer_share)


class _OnlyHeldOut(HeldOut):
    """Excludes every context that is NOT held out: validation draws only held-out contexts."""

    def __contains__(self, context_id) -> bool:
        return not HeldOut.__contains__(self, context_id)
