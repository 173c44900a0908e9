"""A built corpus folder: the pinned files, checked byte for byte, tokenized once and stored as
token arrays that training reads by window (`fbt-probe corpus build`).

    corpus.json      pins, counts, tokenizer and array sha256s, versions (the folder's record)
    tokenizer.json   the corpus tokenizer (`fbt_probe.corpus.bpe`)
    train.bin        uint16 tokens of the training files, each opened by <|bos|>, in list order
    heldout.bin      the same for the held-out files
    documents.tsv    archive, path, split, start, n_tokens: where each file's tokens lie

Every random draw of a window derives from (seed, step, split), so a resumed run reads the same
windows; the held-out windows of the diagnostics are drawn one per document.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from fbt_probe.corpus.bpe import check_whole, train_tokenizer
from fbt_probe.corpus.pins import (
    FileRow,
    Pins,
    archive_members,
    read_files,
    read_pins,
    scan,
    sha256_bytes,
    write_files,
)
from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, sha256_file
from fbt_probe.marker import output_dir
from fbt_probe.provenance import provenance

COMMAND = "corpus build"
KIND = "a corpus folder written by fbt-probe corpus build"
FORMAT = "fbt-probe-corpus/1"
DTYPE = np.dtype("<u2")  # little-endian uint16: every id of a vocabulary below 65,536
SPLITS = ("train", "heldout")


def archive_path(src: Path, file: str) -> Path:
    return Path(src) / file


def verify_archive(archive, src: Path) -> Path:
    """The archive's path in `src`, its sha256 checked; one line naming the file otherwise."""
    path = archive_path(src, archive.file)
    if not path.is_file():
        raise FbtError(
            f"{path}: archive missing (expected {archive.requirement}, sha256 {archive.sha256[:12]}...; "
            f"fbt-probe corpus fetch --dir {src} gets it)"
        )
    got = sha256_file(path)
    if got != archive.sha256:
        raise FbtError(
            f"{path}: sha256 {got[:12]}... is not the pinned {archive.sha256[:12]}... of {archive.requirement}; "
            "refusing to build from it (delete it and run fbt-probe corpus fetch again)"
        )
    return path


def read_texts(pins: Pins, files: list[FileRow], src: Path) -> list[tuple[FileRow, str]]:
    """Every listed file's text from the verified archives, in list order; each file's size and
    sha256 checked, and the archives' chosen files must be exactly the listed ones."""
    listed = {(r.archive, r.path): r for r in files}
    found: dict[tuple[str, str], bytes] = {}
    for a in pins.archives:
        path = verify_archive(a, src)
        for rel, data in archive_members(a, path):
            key = (a.file, rel)
            if key not in listed:
                continue
            row = listed[key]
            if len(data) != row.bytes or sha256_bytes(data) != row.sha256:
                raise FbtError(
                    f"{path}: member {rel}: sha256 {sha256_bytes(data)[:12]}... ({len(data)} bytes) is not the "
                    f"listed {row.sha256[:12]}... ({row.bytes} bytes)"
                )
            found[key] = data
    missing = [k for k in listed if k not in found]
    if missing:
        archive, rel = missing[0]
        raise FbtError(
            f"{archive_path(src, archive)}: listed member {rel} is not in the archive ({len(missing)} missing)"
        )
    return [(r, found[(r.archive, r.path)].decode("utf-8")) for r in files]


def build(
    out: str | Path,
    src: str | Path,
    pins: Pins | None = None,
    files: list[FileRow] | None = None,
    tokenizer=None,
    force: bool = False,
    progress=None,
) -> dict:
    """Build the corpus folder `out` from the archives in `src`: every input is checked before
    anything is written, the folder is written beside `out` and swapped in when complete.
    `tokenizer`: a tokenizer to use instead of training one on the training files."""
    pins = pins or read_pins()
    files = files if files is not None else read_files(pins)
    texts = read_texts(pins, files, Path(src))
    say = progress or (lambda msg: None)
    if tokenizer is None:
        say(f"training the tokenizer on {sum(r.split == 'train' for r in files):,} files")
        tokenizer = train_tokenizer([t for r, t in texts if r.split == "train"])
    check_whole(tokenizer)
    if tokenizer.get_vocab_size() > np.iinfo(DTYPE).max + 1:
        raise FbtError(f"tokenizer: {tokenizer.get_vocab_size():,} ids do not fit the corpus's uint16 arrays")
    with output_dir(Path(out), COMMAND, force=force, kind=KIND) as tmp:
        tokenizer.save(str(tmp / "tokenizer.json"))
        docs, counts = [], {}
        for split in SPLITS:
            chosen = [(r, t) for r, t in texts if r.split == split]
            say(f"tokenizing {len(chosen):,} {split} files")
            start = 0
            with open(tmp / f"{split}.bin", "wb") as f:
                for i in range(0, len(chosen), 256):
                    batch = chosen[i : i + 256]
                    for (row, _), enc in zip(batch, tokenizer.encode_batch([t for _, t in batch])):
                        ids = np.asarray(enc.ids, dtype=DTYPE)
                        f.write(ids.tobytes())
                        docs.append((row.archive, row.path, split, start, len(ids)))
                        start += len(ids)
            counts[split] = {"files": len(chosen), "tokens": start}
        with open(tmp / "documents.tsv", "w", newline="") as f:
            w = csv.writer(f, delimiter="\t", lineterminator="\n")
            w.writerow(("archive", "path", "split", "start", "n_tokens"))
            w.writerows(docs)
        record = {
            "format": FORMAT,
            "pins": pins.record(),
            "files_listed": len(files),
            "files_sha256": hashlib.sha256(
                "".join(f"{r.archive}\t{r.path}\t{r.sha256}\t{r.split}\n" for r in files).encode()
            ).hexdigest(),
            "counts": counts,
            "vocab_size": tokenizer.get_vocab_size(),
            "sha256": {
                name: sha256_file(tmp / name)
                for name in ("tokenizer.json", "train.bin", "heldout.bin", "documents.tsv")
            },
            "provenance": provenance(),
        }
        (tmp / "corpus.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


@dataclass
class Corpus:
    """An opened corpus folder: its record, tokenizer and token arrays (memory-mapped)."""

    folder: Path
    record: dict
    arrays: dict
    documents: list[tuple[str, str, str, int, int]]

    @property
    def sha256(self) -> str:
        """The corpus's identity: the sha256 of its record's array and tokenizer hashes."""
        return hashlib.sha256(json.dumps(self.record["sha256"], sort_keys=True).encode()).hexdigest()

    def tokenizer(self):
        return Tokenizer.from_file(str(self.folder / "tokenizer.json"))  # its sha256 checked by open_corpus

    def windows(self, split: str, rows: int, length: int, seed: int) -> tuple:
        """`rows` windows of `length` + 1 tokens at uniform random offsets of the split's array
        (the draw a function of `seed`): (tokens, targets) [rows, length] int64."""
        arr = self.arrays[split]
        if len(arr) < length + 1:
            raise FbtError(
                f"{self.folder}: the {split} split has {len(arr):,} tokens, fewer than a window of {length + 1}"
            )
        starts = np.random.default_rng(seed).integers(0, len(arr) - length, size=rows)
        block = np.stack([arr[s : s + length + 1] for s in starts]).astype(np.int64)
        t = torch.from_numpy(block)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def document_windows(self, split: str, length: int, min_tokens: int | None = None) -> tuple:
        """One window per document of the split long enough for it (its first `length` + 1 tokens, the
        <|bos|> included): (tokens, targets, document index list). The unit of a held-out interval."""
        need = length + 1 if min_tokens is None else min_tokens
        arr = self.arrays[split]
        picked = [i for i, d in enumerate(self.documents) if d[2] == split and d[4] >= need]
        if not picked:
            raise FbtError(f"{self.folder}: no {split} document has {need} tokens (a window of {length})")
        block = np.stack([arr[self.documents[i][3] : self.documents[i][3] + length + 1] for i in picked]).astype(
            np.int64
        )
        t = torch.from_numpy(block)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous(), picked


def open_corpus(folder: str | Path, verify: bool = True) -> Corpus:
    """A corpus folder built by `build`; with `verify`, every file's sha256 checked against its record."""
    folder = Path(folder)
    rec_path = folder / "corpus.json"
    if not rec_path.is_file():
        raise FbtError(f"{folder}: not a corpus folder (no corpus.json; build one with fbt-probe corpus build)")
    try:
        record = json.loads(rec_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FbtError(f"{rec_path}: not valid JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("sha256"), dict):
        raise FbtError(f"{rec_path}: field 'format': expected {FORMAT!r} with a 'sha256' record")
    for name in ("tokenizer.json", "train.bin", "heldout.bin", "documents.tsv"):
        path = folder / name
        if not path.is_file():
            raise FbtError(f"{path}: missing from the corpus folder (rebuild it with fbt-probe corpus build --force)")
        if verify and sha256_file(path) != record["sha256"].get(name):
            raise FbtError(
                f"{path}: sha256 differs from {rec_path}'s record (rebuild with fbt-probe corpus build --force)"
            )
    arrays = {s: np.memmap(folder / f"{s}.bin", dtype=DTYPE, mode="r") for s in SPLITS}
    with open(folder / "documents.tsv", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader)
        documents = [(a, p, s, int(st), int(n)) for a, p, s, st, n in reader]
    return Corpus(folder, record, arrays, documents)


def pin(src: str | Path, out: str | Path, pins_path: str | Path | None = None) -> int:
    """Write files.tsv for the pins from the verified archives in `src` (the maintainers' step that
    made the built-in list); returns the number of files listed."""
    pins = read_pins(pins_path)
    for a in pins.archives:
        verify_archive(a, Path(src))
    rows = scan(pins, Path(src))
    with atomic_path(Path(out)) as tmp:  # complete or absent
        write_files(rows, tmp)
    return len(rows)
