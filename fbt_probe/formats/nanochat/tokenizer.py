"""nanochat's tokenizer: its `tokenizer.pkl` (a pickled `tiktoken.Encoding`) read without running
pickled code, and converted to a Hugging Face `tokenizer.json` that encodes exactly as tiktoken does.

The pickle of an Encoding is one global (`tiktoken.core.Encoding`), created empty and then given a
state dict {name, pat_str, mergeable_ranks: {bytes: rank}, special_tokens: {str: id}}. `read_pickle`
unpickles with a reader whose only global is a stand-in for that class (it records the state, it
runs nothing); every other global, a persistent id or a state of any other shape is refused. A
registered encoding pickled by name (a state that is a string) carries no data and is refused too.

The conversion is a byte-level BPE: each token's bytes in the GPT-2 byte-to-character alphabet, its
rank as its id; a merge (left, right) for every split of a token into two tokens, ranked by the
token they make (tiktoken merges the adjacent pair whose concatenation has the lowest rank); a whole
pre-token that is itself a token is emitted as it is (`ignore_merges`, tiktoken's shortcut); the
split pattern is the Encoding's own; special tokens keep their ids. nanochat starts every training
document with `<|bos|>`: when the Encoding has that token the tokenizer's template prepends it, so
encoding with the template gives the model's training-time input.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path

BOS = "<|bos|>"  # nanochat's document delimiter, prepended to every training document
# Bounds checked before a pickle is read and before its merges are enumerated (each token's splits):
# tiktoken's own encodings hold ~2 MB pickles with tokens of at most 128 bytes.
MAX_PICKLE_BYTES = 64 * 2**20
MAX_TOKEN_BYTES = 1024
MAX_MERGE_WORK = 2 * 10**8  # the bytes the merge enumeration slices: sum of len(token)^2 over the ranks
_GLOBAL = ("tiktoken.core", "Encoding")
_STATE_KEYS = {"name", "pat_str", "mergeable_ranks", "special_tokens"}


@dataclass(frozen=True)
class EncodingData:
    """What a pickled tiktoken Encoding holds."""

    name: str
    pat_str: str
    ranks: dict[bytes, int]
    special: dict[str, int]

    @property
    def n_ids(self) -> int:
        """One more than the largest id (ranks and special tokens)."""
        return max([*self.ranks.values(), *self.special.values()]) + 1


class _Refused(Exception):
    pass


class _EncodingState:
    """Stands in for `tiktoken.core.Encoding` while unpickling: keeps the state, runs nothing."""

    def __new__(cls, *args, **kwargs):
        if args or kwargs:
            raise _Refused("the Encoding is built with arguments, not from a state")
        return object.__new__(cls)

    def __setstate__(self, state) -> None:
        self.state = state


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == _GLOBAL:
            return _EncodingState
        raise _Refused(f"it names {module}.{name}; only {'.'.join(_GLOBAL)} is read")

    def persistent_load(self, pid):
        raise _Refused("it holds a persistent id")


def read_pickle(path: str | Path) -> EncodingData:
    """The data of a pickled tiktoken Encoding (nanochat's `tokenizer.pkl`), read without running
    pickled code; a one-line FbtError for a file that holds anything else."""
    path = Path(path)
    if not path.is_file():
        raise FbtError(f"{path}: tokenizer pickle not found")

    def refuse(why: str):
        raise FbtError(f"{path}: not a pickled tiktoken Encoding ({why}); refused unread")

    size = path.stat().st_size
    if size > MAX_PICKLE_BYTES:
        raise FbtError(
            f"{path}: {size / 2**20:,.1f} MiB, more than a tokenizer pickle holds (at most "
            f"{MAX_PICKLE_BYTES // 2**20} MiB); refused unread"
        )

    try:
        obj = _Reader(io.BytesIO(path.read_bytes())).load()
    except _Refused as exc:
        refuse(str(exc))
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is one line naming the file
        refuse(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}")
    if not isinstance(obj, _EncodingState) or not hasattr(obj, "state"):
        refuse(f"its top object is a {type(obj).__name__}")
    state = obj.state
    if isinstance(state, str):
        refuse(f"it names the registered encoding {state!r} instead of holding its ranks")
    if not isinstance(state, dict) or set(state) != _STATE_KEYS:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        refuse(f"its state has {got}; expected the fields {sorted(_STATE_KEYS)}")
    name, pat, ranks, special = (state[k] for k in ("name", "pat_str", "mergeable_ranks", "special_tokens"))
    if not isinstance(name, str) or not isinstance(pat, str):
        refuse("field 'name' or 'pat_str' is not a string")
    if not isinstance(ranks, dict) or not all(type(k) is bytes and k and type(v) is int for k, v in ranks.items()):
        refuse("field 'mergeable_ranks' is not a dict of non-empty bytes to int")
    if not isinstance(special, dict) or not all(type(k) is str and type(v) is int for k, v in special.items()):
        refuse("field 'special_tokens' is not a dict of str to int")
    return check_encoding(EncodingData(name, pat, dict(ranks), dict(special)), str(path))


def check_encoding(data: EncodingData, source: str) -> EncodingData:
    """Refuse (one line) what a byte-level BPE cannot mirror: ranks other than 0..n-1, a byte with
    no token of its own, special-token ids that collide with ranks."""
    n = len(data.ranks)
    if not n:
        raise FbtError(f"{source}: field 'mergeable_ranks' is empty (no token ids); expected a tokenizer with tokens")
    longest = max(data.ranks, key=len)
    if len(longest) > MAX_TOKEN_BYTES:
        raise FbtError(
            f"{source}: field 'mergeable_ranks': the token of rank {data.ranks[longest]:,} is {len(longest):,} bytes; "
            f"expected tokens of at most {MAX_TOKEN_BYTES:,} bytes (a BPE's merge table is built from every split "
            "of every token)"
        )
    work = sum(len(t) * len(t) for t in data.ranks)
    if work > MAX_MERGE_WORK:
        raise FbtError(
            f"{source}: field 'mergeable_ranks': {n:,} tokens of {sum(map(len, data.ranks)):,} bytes in all; their "
            f"merge table would take {work:,} byte steps to build, past the bound of {MAX_MERGE_WORK:,}"
        )
    if sorted(data.ranks.values()) != list(range(n)):
        raise FbtError(f"{source}: field 'mergeable_ranks': ranks are not 0..{n - 1}, one each")
    missing = [b for b in range(256) if bytes([b]) not in data.ranks]
    if missing:
        raise FbtError(f"{source}: field 'mergeable_ranks': byte {missing[0]:#04x} has no token of its own")
    ids = sorted(data.special.values())
    if ids != list(range(n, n + len(ids))):
        raise FbtError(
            f"{source}: field 'special_tokens': ids {ids} are not {n}..{n + len(ids) - 1}, right after the ranks"
        )
    return data


def byte_alphabet() -> dict[int, str]:
    """Byte -> the character that stands for it in a byte-level BPE vocabulary (GPT-2's mapping:
    printable Latin-1 bytes are themselves, the others 256, 257, ... in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def merges_of(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """(left, right) for every split of a token into two tokens, ordered by the rank of the token
    they make (then by the ranks of the two parts)."""
    found = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def to_tokenizer(data: EncodingData, source: str = "tokenizer"):
    """The Hugging Face `tokenizers.Tokenizer` that encodes as `data`'s tiktoken Encoding does."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    data = check_encoding(data, source)
    alpha = byte_alphabet()

    def text(b: bytes) -> str:
        return "".join(alpha[x] for x in b)

    vocab = {text(tok): rank for tok, rank in data.ranks.items()}
    merges = [(text(a), text(b)) for a, b in merges_of(data.ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    try:
        split = pre_tokenizers.Split(Regex(data.pat_str), behavior="isolated", invert=False)
    except Exception as exc:  # noqa: BLE001 - the regex engine rejects a pattern with a bare Exception
        raise FbtError(f"{source}: field 'pat_str' is not a pattern Hugging Face tokenizers can run ({exc})") from None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    by_id = sorted(data.special.items(), key=lambda kv: kv[1])
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name, _ in by_id])
    for name, want in by_id:
        if tok.token_to_id(name) != want:
            raise FbtError(f"{source}: special token {name!r} would get id {tok.token_to_id(name)}, not its {want}")
    if BOS in data.special:
        bos = data.special[BOS]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
        )
    return tok


def convert(pkl: str | Path, out: str | Path) -> Path:
    """Read `pkl` (safely) and write its Hugging Face `tokenizer.json` to `out` (atomically)."""
    tok = to_tokenizer(read_pickle(pkl), str(pkl))
    out = Path(out)
    with atomic_path(out) as tmp:
        tmp.write_text(tok.to_str(pretty=True))
    return out


# ----------------------------------------------------------------------------- beside a checkpoint
FILES = ("tokenizer.pkl", "tokenizer.json")  # nanochat's own first: the one its training loaded


def find_tokenizer(ckpt_dir: str | Path, given: str | Path | None = None) -> Path | None:
    """The tokenizer file of a nanochat checkpoint folder: `given` (a tokenizer.pkl or tokenizer.json,
    or a folder holding one), else nanochat's cache layout, where `<base>/base_checkpoints/<tag>/`
    (or mid_/chatsft_checkpoints) sits beside `<base>/tokenizer/`, else the checkpoint folder itself.
    None when there is none; a `given` path without one is a one-line FbtError."""
    if given is not None:
        given = Path(given)
        if given.is_file() and given.name.endswith((".pkl", ".json")):
            return given
        for name in FILES:
            if (given / name).is_file():
                return given / name
        raise FbtError(f"--tokenizer {given}: expected tokenizer.pkl or tokenizer.json, or a folder holding one")
    ckpt_dir = Path(ckpt_dir).resolve()
    for folder in (ckpt_dir.parent.parent / "tokenizer", ckpt_dir):
        for name in FILES:
            if (folder / name).is_file():
                return folder / name
    return None


def load_tokenizer_file(path: str | Path):
    """A `tokenizers.Tokenizer` from nanochat's tokenizer.pkl (converted) or a tokenizer.json (as it is)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.suffix == ".pkl":
        return to_tokenizer(read_pickle(path), str(path))
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises a bare Exception for every parse failure
        raise FbtError(
            f"{path}: not a valid Hugging Face tokenizer.json ({(str(exc).splitlines() or [''])[0]})"
        ) from None
    check_vocabulary(tok, str(path))
    return tok


def check_fits(tok, vocab_size: int, rows: int, source: str) -> int:
    """The tokenizer's id count, which must be the checkpoint's vocab_size: nanochat sets vocab_size to
    its tokenizer's size and pads the embedding to `rows` (a multiple of 64), so the ids from
    vocab_size to rows - 1 are padding that never occurs in training. Every id must be below
    vocab_size too (`check_ids_fit`: a count says nothing of where the ids lie)."""
    n = tok.get_vocab_size(with_added_tokens=True)
    check_count(n, vocab_size, rows, source)
    check_ids_fit(tok, vocab_size, source, what="the checkpoint's vocab_size")
    return n


def check_count(n: int, vocab_size: int, rows: int, source: str) -> None:
    """A tokenizer of `n` ids against a checkpoint's vocab_size (and its padded embedding's `rows`)."""
    if n > vocab_size:
        where = f"beyond the embedding's {rows} rows" if n > rows else f"into the {rows - vocab_size} padding rows"
        raise FbtError(
            f"{source}: the tokenizer has {n:,} ids but the checkpoint's vocab_size is {vocab_size:,} "
            f"(ids {vocab_size:,}..{n - 1:,} would fall {where}); not the tokenizer this checkpoint was trained with"
        )
    if n < vocab_size:
        raise FbtError(
            f"{source}: the tokenizer has {n:,} ids, fewer than the checkpoint's vocab_size {vocab_size:,} "
            "(nanochat sets vocab_size to its tokenizer's size); not the tokenizer this checkpoint was trained with"
        )


def check_vocabulary(tok, source: str) -> None:
    """A tokenizer with no token at all is refused (nothing can be encoded with it)."""
    if tok.get_vocab_size(with_added_tokens=True) == 0:
        raise FbtError(
            f"{source}: the tokenizer has an empty vocabulary (no token ids); expected a tokenizer with tokens"
        )


def check_ids_fit(tok, rows: int, source: str, what: str = "the checkpoint's embedding") -> int:
    """Every id the tokenizer can produce has a row of the embedding: its largest id (vocabulary and
    added tokens) and the ids its template adds (a BOS, an EOS) are below `rows`; an empty
    vocabulary is refused. Checked by the ids, not their count: a vocabulary of 2,048 tokens can
    hold the id 5,000. Returns the number of ids."""
    check_vocabulary(tok, source)
    vocab = tok.get_vocab(with_added_tokens=True)
    name, top = max(vocab.items(), key=lambda kv: kv[1])
    limit = f"{what} has {rows:,} rows (ids 0..{rows - 1:,})" if "embedding" in what else f"{what} is {rows:,}"
    if top >= rows:
        raise FbtError(
            f"{source}: the tokenizer's largest id is {top:,} ({name!r}), but {limit}; not the tokenizer of this "
            "checkpoint"
        )
    try:
        added = tok.encode("", add_special_tokens=True).ids  # what its template puts around every text
    except Exception as exc:  # noqa: BLE001 - the Rust side raises a bare Exception
        raise FbtError(f"{source}: the tokenizer cannot encode text ({(str(exc).splitlines() or [''])[0]})") from None
    over = [i for i in added if i >= rows]
    if over:
        raise FbtError(
            f"{source}: the tokenizer's template adds the id {over[0]:,} (a BOS or EOS) to every text, but {limit}; "
            "not the tokenizer of this checkpoint"
        )
    return len(vocab)


def bos_id(tok) -> int | None:
    """The id the tokenizer's template prepends to every text (its BOS), or None."""
    ids = tok.encode("", add_special_tokens=True).ids
    return ids[0] if len(ids) == 1 else None
