"""The DAS experiment over minimal pairs: per task × length cell, hook and k, a rotation trained on the
pairs of some groups and tested on the pairs of held-out groups (grouped CV over pairs), with two
baselines: a random rotation (the trained one's starting point) and the full-vector interchange
(k = D). Beside each fold: the cosine between the learned subspace and the linear probe's direction
fitted on the same training pairs, and that probe's held-out accuracy.

Run it on the no-feedback baseline model too: its fusion is untrained, the control for the feedback
channel (docs/probes.md).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.interventions.attribution import check_hooks, depth_of
from fbt_probe.interventions.das import (
    Examples,
    FinalStep,
    fit_rotations,
    haar,
    iia,
    intervened_logits,
    subspace_cosine,
)
from fbt_probe.interventions.experiments import ONE_PASS, device_of
from fbt_probe.interventions.forwards import forwards
from fbt_probe.interventions.metrics import score
from fbt_probe.interventions.pairs import PairBatch
from fbt_probe.modes import Mode
from fbt_probe.probes import fit_binary, grouped_folds

FEEDBACK = act_name("fusion_feedback")
KS = (1, 2, 4, 8)


def das_hooks(model, mode: Mode, T: int) -> list[str]:
    """fusion.hook_feedback (when the mode feeds the final position), depth 0, the middle and the top."""
    L = model.cfg.n_layers
    fed = mode.first_fed_position(T) <= T - 1
    return ([FEEDBACK] if fed else []) + [depth_name(d) for d in sorted({0, L // 2, L})]


def merge(batches: list[PairBatch]) -> PairBatch:
    """Batches of one token length as one (partners re-indexed)."""
    if len({b.T for b in batches}) != 1:
        raise FbtError("das: a cell's batches differ in token length")
    offsets = np.cumsum([0] + [b.n for b in batches[:-1]])
    return PairBatch(
        torch.cat([b.tokens for b in batches]),
        torch.cat([b.partner + int(o) for b, o in zip(batches, offsets)]),
        torch.cat([b.target for b in batches]),
        torch.cat([b.other for b in batches]),
        pd.concat([b.meta for b in batches], ignore_index=True),
    )


def pair_components(meta: pd.DataFrame) -> np.ndarray:
    """[rows] a CV unit per row: the connected component of group ids linked by pairs, so that no
    group is on both sides of a split of pairs (completion's two samples have different groups)."""
    parent: dict = {}

    def find(g):
        while parent.setdefault(g, g) != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    for _, sub in meta.groupby(["task", "pair_id"] if "task" in meta else "pair_id"):
        a, *rest = [find(str(g)) for g in sub["group_id"]]
        for b in rest:
            parent[b] = a
    return np.array([find(str(g)) for g in meta["group_id"]])


def _examples(step: FinalStep, batch: PairBatch, acts: torch.Tensor, rows: np.ndarray) -> Examples:
    p = batch.partner
    return Examples(step, acts, p, batch.target[p], batch.other[p], torch.as_tensor(np.array(rows), device=acts.device))


def _rows(batch: PairBatch, ref, patched, test: np.ndarray, min_gap: float, **axes) -> pd.DataFrame:
    w = score(batch, ref, patched, min_gap, experiment="das", hook_rule=ONE_PASS, direction="interchange", **axes)
    p = batch.partner.to(patched.device)
    idx = torch.arange(batch.n, device=patched.device)
    ld_src = patched[idx, batch.target[p]] - patched[idx, batch.other[p]]
    w["iia"] = (patched.argmax(-1) == batch.target[p]).double().cpu().numpy()
    w["iia_choice"] = (ld_src > 0).double().cpu().numpy()
    return w[test]


def _fit_all(
    step: FinalStep,
    batch: PairBatch,
    acts,
    name: str,
    train_masks: list,
    ks,
    steps: int,
    lr: float,
    seed: int,
    model,
    max_rows: int,
) -> dict:
    """{(fold, k): (rotation, loss)}: every fold × k of one hook, trained together in chunks of at most
    `max_rows` repeated rows (one forward and backward per step per chunk; see `fit_rotations`)."""
    N, D = acts.shape
    jobs = [(f, k) for f in range(len(train_masks)) for k in ks if k <= D]
    ex = _examples(step, batch, acts, np.ones(N, dtype=bool))
    per, out = max(1, max_rows // N), {}
    for s in range(0, len(jobs), per):
        chunk = jobs[s : s + per]
        spec = [(torch.as_tensor(np.array(train_masks[f]), device=acts.device), k, seed + f) for f, k in chunk]
        out.update(zip(chunk, fit_rotations(ex, name, spec, steps, lr, model)))
    return out


def _cells(batches, device) -> dict:
    """(task, length knob, T) -> that cell's batches, on `device`."""
    cells: dict = {}
    for b in batches:
        b = b.to(device)
        cells.setdefault((str(b.meta["task"].iloc[0]), int(b.meta["length_knob"].iloc[0]), b.T), []).append(b)
    return cells


def _fold_masks(meta: pd.DataFrame, n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row masks per fold: folds of whole pairs, no group on both sides
    (`pair_components`); an FbtError where the cell cannot be split."""
    comp = pair_components(meta)
    first = meta.groupby("pair_id", sort=True).head(1)
    y_pairs, g_pairs, pair_ids = first["label"].to_numpy(), comp[first.index], first["pair_id"].to_numpy()
    if len(np.unique(g_pairs)) < 2:
        raise FbtError("needs pairs from >= 2 groups")
    if len(np.unique(y_pairs)) < 2:  # y only balances the folds: every pair trains in both directions
        y_pairs = np.arange(len(y_pairs)) % 2
    with warnings.catch_warnings():  # few groups per label class: sklearn warns, folds stay valid
        warnings.simplefilter("ignore", UserWarning)
        splits = grouped_folds(y_pairs, g_pairs, n_folds, seed)
    in_pairs = meta["pair_id"].isin
    return [(in_pairs(pair_ids[tr]).to_numpy(), in_pairs(pair_ids[te]).to_numpy()) for tr, te in splits]


def das(
    fw,
    batches,
    mode: Mode = Mode("recurrent", 1),
    min_gap: float = 0.1,
    hooks=None,
    ks=KS,
    steps: int = 200,
    lr: float = 1e-2,
    n_folds: int = 5,
    seed: int = 0,
    max_rows: int = 512,
) -> pd.DataFrame:
    """Wide rows (held-out interchanges; metrics iia, iia_choice and the usual `score` columns) with
    methods `das`, `random-rotation`, `full-interchange`; attrs: `notes`, `tables` {"das_folds": ...}.
    `max_rows`: rows per training forward (the (fold, k) rotations of a hook train side by side).
    Its forwards are its own (`FinalStep`: the final position's pass, with gradients for training)."""
    model = forwards(fw).model
    out, fold_rows, notes = [], [], []
    for (task, knob, T), items in sorted(_cells(batches, device_of(model)).items()):
        batch = merge(items)
        try:
            masks = _fold_masks(batch.meta, n_folds, seed)
        except FbtError as exc:
            notes.append(f"das {mode} {task} length {knob}: skipped ({exc})")
            continue
        step = FinalStep.build(model, batch.tokens, mode)
        with torch.no_grad():
            ref = step()
        names = check_hooks(model, hooks) if hooks is not None else das_hooks(model, mode, T)
        y = batch.meta["label"].to_numpy()
        for name in names:
            acts = step.activation(name)
            D = acts.shape[-1]
            X = acts.double().cpu().numpy()
            fitted = _fit_all(step, batch, acts, name, [m[0] for m in masks], ks, steps, lr, seed, model, max_rows)
            for f, (train, test) in enumerate(masks):
                probe = fit_binary(X[train], y[train])
                w = torch.as_tensor(probe.direction)
                axes = dict(mode=mode, condition=name, depth=depth_of(name, model.cfg.n_layers), fold=f)
                ex_train, ex_test = _examples(step, batch, acts, train), _examples(step, batch, acts, test)
                full = intervened_logits(ex_test, torch.eye(D, dtype=acts.dtype, device=acts.device), D, name)
                out.append(_rows(batch, ref, full, test, min_gap, method="full-interchange", subspace_dim=D, **axes))
                for k in [k for k in ks if k <= D]:
                    rot, loss = fitted[(f, k)]
                    for method, R in (
                        ("das", rot.R.detach()),
                        ("random-rotation", haar(D, seed + f, acts.dtype).to(acts.device)),
                    ):
                        with torch.no_grad():
                            logits = intervened_logits(ex_test, R, k, name)
                        out.append(_rows(batch, ref, logits, test, min_gap, method=method, subspace_dim=k, **axes))
                        fold_rows.append(
                            dict(
                                task=task,
                                length_knob=knob,
                                mode=mode,
                                hook=name,
                                depth=axes["depth"],
                                subspace_dim=k,
                                fold=f,
                                method=method,
                                train_loss=loss if method == "das" else np.nan,
                                train_iia=float(iia([ex_train], R, k, name).mean()),
                                test_iia=float(iia([ex_test], R, k, name).mean()),
                                probe_cosine=subspace_cosine(R[:k], w),
                                probe_accuracy=float(np.mean(probe.predict(X[test]) == y[test])),
                                n_train_pairs=int(train.sum() // 2),
                                n_test_pairs=int(test.sum() // 2),
                            )
                        )
    df = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    df.attrs["notes"] = notes
    df.attrs["tables"] = {"das_folds": pd.DataFrame(fold_rows)}
    return df
