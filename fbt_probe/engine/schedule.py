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

`standard` (and `jacobi:1`) is one `final` chunk under every rule. The one-pass rule's `final`
chunk is fed the states the silent chunks of `Schedule.carry` compute. Prefix reuse
(`fbt_probe.engine.prefix`) runs the chunks below its start position once, silently, and the
rest per run (`Schedule.cut`). `fbt_probe.engine.walk` runs any list
of chunks; `run_chunk` is the one place `model.hook_context` is set: hooks read it to know which
chunk, pass and global positions the tensors they see cover.
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
    hooked: bool = True  # its hooks fire (when the walk runs with hooks on)

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

    def has_state(self, device=None) -> torch.Tensor:
        """[T] the positions that take a carried state."""
        return torch.arange(self.T, device=device) >= self.fed_from

    def final(self) -> Chunk:
        """The one hooked pass of the one-pass rule."""
        feeds = "carried" if self.carries else "none"
        return Chunk("final", range(self.T), feeds, self.mode.passes(self.T), self.mode.passes(self.T))

    def serial(self) -> list[Chunk]:
        """The chunks of the serial computation (the serial rule, `serial=True`)."""
        T = self.T
        if self.mode.parallel:
            return jacobi_chunks(T, self.mode.passes(T), every=True)
        if self.mode.scans:
            return scan_chunks(T, self.mode.n_serial(T))
        return [self.final()]

    def carry(self) -> list[Chunk]:
        """The silent chunks that compute the states the one-pass rule's `final` chunk is fed: passes
        1..K-1 of jacobi:K (K < T), else the serial scan of positions 0..T-2 (jacobi:K with K >= T is
        `full`: its scan, in `full`'s time); none where nothing is carried."""
        T = self.T
        if not self.carries:
            return []
        if self.mode.parallel and self.mode.k < T:
            return jacobi_chunks(T, self.mode.k, every=False)[:-1]
        return scan_chunks(T, T - self.fed_from, stop=T - 1)

    def exact(self) -> list[Chunk]:
        """The passes of the exact hook rule: pass k fixes the k-th fed position."""
        K = self.mode.exact_passes(self.T)
        return [Chunk("exact", range(self.T), "none" if k == 1 else "previous-pass", k, K) for k in range(1, K + 1)]

    def backward(self) -> Chunk:
        """What a backward hook of the exact rule sees: the gradient summed over its passes."""
        K = self.mode.exact_passes(self.T)
        return Chunk("backward", range(self.T), "none", K, K)

    @staticmethod
    def cut(chunks: list[Chunk], start: int, stop: int | None = None) -> list[Chunk]:
        """`chunks` restricted to positions start..stop-1 (prefix reuse walks those below `upto` once,
        those from `start` on per run): a chunk outside is dropped, one across a bound keeps its part."""
        out = []
        for c in chunks:
            a, b = max(c.positions.start, start), c.positions.stop if stop is None else min(c.positions.stop, stop)
            if a < b:
                out.append(c if range(a, b) == c.positions else replace(c, positions=range(a, b)))
        return out


def jacobi_chunks(T: int, K: int, every: bool) -> list[Chunk]:
    """K parallel passes of the Jacobi iteration over T positions, hooks firing in every pass
    (`every`, context `pass`) or in pass K only (context `final`)."""
    return [
        Chunk("pass" if every else "final", range(T), "none" if k == 1 else "previous-pass", k, K, every or k == K)
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
