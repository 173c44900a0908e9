"""Register documents of a training mix (`TrainConfig.register_mix`): kinds of register documents
(m registers, K writes per register, S scratch lines, a weight) that replace the register tasks'
training cells, each document ending in several supervised queries (`register_queries`).

A document is drawn as a probe group is (`fbt_probe.tasks.groups.draw_group`: a random interleaved
schedule and scratch value, named `<task>:m<m>w<K>S<s>:<writes>`), one of its two members (the
schedule or its complement) is written out, then Q queries: distinct registers in random order
(cycling when Q > m), each followed by its answer word. A schedule whose name under any register
task (those trained, and the built-in `registers` and `registers-count`) is held out is never drawn,
so held-out evaluation stays on contexts no stage has trained on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fbt_probe.errors import FbtError
from fbt_probe.tasks.groups import draw_group
from fbt_probe.tasks.rng import StableRng
from fbt_probe.tasks.spec import MAX_DISTRACTORS, MAX_REGISTERS, MAX_WRITES, TaskSpec
from fbt_probe.tasks.streams import HeldOut
from fbt_probe.tasks.tokenizer import encode

MIX = "register-mix"  # the pseudo-task of a mix cell: (MIX, index of its kind)
BUILTIN_REGISTER_TASKS = ("registers", "registers-count")
MAX_QUERIES = 64
_FORM = (
    "m:wpr:K:S[:weight][:vN] (K writes per register) or m:N:S[:weight][:vN] (N assignments, a multiple of m); "
    "vN: values 0..N-1 answered by the value itself (default v2: the task's two label words)"
)
MAX_VALUES = 100  # the numbers 0-99 are words of the task vocabulary


@dataclass(frozen=True)
class RegisterKind:
    registers: int  # m
    writes: int  # K, writes per register
    scratch: int  # S scratch lines after the writes (0: none)
    weight: float = 1.0  # relative share of the mix's documents
    values: int = 2  # N > 2: each write's value is one of 0..N-1 and the answer is that number itself

    def __str__(self) -> str:
        tail = "" if self.values == 2 else f":v{self.values}"
        return f"{self.registers}:wpr:{self.writes}:{self.scratch}:{self.weight:g}{tail}"


def parse_register_mix(text: str) -> tuple[RegisterKind, ...]:
    """'2:wpr:1:0 2:wpr:2:0 8:16:8:0.5' (kinds separated by spaces or commas) -> the kinds."""
    where = f"train config: field 'register_mix' (--register-mix) {text!r}"
    items = text.replace(",", " ").split() if isinstance(text, str) else []
    if not items:
        raise FbtError(f"{where}: expected one or more kinds {_FORM}")
    return tuple(_kind(item, where) for item in items)


def _kind(item: str, where: str) -> RegisterKind:
    parts = item.split(":")
    values = 2
    if len(parts) > 1 and parts[-1].startswith("v"):
        try:
            values = int(parts[-1][1:])
        except ValueError:
            raise FbtError(f"{where}: kind {item!r}: expected {_FORM}") from None
        if not 2 <= values <= MAX_VALUES:
            raise FbtError(f"{where}: kind {item!r}: vN must have N in 2..{MAX_VALUES}")
        parts = parts[:-1]
    per_register = len(parts) > 1 and parts[1] == "wpr"
    if per_register:
        parts = [parts[0], parts[2] if len(parts) > 2 else ""] + parts[3:]
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        m, n, s = int(parts[0]), int(parts[1]), int(parts[2])
        weight = float(parts[3]) if len(parts) == 4 else 1.0
    except ValueError:
        raise FbtError(f"{where}: kind {item!r}: expected {_FORM}") from None
    if not 1 <= m <= MAX_REGISTERS:
        raise FbtError(f"{where}: kind {item!r}: register count m must be 1..{MAX_REGISTERS}")
    if not per_register and (n < 1 or n % m):
        raise FbtError(f"{where}: kind {item!r}: N assignments must be a positive multiple of m = {m}")
    k = n if per_register else n // m
    if not 1 <= k <= MAX_WRITES:
        raise FbtError(f"{where}: kind {item!r}: writes per register must be 1..{MAX_WRITES}")
    if not 0 <= s <= MAX_DISTRACTORS:
        raise FbtError(f"{where}: kind {item!r}: scratch lines must be 0..{MAX_DISTRACTORS}")
    if not weight > 0 or weight == float("inf"):
        raise FbtError(f"{where}: kind {item!r}: weight must be a finite number > 0")
    return RegisterKind(m, k, s, weight, values)


def held_names(task_names) -> tuple[str, ...]:
    """The task names a mix schedule is checked under: the trained register tasks and the built-ins."""
    return tuple(dict.fromkeys([*task_names, *BUILTIN_REGISTER_TASKS]))


def mix_documents(
    spec: TaskSpec,
    kind: RegisterKind,
    queries: int,
    tokenizer,
    n: int,
    seed: int,
    held: HeldOut,
    names,
    only_held: bool = False,
) -> list[dict]:
    """`n` documents of `kind` rendered with the register spec `spec`'s template and label words.
    Each is a dict like `training_documents`' with `answer_positions` (the index of every answer
    token; `answer_pos` is the last) and `labels`. A schedule held out under any of `names` is never
    drawn (`only_held`: only such schedules, for validation)."""
    kspec = dataclasses.replace(spec, registers=kind.registers, assignments=None)
    rng = StableRng("fbt-probe.train.register-mix", seed, str(kind), queries)
    docs = []
    for _ in range(n):
        for _attempt in range(10_000):
            group = draw_group(kspec, kind.writes, rng)
            suffix = group.group_id.split(":", 1)[1]
            if any(f"{t}:{suffix}" in held for t in names) == only_held:
                break
        else:
            raise FbtError(f"register mix kind {kind}: no schedule found outside the held-out contexts in 10,000 draws")
        m, _, s, writes = group.params
        if rng.below(2):  # the group is {schedule, complement}: either member, so values are uniform
            writes = tuple((reg, 1 - v) for reg, v in writes)
        if kind.values > 2:  # the same register schedule with values 0..N-1, never all of them 0/1
            while True:
                many = tuple((reg, rng.below(kind.values)) for reg, _ in writes)
                if any(v > 1 for _, v in many):
                    writes = many
                    break
        docs.append(_document(spec, kind, writes, s, _queries(m, queries, rng), tokenizer, group.group_id))
    return docs


def _queries(m: int, q: int, rng: StableRng) -> list[int]:
    """Q query registers: distinct in random order, cycling (then shuffled) when Q > m."""
    order = rng.shuffle(list(range(m)))
    if q <= m:
        return order[:q]
    return rng.shuffle((order * (q // m + 1))[:q])


def _document(
    spec: TaskSpec, kind: RegisterKind, writes, scratch: int, queries: list[int], tokenizer, group_id: str
) -> dict:
    tpl, latest = spec.template, dict(writes)
    word = (lambda v: spec.label_words[v]) if kind.values == 2 else str  # the answer word of value v
    lines = [tpl["write"].format(i=reg, v=v) for reg, v in writes]
    if kind.scratch:
        lines += [tpl["scratch"][0].format(S=scratch)] + [tpl["scratch"][1]] * (kind.scratch - 1)
    prefixes, labels = [], []
    for q in queries:
        lines += [line.format(i=q) for line in tpl["query"]]
        prefixes.append("\n".join(lines))  # the document up to this query's colon
        labels.append(latest[q])
        lines[-1] += " " + word(latest[q])
    text = "\n".join(lines) + "\n"
    ids = encode(tokenizer, [text, *prefixes])
    used = sorted(set(labels))
    words = dict(zip(used, encode(tokenizer, [" " + word(v) for v in used])))  # each answer word's tokens, once
    full, positions = ids[0], [len(p) for p in ids[1:]]
    for pos, prefix, label in zip(positions, ids[1:], labels):
        if full[:pos] != prefix or full[pos : pos + 1] != words[label] or full[pos - 1] != full[positions[0] - 1]:
            raise FbtError(
                f"{spec.task}: a register-mix answer is not one token after the shared colon under this tokenizer"
            )
    return {
        "token_ids": full,
        "answer_pos": positions[-1],
        "answer_positions": positions,
        "labels": labels,
        "task": MIX,
        "group_id": group_id,
        "context_id": group_id,
        "label": labels[-1],
        "label_word": word(labels[-1]),
        "length_knob": str(kind),
        "text": text,
    }
