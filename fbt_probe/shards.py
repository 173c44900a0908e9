"""Activation folders on disk: what makes one ours, and the checks that keep a damaged shard from
being resumed over or probed.

A shard's sha256 is recorded beside it (`<shard>.sha256`) before the shard is renamed into place, so
an interrupted extraction can tell a finished shard from one whose bytes changed since; the finished
folder's `manifest.json` lists every shard's sha256 again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, read_json, sha256_file
from fbt_probe.marker import MARKER, is_marked, list_files, read_marker, refuse_changed, refuse_links, write_marker

FORMAT = "fbt-probe.activations/1"
COMMAND = "extract"  # the output marker's command


def sidecar(path: Path) -> Path:
    """Where a shard's sha256 is recorded when it is written."""
    return path.with_name(path.name + ".sha256")


def record_sha256(tmp: Path, path: Path) -> str:
    """sha256 of the finished temporary shard `tmp`, written to `path`'s sidecar (atomically)."""
    digest = sha256_file(tmp)
    with atomic_path(sidecar(path)) as side:
        side.write_text(digest + "\n")
    return digest


def verify_finished(path: Path) -> str:
    """The sha256 of a shard an interrupted extraction left, checked against the one recorded when it
    was written; a shard without a record, or whose bytes changed since, is refused."""
    side = sidecar(path)
    recorded = side.read_text().strip() if side.is_file() else None
    if recorded is None:
        raise FbtError(
            f"{path}: no recorded sha256 ({side.name} missing), so this shard cannot be trusted; "
            f"delete it and run the same extract command again"
        )
    digest = sha256_file(path)
    if digest != recorded:
        raise FbtError(
            f"{path}: corrupt shard (its sha256 differs from the one recorded when it was written); "
            f"delete it and run the same extract command again"
        )
    return digest


def verify_shards(folder: Path, shards: list[dict]) -> None:
    """Every shard of a finished folder exists and has the sha256 its manifest lists."""
    for shard in shards:
        path = Path(folder) / shard["file"]
        if not path.is_file():
            raise FbtError(f"{path}: shard missing (listed in {Path(folder) / 'manifest.json'})")
        if sha256_file(path) != shard["sha256"]:
            raise FbtError(
                f"{path}: corrupt shard (sha256 differs from the manifest); re-extract it "
                f"(delete the file and manifest.json, then run extract again)"
            )


def is_activation_folder(path: Path) -> bool:
    """A folder written by `extract` (finished or not): its marker names the command and its plan or
    manifest has our format (file names alone are anyone's)."""
    if not is_marked(path, COMMAND):
        return False
    for name in ("manifest.json", "plan.json"):
        f = Path(path) / name
        if f.is_file():
            try:
                meta = read_json(f)
            except FbtError:
                return False
            return isinstance(meta, dict) and meta.get("format") == FORMAT
    return False


def check_out_dir(out_dir: Path, plan: dict, force: bool) -> str:
    """ "fresh" (absent or empty), "resume" (an interrupted extraction of the same plan) or, with
    `force`, "replace" (an activation folder); refuses anything else, and a folder that is or holds
    a link to a folder or outside it (a resumed extraction would write its shards through it)."""
    refuse_links(out_dir)
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return "fresh"
    if not out_dir.is_dir() or not is_activation_folder(out_dir):
        raise FbtError(
            f"{out_dir}: exists and is not an activation folder; refusing to write into or replace it, even with "
            f"--force (it has no {MARKER} marker of fbt-probe extract with a plan of our format; choose another --out)"
        )
    if force:
        return "replace"
    if (out_dir / "manifest.json").exists():
        raise FbtError(
            f"{out_dir}: already holds a finished extraction; refusing to overwrite (pass --force to replace it)"
        )
    old = read_json(out_dir / "plan.json", "extraction plan")
    if json.dumps(old, sort_keys=True) != json.dumps(json.loads(json.dumps(plan)), sort_keys=True):
        diff = [k for k in plan if old.get(k) != json.loads(json.dumps(plan[k]))]
        raise FbtError(
            f"{out_dir}: holds an unfinished extraction with a different {', '.join(diff)}; pass --force to start over"
        )
    return "resume"


def mark(out_dir: Path, names: tuple[str, ...]) -> None:
    """The folder's marker: the named small files with their sha256 (each shard's is in the plan's
    sidecars and the manifest, and is not hashed twice)."""
    write_marker(out_dir, COMMAND, files={n: sha256_file(out_dir / n) for n in names if (out_dir / n).is_file()})


def foreign_files(out_dir: Path) -> list[str]:
    """The files of activation folder `out_dir` that extract did not write (kept by a forced rerun):
    neither listed in its marker nor a shard (or sidecar) of its plan. A listed file whose bytes
    changed is refused."""
    record = read_marker(out_dir)
    refuse_changed(out_dir, COMMAND, record["files"])
    plan = read_json(out_dir / ("manifest.json" if (out_dir / "manifest.json").is_file() else "plan.json"))
    shards = {s["file"] for s in plan.get("shards", []) if isinstance(s, dict) and isinstance(s.get("file"), str)}
    own = set(record["files"]) | {"manifest.json", "plan.json", "samples.parquet"} | shards
    own |= {f + ".sha256" for f in shards}
    return [rel for rel in list_files(out_dir) if rel not in own]


def read_shard(path: Path, expect_sha: str | None = None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FbtError(f"{path}: unreadable shard ({exc})") from None
    if expect_sha is not None and hashlib.sha256(data).hexdigest() != expect_sha:
        raise FbtError(
            f"{path}: corrupt shard (sha256 differs from the manifest); re-extract it "
            f"(delete the file and manifest.json, then run extract again)"
        )
    try:
        return load(data)
    except Exception as exc:  # safetensors raises its own error type for a damaged file
        raise FbtError(
            f"{path}: corrupt shard ({type(exc).__name__}: {exc}); delete it and run extract again"
        ) from None
