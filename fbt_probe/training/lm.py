"""Next-token prediction on a corpus (`TrainConfig.corpus`): a step's windows and the held-out
windows validation reads.

A step is `tokens_per_step // seq_len` windows of `seq_len` tokens, each at a random offset of the
training split (a function of seed and step: a resumed run reads the same windows), every position
weighted alike. Validation reads the first `seq_len` tokens of held-out files, one window per file,
so its intervals are over files."""

from __future__ import annotations

from pathlib import Path

import torch

from fbt_probe.corpus import open_corpus
from fbt_probe.errors import FbtError
from fbt_probe.training.config import TrainConfig

_OPEN: dict = {}


def corpus_of(cfg: TrainConfig):
    """The run's corpus, opened (and every file's hash checked) once per process."""
    record = Path(cfg.corpus) / "corpus.json"
    stat = record.stat() if record.is_file() else None  # a folder rebuilt in place is opened anew
    key = (str(Path(cfg.corpus).resolve()), stat and (stat.st_ino, stat.st_mtime_ns))
    if key not in _OPEN:
        _OPEN[key] = open_corpus(cfg.corpus)
    corpus = _OPEN[key]
    if cfg.corpus_sha256 is not None and corpus.sha256 != cfg.corpus_sha256:
        raise FbtError(
            f"{cfg.corpus}: corpus sha256 {corpus.sha256[:12]}... is not the run's recorded "
            f"{cfg.corpus_sha256[:12]}... (the run trained on another corpus build)"
        )
    return corpus


def rows_per_step(cfg: TrainConfig) -> int:
    return max(1, cfg.tokens_per_step // cfg.seq_len)


def corpus_batch(cfg: TrainConfig, seed: int, split: str = "train", rows: int | None = None):
    """(tokens, targets, weights) of `rows` (default a step's) windows drawn with `seed`."""
    tokens, targets = corpus_of(cfg).windows(split, rows or rows_per_step(cfg), cfg.seq_len, seed)
    return tokens, targets, torch.ones(tokens.shape, dtype=torch.float32)


def heldout_windows(cfg: TrainConfig, length: int | None = None, limit: int | None = None):
    """(tokens, targets, weights) of one window per held-out file with at least `length` + 1 tokens
    (default `seq_len`), the first `limit` of them (default all)."""
    tokens, targets, _ = corpus_of(cfg).document_windows("heldout", length or cfg.seq_len)
    if limit is not None:
        tokens, targets = tokens[:limit], targets[:limit]
    return tokens, targets, torch.ones(tokens.shape, dtype=torch.float32)
