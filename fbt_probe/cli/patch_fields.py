"""How the `PatchConfig` fields and each experiment's options appear on `fbt-probe patch`'s command
line: the options generated from the dataclasses (`cli.fromconfig`) and what differs from a field."""

from __future__ import annotations

from fbt_probe.cli.fromconfig import FLOATS, INTS, INTS_OR_ALL, NAMES, ConfigOptions, Flag, Text
from fbt_probe.interventions import PatchConfig
from fbt_probe.interventions.registry import EXPERIMENTS
from fbt_probe.modes import parse_modes

MODES = Text(lambda text: tuple(parse_modes(text)), "comma-separated modes", "<mode,...>", ",".join)
OPTIONS = ConfigOptions(
    {"": PatchConfig} | {name: e.options for name, e in EXPERIMENTS.items()},  # an experiment's help names it
    flags={
        "modes": Flag(("--mode", "--modes"), text=MODES),
        "lengths": Flag(text=INTS_OR_ALL),
        "depths": Flag(text=INTS_OR_ALL),
        "scales": Flag(text=FLOATS),
        "ks": Flag(text=INTS),
        "hooks": Flag(text=NAMES),
        "n_folds": Flag(("--folds",)),
    },
    exclude={
        "experiment": "--experiment names one or several",
        "options": "built from the experiment's own options",
        "ci": "the command line reports 95 % intervals",
    },
)
