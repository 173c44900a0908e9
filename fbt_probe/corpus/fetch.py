"""Getting the pinned archives: `pip download` of each pinned distribution file, checked by sha256.

The one step of the corpus that reaches a package index, run once per machine; the build reads
only the archives and refuses any whose sha256 is not the pinned one. Fetch writes only the
archives the folder lacks (each into a temporary file, renamed into place once its hash is
checked) and never replaces or deletes a file: an archive of the pinned name with other bytes is
refused by name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fbt_probe.corpus.pins import Archive, Pins, read_pins
from fbt_probe.errors import FbtError
from fbt_probe.io import sha256_file


def _check_folder(folder: Path) -> None:
    for p in (folder, *folder.parents):
        if p.is_symlink():
            raise FbtError(f"{folder}: {p} is a symbolic link; refusing to write through it (pass a real folder)")
    if folder.exists() and not folder.is_dir():
        raise FbtError(f"{folder}: exists and is not a folder")


def _pip_download(archive: Archive, dest: Path) -> None:
    binary = ["--no-binary", ":all:"] if archive.format == "sdist" else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet"]
    cmd += [*binary, "--dest", str(dest), archive.requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise FbtError(f"pip download {archive.requirement}: could not run pip ({exc.strerror})") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        why = lines[-1].strip() if lines else f"exit code {done.returncode}"
        raise FbtError(f"pip download {archive.requirement}: failed ({why}); nothing was written")


def fetch(folder: str | Path, pins: Pins | None = None, say=None) -> list[dict]:
    """Every pinned archive in `folder`, downloaded where missing; returns one record per archive
    (file, sha256, 'present' or 'fetched')."""
    pins = pins or read_pins()
    folder = Path(folder)
    _check_folder(folder)
    say = say or (lambda msg: None)
    out = []
    for a in pins.archives:  # every archive already there is checked before anything is fetched
        path = folder / a.file
        if path.is_symlink():
            raise FbtError(f"{path}: a symbolic link; refusing to read or replace it (put the archive itself there)")
        if path.exists():
            got = sha256_file(path)
            if got != a.sha256:
                raise FbtError(
                    f"{path}: sha256 {got[:12]}... is not the pinned {a.sha256[:12]}... of {a.requirement}; "
                    "refusing to replace it (move it away, then fetch again)"
                )
    folder.mkdir(parents=True, exist_ok=True)
    for a in pins.archives:
        path = folder / a.file
        if path.exists():
            out.append({"file": a.file, "sha256": a.sha256, "status": "present"})
            continue
        say(f"pip download {a.requirement} ({a.file})")
        with tempfile.TemporaryDirectory(prefix=f".{a.file}.", suffix=".tmp", dir=folder) as tmp:
            _pip_download(a, Path(tmp))
            got_path = Path(tmp) / a.file
            if not got_path.is_file():
                names = ", ".join(sorted(os.listdir(tmp))) or "nothing"
                raise FbtError(f"pip download {a.requirement}: expected {a.file}, got {names}; nothing was written")
            got = sha256_file(got_path)
            if got != a.sha256:
                raise FbtError(
                    f"pip download {a.requirement}: {a.file} has sha256 {got[:12]}..., not the pinned "
                    f"{a.sha256[:12]}...; nothing was written"
                )
            os.replace(got_path, path)
        out.append({"file": a.file, "sha256": a.sha256, "status": "fetched"})
    return out


def copy_from(source: str | Path, folder: str | Path, pins: Pins | None = None) -> list[str]:
    """Copy the pinned archives found in `source` (a folder a user already has, e.g. a pip download
    cache) into `folder`, each checked by sha256 first; returns the files copied."""
    pins = pins or read_pins()
    folder, copied = Path(folder), []
    _check_folder(folder)
    for a in pins.archives:
        src, dst = Path(source) / a.file, folder / a.file
        if dst.exists() or not src.is_file():
            continue
        if sha256_file(src) != a.sha256:
            raise FbtError(f"{src}: sha256 is not the pinned one of {a.requirement}; not copied")
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{a.file}.copy.tmp"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        copied.append(a.file)
    return copied
