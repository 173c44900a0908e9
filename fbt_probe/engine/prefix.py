"""Prefix reuse: compute the positions before `start` of a mode's run once (hooks off, into KV
caches), then run only positions >= start with hooks on, as often as an experiment needs.

Why this equals the full re-run for every intervention that edits only positions >= start:
- one-pass rule (`model(tokens, mode=...)`): the carried states are computed before the hooked
  pass with hooks off, and in that pass a position attends only to itself and earlier positions,
  so its keys and values below `start` are those of a silent run with the same inputs. For
  recurrent / full that silent run is the serial recurrence itself (the hooked pass is exact:
  docs/modes.md), so its KV cache serves directly; for jacobi:K it is pass K over the prefix.
- serial rule (`serial=True`): chunks run in position order, so everything before `start` is
  finished before any edit; from `start` on the hooks fire in the full run's chunks, cut at
  `start` (the standard chunk of recurrent / full becomes range(start, T - k); each Jacobi pass
  covers range(start, T)), with the same `hook_context` phases and pass indices.
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
from fbt_probe.engine.schedule import Schedule, run_chunk
from fbt_probe.modes import Mode, require_mode
from fbt_probe.tokens import check_tokens


@dataclass
class Prefix:
    model: object  # FeedbackTransformer
    tokens: torch.Tensor  # [batch, T]
    mode: Mode
    serial: bool
    upto: int  # a run may start at any position 0..upto
    caches: list[KVCache]  # clean below `upto`: one, or one per pass (Jacobi, serial rule)
    states: torch.Tensor | None = (
        None  # one-pass: carried states [batch, T, d_model]; serial recurrent: the same (state into each position)
    )
    has: torch.Tensor | None = None  # one-pass: [T] positions that take a carried state
    tops: list = field(default_factory=list)  # serial Jacobi: top states [batch, upto, d_model] of passes 1..K-1
    _valid: int = -1  # positions below it are clean in `caches`
    _clean: list[KVCache] | None = None  # copies taken before a run starts below `upto`

    @property
    def T(self) -> int:
        return self.tokens.shape[1]

    def run(self, start: int | None = None, fwd_hooks=()) -> torch.Tensor:
        """Logits [batch, T - start, d_vocab] of positions start..T-1 (default start: `upto`), with
        `fwd_hooks` attached for this run only (as `run_with_hooks`)."""
        start = self.upto if start is None else start
        if not 0 <= start <= self.upto:
            raise ValueError(f"start {start}: this prefix serves starts 0..{self.upto}")
        with torch.no_grad(), self.model.hooks(fwd_hooks=list(fwd_hooks)):
            self._restore(start)
            if not self.serial:
                return self._one_pass(start)
            return self._jacobi(start) if self.mode.kind == "jacobi" else self._recurrent(start)

    def serial_view(self) -> "Prefix":
        """This one-pass recurrent / full prefix under the serial rule: both rules start from the
        same silent recurrence (its cache, and the carried state into each position). Views share
        the caches: run them at start = `upto` only (an earlier start rewrites the shared prefix)."""
        if self.mode.kind not in ("recurrent", "full"):
            raise ValueError(f"mode '{self.mode}': only recurrent / full prefixes have a serial view")
        self._restore(self.upto)
        return replace(self, serial=True, _clean=None)

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

    def _one_pass(self, start: int) -> torch.Tensor:
        m, sched = self.model, Schedule(self.mode, self.T)
        (chunk,) = sched.cut([sched.final()], start)
        states = None if self.states is None else self.states[:, start:]
        has = None if self.has is None else self.has[start:]
        return run_chunk(m, chunk, m.extend, self.tokens[:, start:], self.caches[0], states, has, hooked)[1]

    def _recurrent(self, start: int) -> torch.Tensor:
        m, cache, sched = self.model, self.caches[0], Schedule(self.mode, self.T)
        out, prev = [], None if self.states is None else self.states[:, start]
        for chunk in sched.cut(sched.serial(), start):
            a, b = chunk.positions.start, chunk.positions.stop
            if chunk.phase == "prefix":
                top, logits = run_chunk(m, chunk, m.extend, self.tokens[:, a:b], cache, None, None, hooked)
                out.append(logits)
                prev = top[:, -1]
                continue
            logits, prev = run_chunk(m, chunk, m.step, self.tokens[:, a], cache, prev, hooked)
            out.append(logits[:, None])
        return torch.cat(out, dim=1)

    def _jacobi(self, start: int) -> torch.Tensor:
        m, sched = self.model, Schedule(self.mode, self.T)
        has = sched.has_state(self.tokens.device, start)
        prev = None
        for chunk, cache in zip(sched.cut(sched.serial(), start), self.caches):
            k, states = chunk.pass_index, None
            if k > 1:  # right-shifted top states of pass k-1; the one into `start` comes from the prefix
                first = self.tops[k - 2][:, start - 1] if start > 0 else torch.zeros_like(prev[:, 0])
                states = torch.cat([first[:, None], prev[:, :-1]], dim=1)
            fed = None if k == 1 else has
            prev, logits = run_chunk(m, chunk, m.extend, self.tokens[:, start:], cache, states, fed, hooked)
        return logits


@torch.no_grad()
def build_prefix(model, tokens: torch.Tensor, mode: Mode, upto: int | None = None, serial: bool = False) -> Prefix:
    """The silent computation of `tokens` under `mode` below position `upto` (default T - 1, the
    final position), for runs of positions >= start (any start <= upto) under the one-pass rule or,
    with `serial`, the serial rule (as `model(tokens, mode=mode, serial=serial)`)."""
    require_mode(mode)
    tokens = check_tokens(tokens, model.cfg)  # the checks of model(tokens): one-line errors
    B, T = tokens.shape
    mode.check_length(T)
    upto = T - 1 if upto is None else upto
    if not 0 <= upto < T:
        raise ValueError(f"upto {upto}: expected 0..{T - 1}")
    L = model.cfg.n_layers
    serial = serial and mode.kind != "standard"  # `standard` has a single pass under both rules
    fed = mode.first_fed_position(T) < T
    base = dict(model=model, tokens=tokens, mode=mode, serial=serial, upto=upto, _valid=upto)
    if serial and mode.kind == "jacobi":
        caches, tops, prev = [], [], None
        K = mode.passes(T)  # jacobi:K runs min(K, T) passes, as the full run
        for k in range(1, K + 1):
            cache = KVCache(L, T)
            if upto > 0:
                states = None if k == 1 else model.shift_states(prev)
                has = None if k == 1 else torch.arange(upto, device=tokens.device) >= 1
                prev, _ = model.extend(tokens[:, :upto], cache, states, has, silent)
            caches.append(cache)
            if k < K:
                tops.append(prev)
        return Prefix(caches=caches, tops=tops, **base)
    if serial:  # recurrent / full: the recurrence up to `upto`, and the state into `upto`
        cache, states, _, last = model.serial_scan(tokens, mode.n_serial(T), stop=max(upto, 1))
        if upto >= T - mode.n_serial(T):
            states[:, upto] = last
        return Prefix(caches=[cache.rewind(upto)], states=states, **base)
    if fed and mode.kind in ("recurrent", "full"):  # the serial run's cache is the hooked pass's prefix
        cache, states, _, last = model.serial_scan(tokens, mode.n_serial(T), stop=T - 1)
        states[:, T - 1] = last
        has = torch.arange(T, device=tokens.device) >= mode.first_fed_position(T)
        return Prefix(caches=[cache.rewind(upto)], states=states, has=has, **base)
    states, has = model.carried_states(tokens, mode) if fed else (None, None)
    cache = KVCache(L, T)
    if upto > 0:
        model.extend(
            tokens[:, :upto],
            cache,
            None if states is None else states[:, :upto],
            None if has is None else has[:upto],
            silent,
        )
    return Prefix(caches=[cache], states=states, has=has, **base)
