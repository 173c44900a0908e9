"""Probe-sweep benchmark: a depth x fold sweep on synthetic activations, the project's CPU path
(lbfgs, 1 BLAS thread per fit, fits over cores with joblib) against scikit-learn with default
settings in one plain loop, timed in the same run. Optionally the batched torch path too.

Run it as `fbt-probe bench probes --out FILE.md` (`--help` lists the options).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_info

from fbt_probe.probes import ProbeConfig, grouped_splits
from fbt_probe.probes.fit_cpu import INLINE_WORK, fit_cells_sklearn, resolve_jobs
from fbt_probe.probes.fit_torch import default_device, fit_cells_torch
from fbt_probe.provenance import provenance


def synthetic_activations(n: int = 1600, d: int = 1536, depths: int = 25, seed: int = 0):
    """(X [depths, n, d] float32, labels [n], groups [n]): minimal pairs (one group per pair), an
    anisotropic residual-like spectrum, and a label direction whose strength grows with depth from
    none (chance) to strong (near ceiling)."""
    rng = np.random.default_rng(seed)
    y = np.tile([0, 1], n // 2)
    groups = np.repeat(np.arange(n // 2), 2).astype(str)
    spectrum = (1.0 / np.sqrt(np.arange(1, d + 1))).astype(np.float32) * 4.0  # a few large directions
    u = rng.normal(size=d).astype(np.float32)
    u /= np.linalg.norm(u)
    X = np.empty((depths, n, d), dtype=np.float32)
    for p in range(depths):
        X[p] = rng.standard_normal((n, d), dtype=np.float32) * spectrum
        X[p] += (1.5 * p / max(depths - 1, 1)) * np.outer(2 * y - 1, u).astype(np.float32)
    return X, y, groups


def _sklearn_default_loop(X, y, splits) -> tuple[float, np.ndarray, np.ndarray, int]:
    """What a user writes first: a fresh default pipeline per cell, BLAS at its default threads."""
    acc = np.zeros((X.shape[0], len(splits)))
    n_iter = np.zeros_like(acc, dtype=int)
    unconverged = 0
    start = time.perf_counter()
    for p in range(X.shape[0]):
        for f, (train, test) in enumerate(splits):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConvergenceWarning)
                clf = make_pipeline(StandardScaler(), LogisticRegression()).fit(X[p][train], y[train])
            unconverged += sum(issubclass(w.category, ConvergenceWarning) for w in caught)
            acc[p, f] = clf.score(X[p][test], y[test])
            n_iter[p, f] = int(clf[-1].n_iter_[0])
    return time.perf_counter() - start, acc, n_iter, unconverged


def bench_probe_sweep(
    n: int = 1600,
    d: int = 1536,
    depths: int = 25,
    folds: int = 5,
    n_jobs: int = -1,
    seed: int = 0,
    torch_path: bool = False,
    device: str | None = None,
) -> dict:
    """Time one sweep (`depths` x `folds` fits, no control task) three or four ways; returns a dict."""
    X, y, groups = synthetic_activations(n, d, depths, seed)
    splits = grouped_splits(y, groups, n_splits=folds)
    cfg = ProbeConfig()
    start = time.perf_counter()
    fast = fit_cells_sklearn(X, y[None], splits, C=cfg.C, max_iter=cfg.max_iter, tol=cfg.tol, n_jobs=n_jobs)
    t_fast = time.perf_counter() - start
    t_default, acc_default, iter_default, unconverged = _sklearn_default_loop(X, y, splits)
    result = {
        "config": {
            "n": n,
            "d": d,
            "depths": depths,
            "folds": folds,
            "fits": depths * folds,
            "seed": seed,
            "jobs": 1 if depths * folds * n * d < INLINE_WORK else min(resolve_jobs(n_jobs), depths * folds),
            "probe": {"C": cfg.C, "max_iter": cfg.max_iter, "tol": cfg.tol},
        },
        "threadpools": [{"api": i["internal_api"], "threads": i["num_threads"]} for i in threadpool_info()],
        "cpu_path_s": t_fast,
        "sklearn_default_loop_s": t_default,
        "speedup": t_default / t_fast,
        "max_abs_accuracy_diff": float(np.abs(fast["accuracy"][:, 0] - acc_default).max()),
        "accuracy_by_depth": fast["accuracy"][:, 0].mean(-1).round(4).tolist(),
        "n_iter_cpu_path_mean": float(fast["n_iter"].mean()),
        "n_iter_default_mean": float(iter_default.mean()),
        "default_unconverged_fits": int(unconverged),
    }
    if torch_path:
        dev = device or default_device()
        fit_cells_torch(X[:1], y[None], splits[:1], max_iter=5, device=dev)  # warm-up (allocator, kernels)
        start = time.perf_counter()
        batched = fit_cells_torch(X, y[None], splits, C=cfg.C, max_iter=cfg.max_iter, tol=cfg.tol, device=dev)
        t_torch = time.perf_counter() - start  # results are on the host already: the device is synchronized
        result.update(
            torch_path_s=t_torch,
            torch_device=dev,
            torch_speedup=t_default / t_torch,
            torch_max_abs_accuracy_diff=float(np.abs(batched["accuracy"][:, 0] - acc_default).max()),
        )

    result["provenance"] = provenance(seed=seed)
    return result


def to_markdown(r: dict) -> str:
    c = r["config"]
    lines = [
        f"Sweep: {c['depths']} depths x {c['folds']} folds = {c['fits']} fits, N = {c['n']} samples "
        f"(GroupKFold over {c['n'] // 2} pairs), D = {c['d']}, float32, no control task.",
        "",
        "| path | time (s) | speed-up vs default loop | max held-out accuracy difference |",
        "|---|---:|---:|---:|",
        f"| scikit-learn defaults, one plain loop (BLAS default threads) | {r['sklearn_default_loop_s']:.1f} | 1.0x | - |",
        f"| CPU path: lbfgs, 1 BLAS thread per fit, {c['jobs']} joblib workers | {r['cpu_path_s']:.1f} | "
        f"{r['speedup']:.1f}x | {r['max_abs_accuracy_diff']:.4f} |",
    ]
    if "torch_path_s" in r:
        lines.append(
            f"| batched torch L-BFGS on {r['torch_device']} | {r['torch_path_s']:.1f} | "
            f"{r['torch_speedup']:.1f}x | {r['torch_max_abs_accuracy_diff']:.4f} |"
        )
    lines += [
        "",
        f"Mean lbfgs iterations: {r['n_iter_cpu_path_mean']:.0f} (CPU path, max_iter "
        f"{c['probe']['max_iter']}) vs {r['n_iter_default_mean']:.0f} (defaults, max_iter 100; "
        f"{r['default_unconverged_fits']} fits hit it). Default thread pools: "
        + ", ".join(f"{b['api']} x{b['threads']}" for b in r["threadpools"])
        + ".",
    ]
    return "\n".join(lines) + "\n"
