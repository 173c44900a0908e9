"""Structural groups of the three task kinds (the paper's appendix F) and their rendering into
minimal pairs.

A *group* is the unit of grouped cross-validation; rendering it at one length-grid value gives its
samples, two per minimal pair:

- completion: the unordered pair {a, b} of counts. At each length it holds the four assignments
  (required, completed) = (a, b), (a, a), (b, a), (b, b) as two pairs that share `required` and the
  scratch value and differ only in `completed`. Group `<task>:p<a>-<b>`; context (the training
  hold-out unit, what a pair shares) `<task>:R<required>-S<scratch>`.
- memory: the label-irrelevant `scratch ^= X` context (its bits). At each length one pair: state 0
  and state 1. Group = context = `<task>:c<hex of the bits>`.
- registers: a random update schedule (m registers, w writes each, interleaved, random bits, a
  scratch value) and its bitwise value complement, with a query for every register: m pairs, each
  the schedule and its complement under the same query. Group = context =
  `<task>:m<m>w<w>S<scratch>:<hex digit 2*register+value per write>`, spelled from the member whose
  first written value is 0.

- compose: a word of k generator indices (the knob k is the number of dependent steps). At each
  length one pair per accepted point b: a start a1 with π(a1) = b (label 1) and a start a0 with
  π(a0) outside the accepted set (label 0), π the word's composed permutation; the pair differs
  only in the start value. Group = context = `<task>:k<k>:<hex digit per step>`. With `step_lines`
  the word has that many lines, k of them dependent steps and the rest the identity generator. With
  `inline_steps` the steps are the words of one line (one token a step), the pairs the same.

Ids spell their content out (no hashing), so different groups never share an id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fbt_probe.tasks.rng import StableRng
from fbt_probe.tasks.spec import TaskSpec, completion_truth, compose_steps, identity_generator


@dataclass(frozen=True)
class Group:
    group_id: str
    params: tuple


@dataclass(frozen=True)
class Sample:
    text: str
    label: int
    group_id: str
    context_id: str
    pair: int  # index of the sample's minimal pair within the group at this length


def draw_group(spec: TaskSpec, knob: int, rng: StableRng) -> Group:
    """One random group (completion and memory groups do not depend on the length knob)."""
    return _DRAW[spec.kind](spec, knob, rng)


def group_space(spec: TaskSpec, knob: int) -> int:
    """How many distinct groups `draw_group` can draw at `knob` (before any context filter): what
    a request for more groups is capped at. Exact, and computed from the spec's sizes alone."""
    if spec.kind == "completion":  # the unordered pairs {a, b} of distinct counts
        lo, hi = spec.value_range
        return math.comb(hi - lo + 1, 2)
    if spec.kind == "memory":  # the bits of the context lines
        return 2**spec.context_updates
    if spec.kind == "registers":  # write orders x values (named by the member whose first is 0) x scratch
        m, w = spec.registers_and_writes(knob)
        orders = math.factorial(m * w) // math.factorial(w) ** m
        lo, hi = spec.scratch_range
        return orders * 2 ** (m * w - 1) * (hi - lo + 1)
    n = len(spec.permutations)  # compose: words of k generator indices
    if identity_generator(spec) is None:
        return n**knob
    return math.comb(spec.step_lines, knob) * (n - 1) ** knob


def render_group(spec: TaskSpec, knob: int, group: Group, rng: StableRng, contexts=None) -> list[Sample] | None:
    """The group's samples at one length knob, pairs adjacent (order within a pair drawn from
    `rng`). With `contexts` (a container of context ids), only those contexts are used; None when
    the group has no sample that fits."""
    return _RENDER[spec.kind](spec, knob, group, rng, contexts)


def _pairs(samples: list[Sample], rng: StableRng) -> list[Sample]:
    out = []
    for i in range(0, len(samples), 2):
        a, b = samples[i], samples[i + 1]
        out += [b, a] if rng.below(2) else [a, b]
    return out


# ----------------------------------------------------------------------------- completion
def _draw_completion(spec: TaskSpec, knob: int, rng: StableRng) -> Group:
    lo, hi = spec.value_range
    a = lo + rng.below(hi - lo + 1)
    b = lo + rng.below(hi - lo)
    b += b >= a  # uniform over the values other than a
    a, b = min(a, b), max(a, b)
    return Group(f"{spec.task}:p{a}-{b}", (a, b))


def _completion_text(spec: TaskSpec, knob: int, r: int, c: int, s: int) -> str:
    tpl = spec.template
    return "\n".join([h.format(R=r, C=c, S=s) for h in tpl["header"]] + [tpl["distractor"]] * knob + [tpl["query"]])


def _render_completion(spec: TaskSpec, knob: int, group: Group, rng: StableRng, contexts) -> list[Sample] | None:
    a, b = group.params
    lo, hi = spec.scratch_range
    samples = []
    for pair, (r, other) in enumerate(((a, b), (b, a))):
        scratch = [s for s in range(lo, hi + 1) if contexts is None or f"{spec.task}:R{r}-S{s}" in contexts]
        if not scratch:
            return None
        s = rng.choice(scratch)
        ctx = f"{spec.task}:R{r}-S{s}"
        samples += [
            Sample(_completion_text(spec, knob, r, c, s), int(completion_truth(spec, r, c)), group.group_id, ctx, pair)
            for c in (other, r)
        ]
    return _pairs(samples, rng)


# ----------------------------------------------------------------------------- memory
def _draw_memory(spec: TaskSpec, knob: int, rng: StableRng) -> Group:
    n = spec.context_updates
    bits = rng.bits(n)
    return Group(f"{spec.task}:c{bits:0{(n + 3) // 4}x}", (bits,))


def _render_memory(spec: TaskSpec, knob: int, group: Group, rng: StableRng, contexts) -> list[Sample] | None:
    if contexts is not None and group.group_id not in contexts:
        return None
    (bits,), n, tpl = group.params, spec.context_updates, spec.template
    body = (
        [tpl["context"].format(X=(bits >> (n - 1 - j)) & 1) for j in range(n)]
        + [tpl["distractor"]] * knob
        + [tpl["query"]]
    )
    samples = [
        Sample("\n".join([h.format(B=b) for h in tpl["header"]] + body), b, group.group_id, group.group_id, 0)
        for b in (0, 1)
    ]
    return _pairs(samples, rng)


# ----------------------------------------------------------------------------- registers
def _draw_registers(spec: TaskSpec, knob: int, rng: StableRng) -> Group:
    m, w = spec.registers_and_writes(knob)
    order = rng.shuffle([reg for reg in range(m) for _ in range(w)])
    values = [rng.bits(1) for _ in order]
    if values[0]:  # the group is {schedule, complement}: name it by the member whose first value is 0
        values = [1 - v for v in values]
    lo, hi = spec.scratch_range
    s = lo + rng.below(hi - lo + 1)
    writes = tuple(zip(order, values))
    width = max(1, ((2 * m - 1).bit_length() + 3) // 4)
    gid = f"{spec.task}:m{m}w{w}S{s}:" + "".join(format(2 * reg + v, f"0{width}x") for reg, v in writes)
    return Group(gid, (m, w, s, writes))


def registers_text(spec: TaskSpec, writes, scratch: int, query: int) -> str:
    tpl = spec.template
    body = [tpl["write"].format(i=reg, v=v) for reg, v in writes]
    body += [tpl["scratch"][0].format(S=scratch)] + [tpl["scratch"][1]] * (spec.empty_updates - 1)
    return "\n".join(body + [q.format(i=query) for q in tpl["query"]])


def _render_registers(spec: TaskSpec, knob: int, group: Group, rng: StableRng, contexts) -> list[Sample] | None:
    if contexts is not None and group.group_id not in contexts:
        return None
    m, _, s, writes = group.params
    complement = tuple((reg, 1 - v) for reg, v in writes)
    latest = dict(writes)
    samples = []
    for reg in range(m):
        samples += [
            Sample(
                registers_text(spec, ws, s, reg),
                latest[reg] if ws is writes else 1 - latest[reg],
                group.group_id,
                group.group_id,
                reg,
            )
            for ws in (writes, complement)
        ]
    return _pairs(samples, rng)


# ----------------------------------------------------------------------------- compose
def _draw_compose(spec: TaskSpec, knob: int, rng: StableRng) -> Group:
    ident = identity_generator(spec)
    if ident is None:
        word = tuple(rng.below(len(spec.permutations)) for _ in range(knob))
    else:  # k dependent steps at random lines among `step_lines`, the identity on the rest
        moves = [g for g in range(len(spec.permutations)) if g != ident]
        at = set(rng.shuffle(list(range(spec.step_lines)))[:knob])
        word = tuple(rng.choice(moves) if i in at else ident for i in range(spec.step_lines))
    return Group(f"{spec.task}:k{knob}:" + "".join(format(g, "x") for g in word), (word,))


def compose_text(spec: TaskSpec, start: int, word) -> str:
    tpl = spec.template
    steps = [tpl["step"].format(g=g) for g in word]
    if spec.inline_steps:  # one line of step words
        steps = [" ".join(steps)]
    return "\n".join([tpl["start"].format(A=start)] + steps + [tpl["query"]])


def _render_compose(spec: TaskSpec, knob: int, group: Group, rng: StableRng, contexts) -> list[Sample] | None:
    if contexts is not None and group.group_id not in contexts:
        return None
    (word,) = group.params
    pi = compose_steps(*(spec.permutations[g] for g in word))
    inverse = {b: a for a, b in enumerate(pi)}
    rejected = [c for c in range(len(pi)) if c not in spec.accept]
    samples = []
    for pair, b in enumerate(spec.accept):
        c = rng.choice(rejected)
        samples += [
            Sample(compose_text(spec, inverse[b], word), 1, group.group_id, group.group_id, pair),
            Sample(compose_text(spec, inverse[c], word), 0, group.group_id, group.group_id, pair),
        ]
    return _pairs(samples, rng)


_DRAW = {
    "completion": _draw_completion,
    "memory": _draw_memory,
    "registers": _draw_registers,
    "compose": _draw_compose,
}
_RENDER = {
    "completion": _render_completion,
    "memory": _render_memory,
    "registers": _render_registers,
    "compose": _render_compose,
}
