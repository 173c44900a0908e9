"""The corpus pins: which archives (package, version, file sha256), which of their files (each by
its own sha256) and which of those are held out.

`pins.json` names the archives and the rule that chose their files; `files.tsv` lists every file
used, with its sha256, its size and its split, so a build checks every byte it reads. Both are
package data, written once by `scan` from the archives themselves (`fbt-probe corpus pin`).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import tarfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

from fbt_probe.errors import FbtError

FILES_HEADER = ("archive", "path", "bytes", "sha256", "split")


@dataclass(frozen=True)
class Archive:
    package: str
    version: str
    file: str
    sha256: str
    format: str  # "sdist" (a .tar.gz) or "wheel" (a .whl zip)
    root: str  # the folder every member sits under ("" for a wheel)
    include: tuple[str, ...]  # fnmatch patterns on the path below `root` (`*` crosses folders)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Pins:
    name: str
    archives: tuple[Archive, ...]
    max_file_bytes: int
    heldout_fraction: float
    heldout_salt: str
    source: str  # where the pins were read from (for messages)

    def archive(self, file: str) -> Archive:
        for a in self.archives:
            if a.file == file:
                return a
        raise FbtError(f"{self.source}: no archive named {file!r}")

    def record(self) -> dict:
        """What a corpus folder and a model card record of the pins."""
        return {
            "name": self.name,
            "archives": [
                {"package": a.package, "version": a.version, "file": a.file, "sha256": a.sha256} for a in self.archives
            ],
        }


@dataclass(frozen=True)
class FileRow:
    archive: str
    path: str
    bytes: int
    sha256: str
    split: str  # "train" or "heldout"


def _pin_error(source: str, field: str, expected: str) -> FbtError:
    return FbtError(f"{source}: field '{field}': expected {expected}")


def read_pins(path: str | Path | None = None) -> Pins:
    """The pins of `path` (a pins.json), or the built-in ones."""
    if path is None:
        text, source = resources.files(__package__).joinpath("pins.json").read_text(), "built-in pins.json"
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise FbtError(f"{path}: cannot read the corpus pins ({exc.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FbtError(f"{source}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(d, dict):
        raise FbtError(f"{source}: expected an object with 'name' and 'archives'")
    archives = []
    for i, a in enumerate(d.get("archives") or []):
        where = f"archives[{i}]"
        if not isinstance(a, dict):
            raise _pin_error(source, where, "an object")
        for key in ("package", "version", "file", "sha256", "format", "root"):
            if not isinstance(a.get(key), str):
                raise _pin_error(source, f"{where}.{key}", "a string")
        if a["format"] not in ("sdist", "wheel"):
            raise _pin_error(source, f"{where}.format", "'sdist' or 'wheel'")
        if len(a["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in a["sha256"]):
            raise _pin_error(source, f"{where}.sha256", "64 lower-case hex digits")
        if "/" in a["file"] or a["file"].startswith("."):
            raise _pin_error(source, f"{where}.file", "a plain file name")
        inc = a.get("include")
        if not isinstance(inc, list) or not inc or not all(isinstance(p, str) and p for p in inc):
            raise _pin_error(source, f"{where}.include", "a non-empty list of patterns")
        archives.append(
            Archive(**{**{k: a[k] for k in Archive.__annotations__ if k != "include"}, "include": tuple(inc)})
        )
    if not archives:
        raise _pin_error(source, "archives", "a non-empty list")
    if not isinstance(d.get("name"), str) or not d["name"]:
        raise _pin_error(source, "name", "a non-empty string")
    mfb, frac = d.get("max_file_bytes"), d.get("heldout_fraction")
    if not isinstance(mfb, int) or isinstance(mfb, bool) or mfb < 1:
        raise _pin_error(source, "max_file_bytes", "an integer >= 1")
    if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac < 1:
        raise _pin_error(source, "heldout_fraction", "a number in (0, 1)")
    salt = d.get("heldout_salt")
    if not isinstance(salt, str):
        raise _pin_error(source, "heldout_salt", "a string")
    return Pins(d["name"], tuple(archives), mfb, float(frac), salt, source)


def read_files(pins: Pins, path: str | Path | None = None) -> list[FileRow]:
    """The files of the pins (`path`: a files.tsv; default the built-in one, beside the built-in pins)."""
    if path is None:
        text, source = resources.files(__package__).joinpath("files.tsv").read_text(), "built-in files.tsv"
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise FbtError(f"{path}: cannot read the corpus file list ({exc.strerror})") from None
    reader = csv.reader(io.StringIO(text), delimiter="\t", lineterminator="\n")
    header = next(reader, None)
    if tuple(header or ()) != FILES_HEADER:
        raise FbtError(f"{source}: expected the tab-separated header {' '.join(FILES_HEADER)!r}")
    names = {a.file for a in pins.archives}
    rows = []
    for n, rec in enumerate(reader, start=2):
        if len(rec) != len(FILES_HEADER) or rec[0] not in names or rec[4] not in ("train", "heldout"):
            raise FbtError(f"{source}: line {n}: expected archive, path, bytes, sha256, split (train|heldout)")
        rows.append(FileRow(rec[0], rec[1], int(rec[2]), rec[3], rec[4]))
    if not rows:
        raise FbtError(f"{source}: lists no file")
    return rows


def write_files(rows: list[FileRow], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(FILES_HEADER)
        for r in rows:
            w.writerow([r.archive, r.path, r.bytes, r.sha256, r.split])


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def archive_members(archive: Archive, path: Path) -> Iterator[tuple[str, bytes]]:
    """(path below the archive's root, bytes) of every regular file the archive holds, in name order."""
    if archive.format == "sdist":
        with tarfile.open(path, "r:gz") as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
            for m in members:
                if m.name.startswith(archive.root):
                    yield m.name[len(archive.root) :], tar.extractfile(m).read()
    else:
        with zipfile.ZipFile(path) as z:
            for name in sorted(z.namelist()):
                if not name.endswith("/") and name.startswith(archive.root):
                    yield name[len(archive.root) :], z.read(name)


def chosen(archive: Archive, rel: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in archive.include)


def held_out(pins: Pins, archive: str, rel: str) -> bool:
    """A file is held out by a hash of its archive and path: a split by file, the same on every machine."""
    h = hashlib.sha256(f"{pins.heldout_salt}:{archive}:{rel}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < pins.heldout_fraction


def scan(pins: Pins, folder: Path) -> list[FileRow]:
    """The file list of the pins from the archives in `folder`: every member the include patterns
    choose that is UTF-8 text of 1..max_file_bytes bytes, a content seen before (an empty
    `__init__.py`, a copied module) kept once, in archive then name order."""
    rows, seen = [], set()
    for a in pins.archives:
        for rel, data in archive_members(a, Path(folder) / a.file):
            if not chosen(a, rel) or not 0 < len(data) <= pins.max_file_bytes:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            sha = sha256_bytes(data)
            if sha in seen:
                continue
            seen.add(sha)
            rows.append(FileRow(a.file, rel, len(data), sha, "heldout" if held_out(pins, a.file, rel) else "train"))
    return rows
