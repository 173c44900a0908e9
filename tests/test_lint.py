"""The code (the package, the tests and the manual's notebooks) is linted and formatted by ruff
with the settings in pyproject.toml ([tool.ruff])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True)


def test_ruff_check_passes():
    r = _ruff("check", "fbt_probe", "tests", "docs/notebooks", "--output-format", "concise")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    r = _ruff("format", "--check", "fbt_probe", "tests", "docs/notebooks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_checks_can_fail(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\nx = {'a':1}\n")
    assert _ruff("check", "bad.py", cwd=tmp_path).returncode == 1  # F401: os unused
    assert _ruff("format", "--check", "bad.py", cwd=tmp_path).returncode == 1  # quotes and spacing
