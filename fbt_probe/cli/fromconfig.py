"""Typer options generated from config dataclasses, so a knob is declared once: in its dataclass.

Each field becomes `--field-name` with the field's type and default, and as help the first paragraph
of its attribute docstring (the string literal right after the field). A `Flag` says what differs on
the command line: other names, a field read from text (`Text`: tuples, dicts), a default of None that
means "not given" (a recipe or the dataclass decides), a hidden option. `ConfigOptions.command` adds
the options to a command function, which receives their values as dicts.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Annotated, Callable

import typer

from fbt_probe.errors import FbtError


def _commas(value) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)


@dataclass(frozen=True)
class Text:
    """A field given as text on the command line: how to read it and what it expects."""

    read: Callable[[str], object]
    """text -> the field's value; a ValueError is refused as `--flag 'text': expected <expects>`."""
    expects: str
    """The form the text takes, in words (the error message)."""
    metavar: str
    """The form the text takes, in the help."""
    show: Callable[[object], str] = _commas
    """The field's default as text (the option's default)."""

    def parse(self, raw: str | None, flag: str):
        """The value of option `flag`'s text `raw` (None stays None)."""
        if raw is None:
            return None
        try:
            return self.read(raw)
        except ValueError:
            raise FbtError(f"{flag} '{raw}': expected {self.expects}") from None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",") if s.strip())


def _names(text: str) -> tuple[str, ...] | None:
    return tuple(s.strip() for s in text.split(",") if s.strip()) or None


INTS = Text(_ints, "comma-separated integers", "<int,...>")
INTS_OR_ALL = Text(
    lambda t: None if t.strip().lower() == "all" else _ints(t), "comma-separated integers or 'all'", "<int,...|all>"
)
FLOATS = Text(lambda t: tuple(float(s) for s in t.split(",") if s.strip()), "comma-separated numbers", "<number,...>")
NAMES = Text(_names, "comma-separated names", "<name,...>")


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line, where it differs from the field itself."""

    decls: tuple[str, ...] = ()
    """The option's names (default `--field-name`; a bool also gets `--no-field-name`)."""
    text: Text | None = None
    """The field is given as text and read by this (tuple and dict fields)."""
    unset: bool | str = False
    """The option defaults to None, "not given"; the help names what applies then: the field's
    default (True) or this text."""
    default: object = None
    """The option's default where it names the field's default in another form (e.g. 'paper')."""
    hidden: bool = False
    """Left out of the help."""


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> its attribute docstring (the string literal right after the field), cleaned."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    docs = {}
    for node, after in zip(tree.body, tree.body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                if isinstance(after.value.value, str):
                    docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def summary(doc: str) -> str:
    """The help of a docstring: its first paragraph on one line."""
    return " ".join(doc.split("\n\n")[0].split())


@dataclass(frozen=True)
class Generated:
    """One generated option: the field it sets, its flag, its default and help."""

    field: str
    annotation: object
    default: object
    help: str
    flag: Flag

    @property
    def name(self) -> str:
        """The option's first name."""
        return (self.flag.decls or (f"--{self.field.replace('_', '-')}",))[0]

    def value(self, raw):
        """The field's value from the option's value (text read by the flag's `Text`)."""
        return raw if self.flag.text is None or not isinstance(raw, str) else self.flag.text.parse(raw, self.name)


class ConfigOptions:
    """The options of the fields of `sources` (label -> dataclass; a labelled field's help starts with
    its label, a field several dataclasses declare has each one's help), less `exclude` (field ->
    why the command line does not set it), as `flags` say."""

    def __init__(self, sources: dict[str, type], flags: dict[str, Flag] | None = None, exclude=None):
        self.sources, self.flags, self.exclude = sources, flags or {}, exclude or {}
        self.options: dict[str, Generated] = {}
        helps: dict[str, list[str]] = {}
        for label, cls in sources.items():
            docs, hints = attribute_docs(cls), typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if f.name in self.exclude:
                    continue
                if f.name not in docs:
                    raise TypeError(f"{cls.__name__}.{f.name}: an option needs an attribute docstring")
                helps.setdefault(f.name, []).append(
                    f"{label}: {summary(docs[f.name])}" if label else summary(docs[f.name])
                )
                known = self.options.get(f.name)
                if known is not None and (known.annotation, known.default) != (hints[f.name], f.default):
                    raise TypeError(
                        f"{cls.__name__}.{f.name}: another dataclass declares it with another type or default"
                    )
                self.options[f.name] = Generated(f.name, hints[f.name], f.default, "", self.flags.get(f.name, Flag()))
        fields = {f.name for cls in sources.values() for f in dataclasses.fields(cls)}
        stale = (set(self.flags) - set(self.options)) | (set(self.exclude) - fields)
        if stale:
            raise TypeError(f"flags or exclusions name no option: {sorted(stale)}")
        for name, g in self.options.items():
            note = g.flag.unset if isinstance(g.flag.unset, str) else _show(g)
            text = " ".join(helps[name]) + (f" (default: {note})" if g.flag.unset else "")
            self.options[name] = dataclasses.replace(g, help=text)

    def parameter(self, g: Generated) -> inspect.Parameter:
        """The typer parameter of option `g`."""
        flag = g.flag
        default = None if flag.unset else _show(g) if flag.default is None else flag.default
        kind = g.annotation if flag.text is None else str
        if default is None and type(None) not in typing.get_args(kind):
            kind = kind | None
        info = typer.Option(*flag.decls, help=g.help, hidden=flag.hidden, metavar=flag.text and flag.text.metavar)
        return inspect.Parameter(
            g.field, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
        )

    def command(self, func: Callable) -> Callable:
        """`func` with the generated options after its own parameters. It receives `given` (the values
        of the options the command line named) and `defaults` (the others' values but None), each
        field -> value, where its signature asks for them."""
        own = inspect.signature(func, eval_str=True).parameters
        mine = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in own.items() if n not in ("given", "defaults")
        ]
        ctx_name = next((p.name for p in mine if p.annotation is typer.Context), None)
        if ctx_name is None:
            ctx_name = "config_ctx"
            mine.insert(0, inspect.Parameter(ctx_name, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        params = mine + [self.parameter(g) for g in self.options.values()]

        @functools.wraps(func)
        def wrapper(**kwargs):
            ctx = kwargs[ctx_name] if ctx_name in own else kwargs.pop(ctx_name)
            given, defaults = {}, {}
            for name, g in self.options.items():
                value = g.value(kwargs.pop(name))
                source = ctx.get_parameter_source(name)
                if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
                    given[name] = value
                elif value is not None:
                    defaults[name] = value
            passed = {"given": given, "defaults": defaults}
            return func(**kwargs, **{k: v for k, v in passed.items() if k in own})

        wrapper.__signature__ = inspect.Signature(params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper


def _show(g: Generated):
    """Option `g`'s field default as the command line gives it."""
    if g.default is dataclasses.MISSING or g.default is None or g.flag.text is None:
        return None if g.default is dataclasses.MISSING else g.default
    return g.flag.text.show(g.default)
