"""Minimal pairs as batches: both samples of each pair in one tensor, partners indexed.

A batch holds P pairs of one task and one token length as N = 2P rows (rows 0..P-1 are the first
samples, P..2P-1 their partners), so every intervention of a row and of its partner runs in the
same forward and the partner's reference logits are a permutation of the row's (no extra pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.tasks.tokenizer import answer_ids

META_COLUMNS = ("row", "task", "pair_id", "label", "group_id", "length_knob", "n_tokens")


@dataclass
class PairBatch:
    tokens: torch.Tensor  # [N, T] LongTensor, N = 2P
    partner: torch.Tensor  # [N] index of each row's partner in this batch
    target: torch.Tensor  # [N] token id of the row's own label word
    other: torch.Tensor  # [N] token id of the other label word
    meta: pd.DataFrame  # N rows: META_COLUMNS (row = index in the dataset frame)

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @property
    def T(self) -> int:
        return self.tokens.shape[1]

    def to(self, device) -> "PairBatch":
        return PairBatch(
            self.tokens.to(device), self.partner.to(device), self.target.to(device), self.other.to(device), self.meta
        )


def label_token_ids(df: pd.DataFrame, tokenizer=None) -> dict[str, tuple[int, int]]:
    """{task: (token id of the label-0 word, token id of the label-1 word)}.

    From the dataset manifest (`df.attrs['manifest']`, or `df.attrs['label_token_ids']` set by
    `load_pairs`) when present, else from `tokenizer` (the word as the answer after the query)."""
    if "label_token_ids" in df.attrs:
        return {t: tuple(v) for t, v in df.attrs["label_token_ids"].items()}
    out = {}
    manifest = df.attrs.get("manifest") or {}
    known = (manifest.get("tokenizer") or {}).get("label_token_ids") or {}
    for task, sub in df.groupby("task", sort=True):
        words = {int(l): w for l, w in zip(sub["label"], sub["label_word"])}
        if set(words) != {0, 1}:
            raise FbtError(
                f"task {task}: needs samples of both labels 0 and 1 to know its label words, got {sorted(words)}"
            )
        ids = []
        for label in (0, 1):
            word = words[label]
            tid = known.get(word)
            if tid is None and tokenizer is not None:
                full, pos = answer_ids(tokenizer, sub["text"].iloc[0], word)
                tid = None if pos is None else full[pos]
            if tid is None:
                raise FbtError(
                    f"task {task}: label word {word!r} has no single answer token "
                    "(no manifest entry and no tokenizer given, or the word is several tokens)"
                )
            ids.append(int(tid))
        out[str(task)] = tuple(ids)
    return out


def check_pairs(df: pd.DataFrame) -> None:
    """Each (task, pair_id) has exactly two samples, of equal length and the same final token."""
    sizes = df.groupby(["task", "pair_id"]).size()
    bad = sizes[sizes != 2]
    if len(bad):
        (task, pid), n = next(iter(bad.items()))
        raise FbtError(f"dataset: pair {pid} of task {task} has {n} sample(s); minimal pairs need exactly 2")
    for (task, pid), sub in df.groupby(["task", "pair_id"]):
        a, b = (list(map(int, ids)) for ids in sub["token_ids"])
        if len(a) != len(b) or a[-1] != b[-1]:
            raise FbtError(f"dataset: pair {pid} of task {task}: the two samples differ in length or final token")


def round_robin(pairs: pd.DataFrame, n: int, cell) -> pd.DataFrame:
    """At most `n` rows (one per pair, with a `group` column) per `cell`, taken round-robin over
    groups -- each group's first pair, then each group's second, ... -- in their original order:
    a register group holds several pairs, and the first pairs of a cell would all be one group."""
    rank = pairs.groupby([*cell, "group"], sort=False).cumcount()
    order = pairs.assign(_rank=rank).sort_values("_rank", kind="stable")
    return order.groupby(list(cell), sort=False).head(n).sort_index().drop(columns="_rank")


def _pair_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per pair: task, pair_id, n_tokens, length knob, and its two positional rows in `df`."""
    d = df.assign(_pos=np.arange(len(df)))
    pairs = d.groupby(["task", "pair_id"], sort=True)["_pos"].agg(["min", "max"]).reset_index()
    first = pairs["min"].to_numpy()
    pairs["n_tokens"] = d["n_tokens"].to_numpy()[first]
    pairs["knob"] = d["length_knob"].to_numpy()[first]
    pairs["group"] = d["group_id"].to_numpy()[first] if "group_id" in d else pairs["pair_id"]
    return pairs.rename(columns={"min": "row_a", "max": "row_b"})


def pair_batches(
    df: pd.DataFrame, label_ids: dict, batch_size: int = 32, max_pairs: int | None = None, lengths=None
) -> Iterator[PairBatch]:
    """Batches of at most `batch_size` rows (batch_size // 2 pairs), one task, one token length and
    one length knob each.

    `max_pairs` keeps that many pairs of each task × length-knob cell, round-robin over groups
    (each group's first pair, then each group's second, ...: the first pair ids of a register cell
    would all be one schedule); `lengths` keeps those knobs.
    `meta.row` is the sample's row number in `df`."""
    if batch_size < 2:
        raise FbtError(f"batch size {batch_size}: needs at least 2 rows (one pair)")
    check_pairs(df)
    df = df.reset_index(drop=True).assign(row=np.arange(len(df)))
    if lengths is not None:
        df = df[df["length_knob"].isin([int(k) for k in lengths])].reset_index(drop=True)
        if df.empty:
            raise FbtError(f"no samples with length knob in {list(lengths)}")
    pairs = _pair_table(df)
    if max_pairs is not None:
        pairs = round_robin(pairs, max_pairs, ("task", "knob"))
    per = max(1, batch_size // 2)
    # a length knob per batch too: padded register inputs share one token length across register
    # counts, and probe-direction fits its probes per (task, knob) cell of a batch
    for (task, _, _), cell in pairs.groupby(["task", "n_tokens", "knob"], sort=True):
        for s in range(0, len(cell), per):
            yield _batch(df, cell.iloc[s : s + per], label_ids[str(task)])


def _batch(df: pd.DataFrame, pairs: pd.DataFrame, ids: tuple[int, int]) -> PairBatch:
    pos = np.concatenate([pairs["row_a"].to_numpy(), pairs["row_b"].to_numpy()])
    P = len(pairs)
    sub = df.iloc[pos]
    tokens = torch.tensor(np.stack([np.asarray(t, dtype=np.int64) for t in sub["token_ids"]]))
    partner = torch.cat([torch.arange(P, 2 * P), torch.arange(P)])
    labels = torch.tensor(sub["label"].to_numpy().astype(np.int64))
    id_t = torch.tensor(ids)
    meta = pd.DataFrame({c: sub[c].to_numpy() for c in META_COLUMNS})
    return PairBatch(tokens, partner, id_t[labels], id_t[1 - labels], meta)
