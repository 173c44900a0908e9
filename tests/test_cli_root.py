"""The root command: `--version`, `-h` as `--help` on every command, and a help that does not
import torch (the distributed session is set up only under torchrun)."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fbt_probe._version import __version__
from fbt_probe.cli import COMMANDS, Group, app, load_command

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


TABLE = [(name, COMMANDS) for name in COMMANDS] + [
    (sub, entry.commands) for entry in COMMANDS.values() if isinstance(entry, Group) for sub in entry.commands
]


@pytest.mark.parametrize(("name", "table"), TABLE, ids=[n if t is COMMANDS else f"sub-{n}" for n, t in TABLE])
def test_each_listed_help_is_the_commands_own(name, table):
    """The table's one-line help is the loaded command's help, so a group's listing cannot drift."""
    assert table[name].help == load_command(name, table).get_short_help_str(10**6)


def _modules_after(args: list[str]) -> list[str]:
    """The fbt_probe.cli modules a fresh process has imported after running `fbt-probe ARGS`."""
    code = (
        f"import sys\nfrom fbt_probe.cli import main\nsys.argv = ['fbt-probe', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, sorted(m for m in sys.modules if m.startswith('fbt_probe.cli.')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_a_group_loads_only_the_sub_command_that_runs():
    assert _modules_after(["model", "--help"]) == "False []"
    assert _modules_after(["bench", "-h"]) == "False []"
    # `model refs` reads the shipped records: its own module, and neither torch nor a sibling's
    assert _modules_after(["model", "refs"]) == "False ['fbt_probe.cli.model', 'fbt_probe.cli.model.refs']"


def test_a_group_lists_its_table():
    res = runner.invoke(app, ["model", "--help"], terminal_width=200)
    listed = [line.split()[0] for line in res.output.split("Commands:")[1].splitlines() if line.strip()]
    assert res.exit_code == 0 and listed == list(COMMANDS["model"].commands)
    assert runner.invoke(app, ["bench", "no-such-benchmark"]).exit_code == 2


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


def test_the_commands_show_the_packages_own_warnings_as_one_note_line(capsys, monkeypatch):
    """`fbt-probe` (its `main`) prints a warning of the package as `note: MESSAGE`, one line, and
    leaves another library's warning as Python shows it."""
    import warnings

    import fbt_probe.cli as cli

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after the test
    monkeypatch.setattr(sys, "argv", ["fbt-probe", "--version"])
    with pytest.raises(SystemExit):
        cli.main()
    assert warnings.showwarning is cli._note
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = cli._note  # catch_warnings restores its own on exit
        warnings.warn_explicit("cell capped at 4 groups", UserWarning, "/x/fbt_probe/tasks/generators.py", 9)
        warnings.warn_explicit("deprecated thing", UserWarning, "/x/site-packages/other/mod.py", 3)
    err = capsys.readouterr().err
    assert err.startswith("note: cell capped at 4 groups\n") and "generators.py" not in err.splitlines()[0]
    assert "mod.py:3: UserWarning: deprecated thing" in err
