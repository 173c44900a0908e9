"""Every forward of the patching experiments, and the one place that decides prefix reuse and sharing.

An experiment says what it runs, `fw.final_logits(tokens, mode, hooks, edit_from=p)`: the final
position's logits of `tokens` under `mode` (and the hook rule, `serial`), with `hooks` attached for
this run only, where the hooks edit positions >= p and nothing before (they may read anything).
`edit_from=None` claims nothing: that run is always the whole sequence. `Forwards` decides how:

- **reuse** (`Forwards(model)`, the default): positions < p are computed once per batch, mode and
  rule with hooks off (`fbt_probe.engine.prefix`), and each run computes only positions >= p. That
  equals the whole-sequence run up to float rounding (tests/test_prefix.py, test_interventions.py).
  `Forwards(model, reuse=False)` runs the whole sequence every time (`final_logits`, the reference).
- **rows** (`rows=perm`): run rows `perm` of the batch (each row's pair partner). From a prefix,
  the prefix's rows are copied (`Prefix.select`); when `perm` pairs rows up (perm[perm] = identity)
  and every hook is a per-row edit (it has `take(rows)`, as `edits.set_at`), the batch runs as it
  is, with the hook's values in partner order, and the output is put back in `perm` order (row i
  run with the value meant for row p(i) of the asked run is that row, as p(p(i)) = i), and no
  prefix is copied.
- **replicas** (`replicas=n`): n copies of the (row-selected) batch, replica-major, as
  `tokens.repeat(n, 1)`: many patch positions in one forward.
- **sharing**: a prefix lives while its batch is the one being run; inside `with fw.holding():` every
  prefix built lives until the outermost holding block ends, so experiments run over the same batches
  in one block build each batch's prefix once (`combined.py`; probe-direction holds a cell's).
  Row-selected and replicated prefixes are kept for one `rows` at a time.
- **Soft / Std decoding** of the answer (`soft_answer_logits`, `std_answer_logits`): the prompt is a
  standard prefill of x_1..x_{T-1}; with reuse it is the serial view of the batch's `recurrent:1`
  prefix when one is held (the same silent recurrence), else one prefix built for it. It is kept apart
  from the prefixes `final_logits` reads, since a view shares its caches and serves start = T-1 only;
  a `final_logits` run that starts earlier on the same batch drops it.

`builds` counts the prefixes built (tests/test_forwards.py, tests/test_combined.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from fbt_probe.engine.hooks import hooked
from fbt_probe.engine.prefix import Prefix, build_prefix
from fbt_probe.engine.schedule import answer_step, run_chunk
from fbt_probe.modes import Mode

RECURRENT_1 = Mode("recurrent", 1)


@torch.no_grad()
def final_logits(model, tokens: torch.Tensor, mode: Mode, hooks=(), serial: bool = False) -> torch.Tensor:
    """[batch, d_vocab] logits at the final position under `mode` with `hooks` (removed on exit): the
    whole sequence, the reference every reused run equals."""
    return model.run_with_hooks(tokens, mode=mode, serial=serial, fwd_hooks=list(hooks))[:, -1]


@torch.no_grad()
def soft_answer_logits(model, tokens: torch.Tensor, hooks=()) -> torch.Tensor:
    """Soft decoding of the answer: standard prefill of x_1..x_{T-1}, then x_T as a Soft step fused
    with h_{T-1} (hooks fire in that step, context `step` at position T-1). [batch, d_vocab]."""
    T = tokens.shape[1]
    cache, state, _ = model.prefill_cache(tokens[:, :-1])
    with model.hooks(fwd_hooks=list(hooks)):
        logits, _ = run_chunk(model, answer_step(T, True), model.step, tokens[:, -1], cache, state[:, -1], hooked)
    return logits


def pairs_up(rows: torch.Tensor) -> bool:
    """rows[rows] is the identity: a permutation made of swaps (each row and its partner)."""
    return torch.equal(rows[rows], torch.arange(len(rows), device=rows.device))


@dataclass
class _Entry:
    tokens: torch.Tensor  # kept alive with the entry, so its address cannot be reused while it is here
    prefix: Prefix
    content: torch.Tensor | None = None  # a copy of the tokens the prefix was built from
    rows: tuple | None = None  # the `rows` the derived prefixes are for
    derived: dict = field(default_factory=dict)  # replicas -> prefix of `rows`, repeated


class Forwards:
    """The runs of one or more experiments over pair batches (module doc)."""

    def __init__(self, model, reuse: bool = True) -> None:
        self.model = model
        self.reuse = reuse
        self.builds = 0
        self._entries: dict = {}
        self._holding = 0

    # ------------------------------------------------------------------ what an experiment runs
    def final_logits(
        self,
        tokens: torch.Tensor,
        mode: Mode,
        hooks=(),
        *,
        edit_from: int | None = None,
        serial: bool = False,
        rows: torch.Tensor | None = None,
        replicas: int = 1,
    ) -> torch.Tensor:
        """[len(rows or batch) * replicas, d_vocab] final-position logits (module doc)."""
        hooks = list(hooks)
        if not self.reuse or edit_from is None:
            batch = tokens if rows is None else tokens[rows]
            batch = batch if replicas == 1 else batch.repeat(replicas, 1)
            return final_logits(self.model, batch, mode, hooks, serial)
        entry = self._entry(("run", mode, serial), tokens, lambda: self._build(tokens, mode, serial))
        if edit_from < entry.prefix.upto:  # this run rewrites prefix positions a Soft view may share
            self._entries.pop(self._key(("soft",), tokens), None)
        if rows is not None and replicas == 1 and pairs_up(rows) and all(hasattr(h, "take") for _, h in hooks):
            out = entry.prefix.run(edit_from, fwd_hooks=[(n, h.take(rows)) for n, h in hooks])[:, -1]
            return out[rows]
        return self._derived(entry, rows, replicas).run(edit_from, fwd_hooks=hooks)[:, -1]

    def soft_answer_logits(self, tokens: torch.Tensor, hooks=()) -> torch.Tensor:
        """The answer under Soft decoding, hooks firing in its one Soft step ([batch, d_vocab])."""
        if not self.reuse:
            return soft_answer_logits(self.model, tokens, hooks)
        return self._soft(tokens).run(fwd_hooks=list(hooks))[:, -1]

    @torch.no_grad()
    def std_answer_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The answer under Std decoding: a standard prefill's final logits ([batch, d_vocab])."""
        if not self.reuse:
            return self.model.prefill_cache(tokens)[2][:, -1]
        return self._soft(tokens).standard_view().run()[:, -1]

    @contextmanager
    def holding(self):
        """Every prefix built inside lives until the outermost holding block ends."""
        self._holding += 1
        try:
            yield self
        finally:
            self._holding -= 1
            if not self._holding:
                self._entries.clear()

    # ------------------------------------------------------------------ internals
    def _soft(self, tokens: torch.Tensor) -> Prefix:
        def build() -> Prefix:
            held = self._lookup(("run", RECURRENT_1, False), tokens)
            if held is not None:  # the same silent recurrence, no second build
                return held.prefix.serial_view()
            return self._build(tokens, RECURRENT_1, True)

        return self._entry(("soft",), tokens, build).prefix

    def _lookup(self, kind: tuple, tokens: torch.Tensor) -> _Entry | None:
        hit = self._entries.get(self._key(kind, tokens))
        # against the copy: a batch changed in place (same tensor, new tokens) gets a new prefix
        if hit is not None and torch.equal(hit.content, tokens):
            return hit
        return None

    def _entry(self, kind: tuple, tokens: torch.Tensor, build) -> _Entry:
        hit = self._lookup(kind, tokens)
        if hit is not None:
            return hit
        if not self._holding:  # outside a holding block, only the batch being run keeps its prefixes
            self._entries = {k: e for k, e in self._entries.items() if e.tokens is tokens}
        entry = self._entries[self._key(kind, tokens)] = _Entry(tokens, build(), tokens.clone())
        return entry

    def _build(self, tokens: torch.Tensor, mode: Mode, serial: bool) -> Prefix:
        self.builds += 1
        return build_prefix(self.model, tokens, mode, serial=serial)

    @staticmethod
    def _key(kind: tuple, tokens: torch.Tensor) -> tuple:
        return (*map(str, kind), tokens.data_ptr(), tuple(tokens.shape), str(tokens.device))

    def _derived(self, entry: _Entry, rows: torch.Tensor | None, replicas: int) -> Prefix:
        key = None if rows is None else tuple(rows.tolist())
        if key != entry.rows:  # one `rows` at a time: the earlier selection and its replicas go
            entry.rows, entry.derived = key, {}
        if 1 not in entry.derived:
            entry.derived[1] = entry.prefix if rows is None else entry.prefix.select(rows)
        if replicas not in entry.derived:
            entry.derived[replicas] = entry.derived[1].repeat(replicas)
        return entry.derived[replicas]


def forwards(model_or_forwards, reuse: bool = True) -> Forwards:
    """The `Forwards` an experiment runs through: the one given, or a new one over a model (prefix
    reuse on unless `reuse` is False)."""
    if isinstance(model_or_forwards, Forwards):
        return model_or_forwards
    return Forwards(model_or_forwards, reuse=reuse)
