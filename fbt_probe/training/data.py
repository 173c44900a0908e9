"""Packed training batches, a pure function of (config, step): resuming needs no data-loader state."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import torch

from fbt_probe.errors import FbtError
from fbt_probe.tasks import heldout_groups, load_spec, training_documents
from fbt_probe.tasks.streams import HeldOut
from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig
from fbt_probe.training.copy import copy_batch, copy_rows
from fbt_probe.training.lm import corpus_batch
from fbt_probe.training.mix import MIX, held_names, mix_documents


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
    """The spec of `task` (a built-in name or a spec file), read once per process (documents are drawn
    every step)."""
    if task not in _SPECS:
        _SPECS[task] = load_spec(task)
    return _SPECS[task]


def one_per_row(
    docs, answer_weight: float, pad_id: int = 0, length: int | None = None, answer_share: float | None = None
):
    """One document per row, starting at position 0 and right-padded to `length` (default the
    longest): the shape of the probe-time inputs. Returns tokens [rows, length], targets (the next
    token) and loss weights (0 on padding and on the last token, `answer_weight` on the position that
    predicts the answer word, 1 elsewhere; each row then normalised to sum to 1, so a 259-token
    register history does not outweigh a 14-token completion sample). `answer_share` instead gives
    the answer that fixed share of every document's weight, whatever its length (1: the answers
    only). A document with `answer_positions` (several answers) gives each answer `answer_weight`,
    or an equal part of `answer_share`."""
    docs = list(docs)
    length = length or max(len(d["token_ids"]) for d in docs)
    tokens = torch.full((len(docs), length), pad_id, dtype=torch.long)
    weights = torch.zeros(len(docs), length)
    for r, doc in enumerate(docs):
        ids = doc["token_ids"]
        tokens[r, : len(ids)] = torch.tensor(ids)
        if "answer_positions" in doc or answer_share == 1:
            _answers_weights(weights[r], doc, answer_weight, answer_share)
            continue
        weights[r, : len(ids) - 1] = 1.0
        n_text = len(ids) - 2  # weighted positions other than the answer's
        w = answer_weight if answer_share is None else answer_share / (1 - answer_share) * max(n_text, 1)
        weights[r, doc["answer_pos"] - 1] = w
        weights[r] /= weights[r].sum()  # every document counts the same, whatever its length
    targets = torch.cat([tokens[:, 1:], torch.full((len(docs), 1), pad_id, dtype=torch.long)], dim=1)
    return tokens, targets, weights


def _answers_weights(row: torch.Tensor, doc: dict, answer_weight: float, answer_share: float | None) -> None:
    """One row's weights for a document with several answers, or answers only (`answer_share` 1)."""
    ids, answers = doc["token_ids"], doc.get("answer_positions", [doc["answer_pos"]])
    row[: len(ids) - 1] = 0.0 if answer_share == 1 else 1.0
    n_text = len(ids) - 1 - len(answers)  # weighted positions other than the answers'
    if answer_share is None:
        w = answer_weight
    else:
        w = 1.0 if answer_share == 1 else answer_share / (1 - answer_share) * max(n_text, 1) / len(answers)
    for pos in answers:
        row[pos - 1] = w
    row /= row.sum()


def _cells(cfg: TrainConfig) -> list[tuple[str, int]]:
    """The (task, length) cells of the configured tasks (validation draws from these)."""
    knobs = cfg.knobs or {t: TRAIN_KNOBS[t] for t in cfg.tasks}
    return [(t, k) for t in cfg.tasks for k in knobs[t]]


def register_tasks(cfg: TrainConfig) -> list[str]:
    return [t for t in cfg.tasks if _spec(t).kind == "registers"]


def _train_cells(cfg: TrainConfig) -> list[tuple[str, int]]:
    """The cells training draws from: `_cells`, with a register mix in place of the register tasks' cells."""
    if cfg.register_mix is None:
        return _cells(cfg)
    mixed = register_tasks(cfg)
    return [(t, k) for t, k in _cells(cfg) if t not in mixed] + [(MIX, i) for i in range(len(cfg.register_kinds))]


def _token_shares(cfg: TrainConfig, cells: list[tuple[str, int]], lengths: np.ndarray) -> np.ndarray:
    """Expected share of a step's tokens per cell: `task_shares[task]` split equally over the task's
    cells; the register tasks' shares together over the mix's cells, so that each kind's share of
    the mix's documents is its weight."""
    per_task = {t: sum(1 for c, _ in cells if c == t) for t, _ in cells}
    shares = np.array([0.0 if t == MIX else cfg.task_shares[t] / per_task[t] for t, _ in cells])
    mix = np.array([t == MIX for t, _ in cells])
    if mix.any():
        doc_share = np.array([k.weight for k in cfg.register_kinds])
        tokens = doc_share * lengths[mix]
        shares[mix] = sum(cfg.task_shares[t] for t in register_tasks(cfg)) * tokens / tokens.sum()
    return shares


def _exclusion(cfg: TrainConfig, split: str) -> HeldOut:
    ho = heldout(cfg)
    return ho if split == "train" else _OnlyHeldOut(ho.fraction, ho.seed, ho.tasks)


_LENGTHS: dict = {}


def cell_length(task: str, knob: int, tokenizer) -> int:
    """Tokens of a training document of a cell (every document of a cell has the same length)."""
    key = (task, knob, id(tokenizer))
    if key not in _LENGTHS:
        _LENGTHS[key] = len(next(iter(training_documents([task], tokenizer, n=1, seed=0, knobs=[knob])))["token_ids"])
    return _LENGTHS[key]


def mix_length(cfg: TrainConfig, i: int, tokenizer) -> int:
    """Tokens of a document of the register mix's kind i (every document of a kind has the same length)."""
    kind = cfg.register_kinds[i]
    key = (MIX, str(kind), cfg.register_queries, register_tasks(cfg)[0], id(tokenizer))
    if key not in _LENGTHS:
        _LENGTHS[key] = len(_mix_docs(cfg, i, tokenizer, 1, 0, "train")[0]["token_ids"])
    return _LENGTHS[key]


def _mix_docs(cfg: TrainConfig, i: int, tokenizer, n: int, seed: int, split: str) -> list[dict]:
    names = held_names(register_tasks(cfg))
    held = HeldOut(cfg.heldout_fraction, cfg.seed, frozenset(names))
    return mix_documents(
        _spec(register_tasks(cfg)[0]),
        cfg.register_kinds[i],
        cfg.register_queries,
        tokenizer,
        n,
        seed,
        held,
        names,
        only_held=split != "train",
    )


def cell_probabilities(cfg: TrainConfig, tokenizer):
    """(cells, their document lengths, the probability a drawn document comes from each): ∝ the
    cell's token share / its length, so a cell's expected share of the tokens is its token share."""
    cells = _train_cells(cfg)
    lengths = np.array(
        [mix_length(cfg, k, tokenizer) if t == MIX else cell_length(t, k, tokenizer) for t, k in cells], dtype=float
    )
    p = _token_shares(cfg, cells, lengths) / lengths
    return cells, lengths, p / p.sum()


def batches_for_step(cfg: TrainConfig, tokenizer, step: int, split: str = "train", max_k: int | None = None) -> list:
    """The micro-batches of `step`: documents drawn one by one, each from a (task, length) cell (or
    a register-mix kind, `TrainConfig.register_mix`) chosen
    with probability ∝ token share / length (`task_shares`: a task's expected share of the tokens,
    split equally over its cells), until `tokens_per_step` is reached; grouped by cell
    into one-document-per-row micro-batches (a cell's documents all have the same length: no padding).
    Their gradients are accumulated into one optimizer step, so every step mixes tasks, and short
    documents come many to a step. Split 'train' excludes the held-out contexts; 'val' draws only
    from them. The first `copy_steps` training steps are one micro-batch of copy documents instead
    (`fbt_probe.training.copy`); the `register_steps` after them draw the register tasks' cells only (under
    `register_ramp`, at first only the mix's kinds with few registers). A corpus run
    (`TrainConfig.corpus`) draws one micro-batch of windows of its stored tokens instead. `max_k` (the k curriculum's
    current k, `TrainConfig.k_curriculum`): training draws only the cells of length knob <= max_k,
    their probabilities renormalised."""
    if cfg.corpus is not None:  # next-token prediction on the corpus: one micro-batch of windows
        part = "train" if split == "train" else "heldout"
        return [corpus_batch(cfg, step_seed(cfg.seed, step, "corpus-" + split), part)]
    if split == "train" and step < cfg.copy_steps:
        return [copy_batch(tokenizer, copy_rows(cfg.tokens_per_step), step_seed(cfg.seed, step, "copy"))]
    cells, lengths, p = cell_probabilities(cfg, tokenizer)
    if split == "train" and step < cfg.copy_steps + cfg.register_steps:
        reg = set(register_tasks(cfg)) | {MIX}
        p = np.where([t in reg for t, _ in cells], p, 0.0)
        bound = cfg.ramp_bound(step)
        if bound is not None:  # the register ramp: only the kinds with at most `bound` registers
            kinds = cfg.register_kinds  # parsed from the config's string on each access
            p = np.where([t != MIX or kinds[k].registers <= bound for t, k in cells], p, 0.0)
        p = p / p.sum()
    if split == "train" and max_k is not None:  # the k curriculum: the cells up to the current k
        p = np.where([t == MIX or k <= max_k for t, k in cells], p, 0.0)
        p = p / p.sum()
    rng = np.random.default_rng(step_seed(cfg.seed, step, split + "-cells"))
    counts, used = np.zeros(len(cells), dtype=int), 0
    while used < cfg.tokens_per_step:
        i = int(rng.choice(len(cells), p=p))
        counts[i] += 1
        used += int(lengths[i])
    out = []
    for i, n in enumerate(counts):
        if n and cells[i][0] == MIX:  # register-mix documents (several answers each)
            docs = _mix_docs(cfg, cells[i][1], tokenizer, int(n), step_seed(cfg.seed, step * 1000 + i, split), split)
            out.append(one_per_row(docs, cfg.answer_weight, answer_share=cfg.answer_share))
        elif n:
            task, knob = cells[i]
            docs = training_documents(
                [_spec(task)],
                tokenizer,
                n=int(n),
                seed=step_seed(cfg.seed, step * 1000 + i, split),
                knobs=[knob],
                exclude_groups=_exclusion(cfg, split),
            )
            out.append(one_per_row(docs, cfg.answer_weight, answer_share=cfg.answer_share))
    return out


def validation_batch(cfg: TrainConfig, tokenizer, rows: int = 16, per_task: int | None = None):
    """About `rows` held-out documents spread over every training cell, one per row (right-padded);
    with `per_task`, at least that many documents of each task, spread over its cells. A cell with no
    held-out context (a fifth of a chain task's 4 words at k = 2: none for some seeds) is left out
    with a warning naming it."""
    cells = _cells(cfg)
    per = max(1, rows // len(cells))
    n_cells = {t: sum(c[0] == t for c in cells) for t in cfg.tasks}
    docs, empty = [], []
    for i, (task, knob) in enumerate(cells):
        try:
            docs += list(
                training_documents(
                    [_spec(task)],
                    tokenizer,
                    n=per if per_task is None else -(-per_task // n_cells[task]),
                    seed=step_seed(cfg.seed, i, "val"),
                    knobs=[knob],
                    exclude_groups=_exclusion(cfg, "val"),
                )
            )
        except FbtError:  # a small cell (a chain task's 4 words at k = 2) may have no held-out context
            empty.append(f"{_spec(task).task} k={knob}")
    if empty:
        if not docs:
            raise FbtError(f"validation: no held-out context in any training cell ({', '.join(empty)})")
        warnings.warn(f"validation: no held-out context at {', '.join(empty)} under seed {cfg.seed}; left out")
    return one_per_row(docs, cfg.answer_weight, answer_share=cfg.answer_share)


class _OnlyHeldOut(HeldOut):
    """Excludes every context that is NOT held out: validation draws only held-out contexts."""

    def __contains__(self, context_id) -> bool:
        return not HeldOut.__contains__(self, context_id)
