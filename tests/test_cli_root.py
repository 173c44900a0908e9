"""The root command: `--version`, `-h` as `--help` on every command, and a help that does not
import torch (the distributed session is set up only under torchrun)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fbt_probe._version import __version__
from fbt_probe.cli import app

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"fbt-probe {__version__}\n"


@pytest.mark.parametrize("args", [[], ["tasks"], ["train"], ["reproduce"], ["model", "refs"]])
def test_short_help_is_the_long_help(args):
    short, long = runner.invoke(app, [*args, "-h"]), runner.invoke(app, [*args, "--help"])
    assert short.exit_code == long.exit_code == 0 and short.output == long.output and short.output.startswith("Usage: ")


def test_help_imports_no_torch():
    code = (
        "import sys\nfrom fbt_probe.cli import main\nsys.argv = ['fbt-probe', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "False"


def test_examples_in_help_are_kept_as_blocks():
    res = runner.invoke(app, ["tasks", "generate", "--help"], terminal_width=80)
    assert (
        "  Example: fbt-probe tasks generate completion memory registers registers-count --out data/tasks\n"
        in res.output
    )


@pytest.mark.parametrize("cmd", [["extract"], ["patch"], ["lens"]])
def test_mode_and_modes_name_the_same_option(cmd):
    res = runner.invoke(app, [*cmd, "--help"], terminal_width=200)
    assert res.exit_code == 0 and ("--mode, --modes" in res.output or "--modes, --mode" in res.output), res.output


def test_train_help_counts_four_tasks():
    assert "on the four tasks" in runner.invoke(app, ["train", "--help"], terminal_width=200).output
