"""The general-LM corpus: pinned PyPI archives (Python source with its docstrings and comments,
and Django's English documentation), checked file by file, a byte-level BPE trained on it, and
the tokens stored once for training (docs/corpus.md; why this corpus:
docs/research/general-lm-corpus.md)."""

from fbt_probe.corpus.pins import read_files, read_pins
from fbt_probe.corpus.store import Corpus, build, open_corpus

__all__ = ["Corpus", "build", "open_corpus", "read_files", "read_pins"]
