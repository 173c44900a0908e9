"""What every result table and report records: config, seed, git commit, hashes, library versions."""

from __future__ import annotations

import json
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
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
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


def package_install() -> dict:
    """How fbt-probe is installed, from its own metadata: the version, and for a pip install from a
    folder or a VCS its `direct_url.json` (`editable`, the URL, the VCS commit where pip recorded one)."""
    out: dict = {"version": "unknown", "kind": "not installed"}
    # one pip recorded first (an *.egg-info left in a source folder on sys.path can be found before
    # the installed dist-info), and of those the one installed where this package was imported from
    here = Path(__file__).resolve().parent.parent

    def rank(d) -> tuple[bool, bool]:
        return d.read_text("direct_url.json") is None, Path(str(d.locate_file(""))).resolve() != here

    dists = sorted(metadata.distributions(name="fbt-probe"), key=rank)
    if not dists:
        return out
    dist = dists[0]
    out.update(version=dist.version, kind="wheel or index")
    raw = dist.read_text("direct_url.json")
    if raw:
        try:
            url = json.loads(raw)
        except json.JSONDecodeError:
            return out
        out["url"] = url.get("url")
        if url.get("dir_info", {}).get("editable"):
            out["kind"] = "editable"
        elif "vcs_info" in url:
            out.update(kind="vcs", vcs_commit=url["vcs_info"].get("commit_id"))
        else:
            out["kind"] = "local folder or file"
    return out


def provenance(**extra) -> dict:
    """A provenance record; callers add config, seed, checkpoint hash, dataset hash as keywords.
    `git_commit` is fbt-probe's own source tree (an editable checkout; 'unknown' for an installed
    package, whose version and install are in `package`); `working_directory_commit` is the commit
    of the folder the command ran in (a user's repository, say), labelled as such."""
    return {
        "git_commit": git_commit(),
        "package": package_install(),
        "working_directory_commit": git_commit(Path.cwd()),
        "versions": library_versions(),
        "machine": platform.machine(),
        **extra,
    }
