"""Atomic, non-clobbering file output shared by every stage.

Every writer goes through `atomic_path`: data lands in a temporary file next to the target and is
renamed into place only when complete, so an interrupted run never leaves a half-written output.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from fbt_probe.errors import FbtError


def refuse_existing(path: Path, force: bool = False, hint: str = "--force", own=None, kind: str = "") -> bool:
    """Raise unless `path` is absent, or `force` is set and the path may be replaced: with `own`
    given, only an empty folder or one that `own(path)` recognises as this command's output (`kind`
    names it in the message). Returns True when an existing, non-empty path will be replaced."""
    path = Path(path)
    if not path.exists():
        return False
    if not force:
        raise FbtError(f"{path}: already exists; refusing to overwrite (pass {hint} to replace it)")
    if is_empty_dir(path):
        return False
    if own is not None and not own(path):
        raise FbtError(
            f"{path}: exists and is not {kind or 'an output of this command'}; refusing to replace it, "
            "even with --force (choose another output path, or move it away yourself)"
        )
    return True


def is_empty_dir(path: Path) -> bool:
    return Path(path).is_dir() and not any(Path(path).iterdir())


def temp_sibling(path: Path) -> Path:
    """A new empty folder beside `path` (hidden, `.tmp` suffix) to build a replacement in."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a swapped-in output folder gets the usual permissions
    return tmp


def swap_in(tmp: Path, path: Path, before_delete=None) -> None:
    """Put the finished folder `tmp` at `path`; an old `path` is moved aside first and deleted only
    once the new one is in place, so at every moment one of them is complete. `before_delete(old)`
    runs on the old folder first (what a caller carries over from it)."""
    path = Path(path)
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
        os.replace(path, old / "x")
    os.replace(tmp, path)
    if old is not None:
        if before_delete is not None:
            before_delete(old / "x")
        shutil.rmtree(old)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
    try:
        with disk_full(path.parent, tmp_path):
            yield tmp_path
            os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | Path, force: bool = False, own=None, kind: str = "") -> Iterator[Path]:
    """Yield a temporary folder beside `path`; it replaces `path` only if the block succeeds.
    `force`, `own` and `kind` as in `refuse_existing` (checked before the block runs)."""
    path = Path(path)
    refuse_existing(path, force, own=own, kind=kind)
    tmp = temp_sibling(path)
    try:
        with disk_full(path.parent, tmp):
            yield tmp
            swap_in(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC/EDQUOT, or a writer's own error that wraps one (safetensors, torch, pyarrow)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


@contextlib.contextmanager
def disk_full(folder: Path, written: Path) -> Iterator[None]:
    """Turn a full disk inside the block into one line naming `folder` and the space needed (what
    was written into `written` before the disk filled, at least, beyond what is free)."""
    try:
        yield
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        size = _size(written)
        free = shutil.disk_usage(folder).free if Path(folder).exists() else 0
        raise FbtError(
            f"{folder}: no space left on the device (free {_mb(free)}; the output being written had "
            f"reached {_mb(size)} and needs more: free at least that much and run the command again)"
        ) from None


def _size(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | Path, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, what: str = "JSON file") -> dict:
    path = Path(path)
    if not path.is_file():
        raise FbtError(f"{path}: {what} not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FbtError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_csv(table, path: Path) -> None:
    """`table` (a pandas DataFrame) as CSV through pyarrow's writer: ~15x faster than
    `DataFrame.to_csv` on the interventions' long tables (a 464k-row table: 0.5 s against 7.7 s),
    and read back by `pandas.read_csv` to the same values and dtypes (floats in shortest round-trip
    form, strings quoted only where needed, booleans as true/false, NaN as an empty field).
    Columns pyarrow cannot take (lists, mixed objects) fall back to pandas."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        arrow = pa.Table.from_pandas(table, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        table.to_csv(path, index=False)
        return
    if any(pa.types.is_nested(f.type) for f in arrow.schema):
        table.to_csv(path, index=False)
        return
    pcsv.write_csv(arrow, path, pcsv.WriteOptions(quoting_style="needed"))
