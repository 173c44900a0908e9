"""Prefixes shared by several experiments (`fbt-probe patch --experiment a,b,...`).

Every experiment that edits only the final position builds the same prefix of a batch: the silent
run of positions < T - 1 under the mode (`last_prefix`). Run one after the other, five experiments
recompute it five times (six with state replacement's two passes). Inside `sharing()`, `last_prefix`
asks the active pool first: the first experiment to meet a batch builds its prefix, the others
reuse it. The pool lives for one group of batches (`combined.units`), so at most one group's
prefixes are held at a time (what probe-direction holds on its own anyway).

A shared prefix gives the same numbers as a fresh one: every run starts at `upto` (the final
position), which rewrites only positions >= upto of the caches (`Prefix._restore`), so what one
experiment ran cannot leak into the next (tests/test_combined.py: tables equal to separate runs).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

from fbt_probe.engine.prefix import Prefix, build_prefix
from fbt_probe.modes import Mode

_POOL: ContextVar["PrefixPool | None"] = ContextVar("fbt_probe_prefix_pool", default=None)


class PrefixPool:
    """Final-position prefixes by (model, batch tokens, mode)."""

    def __init__(self) -> None:
        self._entries: dict = {}

    def get(self, model, tokens: torch.Tensor, mode: Mode) -> Prefix:
        key = (id(model), tokens.data_ptr(), tuple(tokens.shape), str(tokens.device), str(mode))
        hit = self._entries.get(key)
        # the tokens tensor is kept alive by the entry, so its address cannot be reused while it is
        # here; the content check guards against an in-place change of the batch
        if hit is not None and (hit[0] is tokens or torch.equal(hit[0], tokens)):
            return hit[1]
        pre = build_prefix(model, tokens, mode)
        self._entries[key] = (tokens, pre)
        return pre


def active() -> PrefixPool | None:
    return _POOL.get()


@contextmanager
def sharing(pool: PrefixPool):
    """`last_prefix` takes its prefixes from `pool` inside this block."""
    token = _POOL.set(pool)
    try:
        yield pool
    finally:
        _POOL.reset(token)
