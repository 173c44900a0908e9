"""Experiments on the fused input and the residual stream (docs/interventions.md) -> wide result rows.

Each experiment says what it measures: which activation it edits, at which position, and which run
it compares. Every forward goes through the runner (`fbt_probe.interventions.forwards.Forwards`),
`fw.final_logits(tokens, mode, hooks, edit_from=p)`; the runner decides prefix reuse, partner
batches in place and prefixes shared between experiments. Experiments take a `Forwards` or a model
(a model gets a `Forwards` with prefix reuse on; `Forwards(model, reuse=False)` re-runs the whole
sequence every time, the reference).

Hook rule per experiment (docs/modes.md):
- feedback swap, state replacement, gate ablation: **one-pass**. They edit `fusion.*` at the final
  position T-1 in the one hooked pass; nothing later depends on that position, so the edit is exact.
- gate ablation under Soft decoding: the KV-cache step path (`model.step` with hooks on), the
  prompt's last token fed as the first Soft step.
- residual patching: **serial** (`serial=True`) when the mode carries a state, so that a patch at
  position t < T-1 reaches the carried state of the next position; one-pass under `standard`.
Every run attaches its hooks for that run only.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.interventions.edits import capture, patch_rows_at, set_at, stitch
from fbt_probe.interventions.forwards import Forwards, forwards
from fbt_probe.interventions.metrics import score
from fbt_probe.interventions.pairs import PairBatch
from fbt_probe.modes import Mode

FEEDBACK, VALUE, GATE, FUSED = (act_name(k) for k in ("fusion_feedback", "fusion_value", "fusion_gate", "fusion_out"))
ONE_PASS, SERIAL, STEP = "one-pass", "serial", "kv-step"


def device_of(model) -> torch.device:
    return next(model.parameters()).device


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


def reference(fw: Forwards, batch: PairBatch, mode: Mode, names: Iterable[str] = ()):
    """(final logits [N, V], {name: final-position activation [N, D]}) of the unedited run."""
    store: dict = {}
    last = batch.T - 1
    hooks = [(n, capture(store, n, fw.model, last)) for n in names]
    return fw.final_logits(batch.tokens, mode, hooks, edit_from=last), store


# ----------------------------------------------------------------------------- feedback swap
def feedback_swap(fw, batches: Iterable[PairBatch], mode: Mode = Mode("recurrent", 1), min_gap: float = 0.1):
    """Run each row's partner with the row's own carried state (`state`), value W_U h (`value`) or
    gate σ(W_G e) (`gate`) at the final position: does the answer follow the swapped-in state?
    normalized = 1: the answer fully follows it. The gate depends on the token only and both
    samples of a pair end in the same token, so `gate` is an exact no-op control (normalized 0)."""
    fw = forwards(fw)
    out = []
    for batch in batches:
        batch = batch.to(device_of(fw.model))
        require_feedback(mode, batch.T, "feedback-swap")
        swaps = [(c, n) for c, n in (("state", FEEDBACK), ("value", VALUE), ("gate", GATE)) if n in fw.model.hook_dict]
        ref, own = reference(fw, batch, mode, [n for _, n in swaps])  # no gate: nanochat's concat / addition fusions
        for condition, name in swaps:
            # the partner of each row (rows=partner), its final `name` set to the row's own
            hook = set_at(own[name], batch.T - 1, fw.model)
            patched = fw.final_logits(batch.tokens, mode, [(name, hook)], edit_from=batch.T - 1, rows=batch.partner)
            axes = dict(mode=mode, hook_rule=ONE_PASS, direction="denoising")
            out.append(score(batch, ref, patched, min_gap, experiment="feedback-swap", condition=condition, **axes))
    return pd.concat(out, ignore_index=True)


# ----------------------------------------------------------------------------- state replacement
def carried_last_states(fw, batches: list[PairBatch], mode: Mode) -> tuple[torch.Tensor, pd.DataFrame]:
    """Carried state into the final position of every row: ([rows, D], meta)."""
    fw = forwards(fw)
    states, metas = [], []
    for batch in batches:
        batch = batch.to(device_of(fw.model))
        require_feedback(mode, batch.T, "state-replacement")
        states.append(reference(fw, batch, mode, (FEEDBACK,))[1][FEEDBACK])
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


def replacements(states: torch.Tensor, meta: pd.DataFrame, batches: list[PairBatch], seed: int):
    """Per batch, {condition: [n, D] state into its final position}: zero, the task's mean state, a
    random vector of the row's own norm, a non-partner donor's state (`pick_donors`)."""
    donors = torch.as_tensor(pick_donors(meta, seed), device=states.device)
    means = {t: states[torch.tensor(s.index.to_numpy(), device=states.device)].mean(0) for t, s in meta.groupby("task")}
    start = 0
    for batch in batches:
        own = states[start : start + batch.n]
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(batch.meta["row"].min()))
        noise = torch.randn(own.shape, generator=gen, dtype=torch.float64).to(own)
        yield {
            "zero": torch.zeros_like(own),
            "mean": means[str(batch.meta["task"].iloc[0])].expand_as(own),
            "random": noise / noise.norm(dim=-1, keepdim=True) * own.norm(dim=-1, keepdim=True),
            "nonpartner": states[donors[start : start + batch.n]],
        }
        start += batch.n


def state_replacement(
    fw,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    seed: int = 0,
    carried: tuple | None = None,
) -> pd.DataFrame:
    """Replace the carried state into the final position (one-pass, `fusion.hook_feedback`) by: zero
    (the fused input then collapses to 0), the task's mean state, a random vector of the same norm,
    or a non-partner donor's state (another pair, opposite label). normalized = 1: no effect.
    `carried`: `carried_last_states` of these batches, when already computed (the first pass)."""
    fw = forwards(fw)
    batches = [b.to(device_of(fw.model)) for b in batches]
    states, meta = carried if carried is not None else carried_last_states(fw, batches, mode)
    axes = dict(experiment="state-replacement", mode=mode, hook_rule=ONE_PASS, direction="noising")
    out = []
    for batch, values in zip(batches, replacements(states, meta, batches, seed)):
        last = batch.T - 1
        ref = fw.final_logits(batch.tokens, mode, edit_from=last)
        out.append(score(batch, ref, ref, min_gap, condition="none", **axes))
        for condition, value in values.items():
            patched = fw.final_logits(batch.tokens, mode, [(FEEDBACK, set_at(value, last, fw.model))], edit_from=last)
            out.append(score(batch, ref, patched, min_gap, condition=condition, **axes))
    return pd.concat(out, ignore_index=True)


# ----------------------------------------------------------------------------- gate ablation
GATE_CONDITIONS = ("mean", "ones", "zero", "bypass")


def mean_gates(model, batches: list[PairBatch]) -> dict[str, torch.Tensor]:
    """Per task, σ(W_G e) averaged over every token position of the task's samples. (At the final
    position every sample shares its token, so a final-position mean would be the gate itself.)"""
    model = forwards(model).model
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


def gate_hooks(model, condition: str, batch: PairBatch, mean_gate: torch.Tensor) -> list:
    """The edit of `condition` at the final position: the gate set to the task's mean, ones or zero,
    or the fused input replaced by the plain input (`bypass`)."""
    D, last = model.cfg.d_model, batch.T - 1
    if condition == "bypass":
        with torch.no_grad():
            plain = model.plain_inputs(batch.tokens)[:, -1]  # the input without feedback (nanochat: normed and smeared)
        return [(FUSED, set_at(plain, last, model))]
    value = {"mean": mean_gate, "ones": torch.ones(D), "zero": torch.zeros(D)}[condition]
    return [(GATE, set_at(value.to(device_of(model)).expand(batch.n, D), last, model))]


def gate_ablation(
    fw,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    decoding: bool = True,
    means: dict | None = None,
) -> pd.DataFrame:
    """Gate σ(W_G e) at the final position set to the task's mean gate, to ones, to zero, or fusion
    bypassed (plain embedding): under the prefill `mode` (one-pass) and, with `decoding`, for the
    answer under Std decoding (no feedback: the control) and Soft decoding (kv-step path).
    `means`: `mean_gates` over every batch of the run, when these batches are a part of it."""
    fw = forwards(fw)
    batches = list(batches)
    means = mean_gates(fw.model, batches) if means is None else means
    prefill = dict(experiment="gate-ablation", direction="noising", mode=mode, hook_rule=ONE_PASS)
    soft = dict(experiment="gate-ablation", direction="noising", mode="recurrent:1", hook_rule=STEP, decoding="soft")
    out = []
    for batch in batches:
        batch = batch.to(device_of(fw.model))
        require_feedback(mode, batch.T, "gate-ablation")
        mean_gate, last = means[str(batch.meta["task"].iloc[0])], batch.T - 1
        ref = fw.final_logits(batch.tokens, mode, edit_from=last)
        out.append(score(batch, ref, ref, min_gap, condition="none", **prefill))
        for condition in GATE_CONDITIONS:
            hooks = gate_hooks(fw.model, condition, batch, mean_gate)
            patched = fw.final_logits(batch.tokens, mode, hooks, edit_from=last)
            out.append(score(batch, ref, patched, min_gap, condition=condition, **prefill))
        if not decoding:
            continue
        std = fw.std_answer_logits(batch.tokens)
        std_axes = {**soft, "mode": "standard", "decoding": "std"}
        out.append(score(batch, std, std, min_gap, condition="none", **std_axes))
        clean = fw.soft_answer_logits(batch.tokens)
        out.append(score(batch, clean, clean, min_gap, condition="none", **soft))
        for condition in GATE_CONDITIONS:
            patched = fw.soft_answer_logits(batch.tokens, gate_hooks(fw.model, condition, batch, mean_gate))
            out.append(score(batch, clean, patched, min_gap, condition=condition, **soft))
    return pd.concat(out, ignore_index=True)


# ----------------------------------------------------------------------------- residual patching
def residual_patching(
    fw,
    batches: Iterable[PairBatch],
    mode: Mode = Mode("standard"),
    min_gap: float = 0.1,
    depths: Iterable[int] | None = None,
    last_k: int | None = None,
    directions=("denoising", "noising"),
    batch_size: int = 64,
    serial: bool | None = None,
    differing: int = 1,
) -> pd.DataFrame:
    """Patch the residual stream at probe depth d (`depth_name(d)`) and one position p, for every
    d × p: denoising runs the partner with the row's activation patched in (1 = full recovery);
    noising runs the row with its partner's activation (0 = fully destroyed). Many positions run in
    one forward (replicas of the batch, each patched at its own position). `last_k`: only the last
    k positions (every position when k >= T), and besides them the last `differing` positions where
    some pair of the batch differs (the label-deciding token; column `differs` marks every position
    where a pair differs). `serial` defaults to True when the mode carries a state (see module doc)."""
    fw = forwards(fw)
    depths = list(range(fw.model.cfg.n_layers + 1)) if depths is None else list(depths)
    check_depths(depths, fw.model)
    bad = [d for d in directions if d not in ("denoising", "noising")]
    if bad:
        raise FbtError(f"residual: direction '{bad[0]}': expected denoising or noising")
    out = []
    for batch in batches:
        batch = batch.to(device_of(fw.model))
        out += _residual_batch(fw, batch, mode, min_gap, depths, last_k, directions, batch_size, serial, differing)
    return pd.concat(out, ignore_index=True)


def differing_positions(batch: PairBatch) -> list[int]:
    """Positions where some row's tokens differ from its partner's, in order."""
    tokens = batch.tokens
    return torch.nonzero((tokens != tokens[batch.partner.to(tokens.device)]).any(0)).flatten().tolist()


def _residual_batch(
    fw, batch, mode, min_gap, depths, last_k, directions, batch_size, serial, differing=1
) -> list[pd.DataFrame]:
    T, N = batch.T, batch.n
    use_serial = mode.first_fed_position(T) < T if serial is None else serial
    names = [depth_name(d) for d in depths]
    store: dict = {}  # every position of every depth, from the unpatched run
    ref = fw.final_logits(batch.tokens, mode, [(n, capture(store, n, fw.model)) for n in names], serial=use_serial)
    acts = {n: stitch(store[n]) for n in names}
    tail = list(range(max(0, T - last_k), T) if last_k else range(T))  # last_k >= T: every position
    differs = differing_positions(batch)
    extra = [p for p in differs if p < tail[0]][-differing:] if differing else []
    per = max(1, batch_size // N)  # positions per forward
    # chunks never join the differing positions to the tail: a chunk runs from its first position on
    chunks = [extra[s : s + per] for s in range(0, len(extra), per)] + [
        tail[s : s + per] for s in range(0, len(tail), per)
    ]
    own = torch.arange(N, device=batch.tokens.device)
    axes = dict(experiment="residual", mode=mode, hook_rule=SERIAL if use_serial else ONE_PASS)
    rows = []
    for direction in directions:
        # denoising: run each row's partner with the row's activation; noising: the row with its partner's
        run_rows, src_rows = (batch.partner, own) if direction == "denoising" else (None, batch.partner)
        for d, name in zip(depths, names):
            for chunk in chunks:  # replica j patched at chunk[j]
                pos = torch.tensor(chunk, device=own.device).repeat_interleave(N)
                hook = patch_rows_at(acts[name], pos, fw.model, src_rows=src_rows.repeat(len(chunk)))
                logits = fw.final_logits(
                    batch.tokens,
                    mode,
                    [(name, hook)],
                    edit_from=chunk[0],
                    serial=use_serial,
                    rows=run_rows,
                    replicas=len(chunk),
                )
                for j, p in enumerate(chunk):
                    patched = logits[j * N : (j + 1) * N]
                    rows.append(
                        score(
                            batch,
                            ref,
                            patched,
                            min_gap,
                            condition=f"depth{d}",
                            direction=direction,
                            depth=d,
                            position=p,
                            differs=p in differs,
                            **axes,
                        )
                    )
    return rows
