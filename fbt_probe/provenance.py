"""What every result table and report records: config, seed, git commit, hashes, library versions."""
from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

_LIBS = ("fbt-probe", "torch", "transformer-lens", "scikit-learn", "pandas", "numpy", "safetensors", "tokenizers")


def git_commit(cwd: str | Path | None = None) -> str:
    """The commit of the source tree, with '-dirty' if it has uncommitted changes; 'unknown' outside git
    and for an installed (not editable) package, whose folder is no checkout of this project (a
    site-packages inside some other repository would otherwise report that repository's commit)."""
    root = Path(cwd) if cwd else Path(__file__).resolve().parent.parent
    if cwd is None and not (root / "pyproject.toml").is_file():
        return "unknown"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _LIBS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def provenance(**extra) -> dict:
    """A provenance record; callers add config, seed, checkpoint hash, dataset hash as keywords."""
    return {"git_commit": git_commit(), "versions": library_versions(), "machine": platform.machine(), **extra}
