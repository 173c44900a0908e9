"""The word-level tokenizer of the task language, saved as a Hugging Face `tokenizer.json`.

Words are split on spaces; a newline, a colon and a run of digits are tokens of their own, so every
query (`Status:`, `# final state:`, `query = r3` / `Value:`) ends in the same ':' token and `r3` is
`r`, `3` — the split a BPE tokenizer makes, so the paper's k-token suffixes cover the same spans. The vocabulary is a fixed list
(ids never move when a spec file is edited); words a variant spec introduces are appended in sorted
order. It has no special tokens to add; another tokenizer's template (a BOS) is applied when encoding.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.tokenizer import check_ids_fit, check_vocabulary, load_tokenizer_file
from fbt_probe.io import atomic_path
from fbt_probe.tasks.spec import load_spec

PAD, UNK = "<pad>", "<unk>"
# Order is the id: <pad> = 0. Covers the built-in specs (the paper's appendix F) and their answer
# words; numbers up to 99 are single words (a digit run is a token of its own, so `r3` is `r`, `3`).
BASE_VOCAB = (
    PAD,
    UNK,
    "\n",
    ":",
    "=",
    "+=",
    "-=",
    "^=",
    "#",
    *(str(d) for d in range(100)),
    "required",
    "completed",
    "scratch",
    "Status",
    "state",
    "final",
    "query",
    "Value",
    "r",
    "done",
    "more",
    "zero",
    "one",
)
_DIGITS = re.compile(r"[0-9]+")


def words_of(text: str) -> list[str]:
    """The word-level tokens of `text` (the same split the tokenizer's pre-tokenizer makes): words
    split on spaces, with every newline, colon and run of digits a token of its own."""
    out: list[str] = []
    for i, line in enumerate(text.split("\n")):
        if i:
            out.append("\n")
        for word in line.split():
            pieces = word.split(":")
            for j, piece in enumerate(pieces):
                if j:
                    out.append(":")
                out += [w for w in re.split(r"([0-9]+)", piece) if w]
    return out


def build_tokenizer(specs=None):
    """The task-language tokenizer: `BASE_VOCAB`, plus (sorted) any word the given specs can
    produce that it lacks. With the built-in specs the result is always the same file."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(BASE_VOCAB)}
    extra = set()
    for spec in specs or ():
        extra |= spec_words(load_spec(spec))
    for word in sorted(extra - set(vocab)):
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t\r]+"), "removed"),
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Split(":", "isolated"),
            pre_tokenizers.Split(Regex(_DIGITS.pattern), "isolated"),
        ]
    )
    tok.add_special_tokens([PAD, UNK])
    return tok


def spec_words(spec) -> set[str]:
    """Every word a spec's samples and answers can contain."""
    tpl = spec.template
    lines: list[str] = []
    if spec.kind == "completion":
        lo, hi = spec.value_range
        slo, shi = spec.scratch_range
        lines += [h.format(R=v, C=v, S=s) for h in tpl["header"] for v in (lo, hi) for s in (slo, shi)]
        lines += [str(v) for v in range(min(lo, slo), max(hi, shi) + 1)]
        lines += [tpl["distractor"], tpl["query"]]
    elif spec.kind == "memory":
        lines += [h.format(B=b) for h in tpl["header"] for b in (0, 1)]
        lines += [tpl["context"].format(X=b) for b in (0, 1)] + [tpl["distractor"], tpl["query"]]
    elif spec.kind == "compose":
        lines += [tpl["start"].format(A=a) for a in range(len(spec.permutations[0]))]
        lines += [tpl["step"].format(g=g) for g in range(len(spec.permutations))] + [tpl["query"]]
    else:
        top = max(spec.length_grid) if spec.assignments is not None else spec.registers
        for i in range(top):
            lines += [tpl["write"].format(i=i, v=v) for v in (0, 1)] + [q.format(i=i) for q in tpl["query"]]
        lines += [tpl["scratch"][0].format(S=s) for s in range(spec.scratch_range[0], spec.scratch_range[1] + 1)]
        lines += [tpl["scratch"][1], "#"]
    return {w for line in lines for w in words_of(line)} | set(spec.label_words) | {"\n"}


def tokenizer_json(tok) -> str:
    return tok.to_str(pretty=True)


def tokenizer_sha256(tok) -> str:
    """sha256 of the `tokenizer.json` that `save_tokenizer` writes for `tok`."""
    return hashlib.sha256(tokenizer_json(tok).encode()).hexdigest()


def save_tokenizer(tok, path) -> Path:
    """Write `tok` as a Hugging Face `tokenizer.json` (atomically)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(tokenizer_json(tok))
    return path


def load_tokenizer(path):
    """Any Hugging Face `tokenizer.json` (a file, or a folder holding one), or nanochat's
    `tokenizer.pkl` (a file, or a folder holding it and no tokenizer.json), converted as
    `fbt-probe model import-nanochat` converts it: the same tokenizer, the same sha256."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir() and not (path / "tokenizer.json").is_file() and (path / "tokenizer.pkl").is_file():
        path = path / "tokenizer.pkl"
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.suffix == ".pkl" and path.is_file():
        return load_tokenizer_file(path)
    if not path.is_file():
        raise FbtError(f"{path}: tokenizer file not found (expected a Hugging Face tokenizer.json)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for every parse failure
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FbtError(f"{path}: not a valid Hugging Face tokenizer.json ({first})") from None
    check_vocabulary(tok, str(path))
    return tok


def check_tokenizer_fits(tok, rows: int, source: str) -> int:
    """Every id `tok` can produce has one of the model's `rows` embedding rows (its largest id, its
    template's BOS / EOS); returns its id count. See `fbt_probe.formats.nanochat.tokenizer.check_ids_fit`."""
    return check_ids_fit(tok, rows, source)


def encode(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of each text under the tokenizer's own template: a tokenizer whose model was trained
    on documents that start with a BOS (nanochat's, converted) prepends it; the built-in one and a
    Qwen3 tokenizer add nothing. A tokenizer that cannot encode the text (a word-level model without
    its unknown token, say) is a one-line FbtError."""
    try:
        return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=True)]
    except Exception as exc:  # noqa: BLE001 - the Rust side raises a bare Exception
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FbtError(f"tokenizer: cannot encode the text ({first}); use a tokenizer of this text's words") from None


def token_name(tok, token_id: int) -> str:
    name = tok.id_to_token(token_id)
    return repr(name) if name is not None else f"<id {token_id}>"


def check_encoded(tok, task: str, ids: list[list[int]], describe) -> int:
    """Refuse unknown words and differing final tokens; return the shared final token id.

    `describe(i)` names sample i for the message (e.g. 'pair 3, DONE, distractors=8')."""
    unk = tok.token_to_id(UNK)
    for i, row in enumerate(ids):
        if not row:
            raise FbtError(f"{task}: sample {i} ({describe(i)}) encodes to no tokens")
        if unk is not None and unk in row:
            raise FbtError(
                f"{task}: sample {i} ({describe(i)}) has words outside the tokenizer's vocabulary "
                f"(encoded as {UNK}); build the tokenizer from this spec or use another one"
            )
    final = ids[0][-1]
    for i, row in enumerate(ids):
        if row[-1] != final:
            raise FbtError(
                f"{task}: sample {i} ({describe(i)}) ends with token {token_name(tok, row[-1])} (id {row[-1]}) but "
                f"sample 0 ends with {token_name(tok, final)} (id {final}); every sample of a task must end "
                "with the same token under the tokenizer in use"
            )
    return final


def unk_id(tok) -> int | None:
    """The id of the tokenizer's unknown token, if it has one."""
    name = getattr(tok.model, "unk_token", None) or UNK
    return tok.token_to_id(name)


def check_label_words(tok, task: str, query_line: str, words, tokenizer_name: str) -> None:
    """Each label word must be exactly one known token after the query line (where the answer is
    read); else a one-line FbtError naming every word that is not, with the pieces it splits into."""
    unk = unk_id(tok)
    split, pieces = [], []
    for word in words:
        full, pos = answer_ids(tok, query_line, word)
        if pos is None:
            got = tok.encode(f" {word}", add_special_tokens=False).tokens
            n = len(got)
            split.append(f"label word {word!r} is {n if n > 1 else 'not one'} token{'s' if n > 1 else ''}")
            pieces.append(f"{word!r}: {' '.join(map(repr, got))}")
        elif unk is not None and full[pos] == unk:
            raise FbtError(
                f"{task}: label word {word!r} is not in the vocabulary of {tokenizer_name} "
                f"(it encodes as {tok.id_to_token(unk)!r}); use a tokenizer that has it"
            )
    if split:
        raise FbtError(
            f"{task}: {', '.join(split)} after the query under {tokenizer_name}; label words must be single "
            f"tokens (field 'label_words': choose words this tokenizer keeps whole after a space; pieces: "
            f"{'; '.join(pieces)})"
        )


def answer_ids(tok, text: str, word: str) -> tuple[list[int], int | None]:
    """(ids of `text + ' ' + word + '\\n'`, index of the answer token) — the index is None unless
    the text's own ids are a prefix and the word is exactly one token there."""
    prefix, full, bare = encode(tok, [text, f"{text} {word}\n", f"{text} {word}"])
    ok = full[: len(prefix)] == prefix and len(bare) == len(prefix) + 1 and full[: len(bare)] == bare
    return full, (len(prefix) if ok else None)
