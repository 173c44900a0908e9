"""The root command: `--version`, `-h` as `--help` on every command, and a help that does not
import torch (the distributed session is set up only under torchrun)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fbt_probe._version import __version__
from fbt_probe.cli import COMMANDS, app, load_command

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"fbt-probe {__version__}\n"


@pytest.mark.parametrize("args", [[], ["tasks"], ["train"], ["reproduce"], ["model", "refs"]])
def test_short_help_is_the_long_help(args):
    short, long = runner.invoke(app, [*args, "-h"]), runner.invoke(app, [*args, "--help"])
    assert short.exit_code == long.exit_code == 0 and short.output == long.output and short.output.startswith("Usage: ")


def test_help_imports_no_torch_and_no_command_module():
    code = (
        "import sys\nfrom fbt_probe.cli import main\nsys.argv = ['fbt-probe', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('fbt_probe.cli.')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "False []"
    assert all(name in res.stdout for name in COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_root_help_lists_each_commands_own_help(name):
    """The table's one-line help is the loaded command's help, so the root listing cannot drift."""
    assert COMMANDS[name][1] == load_command(name).get_short_help_str(10**6)


def test_a_command_runs_through_the_lazy_group():
    res = runner.invoke(app, ["tasks", "list"])
    assert res.exit_code == 0 and "completion" in res.output, res.output
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2


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
