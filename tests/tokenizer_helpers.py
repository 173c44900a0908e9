"""A nanochat tokenizer made the way nanochat makes one: rustbpe trained on text with nanochat's split
pattern and vocabulary size minus its special tokens, wrapped in a `tiktoken.Encoding` named "rustbpe"
with the special tokens right after the ranks, pickled as `tokenizer.pkl`."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

# nanochat's split pattern (GPT-4's, with digit runs of at most two) and special tokens
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = [
    "<|bos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
]
ROOT = Path(__file__).resolve().parent.parent


def training_text(seed: int = 0) -> list[str]:
    """Documents to train on: this repository's docs and sources (prose, code, numbers) and task-like
    lines, so that the task language's words become tokens as they would in a web-text tokenizer."""
    docs = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    docs += [p.read_text() for p in sorted((ROOT / "fbt_probe" / "tasks").glob("*.py"))]
    rng = random.Random(seed)
    words = ["done", "more", "zero", "one", "state", "final", "query", "Value", "Status", "completed", "required"]
    docs += [
        "\n".join(f"r{rng.randint(0, 9)} = {rng.randint(0, 99)}\nStatus: {rng.choice(words)}" for _ in range(20))
        for _ in range(200)
    ]
    return docs


def nanochat_encoding(vocab_size: int = 2048, seed: int = 0):
    """The tiktoken Encoding nanochat's RustBPETokenizer.train_from_iterator would build."""
    import rustbpe
    import tiktoken

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(training_text(seed)), vocab_size - len(SPECIAL_TOKENS), pattern=SPLIT_PATTERN)
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="rustbpe", pat_str=tok.get_pattern(), mergeable_ranks=ranks, special_tokens=special)


def write_tokenizer_dir(folder: Path, vocab_size: int = 2048) -> tuple[Path, object]:
    """nanochat's tokenizer folder (tokenizer.pkl as its RustBPETokenizer.save writes it); (folder, encoding)."""
    enc = nanochat_encoding(vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.pkl").write_bytes(pickle.dumps(enc))
    return folder, enc


def task_corpus(keep_numbers: bool = True) -> list[str]:
    """Every built-in task's text with its answer word, a few groups each (what a BPE needs to keep
    the task words and ` done`-style answers whole); `keep_numbers=False` drops every digit."""
    import re

    from fbt_probe.tasks import generate, load_spec
    from fbt_probe.tasks.spec import builtin_spec_paths

    out = []
    for name in builtin_spec_paths():
        spec = load_spec(name)
        df = generate(spec.replace(length_grid=[min(spec.length_grid)]), groups=4, seed=0)
        out += [f"{text} {word}\n" for text, word in zip(df.text, df.label_word)]
    return out if keep_numbers else [re.sub(r"[0-9]", "", t) for t in out]


def digit_bpe(split_every_digit: bool = True):
    """A byte-level BPE trained on the task text with the `tokenizers` library (no download).
    `split_every_digit`: every digit its own token, as Qwen3's pre-tokenizer makes them; else digit
    runs kept together but only 10 and 11 merged (they alone are in its training text), so 12 and 13
    split into two tokens while the other numbers up to 11 are one: a small vocabulary's pattern."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=split_every_digit), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    text = task_corpus(keep_numbers=split_every_digit)
    if not split_every_digit:
        text += [" ".join(["10", "11"] * 50)] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=1000, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(text, trainer)
    return tok
