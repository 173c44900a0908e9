"""Task specifications: one declarative JSON file per task in the top-level `tasks/` folder.

A spec names a `kind` (the generator/format: completion, memory or registers) and fills in its
template pieces, label words, relation, length grid, pairs per cell and seed. Validation happens
once, here, with messages that name the file and the field; generators trust a `TaskSpec`.
"""
from __future__ import annotations

import json
import re
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fbt_probe.errors import FbtError

KINDS = ("completion", "memory", "registers")
BUILTIN = ("completion", "memory", "registers")
KNOB_NAMES = {"completion": "distractors", "memory": "distractors", "registers": "writes_per_register"}
MAX_DISTRACTORS = 4096  # ~16k tokens: past any context a CPU model or the paper (1,350 tokens) uses
MAX_WRITES = 64
MAX_REGISTERS = 64
MAX_VALUE = 999  # completion values: each is a word of the tokenizer, and the relation is checked on every (R, C)

# Template keys and the placeholders each may use: name -> (allowed, required exactly once).
_TEMPLATE_FIELDS = {
    "completion": {"header": ({"R", "C", "S"}, {"R", "C", "S"}), "distractor": (set(), set()), "query": (set(), set())},
    "memory": {"header": ({"B"}, {"B"}), "distractor": ({"X"}, set()), "query": (set(), set())},
    "registers": {"write": ({"i", "v"}, {"i", "v"}), "query": ({"i"}, {"i"})},
}
_COMMON = {"task", "kind", "description", "template", "label_words", "length_grid", "pairs_per_cell", "seed"}
_EXTRA = {"completion": {"relation", "value_range"}, "memory": {"answer"}, "registers": {"registers"}}
_STATEMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*(=|\+=|-=|\^=)\s*(-?\d+)\s*$")
_RELATION = re.compile(r"^\s*([A-Za-z_]\w*)\s*(==|!=|<=|>=|<|>)\s*([A-Za-z_]\w*)\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class TaskSpec:
    """A validated task specification (see `tasks/README.md` for the file format)."""

    task: str  # dataset name: `<task>.parquet`, prefix of every group id
    kind: str  # which generator and label interpreter: completion | memory | registers
    template: dict  # template pieces (lines of the task language with {placeholders})
    label_words: tuple  # (word for label 0, word for label 1)
    length_grid: tuple  # distractor counts (completion, memory) or writes per register (registers)
    pairs_per_cell: int  # minimal pairs per length-grid value
    seed: int
    description: str = ""
    relation: str | None = None  # completion: label 1 iff this holds, e.g. "completed == required"
    value_range: tuple | None = None  # completion: inclusive range of R, C and S
    answer: str | None = None  # memory: the variable whose value is the label
    registers: int | None = None  # registers: number of binary registers
    source: str = field(default="", compare=False)  # file it was read from

    @property
    def knob_name(self) -> str:
        return KNOB_NAMES[self.kind]

    def replace(self, **changes) -> "TaskSpec":
        """A re-validated copy with some spec-file fields changed, e.g. `spec.replace(length_grid=[0, 8])`."""
        return spec_from_dict({**self.to_dict(), **changes}, source=f"{self.source or self.task} (modified)")

    def to_dict(self) -> dict:
        """The spec as a JSON object (what a spec file holds; `source` left out)."""
        d = asdict(self)
        d.pop("source")
        d["label_words"] = {"0": self.label_words[0], "1": self.label_words[1]}
        d["length_grid"] = list(self.length_grid)
        d["value_range"] = list(self.value_range) if self.value_range else None
        return {k: v for k, v in d.items() if v is not None}


def repo_tasks_dir() -> Path:
    """The top-level `tasks/` folder of the source tree this package is installed from (editable)."""
    return Path(__file__).resolve().parents[2] / "tasks"


def builtin_spec_paths() -> dict[str, Path]:
    folder = repo_tasks_dir()
    return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def load_spec(path_or_name) -> TaskSpec:
    """A spec from a file path, or a built-in name (`completion`, `memory`, `registers`) resolved in
    the repository's top-level `tasks/` folder. A `TaskSpec` is returned unchanged."""
    if isinstance(path_or_name, TaskSpec):
        return path_or_name
    path = Path(path_or_name)
    if not path.is_file():
        specs = builtin_spec_paths()
        if str(path_or_name) not in specs:
            known = ", ".join(specs) or "none found in " + str(repo_tasks_dir())
            raise FbtError(f"{path_or_name}: unknown task and no such spec file (built-in tasks: {known})")
        path = specs[str(path_or_name)]
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FbtError(f"{path}: not a valid JSON task spec ({exc})") from None
    return spec_from_dict(raw, source=str(path))


def spec_from_dict(raw: dict, source: str = "<spec>") -> TaskSpec:
    """Validate a spec object; every problem is an `FbtError` naming `source` and the field."""
    where = source

    def bad(fld: str, expected: str, got=None) -> FbtError:
        tail = "" if got is None else f", got {json.dumps(got) if not isinstance(got, str) else repr(got)}"
        return FbtError(f"{where}: field '{fld}': expected {expected}{tail}")

    bad.where = where

    if not isinstance(raw, dict):
        raise FbtError(f"{where}: expected a JSON object with the task fields")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise bad("kind", "one of " + ", ".join(KINDS), kind)
    allowed = _COMMON | _EXTRA[kind]
    for key in raw:
        if key not in allowed and not key.startswith("_"):
            raise bad(key, f"no such field for kind {kind} (fields: {', '.join(sorted(allowed))})")
    for key in sorted(allowed - {"description"}):
        if key not in raw:
            raise bad(key, "a value (field is missing)")
    task = raw["task"]
    if not isinstance(task, str) or not _NAME.match(task):
        raise bad("task", "a lower-case name of letters, digits and _ (used as the file name)", task)
    template = _check_template(raw["template"], kind, bad)
    words = raw["label_words"]
    if not isinstance(words, dict) or set(words) != {"0", "1"}:
        raise bad("label_words", 'an object {"0": word, "1": word}', words)
    if not all(isinstance(w, str) and re.fullmatch(r"[A-Za-z_]\w*", w) for w in words.values()) or words["0"] == words["1"]:
        raise bad("label_words", "two different single words (letters, digits, _)", words)
    spec = TaskSpec(
        task=task, kind=kind, template=template, label_words=(words["0"], words["1"]),
        length_grid=_check_grid(raw["length_grid"], kind, bad), pairs_per_cell=_pos_int(raw, "pairs_per_cell", bad),
        seed=_nonneg_int(raw, "seed", bad), description=str(raw.get("description", "")), source=source,
        **_check_extra(raw, kind, template, bad),
    )
    return spec


def _pos_int(raw, key, bad) -> int:
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise bad(key, "an integer >= 1", v)
    return v


def _nonneg_int(raw, key, bad) -> int:
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise bad(key, "an integer >= 0", v)
    return v


def check_knob(kind: str, knob, where: str = "length_grid") -> int:
    """A length-grid value that the generator can produce, else FbtError."""
    lo, hi, what = (1, MAX_WRITES, "writes per register") if kind == "registers" else (0, MAX_DISTRACTORS, "distractor count")
    if isinstance(knob, bool) or not isinstance(knob, int) or not lo <= knob <= hi:
        raise FbtError(f"{where}: {knob!r} is not a {what} that can be produced (expected an integer {lo}..{hi})")
    return knob


def _check_grid(grid, kind, bad) -> tuple:
    if not isinstance(grid, list) or not grid:
        raise bad("length_grid", "a non-empty list of integers", grid)
    for i, k in enumerate(grid):
        check_knob(kind, k, where=f"{bad.where}: field 'length_grid[{i}]'")
    if len(set(grid)) != len(grid):
        raise bad("length_grid", "distinct values", grid)
    return tuple(grid)


def placeholders(text: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as exc:
        raise FbtError(f"template {text!r}: {exc}") from None


def _check_template(tpl, kind, bad) -> dict:
    fields = _TEMPLATE_FIELDS[kind]
    if not isinstance(tpl, dict) or set(tpl) != set(fields):
        raise bad("template", "an object with keys " + ", ".join(fields), tpl)
    seen: list[str] = []
    for key, (allowed, _) in fields.items():
        lines = tpl[key] if key == "header" else [tpl[key]]
        if not isinstance(lines, list) or not all(isinstance(s, str) and s.strip() and "\n" not in s for s in lines):
            raise bad(f"template.{key}", "non-empty one-line strings" if key == "header" else "a non-empty one-line string", tpl[key])
        for line in lines:
            try:
                names = placeholders(line)
            except FbtError as exc:
                raise bad(f"template.{key}", "a valid {placeholder} string", str(exc)) from None
            if set(names) - allowed or any(not n for n in names):
                raise bad(f"template.{key}", "placeholders among {" + ", ".join(sorted(allowed)) + "}" if allowed else "no placeholders", line)
            seen += [f"{key}:{n}" for n in names]
    for key, (_, required) in fields.items():
        for name in sorted(required):
            if seen.count(f"{key}:{name}") != 1:
                raise bad(f"template.{key}", f"placeholder {{{name}}} exactly once", tpl[key])
    if not tpl["query"].rstrip().endswith(":"):
        raise bad("template.query", "a line ending with ':' (every sample ends with the same colon)", tpl["query"])
    return {k: (list(v) if isinstance(v, list) else v) for k, v in tpl.items()}


def parse_statement(line: str):
    """`name op int` -> (name, op, value), or None when the line is not a statement."""
    m = _STATEMENT.match(line)
    return (m.group(1), m.group(2), int(m.group(3))) if m else None


def _assigned(line: str, values: dict, bad, key: str) -> str:
    st = parse_statement(line.format(**values))
    if st is None:
        raise bad(key, "a statement 'name = value' / 'name += value' / 'name ^= value'", line)
    return st[0]


def _check_extra(raw, kind, tpl, bad) -> dict:
    if kind == "completion":
        vr = raw["value_range"]
        if not (isinstance(vr, list) and len(vr) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vr)
                and vr[0] <= vr[1] <= MAX_VALUE):
            raise bad("value_range", f"[low, high] with 0 <= low <= high <= {MAX_VALUE}", vr)
        vals = {"R": vr[0], "C": vr[0], "S": vr[0]}
        owner = {}
        for line in tpl["header"]:
            var = _assigned(line, vals, bad, "template.header")
            for p in placeholders(line):
                owner[p] = var
        m = _RELATION.match(raw["relation"]) if isinstance(raw["relation"], str) else None
        if not m or {m.group(1), m.group(3)} != {owner["R"], owner["C"]}:
            raise bad("relation", f"'<var> <op> <var>' comparing {owner['C']} and {owner['R']} with ==, !=, <, <=, > or >=", raw["relation"])
        if _assigned(tpl["distractor"], {}, bad, "template.distractor") in (owner["R"], owner["C"]):
            raise bad("template.distractor", "a statement that does not change the compared variables", tpl["distractor"])
        table = _truth_matrix(raw["relation"], owner, vr[0], vr[1])
        if not (table.any(1) & ~table.all(1)).any():
            raise bad("relation", "a relation that is true for some values and false for others in value_range", raw["relation"])
        return {"relation": raw["relation"].strip(), "value_range": tuple(vr)}
    if kind == "memory":
        ans = raw["answer"]
        var = None
        for line in tpl["header"]:
            v = _assigned(line, {"B": 0}, bad, "template.header")
            if "B" in placeholders(line):
                var = v
        if ans != var:
            raise bad("answer", f"the variable assigned {{B}} in template.header ({var})", ans)
        if _assigned(tpl["distractor"], {"X": 0}, bad, "template.distractor") == ans:
            raise bad("template.distractor", f"a statement that does not change {ans}", tpl["distractor"])
        return {"answer": ans}
    n = raw["registers"]
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_REGISTERS:
        raise bad("registers", f"an integer 2..{MAX_REGISTERS}", n)
    _assigned(tpl["write"], {"i": 0, "v": 0}, bad, "template.write")
    return {"registers": n}


def relation_owner(spec: TaskSpec) -> dict:
    """completion: placeholder -> variable name it is assigned to in the header."""
    owner = {}
    for line in spec.template["header"]:
        name = parse_statement(line.format(R=0, C=0, S=0))[0]
        owner.update({p: name for p in placeholders(line)})
    return owner


_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def _truth(relation: str, owner: dict, r: int, c: int) -> bool:
    left, op, right = _RELATION.match(relation).groups()
    val = {owner["R"]: r, owner["C"]: c}
    return _OPS[op](val[left], val[right])


def _truth_matrix(relation: str, owner: dict, lo: int, hi: int):
    """[R, C] booleans of the relation for every R, C in lo..hi (row R - lo, column C - lo)."""
    import numpy as np

    vals = np.arange(lo, hi + 1)
    left, op, right = _RELATION.match(relation).groups()
    val = {owner["R"]: vals[:, None], owner["C"]: vals[None, :]}
    return np.broadcast_to(_OPS[op](val[left], val[right]), (len(vals), len(vals)))


def completion_truth_table(spec: TaskSpec):
    """`completion_truth` for every (R, C) of the value range at once: bool [R, C]."""
    return _truth_matrix(spec.relation, relation_owner(spec), *spec.value_range)


def completion_truth(spec: TaskSpec, r: int, c: int) -> bool:
    """Generator side of the relation: does `spec.relation` hold for required=r, completed=c?"""
    return _truth(spec.relation, relation_owner(spec), r, c)


def list_specs() -> list[TaskSpec]:
    return [load_spec(p) for p in builtin_spec_paths().values()]
