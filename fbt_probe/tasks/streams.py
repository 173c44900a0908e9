"""Training streams: the same generators, as documents with the answer word after the colon, and
the held-out split that keeps probe-time contexts out of training.

The unit held out is the pair's *context* (`context_id`): completion (required, scratch) — holding
out whole count pairs {a, b} would leave training almost no `more` cases, since the paper's 80 probe
groups use 80 of the 91 pairs —; memory the scratch context; registers the update schedule (with
its complement). For memory and registers the context is the group id itself.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.tasks.groups import draw_group, render_group
from fbt_probe.tasks.rng import StableRng
from fbt_probe.tasks.spec import TaskSpec, check_knob, load_spec
from fbt_probe.tasks.tokenizer import answer_ids, build_tokenizer


@dataclass(frozen=True)
class HeldOut:
    """Contexts held out of training: `context_id in held` iff the context's task is in `tasks`
    (all tasks when None) and sha256(seed, context_id) falls in the lowest `fraction` of the range.
    Hashing, not listing, because memory's 2**N scratch contexts cannot be enumerated."""

    fraction: float
    seed: int = 0
    tasks: frozenset | None = None

    def __contains__(self, context_id) -> bool:
        if not isinstance(context_id, str):
            return False
        if self.tasks is not None and context_id.split(":", 1)[0] not in self.tasks:
            return False
        digest = hashlib.sha256(f"fbt-probe.heldout:{self.seed}:{context_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < self.fraction * 2.0**64

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """Rows of a dataset whose context is held out."""
        return np.fromiter((c in self for c in df["context_id"]), dtype=bool, count=len(df))

    def split(self, df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(rows usable for training, held-out rows); pairs are never split (they share a context)."""
        m = self.mask(df)
        return df[~m], df[m]


def heldout_groups(spec_or_task, fraction: float = 0.2, seed: int = 0) -> HeldOut:
    """The held-out contexts of one task (a spec, a built-in name or a spec path) or a list of them."""
    items = spec_or_task if isinstance(spec_or_task, (list, tuple)) else [spec_or_task]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise FbtError(f"heldout fraction: expected a number in [0, 1], got {fraction!r}")
    return HeldOut(float(fraction), int(seed), frozenset(load_spec(s).task for s in items))


def _excluded(ex, context_id: str, group_id: str) -> bool:
    if ex is None:
        return False
    if isinstance(ex, HeldOut):
        return context_id in ex
    return context_id in ex or group_id in ex


def _per_task(value, specs: dict, what: str, default) -> dict:
    if value is None:
        return {t: default(s) for t, s in specs.items()}
    if isinstance(value, dict):
        unknown = set(value) - set(specs)
        if unknown:
            raise FbtError(f"{what}: unknown task(s) {sorted(unknown)} (tasks: {', '.join(specs)})")
        return {t: value.get(t, default(s)) for t, s in specs.items()}
    return {t: value for t in specs}


def training_documents(
    specs, tokenizer=None, n: int = 1000, seed: int = 0, mixture=None, exclude_groups=None, knobs=None
) -> Iterator[dict]:
    """Yield `n` training documents drawn from the task generators.

    Each is a dict: `token_ids` (sample text, then the answer word, then a newline), `answer_pos`
    (index of the answer-word token; the model's prediction for it is read at `answer_pos - 1`, the
    shared colon), `task`, `group_id`, `context_id`, `label`, `label_word`, `length_knob`, `text`.
    `mixture`: task -> weight (default uniform). `knobs`: a list of length-grid values for every
    task, or task -> list (default each spec's grid). `exclude_groups`: a `HeldOut` (matched on
    context ids) or any container of context or group ids; such documents are never produced.
    One random sample of a freshly drawn group per document; groups may repeat across documents."""
    spec_list = [load_spec(s) for s in (specs if isinstance(specs, (list, tuple)) else [specs])]
    by_task: dict[str, TaskSpec] = {s.task: s for s in spec_list}
    if len(by_task) != len(spec_list):
        raise FbtError("specs: two specs share a task name")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise FbtError(f"n: expected an integer >= 0, got {n!r}")
    tok = tokenizer if tokenizer is not None else build_tokenizer(spec_list)
    weights = _per_task(mixture, by_task, "mixture", lambda s: 1.0)
    if (
        not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights.values())
        or sum(weights.values()) <= 0
    ):
        raise FbtError(f"mixture: expected non-negative finite weights with a positive sum, got {weights}")
    tasks = [t for t in by_task if weights[t] > 0]
    grids = _per_task(knobs, by_task, "knobs", lambda s: list(s.length_grid))
    for t in tasks:
        if not isinstance(grids[t], (list, tuple)) or not grids[t]:
            raise FbtError(f"knobs[{t}]: expected a non-empty list of length-grid values, got {grids[t]!r}")
        for k in grids[t]:
            check_knob(by_task[t], k, where=f"knobs[{t}]")
    cum = np.cumsum([weights[t] for t in tasks]) / sum(weights[t] for t in tasks)
    rng, final = StableRng("fbt-probe.train", seed), {}
    for _ in range(n):
        task = tasks[min(int(np.searchsorted(cum, rng.uniform(), side="right")), len(tasks) - 1)]
        spec = by_task[task]
        for _attempt in range(10_000):
            knob = rng.choice(grids[task])
            samples = render_group(spec, knob, draw_group(spec, knob, rng), rng)
            sample = samples[rng.below(len(samples))]
            if not _excluded(exclude_groups, sample.context_id, sample.group_id):
                break
        else:
            raise FbtError(f"exclude_groups: no {task} document found outside the excluded groups in 10,000 draws")
        text, label, group = sample.text, sample.label, sample.group_id
        word = spec.label_words[label]
        ids, pos = answer_ids(tok, text, word)
        if pos is None:
            raise FbtError(f"{task}: answer word {word!r} is not a single token after the colon under this tokenizer")
        if final.setdefault(task, ids[pos - 1]) != ids[pos - 1]:
            raise FbtError(
                f"{task}: a document's last token before the answer is id {ids[pos - 1]}, not the shared id {final[task]}"
            )
        yield {
            "token_ids": ids,
            "answer_pos": pos,
            "task": task,
            "group_id": group,
            "context_id": sample.context_id,
            "label": label,
            "label_word": word,
            "length_knob": knob,
            "text": text,
        }
