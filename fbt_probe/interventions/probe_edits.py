"""Probe-direction tests (docs/interventions.md): is the linearly decodable label *used*?

For each task × length cell and each probe depth d, probes are cross-fitted with grouped folds
(no group on both sides): each sample is edited with the probe / eraser fitted on the folds that do
not hold its group, at the final position of depth d in the one hooked pass (**one-pass** rule,
exact: nothing later depends on the final position). With `feedback=True` the carried state the final
position is fed (`fusion.hook_feedback`, what the feedback swap replaces) is edited the same way, its
rows at depth -1 (the axis's "no depth"): a state that is decodable there but not read by the fusion
moves nothing. Conditions:
- `probe`: the held-out probe's correctness on the unedited activation (probe accuracy of the cell);
- `erase-leace`: LEACE (EleutherAI `concept-erasure`), the least-squares edit after which no linear
  classifier beats a constant; `erase-orth`: orthogonal projection off the probe's unit direction
  around the training mean. Erase rows also carry `probe_accuracy` of a probe re-fitted (grouped
  CV) on the erased activations;
- `steer`: x + α·(m_other - m_own)·w, w the unit raw-space probe direction, m the class means of the
  training folds along w: α = 1 moves a sample by the class-mean gap toward the opposite label;
  `steer-random`: the same displacement along a random unit direction (control).
normalized = 1: the answer did not move; 0: it moved as far as the partner's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from concept_erasure import LeaceFitter

from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name
from fbt_probe.interventions.edits import edit_at, rank_one_edit
from fbt_probe.interventions.experiments import FEEDBACK, ONE_PASS, device_of, reference, require_feedback
from fbt_probe.interventions.forwards import forwards
from fbt_probe.interventions.metrics import score
from fbt_probe.modes import Mode
from fbt_probe.probes import fit_binary, grouped_folds


def erase_methods(requested: str = "auto") -> tuple[str, ...]:
    """'auto' = LEACE and the orthogonal projection."""
    if requested == "auto":
        return ("leace", "orth")
    methods = tuple(m.strip() for m in requested.split(",") if m.strip())
    bad = set(methods) - {"leace", "orth"}
    if bad or not methods:
        raise FbtError(f"erase '{requested}': expected auto, leace, orth or leace,orth")
    return methods


def cv_correct(X: np.ndarray, y: np.ndarray, splits, C: float = 1.0) -> np.ndarray:
    """[n] 0/1: each sample's label predicted by the probe fitted on the other folds."""

    out = np.full(len(y), np.nan)
    for train, test in splits:
        out[test] = fit_binary(X[train], y[train], C).predict(X[test]) == y[test]
    return out


# ----------------------------------------------------------------------------- edits per row
def fold_edits(X: np.ndarray, y: np.ndarray, splits, methods, C: float = 1.0, seed: int = 0) -> dict:
    """Per-row edit parameters from the folds that do not hold the row: for each erase method
    (r, l, b) of x -> x - ((x-b)·r) l; for steering the unit step toward the opposite label."""

    n, D = X.shape
    z = np.zeros((n, D))
    edits = {m: (z.copy(), z.copy(), z.copy()) for m in methods}
    edits["step"], edits["random"] = z.copy(), z.copy()
    edits["probe_correct"] = np.full(n, np.nan)
    rng = np.random.default_rng(seed)
    for train, test in splits:
        probe = fit_binary(X[train], y[train], C)
        w = probe.direction
        edits["probe_correct"][test] = probe.predict(X[test]) == y[test]
        proj = X[train] @ w
        m = np.array([proj[y[train] == c].mean() for c in (0, 1)])
        gap = (m[1 - y[test]] - m[y[test]])[:, None]  # [test, 1]
        edits["step"][test] = gap * w
        rand = rng.standard_normal(D)
        edits["random"][test] = np.abs(gap) * (rand / np.linalg.norm(rand))
        for method in methods:
            r, l, b = _eraser(method, X[train], y[train], w)
            for arr, v in zip(edits[method], (r, l, b)):
                arr[test] = v
    return edits


def _eraser(method: str, X: np.ndarray, y: np.ndarray, w: np.ndarray):
    if method == "orth":
        return w, w, X.mean(0)
    e = LeaceFitter.fit(torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y)).eraser
    bias = e.bias if e.bias is not None else torch.zeros(X.shape[1], dtype=torch.float64)
    return e.proj_right[0].numpy(), e.proj_left[:, 0].numpy(), bias.numpy()


def apply_edit(X: np.ndarray, r, l, b) -> np.ndarray:
    return X - ((X - b) * r).sum(-1, keepdims=True) * l


# ----------------------------------------------------------------------------- experiment
def probe_direction(
    fw,
    batches,
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    depths=(0,),
    scales=(0.5, 1.0, 2.0, 4.0),
    n_folds: int = 4,
    erase: str = "auto",
    C: float = 1.0,
    seed: int = 0,
    feedback: bool = False,
) -> pd.DataFrame:
    """Erase / steer the probe direction at the final position of each depth, and with `feedback` of
    the carried state fed to it (depth -1; see module doc). Cells with fewer than two groups are
    skipped and listed in `df.attrs['notes']`. A cell's batches keep their prefixes while the cell runs
    (`Forwards.holding`)."""
    fw = forwards(fw)
    methods = erase_methods(erase)
    depths = list(depths) if depths is not None else list(range(fw.model.cfg.n_layers + 1))
    names = [depth_name(d) for d in depths]
    if feedback:
        depths, names = [*depths, -1], [*names, FEEDBACK]
    cells: dict = {}
    for batch in batches:  # task x length-knob cells, in order of first appearance
        key = (str(batch.meta["task"].iloc[0]), int(batch.meta["length_knob"].iloc[0]))
        if feedback:
            require_feedback(mode, batch.T, "probe-direction --feedback")
        cells.setdefault(key, []).append(batch.to(device_of(fw.model)))
    out, notes = [], []
    for (task, knob), cell in cells.items():
        with fw.holding():
            acts = [reference(fw, batch, mode, names)[1] for batch in cell]
            meta = pd.concat([b.meta for b in cell], ignore_index=True)
            y, groups = meta["label"].to_numpy().astype(np.int64), meta["group_id"].astype(str).to_numpy()
            if len(np.unique(groups)) < 2 or len(np.unique(y)) < 2:
                notes.append(f"{task} length {knob}: skipped (needs >= 2 groups and both labels)")
                continue
            try:
                splits = grouped_folds(y, groups, n_folds, seed)
            except FbtError as exc:
                notes.append(f"{task} length {knob}: skipped ({exc})")
                continue
            for d, name in zip(depths, names):
                X = torch.cat([a[name] for a in acts]).double().cpu().numpy()
                # the random steer's stream: seed + depth, the carried state's after the last depth's
                edits = fold_edits(X, y, splits, methods, C, seed + (d if d >= 0 else fw.model.cfg.n_layers + 1))
                erased_acc = {m: cv_correct(apply_edit(X, *edits[m]), y, splits, C) for m in methods}
                out.extend(_cell_rows(fw, cell, mode, d, name, edits, erased_acc, methods, scales, min_gap))
    df = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    df.attrs["notes"] = notes
    return df


def _cell_rows(fw, cell, mode, d, name, edits, erased_acc, methods, scales, min_gap) -> list[pd.DataFrame]:
    """One depth of one cell: each batch edited at its final position by every erasure and steer."""
    rows, start = [], 0
    axes = dict(experiment="probe-direction", mode=mode, hook_rule=ONE_PASS, direction="noising", depth=d)
    for batch in cell:
        sl = slice(start, start + batch.n)
        start += batch.n
        dev, last = batch.tokens.device, batch.T - 1

        def run(fn):  # the cell's final position of depth d edited by fn
            return fw.final_logits(batch.tokens, mode, [(name, edit_at(fn, last, fw.model))], edit_from=last)

        ref = fw.final_logits(batch.tokens, mode, edit_from=last)
        probe = score(batch, ref, ref, min_gap, condition="probe", method="probe", **axes)
        probe["probe_accuracy"] = edits["probe_correct"][sl]
        rows.append(probe)
        for m in methods:
            r, l, b = (torch.as_tensor(a[sl], device=dev) for a in edits[m])
            row = score(batch, ref, run(rank_one_edit(r, l, b)), min_gap, condition=f"erase-{m}", method=m, **axes)
            row["probe_accuracy"] = erased_acc[m][sl]
            rows.append(row)
        step, random = (torch.as_tensor(edits[k][sl], device=dev) for k in ("step", "random"))
        zero = torch.zeros_like(step)
        for alpha in scales:
            for cond, method, shift in (
                ("steer", "probe-direction", step),
                ("steer-random", "random-direction", random),
            ):
                patched = run(rank_one_edit(zero, zero, zero, shift=alpha * shift))
                rows.append(
                    score(batch, ref, patched, min_gap, condition=cond, scale=float(alpha), method=method, **axes)
                )
    return rows
