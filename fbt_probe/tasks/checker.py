"""An independent label checker: a tiny interpreter for the task language.

A sample is a program: one statement per line (`name = 3`, `name += 0`, `name ^= 1`; blank lines
and lines of '#'s are comments), then the query line(s), the last ending in ':'. The interpreter runs the statements into an environment and answers the
query from it, using only the text and the spec's declarative fields (query template, relation,
answer variable) — never the generator's own values — so that a generator bug shows up as a
disagreement. Generation runs it on every sample; a mismatch is a hard error.
"""

from __future__ import annotations

import re

from fbt_probe.errors import FbtError

_LINE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(\+=|-=|\^=|=)\s*(-?\d+)\s*$")
_CMP = re.compile(r"^\s*(\w+)\s*(==|!=|<=|>=|<|>)\s*(\w+)\s*$")
_COMMENT = re.compile(r"^[#\s]*$")


def run_program(text: str, query_lines: int = 1) -> tuple[dict, list[str]]:
    """Execute every line but the last `query_lines` (blank lines and lines of '#'s only are
    comments: padding); return (environment, query lines)."""
    lines = text.split("\n")
    body, query = lines[: len(lines) - query_lines], lines[len(lines) - query_lines :]
    env: dict[str, int] = {}
    for n, line in enumerate(body, 1):
        if _COMMENT.match(line):
            continue
        m = _LINE.match(line)
        if m is None:
            raise FbtError(f"line {n}: {line!r} is not a statement of the task language")
        name, op, value = m.group(1), m.group(2), int(m.group(3))
        if op == "=":
            env[name] = value
            continue
        if name not in env:
            raise FbtError(f"line {n}: {name} is updated before it is assigned")
        env[name] = env[name] + value if op == "+=" else env[name] - value if op == "-=" else env[name] ^ value
    if not query or not query[-1].rstrip().endswith(":"):
        raise FbtError(f"last line {query[-1] if query else ''!r} is not a query ending in ':'")
    return env, query


def _compare(left: int, op: str, right: int) -> bool:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right
    if op == "<=":
        return left <= right
    if op == ">":
        return left > right
    return left >= right


def _lookup(env: dict, name: str) -> int:
    if name not in env:
        raise FbtError(f"query asks for {name}, which is never assigned")
    return env[name]


def _query_pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{i\}", template)
    return re.compile("^" + r"(\d+)".join(re.escape(p) for p in parts) + "$")


def _template_pattern(template: str, field: str) -> re.Pattern:
    parts = template.split("{" + field + "}")
    return re.compile("^" + r"\s*(\d+)\s*".join(re.escape(p) for p in parts) + "$")


def compose_points(spec, text: str) -> list[int]:
    """compose: the point after each step, from the text alone: the start line sets it (p_0), each
    step line (with `inline_steps`, each word of the one step line) applies its generator (the spec's
    table, read point by point here): [p_0, p_1, ..., p_k]. The query asks whether p_k is accepted."""
    lines = [line for line in text.split("\n") if not _COMMENT.match(line)]
    tpl = spec.template
    if len(lines) < 2 or lines[-1] != tpl["query"]:
        raise FbtError(f"query {lines[-1] if lines else ''!r} is not {tpl['query']!r}")
    m = _template_pattern(tpl["start"], "A").match(lines[0])
    if m is None:
        raise FbtError(f"first line {lines[0]!r} does not match the start template {tpl['start']!r}")
    point, n = int(m.group(1)), len(spec.permutations[0])
    if point >= n:
        raise FbtError(f"start value {point} is not a point of 0..{n - 1}")
    points = [point]
    step = _template_pattern(tpl["step"], "g")
    steps = lines[1:-1]
    if spec.inline_steps:  # the steps are the space-separated words of one line
        if len(steps) != 1:
            raise FbtError(f"expected one line of steps between the start and the query, got {len(steps)}")
        steps = steps[0].split(" ")
    for line in steps:
        m = step.match(line)
        if m is None or int(m.group(1)) >= len(spec.permutations):
            raise FbtError(f"line {line!r} is not a step {tpl['step']!r} with a generator of the spec")
        point = spec.permutations[int(m.group(1))][point]
        points.append(point)
    return points


def _run_compose(spec, text: str) -> int:
    return int(compose_points(spec, text)[-1] in spec.accept)


def interpret(spec, text: str) -> int:
    """The label (0/1) of `text` under the task format of `spec`, derived from the text alone."""
    tpl = spec.template
    if spec.kind == "compose":
        return _run_compose(spec, text)
    if spec.kind == "registers":
        env, query = run_program(text, len(tpl["query"]))
        index = None
        for line, pattern in zip(query, tpl["query"]):
            m = _query_pattern(pattern).match(line)
            if m is None:
                raise FbtError(f"query line {line!r} does not match template {pattern!r}")
            index = m.group(1) if m.groups() else index
        register = _LINE.match(tpl["write"].format(i=index, v=0)).group(1)
        value = _lookup(env, register)
    else:
        env, (query,) = run_program(text)
        if query != tpl["query"]:
            raise FbtError(f"query {query!r} is not {tpl['query']!r}")
        if spec.kind == "completion":
            left, op, right = _CMP.match(spec.relation).groups()
            value = int(_compare(_lookup(env, left), op, _lookup(env, right)))
        else:
            value = _lookup(env, spec.answer)
    if value not in (0, 1):
        raise FbtError(f"query value {value} is not a binary label")
    return value


def disagreement(spec, text: str, label: int, label_word: str, where: str) -> int | None:
    """The interpreter's label of `text` where it disagrees with `label` or `label_word`, else None;
    a text it cannot read raises, naming `where`."""
    try:
        got = interpret(spec, text)
    except FbtError as exc:
        raise FbtError(f"{where}: label checker cannot read the sample: {exc.message}") from None
    return got if got != label or spec.label_words[got] != label_word else None


def check_sample(spec, text: str, label: int, label_word: str, where: str) -> None:
    """Raise unless the interpreter agrees with the generator's label and label word."""
    got = disagreement(spec, text, label, label_word, where)
    if got is not None:
        raise FbtError(
            f"{where}: label checker says {got} ({spec.label_words[got]}) but the generator "
            f"wrote {label} ({label_word}); refusing to write an inconsistent dataset"
        )
