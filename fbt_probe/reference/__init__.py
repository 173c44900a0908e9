"""Reference checkpoints shipped inside the package, loadable by name (`ref:<name>`).

Each lives in `fbt_probe/reference/models/<name>/`: config.json, model.safetensors, tokenizer.json,
metrics.jsonl (the training log), card.md (the model card) and reference.json, which records the
sha256 of every other file, the held-out answer accuracy on a small check slice and how the model
was trained. Every load verifies the hashes, so a missing or altered file is a one-line error,
never a silently different model. `fbt-probe model refs` lists them; `fbt-probe model pack` makes one."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.io import read_json, sha256_file

PREFIX = "ref:"
ROOT = Path(str(resources.files("fbt_probe.reference").joinpath("models")))  # package data: in the wheel
RECORD = "reference.json"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl", "card.md")


def is_reference(source) -> bool:
    """`source` names a shipped model: a str `ref:<name>`, or an os.PathLike spelling one (no such path exists)."""
    if isinstance(source, os.PathLike) and not isinstance(source, str):
        return not Path(source).exists() and str(source).startswith(PREFIX)
    return isinstance(source, str) and source.startswith(PREFIX)


def names(root: Path | None = None) -> list[str]:
    """Shipped reference names (folders with a reference.json), sorted."""
    root = ROOT if root is None else root
    return sorted(p.name for p in root.iterdir() if (p / RECORD).is_file()) if root.is_dir() else []


def record(name: str, root: Path | None = None) -> dict:
    """reference.json of a shipped model, checked against its schema (the files' hashes: `folder`)."""
    path = _folder(name, root) / RECORD
    return check_record(read_json(path, f"reference record of {PREFIX}{name}"), path)


NUMBER = (int, float)
# reference.json: field -> type (what `model pack` writes and the commands that read a record use)
SCHEMA = {
    "name": str,
    "arch": str,
    "baseline": bool,
    "seed": int,
    "steps": int,
    "train_seconds": NUMBER,
    "checkpoint_sha256": str,
    "sha256": dict,
    "accuracy": dict,
    "check": dict,
    "train": dict,
    "cpu": str,
}
ROWS = {
    "accuracy": {"task": str, "mode": str, "length_knob": int, "correct": int, "n": int, "accuracy": NUMBER},
    "check": {"task": str, "length_knob": int, "correct": int, "n": int},
}


def check_record(rec, path: Path) -> dict:
    """`rec` (a reference.json) has every field of SCHEMA with its type, and accuracy/check rows
    with theirs; else FbtError naming the first field that is not so."""

    def bad(field: str, what: str):
        return FbtError(f"{path}: field '{field}' {what}; reinstall fbt-probe")

    if not isinstance(rec, dict):
        raise FbtError(f"{path}: expected an object of reference fields; reinstall fbt-probe")
    for field, kind in SCHEMA.items():
        if field not in rec:
            raise bad(field, "missing")
        if not _is(rec[field], kind):
            raise bad(field, f"must be {_kind_name(kind)}, got {type(rec[field]).__name__}")
    for table, columns in ROWS.items():
        rows = rec[table].get("rows")
        if not isinstance(rows, list):
            raise bad(f"{table}.rows", "missing or not a list")
        for i, row in enumerate(rows):
            for col, kind in columns.items():
                if not isinstance(row, dict) or col not in row:
                    raise bad(f"{table}.rows[{i}].{col}", "missing")
                if not _is(row[col], kind):
                    raise bad(f"{table}.rows[{i}].{col}", f"must be {_kind_name(kind)}, got {type(row[col]).__name__}")
            if row["n"] < 1 or not 0 <= row["correct"] <= row["n"]:
                raise bad(
                    f"{table}.rows[{i}]", f"must have 0 <= correct <= n and n >= 1, got {row['correct']} of {row['n']}"
                )
    return rec


def _is(value, kind) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _kind_name(kind) -> str:
    return (
        "a number"
        if kind == NUMBER
        else {str: "a string", bool: "true or false", int: "an integer", dict: "an object"}[kind]
    )


def _folder(name: str, root: Path | None) -> Path:
    root = ROOT if root is None else root
    known = names(root)
    if name not in known:
        raise FbtError(
            f"{PREFIX}{name}: no such reference model (shipped: {', '.join(PREFIX + n for n in known) or 'none'})"
        )
    return root / name


def folder(source: str, root: Path | None = None) -> Path:
    """The verified folder of `ref:<name>`: every file present with its recorded sha256, else FbtError."""
    source = str(source)
    name = source[len(PREFIX) :] if is_reference(source) else source
    path = _folder(name, root)
    rec = record(name, root)
    hashes = rec["sha256"]
    if not isinstance(hashes, dict) or set(hashes) != set(FILES):
        raise FbtError(
            f"{path / RECORD}: field 'sha256' must give the hash of each of {list(FILES)}; reinstall fbt-probe"
        )
    for f in FILES:
        if not (path / f).is_file():
            raise FbtError(f"{PREFIX}{name}: shipped file {f} is missing from {path}; reinstall fbt-probe")
        got = sha256_file(path / f)
        if got != hashes[f]:
            raise FbtError(
                f"{PREFIX}{name}: shipped file {f} is corrupted (sha256 {got[:12]}..., recorded "
                f"{hashes[f][:12]}...); reinstall fbt-probe"
            )
    return path


def resolve(source):
    """`ref:<name>` -> its verified folder (a str); anything else unchanged."""
    return str(folder(str(source))) if is_reference(source) else source
