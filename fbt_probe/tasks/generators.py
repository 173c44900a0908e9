"""`generate`: a task spec -> a checked minimal-pair DataFrame (the paper's appendix F by default).

Group counts follow the spec's `groups`: completion and memory groups span the whole length grid
(each group appears at every length: 80 x 4 x 5 = 1,600 and 128 x 2 x 5 = 1,280 samples), register
and compose groups are drawn per cell (128 per register count or writes-per-register value). Every label is
re-derived from the text by the independent interpreter, every sample of a task must end in the same
token, label words must be single tokens after the query, and register samples can be padded to an
exact token length (a leading comment line of '#'s).
"""

from __future__ import annotations

import warnings

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.tasks.checker import check_sample
from fbt_probe.tasks.groups import Group, draw_group, group_space, render_group
from fbt_probe.tasks.rng import StableRng
from fbt_probe.tasks.spec import MAX_GROUPS, TaskSpec, check_knob, load_spec
from fbt_probe.tasks.tokenizer import (
    build_tokenizer,
    check_encoded,
    check_label_words,
    encode,
    token_name,
    tokenizer_sha256,
)

COLUMNS = (
    "task",
    "text",
    "token_ids",
    "label",
    "label_word",
    "pair_id",
    "group_id",
    "context_id",
    "length_knob",
    "n_tokens",
    "seed",
)


def _distinct_groups(spec: TaskSpec, knob: int, n: int, rng: StableRng, fits) -> list[Group]:
    """Up to `n` distinct groups (by id) for which `fits(group)` holds; fewer when the space is smaller."""
    seen, out, budget = set(), [], 40 * n + 2000
    while len(out) < n and budget > 0:
        budget -= 1
        g = draw_group(spec, knob, rng)
        if g.group_id in seen:
            continue
        seen.add(g.group_id)
        if fits(g):
            out.append(g)
    return out


def count_widths(spec: TaskSpec, tok) -> dict[int, int] | None:
    """completion under `tok`: the token length of the header with each count the spec can draw as
    `completed`, where these lengths differ (None where every count has one length, as under the
    built-in tokenizer, whose numbers up to 99 are single tokens). A minimal pair's two samples
    differ only in that count, so a pair of counts of two lengths would be samples of two lengths."""
    if spec.kind != "completion":
        return None
    lo, hi = spec.value_range
    lines = spec.template["header"]
    texts = ["\n".join(h.format(R=lo, C=v, S=spec.scratch_range[0]) for h in lines) for v in range(lo, hi + 1)]
    widths = dict(zip(range(lo, hi + 1), map(len, encode(tok, texts))))
    return widths if len(set(widths.values())) > 1 else None


def _cells(spec: TaskSpec, n_groups: int, seed: int, contexts, widths=None) -> list[tuple[int, list]]:
    """[(knob, [Sample, ...])] in grid order; `widths` (`count_widths`): draw only groups whose two
    counts have one token length."""

    def render(knob, g):
        return render_group(spec, knob, g, StableRng("fbt-probe.tasks", spec.task, seed, knob, g.group_id), contexts)

    out = []
    if spec.kind in ("registers", "compose"):  # a schedule or a word has the cell's size: groups per cell
        for knob in spec.length_grid:
            rng = StableRng("fbt-probe.tasks", spec.task, seed, knob)
            n = min(n_groups, group_space(spec, knob))  # never more draws than the groups that exist
            groups = _distinct_groups(spec, knob, n, rng, lambda g: contexts is None or g.group_id in contexts)
            out.append((knob, [s for g in groups for s in render(knob, g)]))
        return out
    first = spec.length_grid[0]  # completion and memory groups do not depend on the length
    rng = StableRng("fbt-probe.tasks", spec.task, seed, "groups")
    probe = StableRng("unused")
    groups = _distinct_groups(
        spec,
        first,
        min(n_groups, group_space(spec, first)),
        rng,
        lambda g: (
            (widths is None or widths[g.params[0]] == widths[g.params[1]])
            and render_group(spec, first, g, probe, contexts) is not None
        ),
    )
    return [(knob, [s for g in groups for s in render(knob, g)]) for knob in spec.length_grid]


def _rows(spec: TaskSpec, n_groups: int, seed: int, contexts, widths) -> tuple[list[dict], dict]:
    """The rows of every cell (a pair's two samples adjacent) and each cell's group counts; a warning
    for a cell with fewer distinct groups than asked for (and its grid allows)."""
    rows, counts = [], {}
    for knob, samples in _cells(spec, n_groups, seed, contexts, widths):
        n_cell_groups = len({s.group_id for s in samples})
        counts[str(knob)] = {"groups": n_cell_groups, "requested_groups": n_groups}
        for s in samples:
            rows.append(
                {
                    "task": spec.task,
                    "text": s.text,
                    "label": s.label,
                    "label_word": spec.label_words[s.label],
                    "pair_id": len(rows) // 2,
                    "group_id": s.group_id,
                    "context_id": s.context_id,
                    "length_knob": knob,
                    "seed": seed,
                    "_query": s.pair,
                }
            )
        if n_cell_groups < min(n_groups, group_space(spec, knob)):
            warnings.warn(
                f"{spec.task}: {spec.knob_name}={knob} has only {n_cell_groups} distinct group(s) "
                f"(asked for {n_groups})",
                stacklevel=3,  # the caller of `generate`
            )
    return rows, counts


def _count_cells(df: pd.DataFrame, counts: dict) -> None:
    """Adds each cell's samples, pairs and token-length range to its `counts` entry."""
    for knob, c in counts.items():
        cell = df[df.length_knob == int(knob)]
        c.update(
            samples=len(cell),
            pairs=len(cell) // 2,
            n_tokens_min=int(cell.n_tokens.min()) if len(cell) else None,
            n_tokens_max=int(cell.n_tokens.max()) if len(cell) else None,
        )


def generate(
    spec,
    groups: int | None = None,
    seed: int | None = None,
    tokenizer=None,
    contexts=None,
    tokenizer_name: str | None = None,
    option: str = "groups",
) -> pd.DataFrame:
    """One row per sample, the two samples of a pair adjacent, cells in length-grid order.

    `groups` and `seed` override the spec's; `tokenizer` defaults to `build_tokenizer([spec])`;
    `contexts` (a container of context ids, e.g. a `HeldOut`) restricts sampling to those contexts.
    Each label word must be one token of `tokenizer` after the query (`tokenizer_name` names it in errors).
    `df.attrs` carries the spec, seed, per-cell counts, the shared final token and, for register
    specs with `suffix_spans`, how many tokens each paper k covers (`suffix_tokens`)."""
    spec = load_spec(spec)
    n_groups = spec.groups if groups is None else groups
    seed = spec.seed if seed is None else seed
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or not 1 <= n_groups <= MAX_GROUPS:
        raise FbtError(f"{option}: expected an integer 1..{MAX_GROUPS} (structural groups), got {n_groups!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FbtError(f"seed: expected an integer >= 0, got {seed!r}")
    for knob in spec.length_grid:
        check_knob(spec, knob, where=f"{spec.source or spec.task}: field 'length_grid'")
    tok = tokenizer if tokenizer is not None else build_tokenizer([spec])
    name = tokenizer_name or ("the given tokenizer" if tokenizer is not None else "the built-in tokenizer")
    _note_cap(spec, n_groups, option)
    widths = count_widths(spec, tok)
    if widths is not None:
        _note_widths(spec, widths, name)
    rows, counts = _rows(spec, n_groups, seed, contexts, widths)
    if not rows and widths is not None:
        raise FbtError(
            f"{spec.task}: under {name} no two counts of field 'value_range' give the header one length "
            f"({_lengths(widths)}), so no minimal pair can be exact; use a tokenizer that keeps them whole, or a "
            "value_range of counts of one length"
        )
    if not rows:
        raise FbtError(f"{spec.task}: no group can be produced (is the contexts filter empty for this task?)")

    def describe(i: int) -> str:
        r = rows[i]
        return f"pair {r['pair_id']}, {r['label_word']}, {spec.knob_name}={r['length_knob']}"

    for i, r in enumerate(rows):
        check_sample(spec, r["text"], r["label"], r["label_word"], f"{spec.task}: sample {i} ({describe(i)})")
    ids = encode(tok, [r["text"] for r in rows])
    target = _pad(spec, tok, rows, ids)
    final = check_encoded(tok, spec.task, ids, describe)
    check_pairs(tok, spec.task, ids, describe, name)
    check_label_words(tok, spec.task, rows[0]["text"].rsplit("\n", 1)[-1], spec.label_words, name)
    for r, row_ids in zip(rows, ids):
        r["token_ids"], r["n_tokens"] = row_ids, len(row_ids)
    suffix = _suffix_tokens(spec, tok, rows) if spec.suffix_spans else None
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    _count_cells(df, counts)
    df.attrs.update(
        spec=spec.to_dict(),
        seed=seed,
        groups=n_groups,
        counts=counts,
        final_token_id=int(final),
        final_token=tok.id_to_token(final),
        tokenizer_sha256=tokenizer_sha256(tok),
    )
    if suffix is not None:
        df.attrs["suffix_tokens"] = suffix
    if target is not None:
        df.attrs["padded_to"] = target
    return df


def check_pairs(tok, task: str, ids: list[list[int]], describe, name: str) -> None:
    """Every minimal pair (samples 2i and 2i + 1) is exact under `tok`: its two samples have one
    token length (their final token is checked for every sample by `check_encoded`); else a one-line
    FbtError naming the pair and the pieces in which its samples differ."""
    for i in range(0, len(ids) - 1, 2):
        a, b = ids[i], ids[i + 1]
        if len(a) != len(b):
            pa, pb = _differing(tok, a, b)
            raise FbtError(
                f"{task}: pair {i // 2} ({describe(i)}) is not exact under {name}: its samples have {len(a)} and "
                f"{len(b)} tokens, differing in {pa} against {pb}; no value of the spec keeps them one length "
                "under this tokenizer (use a tokenizer that keeps these values whole, or another spec)"
            )


def _differing(tok, a: list[int], b: list[int]) -> tuple[str, str]:
    """The token pieces where `a` and `b` differ (their common start and end left out)."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1

    def pieces(ids: list[int]) -> str:
        return " ".join(token_name(tok, t) for t in ids[start : len(ids) - end]) or "nothing"

    return pieces(a), pieces(b)


def _note_widths(spec: TaskSpec, widths: dict[int, int], name: str) -> None:
    """Say that the counts are drawn so that every pair stays one length (and how many tokens each has)."""
    warnings.warn(
        f"{spec.task}: under {name} the header's length depends on the count ({_lengths(widths)}); only groups "
        "whose two counts have the same length are drawn, so both samples of every minimal pair have one length",
        stacklevel=3,
    )


def _lengths(widths: dict[int, int]) -> str:
    """'with 0-9: 14 tokens; with 10-13: 15 tokens': the header's token length with each count."""
    by: dict[int, list[int]] = {}
    for v, w in widths.items():
        by.setdefault(w, []).append(v)
    return "; ".join(f"with {_spans(vs)}: {w} tokens" for w, vs in sorted(by.items()))


def _spans(values: list[int]) -> str:
    """Sorted integers as ranges: [0, 1, 2, 5] -> '0-2, 5'."""
    out, run = [], [values[0]]
    for v in values[1:]:
        if v == run[-1] + 1:
            run.append(v)
        else:
            out.append(run)
            run = [v]
    out.append(run)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _note_cap(spec: TaskSpec, n_groups: int, option: str) -> None:
    """One note where more groups are asked for than the spec can produce (at a knob value): those
    cells hold every group there is, found in time bounded by what exists, not by the request."""
    capped = {k: group_space(spec, k) for k in spec.length_grid if group_space(spec, k) < n_groups}
    if spec.kind in ("completion", "memory"):
        capped = dict(list(capped.items())[:1])
    if capped:
        where = ", ".join(f"{spec.knob_name}={k}: {n:,}" for k, n in capped.items())
        per = "" if spec.kind in ("completion", "memory") else " per cell"
        warnings.warn(
            f"{spec.task}: {option} {n_groups:,} is more than the distinct groups the spec can produce{per} "
            f"({where if per else f'{next(iter(capped.values())):,}'}); capped at that",
            stacklevel=3,
        )


PAD_LINE = "#"  # padding: one leading line of '#'s (a comment the interpreter skips)


def _pad(spec: TaskSpec, tok, rows: list[dict], ids: list[list[int]]) -> int | None:
    """Pad every sample to the spec's `pad_to` token length (in place); the target, or None."""
    if spec.pad_to is None:
        return None
    target = max(map(len, ids)) if spec.pad_to == "max" else spec.pad_to
    found: dict[int, int] = {}  # missing tokens -> '#'s that add exactly that many (under this tokenizer)
    for i, r in enumerate(rows):
        missing = target - len(ids[i])
        if missing < 0:
            raise FbtError(
                f"{spec.task}: field 'pad_to': sample {i} already has {len(ids[i])} tokens, more than "
                f'{target}; raise pad_to or use "max"'
            )
        if missing == 0:
            continue
        tries = [found[missing]] if missing in found else range(missing)
        for j in tries:
            text = " ".join([PAD_LINE] * j) + "\n" + r["text"]
            new = encode(tok, [text])[0]
            if len(new) == target:
                found[missing] = j
                r["text"], ids[i] = text, new
                break
        else:
            raise FbtError(
                f"{spec.task}: field 'pad_to': sample {i} cannot be padded from {len(ids[i])} to exactly "
                f"{target} tokens with a leading line of '{PAD_LINE}'s under this tokenizer"
            )
    return target


def _suffix_tokens(spec: TaskSpec, tok, rows: list[dict]) -> dict:
    """Paper k -> how many final tokens cover its span (the same for every sample, else FbtError)."""
    out = {}
    for k, span in spec.suffix_spans.items():
        counts = set()
        for r in rows:
            text, piece = r["text"], span.format(i=r["_query"])
            if not text.endswith(piece):
                raise FbtError(
                    f"{spec.task}: field 'suffix_spans' k={k}: {piece!r} is not the end of sample {r['pair_id']}'s text"
                )
            head = encode(tok, [text[: len(text) - len(piece)]])[0]
            if r["token_ids"][: len(head)] != head:
                raise FbtError(
                    f"{spec.task}: field 'suffix_spans' k={k}: the tokenizer does not split the text where "
                    f"{piece!r} starts, so no whole-token suffix covers it"
                )
            counts.add(len(r["token_ids"]) - len(head))
        if len(counts) != 1:
            raise FbtError(
                f"{spec.task}: field 'suffix_spans' k={k}: {span!r} covers {sorted(counts)} tokens in different "
                "samples under this tokenizer; a recurrent:k suffix would not mean one span"
            )
        out[k] = counts.pop()
    return out


def suffix_modes(manifest_or_attrs: dict, ks=(1, 2, 4)) -> dict[str, str]:
    """'recurrent:<paper k>' -> the mode string whose suffix covers the same span under the dataset's
    tokenizer (identity under the built-in tokenizer; without `suffix_tokens`, identity)."""
    got = manifest_or_attrs.get("suffix_tokens") or {}
    return {f"recurrent:{k}": f"recurrent:{got.get(str(k), k)}" for k in ks}
