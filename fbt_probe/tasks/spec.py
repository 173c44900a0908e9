"""Task specifications: one declarative JSON file per task in the package's `fbt_probe/tasks/specs/` folder.

A spec names a `kind` (the generator and label interpreter: completion, memory, registers or compose) and
fills in its template lines, label words, length grid, group count and seed. The built-in files follow
the paper's appendix F (`fbt_probe/tasks/specs/README.md` lists every departure). Validation happens once, here,
with messages that name the file and the field; generators trust a `TaskSpec`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
from dataclasses import asdict, dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from fbt_probe.errors import FbtError

KINDS = ("completion", "memory", "registers", "compose")
BUILTIN = ("completion", "memory", "registers", "registers-count", "compose")
MAX_DISTRACTORS = 4096  # ~16k tokens: past any context a CPU model or the paper (1,350 tokens) uses
MAX_WRITES = 64
MAX_REGISTERS = 64
MAX_VALUE = 99  # numbers are single words of the task tokenizer up to 99
MAX_CONTEXT_UPDATES = 24
MAX_GROUPS = 100_000
MAX_STEPS = 256  # compose: dependent steps per sample (~1,550 tokens at six tokens a step)
MAX_POINTS = 10  # compose: the permuted set is 0..n-1, each point one number word
MAX_GENERATORS = 16  # compose: a step's generator index is one hex digit of the group id

# Template keys: name -> (one line or a list of lines, placeholders allowed, placeholders required once).
_TEMPLATE_FIELDS = {
    "completion": {
        "header": ("lines", {"R", "C", "S"}, {"R", "C", "S"}),
        "distractor": ("line", set(), set()),
        "query": ("line", set(), set()),
    },
    "memory": {
        "header": ("lines", {"B"}, {"B"}),
        "context": ("line", {"X"}, {"X"}),
        "distractor": ("line", set(), set()),
        "query": ("line", set(), set()),
    },
    "registers": {
        "write": ("line", {"i", "v"}, {"i", "v"}),
        "scratch": ("lines", {"S"}, {"S"}),
        "query": ("lines", {"i"}, {"i"}),
    },
    "compose": {
        "start": ("line", {"A"}, {"A"}),
        "step": ("line", {"g"}, {"g"}),
        "query": ("line", set(), set()),
    },
}
_COMMON = {"task", "kind", "description", "template", "label_words", "length_grid", "groups", "seed"}
_EXTRA = {
    "completion": {"relation", "value_range", "scratch_range"},
    "memory": {"answer", "context_updates"},
    "registers": {"registers", "assignments", "empty_updates", "scratch_range", "pad_to", "suffix_spans"},
    "compose": {"permutations", "accept", "step_lines", "inline_steps"},
}
_OPTIONAL = {"description", "registers", "assignments", "pad_to", "suffix_spans", "step_lines", "inline_steps"}
_STATEMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(=|\+=|-=|\^=)\s*(-?\d+)\s*$")
_RELATION = re.compile(r"^\s*([A-Za-z_]\w*)\s*(==|!=)\s*([A-Za-z_]\w*)\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class TaskSpec:
    """A validated task specification (see `fbt_probe/tasks/specs/README.md` for the file format)."""

    task: str  # dataset name: `<task>.parquet`, prefix of every group and context id
    kind: str  # which generator and label interpreter: completion | memory | registers | compose
    template: dict  # template lines of the task language with {placeholders}
    label_words: tuple  # (word for label 0, word for label 1)
    length_grid: tuple  # distractor lines (completion, memory), writes per register or register count (registers)
    groups: int  # structural groups: across the whole grid (completion, memory) or per cell (registers)
    seed: int
    description: str = ""
    relation: str | None = None  # completion: label 1 iff this holds ("completed == required")
    value_range: tuple | None = None  # completion: inclusive range of the compared counts a, b
    scratch_range: tuple | None = None  # completion, registers: inclusive range of the scratch value S
    answer: str | None = None  # memory: the variable whose initial value is the label
    context_updates: int | None = None  # memory: label-irrelevant `scratch ^= X` lines that form a group's context
    registers: int | None = None  # registers, overwrite sweep: m registers; the knob is writes per register
    assignments: int | None = None  # registers, count sweep: total writes; the knob is the register count m
    empty_updates: int | None = None  # registers: scratch lines (the first assigns S, the rest repeat the second)
    pad_to: int | str | None = None  # registers: None, "max" (longest sample) or an exact token length
    suffix_spans: dict | None = None  # registers: paper k -> the text span the last k inputs cover ({i}: register)
    permutations: tuple | None = None  # compose: the generators, each a permutation of 0..n-1 (image of each point)
    accept: tuple | None = None  # compose: label 1 iff the final point is one of these
    step_lines: int | None = None
    """compose: every sample has this many step lines, k of them (the knob) non-identity generators
    and the rest the spec's identity generator, so the text length does not change with k (None: k lines)."""
    inline_steps: bool | None = None
    """compose: the steps are written as words of one line, separated by spaces (the step template is
    one word: with the built-in tokenizer a generator index `{g}` is one token a step), not a line each."""
    source: str = field(default="", compare=False)  # file it was read from

    @property
    def knob_name(self) -> str:
        if self.kind == "compose":
            return "steps"
        if self.kind != "registers":
            return "distractors"
        return "registers" if self.assignments is not None else "writes_per_register"

    def registers_and_writes(self, knob: int) -> tuple[int, int]:
        """registers: (register count m, writes per register) of a length-grid value."""
        if self.assignments is not None:
            return knob, self.assignments // knob
        return self.registers, knob

    def replace(self, **changes) -> "TaskSpec":
        """A re-validated copy with some spec-file fields changed, e.g. `spec.replace(length_grid=[0, 8])`."""
        return spec_from_dict({**self.to_dict(), **changes}, source=f"{self.source or self.task} (modified)")

    def to_dict(self) -> dict:
        """The spec as a JSON object (what a spec file holds; `source` left out)."""
        d = asdict(self)
        d.pop("source")
        d["label_words"] = {"0": self.label_words[0], "1": self.label_words[1]}
        d["length_grid"] = list(self.length_grid)
        for key in ("value_range", "scratch_range", "accept"):
            d[key] = list(d[key]) if d[key] is not None else None
        if self.permutations is not None:
            d["permutations"] = [list(p) for p in self.permutations]
        return {k: v for k, v in d.items() if v is not None}


def builtin_tasks_dir() -> Traversable:
    """The package's own `fbt_probe/tasks/specs/` folder (package data: in the wheel, wherever it is installed)."""
    return resources.files("fbt_probe.tasks").joinpath("specs")


def builtin_spec_paths() -> dict[str, Traversable]:
    """Built-in task name -> its spec file, sorted by name."""
    folder = builtin_tasks_dir()
    if not folder.is_dir():
        return {}
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)
    return {f.name.removesuffix(".json"): f for f in files}


def load_spec(path_or_name) -> TaskSpec:
    """A spec from a file path, or a built-in name (`completion`, `memory`, `registers`,
    `registers-count`) resolved in the package's `fbt_probe/tasks/specs/` folder. A `TaskSpec` is
    returned unchanged."""
    if isinstance(path_or_name, TaskSpec):
        return path_or_name
    path = Path(path_or_name)
    if not path.is_file():
        specs = builtin_spec_paths()
        if str(path_or_name) not in specs:
            known = ", ".join(specs) or "none found in " + str(builtin_tasks_dir())
            raise FbtError(f"{path_or_name}: unknown task and no such spec file (built-in tasks: {known})")
        path = specs[str(path_or_name)]
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FbtError(f"{path}: not a valid JSON task spec ({exc})") from None
    return spec_from_dict(raw, source=str(path))


class _Bad:
    """Builds the one-line errors of a spec file: `<file>: field '<name>': expected ..., got ...`."""

    def __init__(self, where: str):
        self.where = where

    def __call__(self, fld: str, expected: str, got=None) -> FbtError:
        tail = "" if got is None else f", got {json.dumps(got) if not isinstance(got, str) else repr(got)}"
        return FbtError(f"{self.where}: field '{fld}': expected {expected}{tail}")


def spec_from_dict(raw: dict, source: str = "<spec>") -> TaskSpec:
    """Validate a spec object; every problem is an `FbtError` naming `source` and the field."""
    bad = _Bad(source)
    if not isinstance(raw, dict):
        raise FbtError(f"{source}: expected a JSON object with the task fields")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise bad("kind", "one of " + ", ".join(KINDS), kind)
    allowed = _COMMON | _EXTRA[kind]
    for key in raw:
        if key not in allowed and not key.startswith("_"):
            raise bad(key, f"no such field for kind {kind} (fields: {', '.join(sorted(allowed))})")
    for key in sorted(allowed - _OPTIONAL):
        if key not in raw:
            raise bad(key, "a value (field is missing)")
    task = raw["task"]
    if not isinstance(task, str) or not _NAME.match(task):
        raise bad("task", "a lower-case name of letters, digits, - and _ (used as the file name)", task)
    template = _check_template(raw["template"], kind, bad)
    words = raw["label_words"]
    if not isinstance(words, dict) or set(words) != {"0", "1"}:
        raise bad("label_words", 'an object {"0": word, "1": word}', words)
    if (
        not all(isinstance(w, str) and re.fullmatch(r"[A-Za-z_]+", w) for w in words.values())
        or words["0"] == words["1"]
    ):
        raise bad("label_words", "two different single words of letters and _", words)
    extra = _EXTRA_CHECKS[kind](raw, template, bad)
    spec = TaskSpec(
        task=task,
        kind=kind,
        template=template,
        label_words=(words["0"], words["1"]),
        length_grid=(),
        groups=_int(raw, "groups", bad, 1, MAX_GROUPS),
        seed=_int(raw, "seed", bad, 0, 2**31 - 1),
        description=str(raw.get("description", "")),
        source=source,
        **extra,
    )
    grid = raw["length_grid"]
    if not isinstance(grid, list) or not grid:
        raise bad("length_grid", "a non-empty list of integers", grid)
    for i, k in enumerate(grid):
        check_knob(spec, k, where=f"{source}: field 'length_grid[{i}]'")
    if len(set(grid)) != len(grid):
        raise bad("length_grid", "distinct values", grid)
    return _replace_grid(spec, tuple(grid))


def _replace_grid(spec: TaskSpec, grid: tuple) -> TaskSpec:
    return dataclasses.replace(spec, length_grid=grid)


def _int(raw, key, bad, lo: int, hi: int) -> int:
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(key, f"an integer {lo}..{hi}", v)
    return v


def _range(raw, key, bad, width: int | None = None) -> tuple:
    vr = raw[key]
    ok = (
        isinstance(vr, list)
        and len(vr) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in vr)
        and 0 <= vr[0] <= vr[1] <= MAX_VALUE
    )
    if not ok or (width is not None and vr[1] - vr[0] + 1 < width):
        need = "" if width is None else f" holding at least {width} values"
        raise bad(key, f"[low, high] with 0 <= low <= high <= {MAX_VALUE}{need}", vr)
    return tuple(vr)


def check_knob(spec: TaskSpec, knob, where: str = "length_grid") -> int:
    """A length-grid value that the spec's generator can produce, else FbtError."""
    if spec.kind == "compose":
        lo, hi, what = 1, spec.step_lines or MAX_STEPS, "number of dependent steps"
    elif spec.kind != "registers":
        lo, hi, what = 0, MAX_DISTRACTORS, "distractor count"
    elif spec.assignments is None:
        lo, hi, what = 1, MAX_WRITES, "writes per register"
    else:
        lo, hi, what = (
            1,
            min(MAX_REGISTERS, spec.assignments),
            f"register count dividing {spec.assignments} assignments",
        )
    if (
        isinstance(knob, bool)
        or not isinstance(knob, int)
        or not lo <= knob <= hi
        or (spec.assignments is not None and spec.assignments % knob)
    ):
        raise FbtError(f"{where}: {knob!r} is not a {what} that can be produced (expected an integer {lo}..{hi})")
    return knob


def placeholders(text: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise FbtError(f"template {text!r}: {exc}") from None


def _check_template(tpl, kind, bad) -> dict:
    fields = _TEMPLATE_FIELDS[kind]
    if not isinstance(tpl, dict) or set(tpl) != set(fields):
        raise bad("template", "an object with keys " + ", ".join(fields), tpl)
    for key, (shape, allowed, required) in fields.items():
        lines = tpl[key] if shape == "lines" else [tpl[key]]
        if (
            not isinstance(lines, list)
            or not lines
            or not all(isinstance(s, str) and s.strip() and "\n" not in s for s in lines)
        ):
            what = "a non-empty list of one-line strings" if shape == "lines" else "a non-empty one-line string"
            raise bad(f"template.{key}", what, tpl[key])
        seen: list[str] = []
        for line in lines:
            try:
                names = placeholders(line)
            except FbtError as exc:
                raise bad(f"template.{key}", "a valid {placeholder} string", str(exc)) from None
            if set(names) - allowed or any(not n for n in names):
                expected = "placeholders among {" + ", ".join(sorted(allowed)) + "}" if allowed else "no placeholders"
                raise bad(f"template.{key}", expected, line)
            seen += names
        for name in sorted(required):
            if seen.count(name) != 1:
                raise bad(f"template.{key}", f"placeholder {{{name}}} exactly once", tpl[key])
    last = tpl["query"][-1] if isinstance(tpl["query"], list) else tpl["query"]
    if not last.rstrip().endswith(":") or placeholders(last):
        raise bad(
            "template.query",
            "a last line without placeholders ending with ':' (every sample ends with the same colon)",
            tpl["query"],
        )
    return {k: (list(v) if isinstance(v, list) else v) for k, v in tpl.items()}


def parse_statement(line: str):
    """`name op int` -> (name, op, value), or None when the line is not a statement."""
    m = _STATEMENT.match(line)
    return (m.group(1), m.group(2), int(m.group(3))) if m else None


def _assigned(line: str, values: dict, bad, key: str, ops=("=",)) -> str:
    st = parse_statement(line.format(**values))
    if st is None or st[1] not in ops:
        raise bad(key, f"a statement 'name {' / name '.join(ops)} value'", line)
    return st[0]


def _completion_extra(raw, tpl, bad) -> dict:
    vr = _range(raw, "value_range", bad, width=2)
    sr = _range(raw, "scratch_range", bad)
    owner = {}
    for line in tpl["header"]:
        var = _assigned(line, {"R": vr[0], "C": vr[0], "S": sr[0]}, bad, "template.header")
        owner.update({p: var for p in placeholders(line)})
    if len({owner["R"], owner["C"], owner["S"]}) != 3:
        raise bad("template.header", "{R}, {C} and {S} assigned to three different variables", tpl["header"])
    m = _RELATION.match(raw["relation"]) if isinstance(raw["relation"], str) else None
    if not m or {m.group(1), m.group(3)} != {owner["R"], owner["C"]}:
        raise bad(
            "relation",
            f"'{owner['C']} == {owner['R']}' or '{owner['C']} != {owner['R']}' (every group holds the "
            "assignments (a,a), (a,b), (b,a), (b,b): only == and != give each pair two labels)",
            raw["relation"],
        )
    if _assigned(tpl["distractor"], {}, bad, "template.distractor", ("=", "+=", "-=", "^=")) in (
        owner["R"],
        owner["C"],
    ):
        raise bad("template.distractor", "a statement that does not change the compared variables", tpl["distractor"])
    return {"relation": raw["relation"].strip(), "value_range": vr, "scratch_range": sr}


def _memory_extra(raw, tpl, bad) -> dict:
    ans, var = raw["answer"], None
    for line in tpl["header"]:
        v = _assigned(line, {"B": 0}, bad, "template.header")
        if "B" in placeholders(line):
            var = v
    if ans != var:
        raise bad("answer", f"the variable assigned {{B}} in template.header ({var})", ans)
    for key, values in (("context", {"X": 0}), ("distractor", {})):
        if _assigned(tpl[key], values, bad, f"template.{key}", ("=", "+=", "-=", "^=")) == ans:
            raise bad(f"template.{key}", f"a statement that does not change {ans}", tpl[key])
    return {"answer": ans, "context_updates": _int(raw, "context_updates", bad, 1, MAX_CONTEXT_UPDATES)}


def _registers_extra(raw, tpl, bad) -> dict:
    has_m, has_n = raw.get("registers") is not None, raw.get("assignments") is not None
    if has_m == has_n:
        raise bad(
            "registers",
            "exactly one of 'registers' (overwrite sweep: the knob is writes per register) and "
            "'assignments' (count sweep: the knob is the register count)",
            raw.get("registers"),
        )
    m = _int(raw, "registers", bad, 1, MAX_REGISTERS) if has_m else None
    n = _int(raw, "assignments", bad, 1, MAX_REGISTERS * MAX_WRITES) if has_n else None
    _assigned(tpl["write"], {"i": 0, "v": 0}, bad, "template.write")
    sr = _range(raw, "scratch_range", bad)
    scratch = tpl["scratch"]
    if len(scratch) != 2 or "S" not in placeholders(scratch[0]) or placeholders(scratch[1]):
        raise bad(
            "template.scratch", "two lines: the first assigns {S}, the second (no placeholder) is repeated", scratch
        )
    _assigned(scratch[0], {"S": sr[0]}, bad, "template.scratch")
    _assigned(scratch[1], {}, bad, "template.scratch", ("=", "+=", "-=", "^="))
    empty = _int(raw, "empty_updates", bad, 1, MAX_DISTRACTORS)
    pad = raw.get("pad_to")
    if pad is not None and pad != "max" and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 1):
        raise bad("pad_to", 'null, "max" or a positive token length', pad)
    spans = raw.get("suffix_spans")
    if spans is not None:
        if (
            not isinstance(spans, dict)
            or not spans
            or not all(
                isinstance(k, str) and k.isdigit() and int(k) >= 1 and isinstance(v, str) and v
                for k, v in spans.items()
            )
        ):
            raise bad(
                "suffix_spans",
                'an object {"k": "text the last k inputs cover", ...} ({i}: the queried register)',
                spans,
            )
        spans = dict(sorted(spans.items(), key=lambda kv: int(kv[0])))
    return {
        "registers": m,
        "assignments": n,
        "empty_updates": empty,
        "scratch_range": sr,
        "pad_to": pad,
        "suffix_spans": spans,
    }


def _compose_extra(raw, tpl, bad) -> dict:
    _assigned(tpl["start"], {"A": 0}, bad, "template.start")
    perms = raw["permutations"]
    ok = (
        isinstance(perms, list)
        and 2 <= len(perms) <= MAX_GENERATORS
        and all(isinstance(p, list) and all(type(x) is int for x in p) for p in perms)  # 1.0 is no point
    )
    n = len(perms[0]) if ok and perms[0] else 0
    ok = ok and 2 <= n <= MAX_POINTS and all(sorted(p) == list(range(n)) and len(p) == n for p in perms)
    if not ok or len({tuple(p) for p in perms}) != len(perms):
        raise bad(
            "permutations",
            f"2..{MAX_GENERATORS} distinct permutations of one set 0..n-1 (n = 2..{MAX_POINTS}), "
            "each the list of the images of 0..n-1",
            perms,
        )
    if all(compose_steps(p, q) == compose_steps(q, p) for p in perms for q in perms):
        raise bad("permutations", "two generators that do not commute (commuting steps can be counted, not composed)")
    acc = raw["accept"]
    if (
        not isinstance(acc, list)
        or not all(isinstance(a, int) and not isinstance(a, bool) and 0 <= a < n for a in acc)
        or len(set(acc)) != len(acc)
        or not 0 < len(acc) < n
    ):
        raise bad("accept", f"distinct points of 0..{n - 1}, at least one and not all", acc)
    lines = raw.get("step_lines")
    if lines is not None:
        ident = [p for p in perms if p == list(range(n))]
        if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= MAX_STEPS or len(ident) != 1:
            raise bad(
                "step_lines",
                f"an integer 1..{MAX_STEPS} (step lines per sample), with exactly one identity permutation "
                "among the generators to fill the lines that are not dependent steps",
                lines,
            )
    inline = raw.get("inline_steps")
    if inline is not None and not isinstance(inline, bool):
        raise bad("inline_steps", "true (the steps are words of one line) or false (a line each)", inline)
    if inline and any(c.isspace() for c in tpl["step"]):
        raise bad(
            "template.step", "one word without spaces (inline_steps writes the steps as words of one line)", tpl["step"]
        )
    return {
        "permutations": tuple(tuple(p) for p in perms),
        "accept": tuple(sorted(acc)),
        "step_lines": lines,
        "inline_steps": inline or None,
    }


def identity_generator(spec: TaskSpec) -> int | None:
    """compose with `step_lines`: the index of the identity generator (the filler line)."""
    if spec.step_lines is None:
        return None
    n = len(spec.permutations[0])
    return next(i for i, p in enumerate(spec.permutations) if p == tuple(range(n)))


def compose_steps(*perms) -> tuple:
    """The permutation that applies `perms` in order (each the tuple of the images of 0..n-1)."""
    out = tuple(range(len(perms[0])))
    for p in perms:
        out = tuple(p[x] for x in out)
    return out


_EXTRA_CHECKS = {
    "completion": _completion_extra,
    "memory": _memory_extra,
    "registers": _registers_extra,
    "compose": _compose_extra,
}


def relation_owner(spec: TaskSpec) -> dict:
    """completion: placeholder -> variable name it is assigned to in the header."""
    owner = {}
    for line in spec.template["header"]:
        name = parse_statement(line.format(R=0, C=0, S=0))[0]
        owner.update({p: name for p in placeholders(line)})
    return owner


def completion_truth(spec: TaskSpec, r: int, c: int) -> bool:
    """Generator side of the relation: does `spec.relation` hold for required=r, completed=c?"""
    left, op, right = _RELATION.match(spec.relation).groups()
    val = {relation_owner(spec)["R"]: r, relation_owner(spec)["C"]: c}
    return (val[left] == val[right]) == (op == "==")


def list_specs() -> list[TaskSpec]:
    return [load_spec(p) for p in builtin_spec_paths().values()]
