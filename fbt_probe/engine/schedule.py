"""A mode's schedule: the chunks its computation runs, in order, and the one runner that sets the
hook context while a chunk runs (docs/modes.md).

A *chunk* is one call of the model's arithmetic over some positions: a parallel pass over the whole
sequence, a standard prefix through the KV cache, or one serial step. What feeds its layer-0 input
is part of the chunk (`feeds`):

| rule (`model.hook_rule`) | recurrent:k / full                                 | jacobi:K                        |
|--------------------------|----------------------------------------------------|---------------------------------|
| one-pass                 | `final` over 0..T-1, fed the silently computed states of the serial scan | `final`, fed the silent passes' states |
| serial                   | `prefix` 0..P-1 plain, then `step` t for t = P..T-1, each fed the previous step's top state | `pass` k = 1..K over 0..T-1, pass k >= 2 fed pass k-1's right-shifted top states |
| exact                    | `exact` k = 1..recurrent: k+1, full: T, each fed pass k-1's shifted top states at the fed positions | the same, K passes |

`standard` (and `jacobi:1`) is one `final` chunk under every rule. Prefix reuse
(`fbt_probe.engine.prefix`) runs the same chunks cut at its start position (`Schedule.cut`).
`run_chunk` is the one place `model.hook_context` is set: hooks read it to know which chunk, pass
and global positions the tensors they see cover.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fbt_probe.engine.hooks import HookContext
from fbt_probe.modes import Mode, require_mode


@dataclass(frozen=True)
class Chunk:
    """One call of the model over `positions` (global, 0-based)."""

    phase: str  # "final", "prefix", "step", "pass", "exact" or "backward"
    positions: range
    feeds: str = "none"  # what the fed positions' layer-0 input is fused with: "none", "carried",
    # "previous-step" or "previous-pass"
    pass_index: int = 1  # the pass (1-based) of a parallel pass; 1 elsewhere
    n_passes: int = 1  # passes of the run the chunk belongs to

    def context(self) -> HookContext:
        return HookContext(self.phase, self.positions, self.pass_index, self.n_passes)


class Schedule:
    """The chunks `mode` runs on T positions under each hook rule."""

    def __init__(self, mode: Mode, T: int):
        self.mode = require_mode(mode)
        self.T = T
        mode.check_length(T)

    @property
    def fed_from(self) -> int:
        """The first position that takes a carried state (T: none)."""
        return self.mode.first_fed_position(self.T)

    @property
    def carries(self) -> bool:
        return self.fed_from < self.T

    def has_state(self, device=None, start: int = 0) -> torch.Tensor:
        """[T - start] positions start..T-1 that take a carried state."""
        return torch.arange(start, self.T, device=device) >= self.fed_from

    def final(self) -> Chunk:
        """The one hooked pass of the one-pass rule."""
        feeds = "carried" if self.carries else "none"
        return Chunk("final", range(self.T), feeds, self.mode.passes(self.T), self.mode.passes(self.T))

    def serial(self) -> list[Chunk]:
        """The chunks of the serial computation (the serial rule, `serial=True`)."""
        T, kind = self.T, self.mode.kind
        if kind == "jacobi":
            return [c for c, _ in jacobi_chunks(T, self.mode.passes(T), every=True)]
        if kind in ("recurrent", "full"):
            return scan_chunks(T, self.mode.n_serial(T))
        return [self.final()]

    def exact(self) -> list[Chunk]:
        """The passes of the exact hook rule: pass k fixes the k-th fed position."""
        K = self.mode.exact_passes(self.T)
        return [Chunk("exact", range(self.T), "none" if k == 1 else "previous-pass", k, K) for k in range(1, K + 1)]

    def backward(self) -> Chunk:
        """What a backward hook of the exact rule sees: the gradient summed over its passes."""
        K = self.mode.exact_passes(self.T)
        return Chunk("backward", range(self.T), "none", K, K)

    def cut(self, chunks: list[Chunk], start: int) -> list[Chunk]:
        """`chunks` restricted to positions >= start (prefix reuse): a chunk wholly before `start`
        is dropped, one that straddles it keeps its positions from `start` on."""
        out = []
        for c in chunks:
            if c.positions.stop <= start:
                continue
            out.append(c if c.positions.start >= start else replace(c, positions=range(start, c.positions.stop)))
        return out


def jacobi_chunks(T: int, K: int, every: bool) -> list[tuple[Chunk, bool]]:
    """K parallel passes of the Jacobi iteration over T positions, each with whether its hooks fire:
    in every pass (`every`, context `pass`) or in pass K only (context `final`)."""
    return [
        (Chunk("pass" if every else "final", range(T), "none" if k == 1 else "previous-pass", k, K), every or k == K)
        for k in range(1, K + 1)
    ]


def scan_chunks(T: int, n_serial: int, stop: int | None = None) -> list[Chunk]:
    """The serial scan of positions 0..stop-1 (default T) whose last `n_serial` positions are
    computed one at a time: the plain prefix 0..P-1 (P = T - n_serial, at most stop), then one step
    per position, each fed the previous step's top state."""
    stop = T if stop is None else stop
    P = min(T - n_serial, stop)
    return [Chunk("prefix", range(P))] + [Chunk("step", range(t, t + 1), "previous-step") for t in range(P, stop)]


def answer_step(T: int, fed: bool) -> Chunk:
    """The final position alone, as one serial step over a frozen prefix (DAS's final step, Soft
    decoding of the answer), fed a carried state or not."""
    return Chunk("step", range(T - 1, T), "previous-step" if fed else "none")


def run_chunk(model, chunk: Chunk | None, fn, *args):
    """`fn(*args)` with `model.hook_context` naming `chunk` while it runs (None: no hook fires, no
    context); the one runner that sets the context."""
    model.hook_context = None if chunk is None else chunk.context()
    try:
        return fn(*args)
    finally:
        model.hook_context = None
