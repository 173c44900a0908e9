"""Depth-0 decodability under probe variants: whether a control's reading rests on one
preprocessing choice.

For each cell (task x length) of one mode, the probe is refitted on the same grouped folds as the
main sweep with standardised or raw features and C in `CS`, and the control task (labels permuted
across groups, Hewitt & Liang) is fitted beside it. A number that moves with the variant is a
property of the probe, not of the model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from fbt_probe.activations import ActivationStore
from fbt_probe.probes.estimator import LinearProbe
from fbt_probe.probes.splits import control_labels, grouped_splits
from fbt_probe.probes.sweep import ProbeConfig

CS = (0.01, 0.1, 1.0, 10.0)


def variants() -> list[tuple[bool, float]]:
    """(standardize, C) of every variant: standardised first (the main sweep's is (True, 1.0))."""
    return [(s, c) for s in (True, False) for c in CS]


def robustness(store, mode: str = "recurrent:1", depth: int = 0, cfg: ProbeConfig = ProbeConfig()) -> pd.DataFrame:
    """One row per task x length x variant x fold: accuracy and control accuracy on the test fold,
    with n_test (the main sweep's folds: `cfg.n_splits`, `cfg.cv`, `cfg.seed`)."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    with threadpool_limits(1):  # fits of a few hundred x d_model: one BLAS thread is 10-30x faster than several
        return _robustness(store, mode, depth, cfg)


def _robustness(store, mode: str, depth: int, cfg: ProbeConfig) -> pd.DataFrame:
    rows = []
    if mode not in store.modes:
        return pd.DataFrame(
            columns=[
                "task",
                "mode",
                "length",
                "depth",
                "standardize",
                "C",
                "fold",
                "accuracy",
                "control_accuracy",
                "n_test",
            ]
        )
    for m, task, length in store.conditions():
        if m != mode:
            continue
        X, meta, targets = store.load(mode, task, length)
        p = [t.depth for t in targets].index(depth)
        x = np.asarray(X[p], dtype=np.float64)
        y, groups = meta["label"].to_numpy(), meta["group_id"].astype(str).to_numpy()
        splits = grouped_splits(y, groups, cfg.n_splits, cfg.cv, cfg.seed, where=f"{task} {mode} length {length}")
        control = control_labels(y, groups, cfg.seed)
        for standardize, C in variants():
            for f, (train, test) in enumerate(splits):
                acc = []
                for labels in (y, control):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", ConvergenceWarning)  # raw features at C = 10: recorded as is
                        probe = LinearProbe(C=C, max_iter=cfg.max_iter, tol=cfg.tol, standardize=standardize)
                        probe.fit(x[train], labels[train])
                    acc.append(float(probe.score(x[test], labels[test])))
                rows.append(
                    {
                        "task": task,
                        "mode": mode,
                        "length": int(length),
                        "depth": depth,
                        "standardize": standardize,
                        "C": C,
                        "fold": f,
                        "accuracy": acc[0],
                        "control_accuracy": acc[1],
                        "n_test": len(test),
                    }
                )
    return pd.DataFrame(rows)


def pooled_by_variant(panel: pd.DataFrame) -> pd.DataFrame:
    """One row per variant (standardize, C), in the panel's order: accuracy and control accuracy
    pooled over its length x fold cells (correct over tested samples)."""
    w = panel.assign(correct=panel["accuracy"] * panel["n_test"], control=panel["control_accuracy"] * panel["n_test"])
    g = w.groupby(["standardize", "C"], sort=False)[["correct", "control", "n_test"]].sum()
    return pd.DataFrame(
        {"accuracy": g["correct"] / g["n_test"], "control_accuracy": g["control"] / g["n_test"]}
    ).reset_index()
