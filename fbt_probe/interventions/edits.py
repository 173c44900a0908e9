"""Pure hook functions: every factory returns `fn(x, hook) -> x` for `run_with_hooks` (`set_at`: a
callable per-row edit).

Hooks are position-aware. In the one hooked pass of a mode (docs/modes.md) a hook sees the whole
sequence; with `serial=True` it fires once per chunk (the standard prefix, then each serial step)
and `model.hook_context.positions` names the global positions the chunk covers. Every factory
takes global positions and patches only the ones the firing chunk covers, so the same hook works
under both rules. Factories never mutate the incoming tensor (they return an edited clone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

HookFn = Callable[[torch.Tensor, object], torch.Tensor]


def span(model, x: torch.Tensor) -> range:
    """Global positions covered by the tensor a hook is firing with ([batch, pos, ...])."""
    ctx = getattr(model, "hook_context", None) if model is not None else None
    return ctx.positions if ctx is not None else range(x.shape[1])


@dataclass(frozen=True)
class SetAt:
    """x[:, position] <- values ([batch, ...], or broadcastable to it). A per-row edit: `take(rows)`
    is the same edit for rows `rows` of the batch (what `Forwards` needs to run a partner in place)."""

    values: torch.Tensor
    position: int
    model: object = None

    def __call__(self, x, hook=None):
        s = span(self.model, x)
        if self.position not in s:
            return x
        x = x.clone()
        x[:, self.position - s.start] = self.values.to(x.dtype)
        return x

    def take(self, rows: torch.Tensor) -> "SetAt":
        return replace(self, values=self.values[rows])


def set_at(values: torch.Tensor, position: int, model=None) -> SetAt:
    """x[:, position] <- values ([batch, ...], or broadcastable to it)."""
    return SetAt(values, position, model)


def edit_at(fn: Callable[[torch.Tensor], torch.Tensor], position: int, model=None) -> HookFn:
    """x[:, position] <- fn(x[:, position]) (fn maps [batch, ...] to the same shape)."""

    def hook(x, hook=None):
        s = span(model, x)
        if position not in s:
            return x
        x = x.clone()
        i = position - s.start
        x[:, i] = fn(x[:, i]).to(x.dtype)
        return x

    return hook


def patch_all(source: torch.Tensor, model=None) -> HookFn:
    """x <- source over every position the chunk covers. source: [batch, pos, ...] (whole sequence)."""

    def hook(x, hook=None):
        s = span(model, x)
        return source[:, s.start : s.stop].to(x.dtype).clone()

    return hook


def patch_rows_at(
    source: torch.Tensor, positions: torch.Tensor, model=None, src_rows: torch.Tensor | None = None
) -> HookFn:
    """Row r gets source[src_rows[r], positions[r]] at positions[r]: one position per row, so many
    positions are patched in one batched forward (replicas of a batch, each at its own position).
    source: [n, pos, ...]; positions, src_rows: LongTensor [rows] (src_rows defaults to 0..rows-1)."""

    def hook(x, hook=None):
        s = span(model, x)
        inside = (positions >= s.start) & (positions < s.stop)
        if not bool(inside.any()):
            return x
        rows = torch.nonzero(inside, as_tuple=True)[0]
        pos = positions[rows]
        src = rows if src_rows is None else src_rows[rows]
        x = x.clone()
        x[rows, pos - s.start] = source[src, pos].to(x.dtype)
        return x

    return hook


def capture(store: dict, key: str, model=None, position: int | None = None) -> HookFn:
    """Record the activation (detached): at one global `position` ([batch, ...]) or the chunks of the
    whole sequence (call `stitch(store[key])` for [batch, pos, ...])."""

    def hook(x, hook=None):
        s = span(model, x)
        if position is None:
            store.setdefault(key, []).append((s.start, x.detach().clone()))
        elif position in s:
            store[key] = x[:, position - s.start].detach().clone()
        return x

    return hook


def stitch(chunks: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """Chunks recorded by `capture` -> one [batch, pos, ...] tensor in position order."""
    return torch.cat([t for _, t in sorted(chunks, key=lambda c: c[0])], dim=1)


def rank_one_edit(r: torch.Tensor, l: torch.Tensor, b: torch.Tensor, shift: torch.Tensor | None = None):
    """Per-row affine edit x -> x - ((x - b)·r) l + shift; r, l, b, shift: [batch, D].

    Orthogonal projection off a unit direction w around a mean μ: r = l = w, b = μ. A LEACE eraser
    for a binary concept is the same form (rank one): r = proj_right, l = proj_left, b = its bias.
    Steering: r = 0 and shift = α·w."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        coef = ((x - b.to(x.dtype)) * r.to(x.dtype)).sum(-1, keepdim=True)
        out = x - coef * l.to(x.dtype)
        return out if shift is None else out + shift.to(x.dtype)

    return fn
