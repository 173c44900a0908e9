"""Minimal-pair generators for the three task kinds, and `generate` (spec -> DataFrame).

A draw fixes everything a pair shares (its *context*) plus the one field the label depends on;
`render` turns it into the two samples. Ids (see tasks/README.md):

- completion: group `<task>:R4-C9` (the digit pair, DESIGN §4); context `<task>:R4-S7` (what the
  two samples share: required and scratch values; distractors are identical lines).
- memory: group = context = `<task>:n8:<hex of the 8 scratch bits>` (the scratch context).
- registers: group = context = `<task>:w4:<one hex digit per write: 2*register+value>` (the update
  history). For > 8 registers each write takes more hex digits.

Both ids encode the context exactly (no hashing), so different contexts never share an id.
"""
from __future__ import annotations

import hashlib
import random
import warnings
from dataclasses import dataclass

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.tasks.checker import check_sample
from fbt_probe.tasks.spec import TaskSpec, check_knob, completion_truth_table, load_spec, placeholders


class StableRng:
    """Seeded from a key via SHA-256 and driven only by `getrandbits`, whose stream Python keeps
    fixed across versions (unlike `randrange`/`shuffle`), so datasets stay byte-identical."""

    def __init__(self, *key):
        digest = hashlib.sha256(repr(key).encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:16], "big"))

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        k = max(n - 1, 1).bit_length()
        while (x := self._r.getrandbits(k)) >= n:
            pass
        return x

    def uniform(self) -> float:
        return self._r.random()

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def bits(self, k: int) -> int:
        return self._r.getrandbits(k) if k > 0 else 0

    def shuffle(self, items: list) -> list:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
        return items


@dataclass(frozen=True)
class Draw:
    key: tuple  # identifies the pair within a cell (no two pairs of a cell share it)
    context_id: str
    params: tuple
    swap: bool  # row order within the pair


_TRUTH_TABLES: dict = {}


def _truth_table(spec: TaskSpec) -> dict:
    """(R -> ([C making the relation true], [C making it false])), for every R with both kinds.
    Memoised per spec content (training draws documents every step)."""
    key = repr(spec)
    if key not in _TRUTH_TABLES:
        _TRUTH_TABLES[key] = _build_truth_table(spec)
    return _TRUTH_TABLES[key]


def _build_truth_table(spec: TaskSpec) -> dict:
    lo, hi = spec.value_range
    vals = list(range(lo, hi + 1))
    truth = completion_truth_table(spec)
    table = {r: ([c for c, t in zip(vals, row) if t], [c for c, t in zip(vals, row) if not t]) for r, row in zip(vals, truth.tolist())}
    return {r: tc for r, tc in table.items() if tc[0] and tc[1]}


def draw_pair(spec: TaskSpec, knob: int, rng: StableRng, table=None) -> Draw:
    if spec.kind == "completion":
        table = table or _truth_table(spec)
        r = rng.choice(sorted(table))
        s = rng.below(spec.value_range[1] - spec.value_range[0] + 1) + spec.value_range[0]
        c_true, c_false = rng.choice(table[r][0]), rng.choice(table[r][1])
        return Draw((r, s, c_true, c_false), f"{spec.task}:R{r}-S{s}", (r, s, c_true, c_false), bool(rng.below(2)))
    if spec.kind == "memory":
        bits = rng.bits(knob) if "X" in placeholders(spec.template["distractor"]) else 0
        return Draw((bits,), _memory_id(spec.task, knob, bits), (bits,), bool(rng.below(2)))
    n = spec.registers
    while True:
        order = rng.shuffle([reg for reg in range(n) for _ in range(knob)])
        writes = tuple((reg, rng.bits(1)) for reg in order)
        latest = dict(writes)
        ones = [reg for reg in range(n) if latest[reg] == 1]
        zeros = [reg for reg in range(n) if latest[reg] == 0]
        if ones and zeros:
            break
    q1, q0 = rng.choice(ones), rng.choice(zeros)
    return Draw((writes,), _registers_id(spec.task, knob, n, writes), (writes, q0, q1), bool(rng.below(2)))


def _memory_id(task: str, knob: int, bits: int) -> str:
    return f"{task}:n{knob}:" + (format(bits, f"0{(knob + 3) // 4}x") if knob else "-")


def _registers_id(task: str, knob: int, n: int, writes) -> str:
    width = max(1, ((2 * n - 1).bit_length() + 3) // 4)
    return f"{task}:w{knob}:" + "".join(format(2 * reg + v, f"0{width}x") for reg, v in writes)


def group_ids(spec: TaskSpec, draw: Draw) -> list[str]:
    """The group ids of a pair's two samples, in row order (without rendering the texts)."""
    if spec.kind != "completion":
        return [draw.context_id] * 2
    r, _, c_true, c_false = draw.params
    out = [f"{spec.task}:R{r}-C{c}" for c in (c_false, c_true)]
    return out[::-1] if draw.swap else out


def render(spec: TaskSpec, knob: int, draw: Draw) -> list[tuple[str, int, str]]:
    """The two samples of a pair, in row order: (text, label, group_id)."""
    tpl = spec.template
    if spec.kind == "completion":
        r, s, c_true, c_false = draw.params
        tail = [tpl["distractor"]] * knob + [tpl["query"]]
        out = [("\n".join([h.format(R=r, C=c, S=s) for h in tpl["header"]] + tail), label, f"{spec.task}:R{r}-C{c}")
               for c, label in ((c_false, 0), (c_true, 1))]
    elif spec.kind == "memory":
        (bits,) = draw.params
        body = [tpl["distractor"].format(X=(bits >> j) & 1) for j in range(knob)] + [tpl["query"]]
        out = [("\n".join([h.format(B=b) for h in tpl["header"]] + body), b, draw.context_id) for b in (0, 1)]
    else:
        writes, q0, q1 = draw.params
        body = [tpl["write"].format(i=reg, v=v) for reg, v in writes]
        out = [("\n".join(body + [tpl["query"].format(i=q)]), label, draw.context_id) for q, label in ((q0, 0), (q1, 1))]
    return out[::-1] if draw.swap else out


def draw_cell(spec: TaskSpec, knob: int, n_pairs: int, seed: int, contexts=None) -> list[Draw]:
    """Up to `n_pairs` distinct pairs for one length-grid cell (fewer when the cell's space of
    distinct pairs, restricted to `contexts` if given, is smaller). Each cell has its own random
    stream, so a cell does not change when the grid or the pair count of other cells does, and a
    smaller `n_pairs` gives a prefix of a larger one."""
    rng = StableRng("fbt-probe.tasks", spec.task, seed, knob)
    table = _truth_table(spec) if spec.kind == "completion" else None
    seen, out, budget = set(), [], 20 * n_pairs + 1000
    while len(out) < n_pairs and budget > 0:
        budget -= 1
        d = draw_pair(spec, knob, rng, table)
        if d.key in seen or (contexts is not None and d.context_id not in contexts):
            continue
        seen.add(d.key)
        out.append(d)
    return out


COLUMNS = ("task", "text", "token_ids", "label", "label_word", "pair_id", "group_id", "context_id",
           "length_knob", "n_tokens", "seed")


def generate(spec, pairs: int | None = None, seed: int | None = None, tokenizer=None, contexts=None,
             tokenizer_name: str | None = None) -> pd.DataFrame:
    """One row per sample, both samples of a pair adjacent, cells in length-grid order.

    `pairs` and `seed` override the spec's `pairs_per_cell` and `seed`; `tokenizer` defaults to
    `build_tokenizer([spec])`; `contexts` (a set of context ids or a `HeldOut`) restricts sampling
    to those contexts, e.g. to draw a probe set only from contexts held out of training. Every
    label is re-derived by the independent checker, and every sample must end in the same token.
    Each label word must be one token of `tokenizer` (`tokenizer_name` names it in errors).
    `df.attrs` carries the spec, seed, per-cell counts and the shared final token."""
    from fbt_probe.tasks.tokenizer import (build_tokenizer, check_encoded, check_label_words, encode,
                                           tokenizer_sha256)

    spec = load_spec(spec)
    n_pairs = spec.pairs_per_cell if pairs is None else pairs
    seed = spec.seed if seed is None else seed
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise FbtError(f"pairs: expected an integer >= 1, got {n_pairs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FbtError(f"seed: expected an integer >= 0, got {seed!r}")
    tok = tokenizer if tokenizer is not None else build_tokenizer([spec])
    rows, counts = [], {}
    for knob in spec.length_grid:
        check_knob(spec.kind, knob, where=f"{spec.source or spec.task}: field 'length_grid'")
        draws = draw_cell(spec, knob, n_pairs, seed, contexts)
        counts[str(knob)] = {"pairs": len(draws), "requested": n_pairs}
        for d in draws:
            pair_id = len(rows) // 2
            for text, label, group in render(spec, knob, d):
                rows.append({"task": spec.task, "text": text, "label": label, "label_word": spec.label_words[label],
                             "pair_id": pair_id, "group_id": group, "context_id": d.context_id, "length_knob": knob, "seed": seed})
        if len(draws) < n_pairs:
            warnings.warn(f"{spec.task}: {spec.knob_name}={knob} has only {len(draws)} distinct pair(s) "
                          f"(asked for {n_pairs})", stacklevel=2)
    if not rows:
        raise FbtError(f"{spec.task}: no pair can be produced (is the contexts filter empty for this task?)")

    def describe(i: int) -> str:
        r = rows[i]
        return f"pair {r['pair_id']}, {r['label_word']}, {spec.knob_name}={r['length_knob']}"

    for i, r in enumerate(rows):
        check_sample(spec, r["text"], r["label"], r["label_word"], f"{spec.task}: sample {i} ({describe(i)})")
    ids = encode(tok, [r["text"] for r in rows])
    final = check_encoded(tok, spec.task, ids, describe)
    name = tokenizer_name or ("the given tokenizer" if tokenizer is not None else "the built-in tokenizer")
    check_label_words(tok, spec.task, rows[0]["text"].rsplit("\n", 1)[-1], spec.label_words, name)
    for r, row_ids in zip(rows, ids):
        r["token_ids"], r["n_tokens"] = row_ids, len(row_ids)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for knob, c in counts.items():
        n_tok = df.loc[df.length_knob == int(knob), "n_tokens"]
        c.update(samples=int(len(n_tok)), n_tokens_min=int(n_tok.min()) if len(n_tok) else None,
                 n_tokens_max=int(n_tok.max()) if len(n_tok) else None)
    df.attrs.update(spec=spec.to_dict(), seed=seed, pairs_per_cell=n_pairs, counts=counts,
                    final_token_id=int(final), final_token=tok.id_to_token(final), tokenizer_sha256=tokenizer_sha256(tok))
    return df
