"""Output markers: how a command recognises its own output folder.

Every output folder a command writes holds `.fbt-output.json`: the command, the marker's format and
the sha256 of each file the command wrote there. A folder counts as a command's own output by this
record alone, never by its file names, so that a user's folder that happens to hold `cfg.json` or
`stages.json` is refused. Replacing an output (`--force`, a study's redone stage) removes only the
files the marker lists with their recorded hash: every other file is carried into the new output,
and a listed file whose bytes changed since it was written is refused rather than replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterator

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, disk_full, is_empty_dir, sha256_file, swap_in, temp_sibling

MARKER = ".fbt-output.json"
FORMAT = 1


def is_temporary(rel: str) -> bool:
    """A hidden temporary a writer leaves while it works (`.name.XXXX.tmp`, `.name.XXXX.old`)."""
    return any(p.startswith(".") and p.endswith((".tmp", ".old")) for p in Path(rel).parts)


def list_files(folder: Path) -> list[str]:
    """Relative paths (posix) of every file, symbolic link and empty folder under `folder` (what a
    replacement must either own or carry over), the marker and hidden temporaries aside."""
    folder = Path(folder)
    out = []
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if rel == MARKER or is_temporary(rel):
            continue
        if f.is_symlink() or f.is_file() or (f.is_dir() and not any(f.iterdir())):
            out.append(rel)
    return out


def files_of(folder: Path) -> dict[str, str]:
    """Relative path (posix) -> sha256 of every regular file `list_files` lists."""
    folder = Path(folder)
    return {
        rel: sha256_file(folder / rel)
        for rel in list_files(folder)
        if (folder / rel).is_file() and not (folder / rel).is_symlink()
    }


def changed_files(folder: Path, recorded: dict[str, str]) -> list[str]:
    """The files the marker lists whose bytes differ from the recorded sha256 (absent ones aside)."""
    folder = Path(folder)
    return [rel for rel, sha in recorded.items() if (folder / rel).is_file() and sha256_file(folder / rel) != sha]


def refuse_changed(folder: Path, command: str, recorded: dict[str, str]) -> None:
    changed = changed_files(folder, recorded)
    if changed:
        raise FbtError(
            f"{Path(folder) / changed[0]}: changed since fbt-probe {command} wrote it (its sha256 differs from the "
            f"one in {Path(folder) / MARKER}); refusing to replace it, even with --force (move it away, then run again)"
        )


def write_marker(folder: Path, command: str, files: dict[str, str] | None = None) -> dict:
    """Record `files` (default: every file now in `folder`) as written by `command`."""
    folder = Path(folder)
    record = {"command": command, "format": FORMAT, "files": files_of(folder) if files is None else files}
    with atomic_path(folder / MARKER) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def read_marker(folder: Path) -> dict | None:
    """The folder's marker, or None where it has none (or one that is not ours)."""
    path = Path(folder) / MARKER
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("command"), str):
        return None
    files = record.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    return record


def is_marked(folder: Path, command: str) -> bool:
    record = read_marker(folder)
    return record is not None and record["command"] == command


def check_replaceable(folder: Path, command: str, kind: str = "") -> list[str]:
    """Refuse `folder` unless its marker names `command` and none of the files it lists changed;
    returns the files to keep (those the marker does not list)."""
    folder = Path(folder)
    record = read_marker(folder)
    if record is None or record["command"] != command:
        what = kind or f"an output of fbt-probe {command}"
        why = (
            f"it has no {MARKER} marker"
            if record is None
            else f"its {MARKER} marker names fbt-probe {record['command']}"
        )
        raise FbtError(
            f"{folder}: exists and is not {what} ({why}); "
            "refusing to replace it, even with --force (choose another output path, or move it away yourself)"
        )
    refuse_changed(folder, command, record["files"])
    return [rel for rel in list_files(folder) if rel not in record["files"]]


def refuse_unowned(path: Path, command: str, force: bool = False, kind: str = "") -> list[str] | None:
    """Check an output path before any work: None where it is absent or an empty folder, else (with
    `force`, and only for a folder whose marker names `command` with every listed file unchanged) the
    files to keep. Without `force` an existing output is refused."""
    path = Path(path)
    if not path.exists() or is_empty_dir(path):
        return None
    if not force:
        raise FbtError(f"{path}: already exists; refusing to overwrite (pass --force to replace it)")
    if not path.is_dir():
        raise FbtError(
            f"{path}: exists and is a file, not {kind or f'an output folder of fbt-probe {command}'}; refusing to "
            "replace it, even with --force (choose another output path)"
        )
    return check_replaceable(path, command, kind)


@contextlib.contextmanager
def output_dir(path: str | Path, command: str, force: bool = False, kind: str = "") -> Iterator[Path]:
    """Yield a temporary folder beside `path`; when the block succeeds it is marked as `command`'s
    output and put at `path`. An old output (with `force`, see `refuse_unowned`) is moved aside, the
    files its marker does not list are carried into the new folder, and the rest is deleted."""
    path = Path(path)
    keep = refuse_unowned(path, command, force, kind) or []
    tmp = temp_sibling(path)
    try:
        with disk_full(path.parent, tmp):
            yield tmp
            write_marker(tmp, command)
        clash = [
            rel
            for rel in keep
            if ((tmp / rel).exists() or (tmp / rel).is_symlink()) and not _merges(path / rel, tmp / rel)
        ]
        if clash:
            raise FbtError(
                f"{path / clash[0]}: not written by fbt-probe {command} (absent from {path / MARKER}) and the new "
                "output writes a file of that name; refusing to replace it (move it away, then run again)"
            )
        swap_keeping(tmp, path, keep)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def swap_keeping(tmp: Path, path: Path, keep: list[str]) -> None:
    """Put the finished folder `tmp` at `path`; an old `path` is moved aside first, the files `keep`
    are moved from it into the new folder, and the rest of it is deleted."""
    path = Path(path)
    swap_in(tmp, path, before_delete=lambda old: carry(old, path, keep))


def carry(old: Path, new: Path, keep: list[str]) -> None:
    """Move the files `keep` (relative paths) from `old` into `new` (an empty folder that the new
    output has too needs no move)."""
    for rel in keep:
        src, dst = Path(old) / rel, Path(new) / rel
        if _merges(src, dst):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)


def _merges(src: Path, dst: Path) -> bool:
    return src.is_dir() and not src.is_symlink() and dst.is_dir()


NAMED = "named outputs"  # the marker of a folder that commands write named files into (figures, tables)


def refuse_named(paths: list[Path], force: bool = False) -> list[Path]:
    """Check named output files before any work: without `force` an existing one is refused; with it,
    only a file its folder's marker lists with the same sha256 (one fbt-probe wrote, unchanged since)
    may be replaced. Returns the files that will be replaced."""
    replacing = []
    for p in map(Path, paths):
        if not p.exists():
            continue
        if not force:
            raise FbtError(f"{p}: already exists; refusing to overwrite (pass --force to replace it)")
        record = read_marker(p.parent)
        recorded = (record or {}).get("files", {}).get(p.name)
        if recorded is None or not p.is_file():
            raise FbtError(
                f"{p}: exists and was not written by fbt-probe (absent from {p.parent / MARKER}); refusing to replace "
                "it, even with --force (choose another --out, or move it away yourself)"
            )
        if sha256_file(p) != recorded:
            raise FbtError(
                f"{p}: changed since fbt-probe wrote it (its sha256 differs from the one in {p.parent / MARKER}); "
                "refusing to replace it, even with --force (move it away, then run again)"
            )
        replacing.append(p)
    return replacing


def mark_named(paths: list[Path]) -> None:
    """Record the named files just written in their folder's marker (the folder keeps its own
    command where another command marked it)."""
    by_folder: dict[Path, list[Path]] = {}
    for p in map(Path, paths):
        by_folder.setdefault(p.parent, []).append(p)
    for folder, files in by_folder.items():
        record = read_marker(folder) or {"command": NAMED, "files": {}}
        write_marker(folder, record["command"], files={**record["files"], **{p.name: sha256_file(p) for p in files}})
