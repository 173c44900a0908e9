"""Experiments on the fused input and the residual stream (docs/interventions.md) -> wide result rows.

Hook rule per experiment (docs/modes.md):
- feedback swap, state replacement, gate ablation: **one-pass**. They edit `fusion.*` at the final
  position T-1 in the one hooked pass; nothing later depends on that position, so the edit is exact.
- gate ablation under Soft decoding: the KV-cache step path (`model.step` with hooks on), the
  prompt's last token fed as the first Soft step.
- residual patching: **serial** (`serial=True`) when the mode carries a state, so that a patch at
  position t < T-1 reaches the carried state of the next position; one-pass under `standard`.
Every run goes through `run_with_hooks` (or `model.hooks`), which removes its hooks on exit.

Prefix reuse (`reuse=True`, the default): every edit is at positions >= p (p = T-1, or the first
patched position for residual patching), so each batch computes positions < p once, hooks off
(`fbt_probe.engine.prefix`), and every condition runs only positions >= p under the same hook rule.
That equals the full re-run (`reuse=False`) up to float rounding (tests/test_interventions.py, float64).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import torch

from fbt_probe.engine.hooks import HookContext, hooked
from fbt_probe.engine.prefix import Prefix, build_prefix
from fbt_probe.errors import FbtError
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.interventions import pool
from fbt_probe.interventions.edits import capture, patch_rows_at, set_at, stitch
from fbt_probe.interventions.metrics import score
from fbt_probe.interventions.pairs import PairBatch
from fbt_probe.modes import Mode

FEEDBACK, VALUE, GATE, FUSED = (act_name(k) for k in ("fusion_feedback", "fusion_value", "fusion_gate", "fusion_out"))
ONE_PASS, SERIAL, STEP = "one-pass", "serial", "kv-step"


def device_of(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def final_logits(
    model,
    tokens: torch.Tensor,
    mode: Mode,
    hooks=(),
    serial: bool = False,
    prefix: Prefix | None = None,
    start: int | None = None,
) -> torch.Tensor:
    """[batch, d_vocab] logits at the final position under `mode` with `hooks` (removed on exit).
    With `prefix` (`build_prefix` of these tokens, mode and rule) only positions >= `start`
    (default: the prefix's `upto`) run."""
    if prefix is not None:
        return prefix.run(start, fwd_hooks=hooks)[:, -1]
    return model.run_with_hooks(tokens, mode=mode, serial=serial, fwd_hooks=list(hooks))[:, -1]


def last_prefix(model, tokens: torch.Tensor, mode: Mode, reuse: bool = True) -> Prefix | None:
    """Everything before the final position, computed once (None: each run re-runs the whole sequence).
    Inside `pool.sharing` the prefix comes from the active pool (built once for every experiment)."""
    if not reuse:
        return None
    shared = pool.active()
    return build_prefix(model, tokens, mode) if shared is None else shared.get(model, tokens, mode)


def check_depths(depths, model) -> None:
    """Probe depths 0..L of this model, else a one-line error."""
    L = model.cfg.n_layers
    bad = [d for d in depths or () if not 0 <= d <= L]
    if bad:
        raise FbtError(f"--depths {bad[0]}: this model has probe depths 0..{L} (0 = its input, d = block d-1's output)")


def require_feedback(mode: Mode, T: int, experiment: str) -> None:
    if mode.first_fed_position(T) > T - 1:
        raise FbtError(
            f"{experiment}: mode '{mode}' feeds no state into the final position; "
            "use recurrent:k, full or jacobi:K (K >= 2)"
        )


def _reference(model, batch: PairBatch, mode: Mode, names: Iterable[str], prefix: Prefix | None = None):
    """(final logits [N, V], {name: final-position activation [N, D]}) of the unpatched run."""
    store: dict = {}
    last = batch.T - 1
    ref = final_logits(model, batch.tokens, mode, [(n, capture(store, n, model, last)) for n in names], prefix=prefix)
    return ref, store


# ----------------------------------------------------------------------------- feedback swap
def feedback_swap(
    model, batches: Iterable[PairBatch], mode: Mode = Mode("recurrent", 1), min_gap: float = 0.1, reuse: bool = True
) -> pd.DataFrame:
    """Run each row's partner with the row's own carried state (`state`), value W_U h (`value`) or
    gate σ(W_G e) (`gate`) at the final position: does the answer follow the swapped-in state?
    normalized = 1: the answer fully follows it. The gate depends on the token only and both
    samples of a pair end in the same token, so `gate` is an exact no-op control (normalized 0)."""
    out = []
    for batch in batches:  # one function per batch: its prefix is freed before the next is built
        out += _swap_batch(model, batch.to(device_of(model)), mode, min_gap, reuse)
    return pd.concat(out, ignore_index=True)


def _swap_batch(model, batch: PairBatch, mode: Mode, min_gap: float, reuse: bool) -> list[pd.DataFrame]:
    require_feedback(mode, batch.T, "feedback-swap")
    pre = last_prefix(model, batch.tokens, mode, reuse)
    swaps = [
        (c, n) for c, n in (("state", FEEDBACK), ("value", VALUE), ("gate", GATE)) if n in model.hook_dict
    ]  # no gate: nanochat's concat / addition fusions
    ref, own = _reference(model, batch, mode, tuple(n for _, n in swaps), pre)
    partner = batch.partner
    # partners pair up (p(p(i)) = i): row j run with its partner's value is row p(j) of the swap, so
    # the swap reads the prefix as it is instead of a copy of it in partner order
    in_place = pre is not None and torch.equal(partner[partner], torch.arange(len(partner), device=partner.device))
    if in_place:
        tokens, prefix = batch.tokens, pre
    else:
        tokens, prefix = batch.tokens[partner], None if pre is None else pre.select(partner)
    rows = []
    for condition, name in swaps:
        value = own[name][partner] if in_place else own[name]
        patched = final_logits(model, tokens, mode, [(name, set_at(value, batch.T - 1, model))], prefix=prefix)
        patched = patched[partner] if in_place else patched
        rows.append(
            score(
                batch,
                ref,
                patched,
                min_gap,
                experiment="feedback-swap",
                condition=condition,
                mode=mode,
                hook_rule=ONE_PASS,
                direction="denoising",
            )
        )
    return rows


# ----------------------------------------------------------------------------- state replacement
def carried_last_states(
    model, batches: list[PairBatch], mode: Mode, reuse: bool = True
) -> tuple[torch.Tensor, pd.DataFrame]:
    """Carried state into the final position of every row: ([rows, D], meta)."""
    states, metas = [], []
    for batch in batches:
        batch = batch.to(device_of(model))
        require_feedback(mode, batch.T, "state-replacement")
        _, own = _reference(model, batch, mode, (FEEDBACK,), last_prefix(model, batch.tokens, mode, reuse))
        states.append(own[FEEDBACK])
        metas.append(batch.meta)
    return torch.cat(states), pd.concat(metas, ignore_index=True)


def pick_donors(meta: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """For each row, a random row of the same task from another pair with the opposite label."""
    rng = np.random.default_rng(seed)
    donors = np.empty(len(meta), dtype=np.int64)
    for task, sub in meta.groupby("task"):
        if sub["pair_id"].nunique() < 2:
            raise FbtError(f"state-replacement: task {task} has a single pair; a non-partner donor needs >= 2")
        idx, labels, pairs = sub.index.to_numpy(), sub["label"].to_numpy(), sub["pair_id"].to_numpy()
        for i, label, pair in zip(idx, labels, pairs):
            cand = idx[(labels != label) & (pairs != pair)]
            if cand.size == 0:  # every other pair has a single label class: any other pair
                cand = idx[pairs != pair]
            donors[i] = cand[rng.integers(cand.size)]
    return donors


def state_replacement(
    model,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    seed: int = 0,
    reuse: bool = True,
    carried: tuple | None = None,
) -> pd.DataFrame:
    """Replace the carried state into the final position (one-pass, `fusion.hook_feedback`) by: zero
    (the fused input then collapses to 0), the task's mean state, a random vector of the same norm,
    or a non-partner donor's state (another pair, opposite label). normalized = 1: no effect.
    `carried`: `carried_last_states` of these batches, when already computed (the first pass)."""
    batches = list(batches)
    states, meta = carried if carried is not None else carried_last_states(model, batches, mode, reuse)
    donors = torch.as_tensor(pick_donors(meta, seed), device=states.device)
    means = {
        t: states[torch.tensor(sub.index.to_numpy(), device=states.device)].mean(0) for t, sub in meta.groupby("task")
    }
    out, start = [], 0
    for batch in batches:
        batch = batch.to(device_of(model))
        n = batch.n
        own = states[start : start + n]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(batch.meta["row"].min()))
        noise = torch.randn(own.shape, generator=gen, dtype=torch.float64).to(own)
        replacements = {
            "zero": torch.zeros_like(own),
            "mean": means[str(batch.meta["task"].iloc[0])].expand_as(own),
            "random": noise / noise.norm(dim=-1, keepdim=True) * own.norm(dim=-1, keepdim=True),
            "nonpartner": states[donors[start : start + n]],
        }
        start += n
        out += _replacement_batch(model, batch, mode, min_gap, reuse, replacements)
    return pd.concat(out, ignore_index=True)


def _replacement_batch(
    model, batch: PairBatch, mode: Mode, min_gap: float, reuse: bool, replacements: dict
) -> list[pd.DataFrame]:
    axes = dict(experiment="state-replacement", mode=mode, hook_rule=ONE_PASS, direction="noising")
    pre = last_prefix(model, batch.tokens, mode, reuse)
    ref = final_logits(model, batch.tokens, mode, prefix=pre)
    rows = [score(batch, ref, ref, min_gap, condition="none", **axes)]
    for condition, values in replacements.items():
        patched = final_logits(model, batch.tokens, mode, [(FEEDBACK, set_at(values, batch.T - 1, model))], prefix=pre)
        rows.append(score(batch, ref, patched, min_gap, condition=condition, **axes))
    return rows


# ----------------------------------------------------------------------------- gate ablation
GATE_CONDITIONS = ("mean", "ones", "zero", "bypass")


def mean_gates(model, batches: list[PairBatch]) -> dict[str, torch.Tensor]:
    """Per task, σ(W_G e) averaged over every token position of the task's samples. (At the final
    position every sample shares its token, so a final-position mean would be the gate itself.)"""
    counts: dict[str, torch.Tensor] = {}
    for batch in batches:
        task = str(batch.meta["task"].iloc[0])
        c = torch.bincount(batch.tokens.reshape(-1).cpu(), minlength=model.cfg.d_vocab)
        counts[task] = counts.get(task, 0) + c
    out = {}
    with torch.no_grad():
        for task, c in counts.items():
            ids = torch.nonzero(c, as_tuple=True)[0]
            gates = model.fusion.gate(model.token_embedding(ids.to(device_of(model))))
            w = c[ids].to(gates)
            out[task] = (gates * w[:, None]).sum(0) / w.sum()
    return out


def _gate_hooks(model, condition: str, batch: PairBatch, mean_gate: torch.Tensor, position: int):
    D = model.cfg.d_model
    if condition == "bypass":
        with torch.no_grad():
            plain = model.plain_inputs(batch.tokens)[:, -1]  # the input without feedback (nanochat: normed and smeared)
        return [(FUSED, set_at(plain, position, model))]
    value = {"mean": mean_gate, "ones": torch.ones(D), "zero": torch.zeros(D)}[condition]
    return [(GATE, set_at(value.to(device_of(model)).expand(batch.n, D), position, model))]


def gate_ablation(
    model,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    decoding: bool = True,
    reuse: bool = True,
    means: dict | None = None,
) -> pd.DataFrame:
    """Gate σ(W_G e) at the final position set to the task's mean gate, to ones, to zero, or fusion
    bypassed (plain embedding): under the prefill `mode` (one-pass) and, with `decoding`, for the
    answer under Std decoding (no feedback: the control) and Soft decoding (kv-step path).
    `means`: `mean_gates` over every batch of the run, when these batches are a part of it."""
    batches = list(batches)
    means = mean_gates(model, batches) if means is None else means
    out = []
    for batch in batches:
        batch = batch.to(device_of(model))
        out += _gate_batch(model, batch, mode, min_gap, decoding, reuse, means[str(batch.meta["task"].iloc[0])])
    return pd.concat(out, ignore_index=True)


def _gate_batch(
    model, batch: PairBatch, mode: Mode, min_gap: float, decoding: bool, reuse: bool, mean_gate: torch.Tensor
) -> list[pd.DataFrame]:
    require_feedback(mode, batch.T, "gate-ablation")
    axes = dict(experiment="gate-ablation", direction="noising")
    pre = last_prefix(model, batch.tokens, mode, reuse)
    ref = final_logits(model, batch.tokens, mode, prefix=pre)
    rows = [score(batch, ref, ref, min_gap, condition="none", mode=mode, hook_rule=ONE_PASS, **axes)]
    for condition in GATE_CONDITIONS:
        hooks = _gate_hooks(model, condition, batch, mean_gate, batch.T - 1)
        patched = final_logits(model, batch.tokens, mode, hooks, prefix=pre)
        rows.append(score(batch, ref, patched, min_gap, condition=condition, mode=mode, hook_rule=ONE_PASS, **axes))
    if decoding:
        soft = None
        if reuse:  # Soft decoding's prompt is a standard prefill of x_1..x_{T-1}: recurrent:1's prefix
            soft = (
                pre.serial_view()
                if str(pre.mode) == "recurrent:1"
                else build_prefix(model, batch.tokens, Mode("recurrent", 1), serial=True)
            )
        rows += _decoding_rows(model, batch, mean_gate, min_gap, axes, soft)
    return rows


@torch.no_grad()
def soft_answer_logits(model, tokens: torch.Tensor, hooks=(), prefix: Prefix | None = None) -> torch.Tensor:
    """Soft decoding of the answer: standard prefill of x_1..x_{T-1}, then x_T as a Soft step fused
    with h_{T-1} (hooks fire in that step, context `step` at position T-1). [batch, d_vocab].
    `prefix`: `build_prefix(model, tokens, "recurrent:1", serial=True)`, the prefill done once."""
    if prefix is not None:
        return prefix.run(fwd_hooks=hooks)[:, -1]
    T = tokens.shape[1]
    cache, state, _ = model.prefill_cache(tokens[:, :-1])
    with model.hooks(fwd_hooks=list(hooks)):
        model.hook_context = HookContext("step", range(T - 1, T))
        try:
            logits, _ = model.step(tokens[:, -1], cache, state[:, -1], hk=hooked)
        finally:
            model.hook_context = None
    return logits


def _decoding_rows(
    model, batch: PairBatch, mean_gate: torch.Tensor, min_gap: float, axes: dict, soft_pre: Prefix | None = None
) -> list[pd.DataFrame]:
    with torch.no_grad():
        std = model.prefill_cache(batch.tokens)[2][:, -1] if soft_pre is None else soft_pre.standard_view().run()[:, -1]
    rows = [score(batch, std, std, min_gap, condition="none", mode="standard", hook_rule=STEP, decoding="std", **axes)]
    soft = soft_answer_logits(model, batch.tokens, prefix=soft_pre)
    rows.append(
        score(batch, soft, soft, min_gap, condition="none", mode="recurrent:1", hook_rule=STEP, decoding="soft", **axes)
    )
    for condition in GATE_CONDITIONS:
        hooks = _gate_hooks(model, condition, batch, mean_gate, batch.T - 1)
        patched = soft_answer_logits(model, batch.tokens, hooks, prefix=soft_pre)
        rows.append(
            score(
                batch,
                soft,
                patched,
                min_gap,
                condition=condition,
                mode="recurrent:1",
                hook_rule=STEP,
                decoding="soft",
                **axes,
            )
        )
    return rows


# ----------------------------------------------------------------------------- residual patching
def residual_patching(
    model,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("standard"),
    min_gap: float = 0.1,
    depths: Iterable[int] | None = None,
    last_k: int | None = None,
    directions=("denoising", "noising"),
    batch_size: int = 64,
    serial: bool | None = None,
    reuse: bool = True,
) -> pd.DataFrame:
    """Patch the residual stream at probe depth d (`depth_name(d)`) and one position p, for every
    d × p: denoising runs the partner with the row's activation patched in (1 = full recovery);
    noising runs the row with its partner's activation (0 = fully destroyed). Many positions run in
    one forward (replicas of the batch, each patched at its own position). `last_k`: only the last
    k positions (every position when k >= T). `serial` defaults to True when the mode carries a state
    (see module doc). With `reuse`, each run starts at its first patched position from one silent
    run of the batch."""
    depths = list(range(model.cfg.n_layers + 1)) if depths is None else list(depths)
    check_depths(depths, model)
    bad = [d for d in directions if d not in ("denoising", "noising")]
    if bad:
        raise FbtError(f"residual: direction '{bad[0]}': expected denoising or noising")
    out = []
    for batch in batches:
        out += _residual_batch(
            model, batch.to(device_of(model)), mode, min_gap, depths, last_k, directions, batch_size, serial, reuse
        )
    return pd.concat(out, ignore_index=True)


def _residual_batch(
    model,
    batch: PairBatch,
    mode: Mode,
    min_gap: float,
    depths: list[int],
    last_k: int | None,
    directions,
    batch_size: int,
    serial: bool | None,
    reuse: bool,
) -> list[pd.DataFrame]:
    T, N = batch.T, batch.n
    fed = mode.first_fed_position(T) < T
    use_serial = fed if serial is None else serial
    rule = SERIAL if use_serial else ONE_PASS
    names = [depth_name(d) for d in depths]
    store: dict = {}
    with torch.no_grad():
        ref = model.run_with_hooks(
            batch.tokens, mode=mode, serial=use_serial, fwd_hooks=[(n, capture(store, n, model)) for n in names]
        )[:, -1]
    acts = {n: stitch(store[n]) for n in names}
    positions = list(range(max(0, T - last_k), T) if last_k else range(T))  # last_k >= T: every position
    per = max(1, batch_size // N)
    pre = build_prefix(model, batch.tokens, mode, serial=use_serial) if reuse else None  # serves every start
    rows = []
    for direction in directions:
        own = torch.arange(N, device=batch.tokens.device)
        base, src_rows = (
            (batch.tokens[batch.partner], own) if direction == "denoising" else (batch.tokens, batch.partner)
        )
        base_pre = pre if pre is None or direction == "noising" else pre.select(batch.partner)
        replicas: dict = {}  # number of replicas -> the base prefix repeated that often
        for d, name in zip(depths, names):
            for s in range(0, len(positions), per):
                chunk = positions[s : s + per]
                pos = torch.tensor(chunk, device=base.device).repeat_interleave(N)
                hook = patch_rows_at(acts[name], pos, model, src_rows=src_rows.repeat(len(chunk)))
                if base_pre is not None and len(chunk) not in replicas:
                    replicas[len(chunk)] = base_pre.repeat(len(chunk)) if len(chunk) > 1 else base_pre
                logits = final_logits(
                    model,
                    base.repeat(len(chunk), 1),
                    mode,
                    [(name, hook)],
                    use_serial,
                    prefix=replicas.get(len(chunk)),
                    start=chunk[0],
                )
                for j, p in enumerate(chunk):
                    rows.append(
                        score(
                            batch,
                            ref,
                            logits[j * N : (j + 1) * N],
                            min_gap,
                            experiment="residual",
                            condition=f"depth{d}",
                            mode=mode,
                            hook_rule=rule,
                            direction=direction,
                            depth=d,
                            position=p,
                        )
                    )
    return rows
