"""Output markers: how a command recognises its own output folder.

Every output folder a command writes holds `.fbt-output.json`: the command, the marker's format and
the sha256 of each file the command wrote there. A folder counts as a command's own output by this
record alone, never by its file names, so that a user's folder that happens to hold `cfg.json` or
`stages.json` is refused. Replacing an output (`--force`, a study's redone stage) removes only the
files the marker lists with their recorded hash: every other file is carried into the new output,
and a listed file whose bytes changed since it was written is refused rather than replaced. A
folder whose marker names another command, or that has none (a user's folder, or one written
before outputs were marked), is refused even with `--force`.

Commands that write named files into a folder (tables, figures, datasets, reports) record each
file in that folder's marker under the command `named outputs`, with the command that wrote it
(`writers`); `--force` replaces such a file only where the marker lists it, unchanged, as written
by the same command, and a folder that another command owns (an SAE folder, a run) is refused.

One writer at a time: every writer holds the output's lock (`writing`: an exclusive flock on
`.<name>.lock` beside it, which the system releases when the process ends, however it ends) from
its check of the folder to its swap, so two commands writing one folder never both succeed. And
no write or move through a link: an output that is a symbolic link, or holds one that points to a
folder or outside it, is refused before anything is written (`refuse_links`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, disk_full, is_empty_dir, sha256_file, swap_in, temp_sibling

MARKER = ".fbt-output.json"
FORMAT = 1
WAY_OUT = "move it away or delete it yourself, then run again"
LEGACY = "an output written before fbt-probe marked its outputs has none either"


def is_temporary(rel: str) -> bool:
    """A hidden temporary a writer leaves while it works (`.name.XXXX.tmp`, `.name.XXXX.old`, a
    writer's `.name.lock`)."""
    return any(p.startswith(".") and p.endswith((".tmp", ".old", ".lock")) for p in Path(rel).parts)


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


def write_marker(folder: Path, command: str, files: dict[str, str] | None = None, writers: dict | None = None) -> dict:
    """Record `files` (default: every file now in `folder`) as written by `command` (`writers`: for a
    folder of named outputs, the command that wrote each file)."""
    folder = Path(folder)
    record = {"command": command, "format": FORMAT, "files": files_of(folder) if files is None else files}
    if writers:
        record["writers"] = writers
    with atomic_path(folder / MARKER) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def read_marker(folder: Path) -> dict | None:
    """The folder's marker, or None where it has none (or one that is not ours)."""
    path = Path(folder) / MARKER
    if not path.is_file() or path.is_symlink():
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
    writers = record.get("writers", {})
    if not isinstance(writers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in writers.items()):
        return None
    return record


def is_marked(folder: Path, command: str) -> bool:
    record = read_marker(folder)
    return record is not None and record["command"] == command


# ----------------------------------------------------------------------------- links
def refuse_links(folder: Path) -> None:
    """Refuse an output `folder` that is a symbolic link, or that holds a link to a folder or to a
    path outside it: a write, a move or a deletion there would act on what the link points to. A
    link to a file inside the folder is a file like any other (a replacement carries it as it is)."""
    folder = Path(folder)
    if folder.is_symlink():
        raise FbtError(
            f"{folder}: a symbolic link (to {os.readlink(folder)}); refusing to write through a link "
            "(give the folder it points to, or another output path)"
        )
    if not folder.is_dir():
        return
    root = folder.resolve()
    for dirpath, dirnames, filenames in os.walk(folder):  # links to folders are listed, not followed
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            target = p.resolve()
            if p.is_dir() or not target.is_relative_to(root):
                where = "a folder" if p.is_dir() else f"a path outside {folder}"
                raise FbtError(
                    f"{p}: a symbolic link to {where} ({os.readlink(p)}); refusing to write, move or delete "
                    f"files through a link (remove the link, then run again)"
                )


def refuse_link_file(path: Path) -> None:
    """A named output file that is a symbolic link (a write would replace the link, or its folder's
    marker would vouch for what it points to) is refused."""
    path = Path(path)
    for p in (path.parent, path):
        if p.is_symlink():
            raise FbtError(
                f"{p}: a symbolic link (to {os.readlink(p)}); refusing to write through a link "
                "(remove the link, or choose another --out)"
            )


# ----------------------------------------------------------------------------- one writer at a time
_HELD: dict[str, list] = {}  # resolved output path -> [lock file descriptor, lock path, holders in this process]


def lock_path(path: Path) -> Path:
    """The lock file of output `path`: `.<name>.lock` beside it (removed when its writer finishes)."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def writing(path: str | Path, command: str = "") -> Iterator[None]:
    """Hold output `path`'s writer lock while the block runs: another process writing `path` is
    refused at once, in one line. Nested holders in one process share the lock. Folders made to
    hold the lock file are removed again if the block left them empty."""
    path = Path(path)
    created = _make_parents(path.parent)
    key = str(path.parent.resolve() / path.name)
    if key in _HELD:
        _HELD[key][2] += 1
        try:
            yield
        finally:
            _HELD[key][2] -= 1
        return
    try:
        fd = _acquire(path)
    except BaseException:
        _remove_empty(created)
        raise
    _HELD[key] = [fd, lock_path(path), 1]
    try:
        yield
    finally:
        fd, lock, _ = _HELD.pop(key)
        if fd is not None:
            with contextlib.suppress(OSError):
                lock.unlink()  # while still held: a writer that opened it meanwhile finds it gone and retries
            os.close(fd)
        _remove_empty(created)


def _make_parents(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; the ones made, deepest first (none where it cannot)."""
    made, p = [], Path(folder)
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    return made


def _remove_empty(folders: list[Path]) -> None:
    for d in folders:
        try:
            d.rmdir()
        except OSError:
            return


def _acquire(path: Path) -> int | None:
    """An exclusive lock on `path`'s lock file (its descriptor), or None where the folder that would
    hold it cannot be written (a read-only parent: nothing can be swapped in there either)."""
    lock = lock_path(path)
    for _ in range(8):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FbtError(
                f"{path}: another fbt-probe command is writing it now (its lock {lock.name} is held); wait for it "
                "to finish, or choose another output path"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the lock file of a writer that finished meanwhile: take the new one
    raise FbtError(f"{path}: its lock {lock.name} keeps changing hands; wait for the other writers, then run again")


# ----------------------------------------------------------------------------- output folders
def check_replaceable(
    folder: Path, command: str, kind: str = "", legacy: Callable[[Path], bool] | None = None
) -> list[str]:
    """Refuse `folder` unless its marker names `command` and none of the files it lists changed;
    returns the files to keep (those the marker does not list). `legacy(folder)`: the folder looks
    like this command's output of before the marker (the message says so)."""
    folder = Path(folder)
    record = read_marker(folder)
    if record is None or record["command"] != command:
        what = kind or f"an output of fbt-probe {command}"
        if record is None and legacy is not None and _safely(legacy, folder):
            raise FbtError(
                f"{folder}: looks like {what} written before fbt-probe marked its outputs (it has no {MARKER} "
                f"marker, so nothing shows which files are ours); refusing to replace it, even with --force "
                f"({WAY_OUT})"
            )
        why = (
            f"it has no {MARKER} marker"
            if record is None
            else f"its {MARKER} marker names fbt-probe {record['command']}"
        )
        raise FbtError(
            f"{folder}: exists and is not {what} ({why}); "
            f"refusing to replace it, even with --force (choose another output path, or {WAY_OUT}; {LEGACY})"
        )
    refuse_changed(folder, command, record["files"])
    return [rel for rel in list_files(folder) if rel not in record["files"]]


def _safely(check: Callable[[Path], bool], folder: Path) -> bool:
    try:
        return bool(check(folder))
    except (FbtError, OSError, ValueError):
        return False


def refuse_unowned(
    path: Path, command: str, force: bool = False, kind: str = "", legacy: Callable[[Path], bool] | None = None
) -> list[str] | None:
    """Check an output path before any work: None where it is absent or an empty folder, else (with
    `force`, and only for a folder whose marker names `command` with every listed file unchanged) the
    files to keep. Without `force` an existing output is refused; so is a path through a link."""
    path = Path(path)
    refuse_links(path)
    if not path.exists() or is_empty_dir(path):
        return None
    if not force:
        raise FbtError(f"{path}: already exists; refusing to overwrite (pass --force to replace it)")
    if not path.is_dir():
        raise FbtError(
            f"{path}: exists and is a file, not {kind or f'an output folder of fbt-probe {command}'}; refusing to "
            "replace it, even with --force (choose another output path)"
        )
    return check_replaceable(path, command, kind, legacy)


@contextlib.contextmanager
def output_dir(
    path: str | Path,
    command: str,
    force: bool = False,
    kind: str = "",
    legacy: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; when the block succeeds it is marked as `command`'s
    output and put at `path`. An old output (with `force`, see `refuse_unowned`) is moved aside, the
    files its marker does not list are carried into the new folder, and the rest is deleted. The
    output's lock is held from the check to the swap."""
    path = Path(path)
    with writing(path, command):
        keep = refuse_unowned(path, command, force, kind, legacy) or []
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
                    f"{path / clash[0]}: not written by fbt-probe {command} (absent from {path / MARKER}) and the "
                    "new output writes a file of that name; refusing to replace it (move it away, then run again)"
                )
            refuse_links(path)  # a link made while the output was built is not moved through either
            swap_keeping(tmp, path, keep)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)


def replaced_note(keep: list[str] | None) -> str:
    """What a replacement says it kept: the files the old output held that the command had not written."""
    if not keep:
        return ""
    return f" (kept {len(keep)} file(s) it had not written: {', '.join(keep[:3])}{', ...' if len(keep) > 3 else ''})"


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


# ----------------------------------------------------------------------------- named output files
NAMED = "named outputs"  # the marker of a folder that commands write named files into (figures, tables)


def refuse_named(paths: list[Path], force: bool = False, command: str | None = None) -> list[Path]:
    """Check named output files before any work: a file or folder that is a link is refused, and so
    is a folder another command owns (its marker names that command, not named outputs); without
    `force` an existing file is refused; with it, only a file its folder's marker lists with the same
    sha256 (one fbt-probe wrote, unchanged since) and, where the marker records it, as written by
    `command`. Returns the files that will be replaced."""
    replacing = []
    for p in map(Path, paths):
        refuse_link_file(p)
        record = read_marker(p.parent)
        if record is not None and record["command"] != NAMED:
            what = f"fbt-probe {command}" if command else "this command"
            raise FbtError(
                f"{p.parent}: its {MARKER} marker names fbt-probe {record['command']} (the folder is that "
                f"command's output, replaced whole by it); refusing to write {p.name} into it: {what} writes "
                "into a folder of its own (choose another --out)"
            )
        if not p.exists():
            continue
        if not force:
            raise FbtError(f"{p}: already exists; refusing to overwrite (pass --force to replace it)")
        recorded = (record or {}).get("files", {}).get(p.name)
        if recorded is None or not p.is_file():
            raise FbtError(
                f"{p}: exists and was not written by fbt-probe (absent from {p.parent / MARKER}); refusing to replace "
                f"it, even with --force (choose another --out, or {WAY_OUT}; a file written before fbt-probe "
                "marked its outputs is absent too)"
            )
        if sha256_file(p) != recorded:
            raise FbtError(
                f"{p}: changed since fbt-probe wrote it (its sha256 differs from the one in {p.parent / MARKER}); "
                "refusing to replace it, even with --force (move it away, then run again)"
            )
        writer = (record or {}).get("writers", {}).get(p.name)
        if command is not None and writer is not None and writer != command:
            raise FbtError(
                f"{p}: written by fbt-probe {writer} (its {p.parent / MARKER} says so), not by fbt-probe {command}; "
                "refusing to replace it, even with --force (choose another --out)"
            )
        replacing.append(p)
    return replacing


def mark_named(paths: list[Path], command: str | None = None) -> None:
    """Record the named files just written in their folder's marker (with `command` as their writer)."""
    by_folder: dict[Path, list[Path]] = {}
    for p in map(Path, paths):
        by_folder.setdefault(p.parent, []).append(p)
    for folder, files in by_folder.items():
        record = read_marker(folder) or {"command": NAMED, "files": {}}
        writers = dict(record.get("writers", {}))
        if command is not None:
            writers.update({p.name: command for p in files})
        write_marker(
            folder,
            record["command"],
            files={**record["files"], **{p.name: sha256_file(p) for p in files}},
            writers=writers,
        )


@contextlib.contextmanager
def named_outputs(paths: list[Path], command: str, force: bool = False) -> Iterator[list[Path]]:
    """Hold the lock of the files' folder(s), check them (`refuse_named`), run the block that writes
    them and record them in their folder's marker as `command`'s. Yields the files to be replaced."""
    paths = [Path(p) for p in paths]
    with contextlib.ExitStack() as stack:
        for folder in dict.fromkeys(p.parent for p in paths):
            stack.enter_context(writing(folder, command))
        replacing = refuse_named(paths, force, command)
        yield replacing
        mark_named([p for p in paths if p.is_file()], command)
