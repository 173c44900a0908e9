"""The corpus tokenizer: a byte-level BPE trained with the `tokenizers` library on the training
files, every document opened by `<|bos|>`, and the tokens the appendix-F tasks need made whole.

The tasks compare numbers and answer with a word after a colon, and a minimal pair must have two
samples of equal length ending in the same token. A BPE fitted to a few thousand ids splits some
of ` 0` .. ` 99` and some label words; `make_whole` appends, after the trained merges, the merges
that join each such string's pieces (lowest priority, so every string the trained merges already
produced is encoded as before, and the new merges join only those pieces). With every ` N` one
token, a pair that differs in a number differs in one token of the same position.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from fbt_probe.errors import FbtError

BOS = "<|bos|>"
VOCAB_SIZE = 4096
# ` 0` .. ` 99` (every number the built-in task specs draw, after `= `) and the label words after the query
WHOLE = tuple(f" {n}" for n in range(100)) + (" done", " more", " zero", " one")


def new_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    return tok


def train_tokenizer(texts, vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE of `vocab_size` ids (before `make_whole`'s additions) trained on `texts`
    (an iterable of documents, in a fixed order), `<|bos|>` id 0."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return make_whole(tok, WHOLE)


def make_whole(tok, strings):
    """`tok` with merges appended so that each of `strings` (encoded alone, without the template)
    is one token; the trained merges keep their order and priority."""
    d = json.loads(tok.to_str())
    model = d["model"]
    vocab, merges = model["vocab"], model["merges"]
    as_pairs = bool(merges) and isinstance(merges[0], list)
    for s in strings:
        current = Tokenizer.from_str(json.dumps(d))
        pieces = current.encode(s, add_special_tokens=False).tokens
        if not pieces:
            raise FbtError(f"tokenizer: {s!r} encodes to no tokens")
        joined = pieces[0]
        for p in pieces[1:]:
            merges.append([joined, p] if as_pairs else f"{joined} {p}")
            joined = joined + p
            if joined not in vocab:
                vocab[joined] = len(vocab)
    return Tokenizer.from_str(json.dumps(d))


def check_whole(tok, strings=WHOLE) -> None:
    """FbtError naming the first of `strings` that `tok` does not encode as one token."""
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        if len(ids) != 1:
            raise FbtError(f"tokenizer: {s!r} is {len(ids)} tokens, expected one (the tasks' minimal pairs need it)")
