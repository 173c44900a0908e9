"""The executable schedule: `Walk` runs any list of a mode's chunks (`schedule.Chunk`) on a model.

`Schedule` says which chunks a rule runs; the walk runs them. It is the one place that feeds a
chunk's layer-0 input, runs the chunk with the hook context set (`run_chunk`) and carries its top
state on (shifted one position right into the next pass; the last position's into the next step),
and it calls the model only through `Primitives`.

    consumer                               chunks walked                                 callback
    model(tokens, mode): one-pass rule     Schedule.carry() silent, then .final()        -
                         serial, exact     Schedule.serial(); .exact() under GradTaps    -
    prefix reuse (engine.prefix)           Schedule.cut(.., 0, upto) silent, then (.., start)   -
    training (eq. 12), contraction, Fig. 4 jacobi_chunks(T, K)                           each pass
    training (schedule `full`)             Schedule(full).serial() silent, per-row `has`   -

A chunk over a range of positions is one pass (through a KV cache holding the positions before it,
or over the whole sequence without one); a `step` chunk is one position through the cache, on the
lean step (`step.DecodePlan`) where nothing can observe it (`dispatch.step`), and a silent run of
steps is one scan, CUDA-graphed where `dispatch.scan` says so.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fbt_probe.engine import dispatch
from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.graph_scan import GraphedScan
from fbt_probe.engine.hooks import Hk, HookContext, hooked, silent
from fbt_probe.engine.schedule import Chunk, Schedule, jacobi_chunks, run_chunk
from fbt_probe.engine.step import DecodePlan
from fbt_probe.modes import Mode, parse_mode

SILENT_CHUNK_TOKENS = 8192  # batch x positions per chunk of a silent pass through the KV cache (memory bound)


class Primitives(Protocol):
    """All the engine may use of a model (`FeedbackTransformer` implements it): the walk calls the
    three primitives a chunk is made of; the lean step reads the weights below, `dispatch` the
    flags, `run_chunk` sets `hook_context`, prefix reuse attaches hooks (TransformerLens's `hooks`)
    and `dispatch.use_path` walks `modules()`."""

    cfg: Any
    hook_context: HookContext | None
    training: bool
    paper_backbone: bool  # False: a family's extras, which the lean step does not compute
    cuda_graphs: bool
    embed: torch.nn.Embedding
    fusion: torch.nn.Module  # W_U, `gate(e)` (σ(W_G e), the gate written once) and `norm`
    blocks: torch.nn.ModuleList
    ln_final: torch.nn.Module
    head_weight: torch.Tensor

    def embed_fuse(self, tokens, states, has_state, hk: Hk, start: int = 0, cache=None) -> torch.Tensor: ...
    def trunk(self, x, start: int, cache, hk: Hk, tokens=None, stop: int | None = None) -> torch.Tensor: ...
    def top(self, h, hk: Hk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...  # (state, normed, logits)
    def hooks(self, fwd_hooks=(), **kwargs): ...
    def modules(self): ...


# ----------------------------------------------------------------- one chunk
def run_pass(m: Primitives, tokens, states, has, hk: Hk, start: int = 0, cache=None, stop: int | None = None):
    """One pass over tokens [batch, n] at positions start.. (through `cache`, which holds the
    positions before start, or over the whole sequence without one): (top states, logits), or with
    `stop` (the residual stream at block stop's input, None)."""
    x = m.embed_fuse(tokens, states, has, hk, start, cache)
    h = m.trunk(x, start, cache, hk, tokens, stop)
    if stop is not None:
        return h, None
    state, _, logits = m.top(h, hk)
    return state, logits


def extend(m: Primitives, tokens, cache: KVCache, states=None, has=None, hk: Hk = silent):
    """Positions cache.length.. of tokens [batch, n] through the KV cache (written in place): (top
    states, logits). A long silent pass runs in chunks of about SILENT_CHUNK_TOKENS tokens through
    the cache: the same function up to float rounding, activations held for one chunk."""
    B, P = tokens.shape
    size = max(1, SILENT_CHUNK_TOKENS // max(B, 1))
    if hk is not silent or P <= size:
        return run_pass(m, tokens, states, has, hk, cache.length, cache)
    cut = lambda t, a: None if t is None else t[..., a : a + size, :] if t.dim() == 3 else t[..., a : a + size]  # noqa: E731
    parts = [extend(m, tokens[:, a : a + size], cache, cut(states, a), cut(has, a), hk) for a in range(0, P, size)]
    return torch.cat([s for s, _ in parts], dim=1), torch.cat([lg for _, lg in parts], dim=1)


def decode_plan(m: Primitives) -> DecodePlan | None:
    """The lean step of `m` as its weights are now, or None where the module path runs (`dispatch.step`)."""
    return DecodePlan(m) if dispatch.step(m) == "plan" else None


def step(m: Primitives, token, cache: KVCache, state, hk: Hk = silent, has=None):
    """One position through the KV cache: token [batch], state [batch, d_model] carried in (None: a
    plain embedding) -> (logits [batch, d_vocab], top state); `has` [batch, 1]: the rows fused (None:
    every row). Hooks off and every row fused: the lean step where it applies."""
    plan = decode_plan(m) if hk is silent and has is None else None
    if plan is not None:
        return plan.step(token, cache, state)
    new, logits = extend(m, token[:, None], cache, None if state is None else state[:, None], has, hk)
    return logits[:, 0], new[:, 0]


def shift(top: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
    """Top states [batch, n, d_model] one position right, what the next pass is fed; the first
    position gets `first` [batch, d_model] (the state from before it; None: zeros, no state)."""
    first = torch.zeros_like(top[:, :1]) if first is None else first[:, None]
    return torch.cat([first, top[:, :-1]], dim=1)


# ----------------------------------------------------------------- the walk
class Walk:
    """Chunks of `tokens` [batch, T] run in order, hooks calling `hk` in the chunks that fire.

    has: [T] or [batch, T], the positions a fed pass fuses (a step fuses a row's position only
    where a [batch, T] `has` says so: training's plain prompt prefixes); states: [batch, T, d_model], what a
    `carried` chunk is fed; caches: one KV cache per pass (pass k's at k - 1) or one for all (a
    scan without one makes it); entry: pass -> [batch, d_model], its top state at the position
    before the first chunk (prefix reuse); each(chunk, state, logits, previous) after every chunk
    (previous: the chunk before's top states). After `run`: `logits` (the last pass's, from the
    first chunk's position on), `top` (the last chunk's top states) and `top_states(k)`."""

    def __init__(
        self, m: Primitives, tokens, hk: Hk = hooked, *, has=None, states=None, caches=(), entry=None, each=None
    ):
        self.m, self.tokens, self.hk, self.has, self.states = m, tokens, hk, has, states
        self.caches, self.entry, self.each = list(caches), entry or {}, each
        self.start, self.top, self._logits, self._tops = 0, None, [], {}

    @property
    def logits(self) -> torch.Tensor:
        return self._logits[0] if len(self._logits) == 1 else torch.cat(self._logits, dim=1)

    def top_states(self, k: int) -> torch.Tensor:
        """[batch, n, d_model] pass k's top states at every position it ran (a scan is pass 1)."""
        return torch.cat(self._tops[k], dim=1) if len(self._tops[k]) > 1 else self._tops[k][0]

    def run(self, chunks: list[Chunk], stop: int | None = None) -> "Walk":
        """Each chunk in turn; with `stop`, the last one through blocks 0..stop-1 only (`top` is then
        the residual stream there)."""
        self.start = chunks[0].positions.start if chunks else 0
        for i, chunk in enumerate(chunks):
            if chunk.phase == "step" and self._scan(chunks[i:]):
                break
            self._chunk(chunk, stop if i == len(chunks) - 1 else None)
        return self

    def feed(self, chunk: Chunk):
        """(states, has_state) of `chunk`'s layer-0 input (`Chunk.feeds`)."""
        a, b = chunk.positions.start, chunk.positions.stop
        has = None if self.has is None else self.has[..., a:b]
        if chunk.feeds == "carried":
            return self.states[:, a:b], has
        if chunk.feeds == "previous-pass":
            return shift(self.top, self.entry[chunk.pass_index - 1] if a > 0 else None), has
        if chunk.feeds == "previous-step":
            rows = None if self.has is None or self.has.dim() == 1 else self.has[:, a:b]  # [T]: every step is fed
            return (self.entry[chunk.pass_index] if self.top is None else self.top[:, -1]), rows
        return None, None

    def _cache(self, chunk: Chunk) -> KVCache | None:
        if not self.caches:
            if chunk.phase not in ("prefix", "step"):
                return None  # a pass over the whole sequence
            self.caches = [KVCache(self.m.cfg.n_layers, self.tokens.shape[1])]
        return self.caches[0] if len(self.caches) == 1 else self.caches[chunk.pass_index - 1]

    def _chunk(self, chunk: Chunk, stop: int | None) -> None:
        (a, b), cache = (chunk.positions.start, chunk.positions.stop), self._cache(chunk)
        hk, ctx = (self.hk, chunk) if chunk.hooked and self.hk is not silent else (silent, None)
        states, has = self.feed(chunk)
        if chunk.phase == "step":
            logits, state = run_chunk(self.m, ctx, step, self.m, self.tokens[:, a], cache, states, hk, has)
            state, logits = state[:, None], logits[:, None]
        elif cache is None or stop is not None:
            state, logits = run_chunk(
                self.m, ctx, run_pass, self.m, self.tokens[:, a:b], states, has, hk, a, cache, stop
            )
        else:
            state, logits = run_chunk(self.m, ctx, extend, self.m, self.tokens[:, a:b], cache, states, has, hk)
        if self.each is not None:
            self.each(chunk, state, logits, self.top)
        self._keep(chunk, state, logits)

    def _keep(self, chunk: Chunk, state: torch.Tensor, logits: torch.Tensor) -> None:
        if chunk.positions.start == self.start:  # a new pass
            self._logits = []
        self._logits.append(logits)
        self._tops.setdefault(chunk.pass_index, []).append(state)
        self.top = state

    def _scan(self, chunks: list[Chunk]) -> bool:
        """The silent steps `chunks` as one scan on the lean step (one plan: the weights are fixed),
        CUDA-graphed where `dispatch.scan` says so; False where each step runs by itself (hooks on,
        a callback, or no plan applies)."""
        rows = self.has is not None and self.has.dim() == 2  # per-row fusing: each step by itself
        plan = (
            None if self.hk is not silent or self.each is not None or self.top is None or rows else decode_plan(self.m)
        )
        if plan is None:
            return False
        a, b, prev = chunks[0].positions.start, chunks[-1].positions.stop, self.top[:, -1]
        cache, fed = self._cache(chunks[0]), prev.new_zeros(prev.shape[0], b, prev.shape[-1])  # fed[:, t]: into t
        out = self._logits[-1].new_empty(self.tokens.shape[0], b, self._logits[-1].shape[-1])
        if dispatch.scan(True, self.m.cuda_graphs, cache, self.tokens, a, b - a) == "graphed":
            prev = GraphedScan(plan, cache, self.tokens, fed, out, prev, a, fused_epilogue=self.m.cfg.fast_fusion).run(
                b - a
            )
        else:
            for t in range(a, b):
                fed[:, t] = prev
                out[:, t], prev = plan.step(self.tokens[:, t], cache, prev)
        self._keep(chunks[0], torch.cat([fed[:, a + 1 :], prev[:, None]], dim=1), out[:, a:])  # top of t: into t + 1
        return True


# ----------------------------------------------------------------- walks the consumers share
def passes(m: Primitives, tokens, K: int, hk: Hk = hooked, every: bool = False, has=None, each=None) -> Walk:
    """K passes of the Jacobi iteration: pass 1 feeds nothing, pass k the right-shifted top states of
    pass k - 1 at `has` ([T] or [batch, T]; default every position from 1 on). Hooks fire in pass K
    only, or in `every` pass."""
    has = torch.arange(tokens.shape[1], device=tokens.device) >= 1 if has is None else has
    return Walk(m, tokens, hk, has=has, each=each).run(jacobi_chunks(tokens.shape[1], K, every))


def recurrence(m: Primitives, tokens, has=None) -> Walk:
    """The exact recurrence `full` by its serial scan, silent: position t fused with position t - 1's
    top state where `has` ([T] or [batch, T]; default every position from 1 on) says so. Equal to
    the last of T Jacobi passes fed at the same `has` (`passes`), with the arithmetic of one pass."""
    sched = Schedule(parse_mode("full"), tokens.shape[1])
    has = sched.has_state(tokens.device) if has is None else has
    return Walk(m, tokens, silent, has=has).run(sched.serial())


def carried_states(m: Primitives, tokens, mode: Mode):
    """(states [batch, T, d_model], has_state [T], cache) that `mode`'s one-pass `final` chunk is
    fed, walked silently (`Schedule.carry`): each fed position gets the previous position's top
    state in the last pass (K - 1 of jacobi:K) or in the serial scan, whose `cache` holds positions
    0..T-2, which the exact final pass repeats; (None, None, None) where nothing is carried."""
    sched = Schedule(mode, tokens.shape[1])
    if not sched.carries:
        return None, None, None
    chunks, has = sched.carry(), sched.has_state(tokens.device)
    w = Walk(m, tokens, silent, has=has).run(chunks)
    tops = w.top_states(chunks[-1].pass_index)[:, : tokens.shape[1] - 1]  # positions 0..T-2
    states = torch.where(has[:, None], torch.cat([torch.zeros_like(tops[:, :1]), tops], dim=1), 0.0)
    return states, has, w.caches[0] if w.caches else None
