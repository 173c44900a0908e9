"""Prefix reuse: compute the positions before `start` of a mode's run once (hooks off, into KV
caches), then run only positions >= start with hooks on, as often as an experiment needs.

Both halves are walks (`fbt_probe.engine.walk`) of the rule's chunks: the build walks those below
`upto` silently into the caches (`Schedule.cut(chunks, 0, upto)`), a run those from `start` on
(`Schedule.cut(chunks, start)`), fed at `start` the one-pass rule's carried states or each pass's
top state at start - 1. Why a run equals the full re-run for every edit of positions >= start:
- one-pass rule: the carried states are computed before the hooked pass with hooks off, and in that
  pass a position attends only to itself and earlier ones, so its keys and values below `start` are
  those of a silent run with the same inputs: the serial scan itself where one computed the states
  (the hooked pass is exact, docs/modes.md), so its KV cache serves directly; else pass K.
- serial rule: chunks run in position order, so everything before `start` is finished before any
  edit; from `start` on the hooks fire in the full run's chunks cut at `start`, with the same
  `hook_context` phases and pass indices.
`hook_context.positions` names global positions, so the position-aware hooks of
`fbt_probe.interventions.edits` act as in the full run; a hook that indexes from the end (x[:, -1])
sees the same final positions. Logits at positions >= start equal the full run's up to float
rounding (different shapes): tests/test_prefix.py checks every mode and rule in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.hooks import hooked, silent
from fbt_probe.engine.schedule import Schedule
from fbt_probe.engine.walk import Primitives, Walk, carried_states
from fbt_probe.modes import Mode, require_mode
from fbt_probe.tokens import check_tokens


@dataclass
class Prefix:
    model: Primitives
    tokens: torch.Tensor  # [batch, T]
    mode: Mode
    serial: bool
    upto: int  # a run may start at any position 0..upto
    caches: list[KVCache]  # clean below `upto`: one, or one per pass (Jacobi, serial rule)
    states: torch.Tensor | None = None  # one-pass: carried states [batch, T, d_model]
    has: torch.Tensor | None = None  # [T] positions that take a carried state
    tops: list = field(default_factory=list)  # serial: top states [batch, upto, d_model] of each pass
    _valid: int = -1  # positions below it are clean in `caches`
    _clean: list[KVCache] | None = None  # copies taken before a run starts below `upto`

    @property
    def T(self) -> int:
        return self.tokens.shape[1]

    def chunks(self) -> list:
        """The chunks of the rule's whole run."""
        sched = Schedule(self.mode, self.T)
        return sched.serial() if self.serial else [sched.final()]

    def run(self, start: int | None = None, fwd_hooks=()) -> torch.Tensor:
        """Logits [batch, T - start, d_vocab] of positions start..T-1 (default start: `upto`), with
        `fwd_hooks` attached for this run only (as `run_with_hooks`)."""
        start = self.upto if start is None else start
        if not 0 <= start <= self.upto:
            raise ValueError(f"start {start}: this prefix serves starts 0..{self.upto}")
        with torch.no_grad(), self.model.hooks(fwd_hooks=list(fwd_hooks)):
            self._restore(start)
            entry = {k: top[:, start - 1] for k, top in enumerate(self.tops, 1)} if start > 0 else {}
            w = Walk(self.model, self.tokens, hooked, has=self.has, states=self.states, caches=self.caches, entry=entry)
            return w.run(Schedule.cut(self.chunks(), start)).logits

    def serial_view(self) -> "Prefix":
        """This one-pass recurrent / full prefix under the serial rule: both rules start from the
        same silent recurrence (its cache, and the carried state into each position). Views share
        the caches: run them at start = `upto` only (an earlier start rewrites the shared prefix)."""
        if not self.mode.scans:
            raise ValueError(f"mode '{self.mode}': only recurrent / full prefixes have a serial view")
        self._restore(self.upto)
        tops = [self.states[:, 1 : self.upto + 1]]  # the top state of position t is the state carried into t + 1
        return replace(self, serial=True, tops=tops, _clean=None)

    def standard_view(self) -> "Prefix":
        """The `standard` prefix of the same tokens, when every position below `upto` takes a plain
        embedding here (then the caches are a standard prefill: e.g. recurrent:1 at T - 1). Shares
        the caches, as `serial_view`."""
        if self.mode.first_fed_position(self.T) < self.upto or len(self.caches) != 1:
            raise ValueError(f"mode '{self.mode}': positions below {self.upto} are not standard")
        self._restore(self.upto)
        return replace(self, mode=Mode("standard"), serial=False, states=None, has=None, _clean=None)

    def select(self, rows: torch.Tensor) -> "Prefix":
        """The prefix of batch rows `rows` (e.g. each row's pair partner): copies, no recomputation."""
        return self._map(lambda t: t.index_select(0, rows), lambda c: c.select(rows))

    def repeat(self, n: int) -> "Prefix":
        """n replicas of the batch, replica-major (as `tokens.repeat(n, 1)`)."""
        return self._map(lambda t: t.repeat(n, *([1] * (t.dim() - 1))), lambda c: c.repeat(n))

    # ------------------------------------------------------------------ internals
    def _map(self, rows_fn, cache_fn) -> "Prefix":
        self._restore(self.upto)
        opt = lambda t: None if t is None else rows_fn(t)  # noqa: E731
        return replace(
            self,
            tokens=rows_fn(self.tokens),
            caches=[cache_fn(c) for c in self.caches],
            states=opt(self.states),
            tops=[opt(t) for t in self.tops],
            _valid=self.upto,
            _clean=None,
        )

    def _restore(self, start: int) -> None:
        """Make the caches hold clean positions < start and nothing after."""
        if start < self.upto and self._clean is None:  # this run overwrites prefix positions: keep them
            self._clean = [c.fork() for c in self.caches]
        if start > self._valid:
            for c, clean in zip(self.caches, self._clean):
                c.copy_from(clean, self._valid, start)
        for c in self.caches:
            c.rewind(start)
        self._valid = start


@torch.no_grad()
def build_prefix(model, tokens: torch.Tensor, mode: Mode, upto: int | None = None, serial: bool = False) -> Prefix:
    """The silent computation of `tokens` under `mode` below position `upto` (default T - 1, the
    final position), for runs of positions >= start (any start <= upto) under the one-pass rule or,
    with `serial`, the serial rule (as `model(tokens, mode=mode, serial=serial)`)."""
    require_mode(mode)
    tokens = check_tokens(tokens, model.cfg)  # the checks of model(tokens): one-line errors
    T = tokens.shape[1]
    sched = Schedule(mode, T)
    upto = T - 1 if upto is None else upto
    if not 0 <= upto < T:
        raise ValueError(f"upto {upto}: expected 0..{T - 1}")
    prefix = Prefix(model, tokens, mode, serial, upto, [], _valid=upto)
    if serial:  # the serial run's chunks below `upto`, one cache per pass
        passes = sorted({c.pass_index for c in prefix.chunks()})
        prefix.caches, prefix.has = [KVCache(model.cfg.n_layers, T) for _ in passes], sched.has_state(tokens.device)
        w = Walk(model, tokens, silent, has=prefix.has, caches=prefix.caches).run(
            Schedule.cut(prefix.chunks(), 0, upto)
        )
        prefix.tops = [w.top_states(k) for k in passes] if upto > 0 else []
        return prefix
    prefix.states, prefix.has, cache = carried_states(model, tokens, mode)
    if cache is not None:  # a serial scan computed the carried states: its cache is the final pass's prefix
        prefix.caches = [cache.rewind(upto)]
        return prefix
    prefix.caches = [KVCache(model.cfg.n_layers, T)]
    w = Walk(model, tokens, silent, has=prefix.has, states=prefix.states, caches=prefix.caches)
    w.run(Schedule.cut(prefix.chunks(), 0, upto))
    return prefix
