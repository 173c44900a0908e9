"""A small pinned corpus made in a test's folder: an sdist and a wheel of Python and prose text,
their pins.json and files.tsv, and a tokenizer trained on them (the real archives are fetched from
a package index, which tests do not reach)."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

from fbt_probe.corpus.pins import read_files, read_pins, scan, write_files
from fbt_probe.io import sha256_file

PROSE = (
    "The state of a register is the value written last. A reader who wants the final state walks the "
    "writes in order and keeps the last one; nothing else is needed.\n"
)


def python_file(i: int) -> str:
    return (
        f'"""Module {i}: counts and states."""\n\n'
        f"def step_{i}(state, scratch):\n"
        f"    # the state after one more write\n"
        f"    state = {i % 7}\n"
        f"    scratch ^= {i % 3}\n"
        f"    required = {i % 13}\n"
        f"    completed = {(i * 5) % 13}\n"
        f"    return state, scratch, required == completed\n"
    )


def write_sdist(path: Path, root: str, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data = files[name].encode()
            info = tarfile.TarInfo(root + name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


def write_wheel(path: Path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name in sorted(files):
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), files[name])


def make_corpus_sources(folder: Path, n: int = 60) -> tuple[Path, Path]:
    """(pins.json, files.tsv) for two archives in `folder`: an sdist of prose documents and Python
    tests, a wheel of Python modules (with one empty and one duplicated file, which the scan drops)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = {f"docs/topic{i}.txt": (PROSE * (1 + i % 4)) + f"Section {i} ends here.\n" for i in range(n)}
    docs.update({f"tests/test_{i}.py": python_file(1000 + i) for i in range(n // 2)})
    docs["setup.cfg"] = "[metadata]\nname = example\n"  # not chosen by the include patterns
    write_sdist(folder / "Example-1.0.tar.gz", "Example-1.0/", docs)
    mods = {f"pkg/mod{i}.py": python_file(i) for i in range(n)}
    mods["pkg/__init__.py"] = ""  # empty: dropped
    mods["pkg/copy_of_mod0.py"] = python_file(0)  # a duplicate: dropped
    write_wheel(folder / "pkg-2.0-py3-none-any.whl", mods)
    pins = {
        "name": "test-corpus",
        "archives": [
            {
                "package": "Example",
                "version": "1.0",
                "file": "Example-1.0.tar.gz",
                "sha256": sha256_file(folder / "Example-1.0.tar.gz"),
                "format": "sdist",
                "root": "Example-1.0/",
                "include": ["docs/*.txt", "tests/*.py"],
            },
            {
                "package": "pkg",
                "version": "2.0",
                "file": "pkg-2.0-py3-none-any.whl",
                "sha256": sha256_file(folder / "pkg-2.0-py3-none-any.whl"),
                "format": "wheel",
                "root": "",
                "include": ["pkg/*.py"],
            },
        ],
        "max_file_bytes": 4096,
        "heldout_fraction": 0.2,
        "heldout_salt": "test",
    }
    pins_path = folder / "pins.json"
    pins_path.write_text(json.dumps(pins, indent=2))
    files_path = folder / "files.tsv"
    write_files(scan(read_pins(pins_path), folder), files_path)
    return pins_path, files_path


def build_test_corpus(src: Path, out: Path, vocab_size: int = 400):
    """Build the test corpus of `src` into `out` with a tokenizer trained on it; returns the record."""
    from fbt_probe.corpus import build

    pins_path, files_path = make_corpus_sources(src)
    pins = read_pins(pins_path)
    return build(out, src, pins=pins, files=read_files(pins, files_path), tokenizer=fit_tokenizer(src, vocab_size))


def fit_tokenizer(src: Path, vocab_size: int = 400):
    from fbt_probe.corpus.bpe import train_tokenizer
    from fbt_probe.corpus.store import read_texts

    pins = read_pins(src / "pins.json")
    texts = read_texts(pins, read_files(pins, src / "files.tsv"), src)
    return train_tokenizer([t for r, t in texts if r.split == "train"], vocab_size=vocab_size)
