"""The options of `train` and `patch` are generated from their config dataclasses (`cli.fromconfig`):
each exposed field's option has the field's default and, as help, its attribute docstring, and no
knob is declared both in a dataclass and in a command."""

import dataclasses
from dataclasses import dataclass

import pytest

from fbt_probe.cli import load_command
from fbt_probe.cli.fromconfig import ConfigOptions, attribute_docs, summary
from fbt_probe.cli.patch_fields import OPTIONS as PATCH
from fbt_probe.cli.train_fields import OPTIONS as TRAIN
from fbt_probe.training import parse_schedule

COMMANDS = {"train": TRAIN, "patch": PATCH}
# an option default that names the field's default in another form, and how both normalise
EQUIVALENT = {("train", "schedule"): lambda v: str(parse_schedule(v))}


def _params(name: str) -> dict:
    return {p.name: p for p in load_command(name).params}


def _cases():
    for command, options in COMMANDS.items():
        for field in options.options:
            yield pytest.param(command, field, id=f"{command}-{field}")


@pytest.mark.parametrize(("command", "field"), list(_cases()))
def test_an_option_has_its_fields_default_and_docstring(command, field):
    options = COMMANDS[command]
    g, param = options.options[field], _params(command)[field]
    helps = [
        f"{label}: {summary(attribute_docs(cls)[field])}" if label else summary(attribute_docs(cls)[field])
        for label, cls in options.sources.items()
        if field in {f.name for f in dataclasses.fields(cls)}
    ]
    doc = " ".join(helps)
    if g.flag.unset:  # None: not given; the help names what applies then
        shown = g.flag.unset if isinstance(g.flag.unset, str) else (g.flag.text.show if g.flag.text else str)(g.default)
        assert param.default is None and param.help == f"{doc} (default: {shown})"
        return
    assert param.help == doc
    normal = EQUIVALENT.get((command, field))
    if normal is not None:
        assert normal(param.default) == normal(g.default)
    else:
        assert g.flag.default is None, f"{field}: a default of its own needs an entry in EQUIVALENT"
        assert g.value(param.default) == g.default


@pytest.mark.parametrize("command", COMMANDS)
def test_a_knob_is_declared_once(command):
    """The generated options are the dataclasses' fields less the declared exclusions, and an option
    the command declares itself is no field unless excluded (with its reason)."""
    options = COMMANDS[command]
    fields = {f.name for cls in options.sources.values() for f in dataclasses.fields(cls)}
    assert set(options.options) == fields - set(options.exclude)
    own = set(_params(command)) - set(options.options)
    assert own & fields <= set(options.exclude), own & fields
    assert all(isinstance(why, str) and why for why in options.exclude.values())


@dataclass(frozen=True)
class _Toy:
    plain: int = 1
    """One line."""
    long: str = "x"
    """First paragraph,
    on two lines.

    The rest stays out of the help."""
    bare: float = 0.5  # a comment is no docstring


@dataclass(frozen=True)
class _Other:
    plain: int = 2
    """Another default."""


def test_the_attribute_docstrings_and_what_is_refused():
    docs = attribute_docs(_Toy)
    assert set(docs) == {"plain", "long"} and summary(docs["long"]) == "First paragraph, on two lines."
    with pytest.raises(TypeError, match="bare: an option needs an attribute docstring"):
        ConfigOptions({"": _Toy})
    assert set(ConfigOptions({"": _Toy}, exclude={"bare": "why"}).options) == {"plain", "long"}
    with pytest.raises(TypeError, match="another type or default"):  # one knob, two declarations
        ConfigOptions({"a": _Toy, "b": _Other}, exclude={"bare": "why"})
    with pytest.raises(TypeError, match="name no option"):
        ConfigOptions({"": _Other}, exclude={"gone": "why"})
