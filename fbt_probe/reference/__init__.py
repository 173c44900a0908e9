"""Reference checkpoints shipped inside the package, loadable by name (`ref:<name>`).

Each lives in `fbt_probe/reference/models/<name>/`: config.json, model.safetensors, tokenizer.json,
metrics.jsonl (the training log), card.md (the model card) and reference.json, which records the
sha256 of every other file, the held-out answer accuracy on a small check slice and how the model
was trained. Every load verifies the hashes, so a missing or altered file is a one-line error,
never a silently different model. `fbt-probe model refs` lists them; `fbt-probe model pack` makes one."""
from __future__ import annotations

from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.io import read_json, sha256_file

PREFIX = "ref:"
ROOT = Path(__file__).resolve().parent / "models"
RECORD = "reference.json"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl", "card.md")


def is_reference(source) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def names(root: Path | None = None) -> list[str]:
    """Shipped reference names (folders with a reference.json), sorted."""
    root = ROOT if root is None else root
    return sorted(p.name for p in root.iterdir() if (p / RECORD).is_file()) if root.is_dir() else []


def record(name: str, root: Path | None = None) -> dict:
    """reference.json of a shipped model (not verified; `folder` verifies)."""
    return read_json(_folder(name, root) / RECORD, f"reference record of {PREFIX}{name}")


def _folder(name: str, root: Path | None) -> Path:
    root = ROOT if root is None else root
    known = names(root)
    if name not in known:
        raise FbtError(f"{PREFIX}{name}: no such reference model (shipped: {', '.join(PREFIX + n for n in known) or 'none'})")
    return root / name


def folder(source: str, root: Path | None = None) -> Path:
    """The verified folder of `ref:<name>`: every file present with its recorded sha256, else FbtError."""
    name = source[len(PREFIX):] if is_reference(source) else source
    path = _folder(name, root)
    rec = read_json(path / RECORD, f"reference record of {PREFIX}{name}")
    hashes = rec.get("sha256") if isinstance(rec, dict) else None
    if not isinstance(hashes, dict) or set(hashes) != set(FILES):
        raise FbtError(f"{path / RECORD}: field 'sha256' must give the hash of each of {list(FILES)}; reinstall fbt-probe")
    for f in FILES:
        if not (path / f).is_file():
            raise FbtError(f"{PREFIX}{name}: shipped file {f} is missing from {path}; reinstall fbt-probe")
        got = sha256_file(path / f)
        if got != hashes[f]:
            raise FbtError(f"{PREFIX}{name}: shipped file {f} is corrupted (sha256 {got[:12]}..., recorded "
                           f"{hashes[f][:12]}...); reinstall fbt-probe")
    return path


def resolve(source):
    """`ref:<name>` -> its verified folder (a str); anything else unchanged."""
    return str(folder(source)) if is_reference(source) else source
