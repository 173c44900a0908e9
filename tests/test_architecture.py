"""The package's shape: one-way layers (the import-linter contract in pyproject.toml), no cycle at
any depth, a light package root and CLI, and no pointer to a spec outside the repository.

The contract tests run `lint-imports` in a child process: the planted-cycle test lints a copy of the
package, and the child's working directory (first on its sys.path) decides which copy it reads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import typing
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_layer_contract_holds():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout


def test_a_planted_cycle_breaks_the_contract(tmp_path):
    """An upward import (the model reaching into the CLI) breaks the layers; the model importing an
    engine module past the seam breaks the one-seam contract; a cycle between two modules of one
    package breaks the acyclic contract. Only the copy is changed."""
    shutil.copytree(ROOT / "fbt_probe", tmp_path / "fbt_probe", ignore=shutil.ignore_patterns("models", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "fbt_probe" / "model" / "fusion.py", "a") as f:
        f.write("\nimport fbt_probe.cli  # planted\n")
    with open(tmp_path / "fbt_probe" / "model" / "components.py", "a") as f:
        f.write("\nimport fbt_probe.engine.dispatch  # planted\n")
    with open(tmp_path / "fbt_probe" / "interventions" / "metrics.py", "a") as f:
        f.write("\nimport fbt_probe.interventions.runner  # planted\n")
    r = _lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "0 kept, 3 broken" in out, out
    assert "fbt_probe.model.fusion -> fbt_probe.cli" in out, out  # the copy was linted, not the installed package


def test_no_module_imports_the_package_root():
    """Children import `fbt_probe.loading` or `fbt_probe._version`, never the root (which the layers
    contract leaves out): the root stays a thin, lazy entry point."""
    graph = grimp.build_graph("fbt_probe")
    assert graph.find_modules_that_directly_import("fbt_probe") == set()


def test_the_cli_and_the_root_import_without_torch():
    """`fbt-probe --help` and `tasks list` must not pay for torch and transformer-lens (seconds)."""
    code = "import sys, fbt_probe, fbt_probe.cli, fbt_probe.errors; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def test_patch_help_names_every_registered_experiment():
    """The --experiment help is a literal (no torch import for --help); it must list the registry."""
    from fbt_probe.cli.patch import patch
    from fbt_probe.interventions.registry import EXPERIMENTS

    help_text = typing.get_type_hints(patch, include_extras=True)["experiment"].__metadata__[0].help
    names = help_text.split(";")[0]  # after ';': how several run in one command
    assert [e.strip(" .") for e in names.split("|")] == list(EXPERIMENTS)


def test_no_docstring_points_outside_the_repository():
    """The design lives in docs/; the package cites it there, never an external spec file."""
    cited = [str(p.relative_to(ROOT)) for p in (ROOT / "fbt_probe").rglob("*.py") if "DESIGN" in p.read_text()]
    assert cited == []
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    for p in (ROOT / "fbt_probe").rglob("*.py"):
        for ref in set(_doc_refs(p.read_text())):
            assert ref in pages, f"{p.relative_to(ROOT)} cites docs/{ref}, which does not exist"


def _doc_refs(text: str):
    i = text.find("docs/")
    while i >= 0:
        j = i + len("docs/")
        k = j
        while k < len(text) and (text[k].isalnum() or text[k] in "-_."):
            k += 1
        name = text[j:k].rstrip(".")
        if name.endswith(".md"):
            yield name
        i = text.find("docs/", k)
