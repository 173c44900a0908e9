"""CPU path: one scikit-learn lbfgs fit per (depth, label set, fold) cell, BLAS limited to one thread
per fit (with 2 BLAS threads a 1600 x 1536 fit was measured ~6x slower on 2 cores) and the fits
spread over the cores with joblib."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from fbt_probe.probes.estimator import LinearProbe
from fbt_probe.probes.splits import Split


def n_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_jobs(n_jobs: int) -> int:
    return n_cores() if n_jobs is None or n_jobs <= 0 else int(n_jobs)


def _fit_cell(X, p: int, y, train, test, C: float, max_iter: int, tol: float) -> tuple:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        Xp = np.asarray(X[p])
        probe = LinearProbe(C=C, max_iter=max_iter, tol=tol).fit(Xp[train], y[train])
        hit = probe.predict(Xp[test]) == y[test]
        test_acc = float(np.mean(hit))
        train_acc = float(np.mean(probe.predict(Xp[train]) == y[train]))
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return test_acc, train_acc, probe.n_iter_, converged, hit


def _fit_chunk(X, cells, labels, splits, C, max_iter, tol) -> list:
    with threadpool_limits(limits=1):  # one BLAS/OpenMP thread per fit; entering the limit costs ms, so once per chunk
        return [_fit_cell(X, p, labels[s], *splits[f], C, max_iter, tol) for p, s, f in cells]


# Below this many multiply-adds per condition (cells x rows x features) worker start-up and
# memory-mapping cost more than they save: fit in this process.
INLINE_WORK = 2e7


def fit_cells_sklearn(
    X: np.ndarray,
    labels: np.ndarray,
    splits: list[Split],
    *,
    C: float = 1.0,
    max_iter: int = 1000,
    tol: float = 1e-4,
    n_jobs: int = -1,
) -> dict[str, np.ndarray]:
    """Fit every cell of X [P, N, D] x labels [S, N] x splits (F folds).

    Returns arrays of shape [P, S, F]: `accuracy` (held-out), `train_accuracy`, `n_iter`, `converged`;
    and `correct` [P, S, N]: each sample's held-out prediction right (1) or wrong (0), from the fold
    that tests it (NaN for a sample no fold tests).
    """
    X = np.asarray(X)
    labels = np.atleast_2d(np.asarray(labels))
    P, S, F = X.shape[0], labels.shape[0], len(splits)
    cells = [(p, s, f) for p in range(P) for s in range(S) for f in range(F)]
    jobs = min(resolve_jobs(n_jobs), len(cells))
    if jobs == 1 or len(cells) * X.shape[1] * X.shape[2] < INLINE_WORK:
        results = _fit_chunk(X, cells, labels, splits, C, max_iter, tol)
    else:
        chunks = [cells[i :: jobs * 4] for i in range(jobs * 4)]  # interleaved: balances cheap and costly depths
        with tempfile.TemporaryDirectory(prefix="fbt-probe-") as tmp:
            # One memory-mapped copy shared by all workers instead of one pickled copy per fit.
            path = Path(tmp) / "X.npy"
            np.save(path, X)
            Xmm = np.load(path, mmap_mode="r")
            parts = Parallel(n_jobs=jobs, backend="loky")(
                delayed(_fit_chunk)(Xmm, chunk, labels, splits, C, max_iter, tol) for chunk in chunks if chunk
            )
        by_cell = {cell: r for chunk, part in zip([c for c in chunks if c], parts) for cell, r in zip(chunk, part)}
        results = [by_cell[cell] for cell in cells]
    out = {
        k: np.zeros((P, S, F), dtype=dt)
        for k, dt in (("accuracy", float), ("train_accuracy", float), ("n_iter", int), ("converged", bool))
    }
    out["correct"] = np.full((P, S, X.shape[1]), np.nan)
    for (p, s, f), (acc, tr_acc, n_iter, conv, hit) in zip(cells, results):
        out["accuracy"][p, s, f], out["train_accuracy"][p, s, f] = acc, tr_acc
        out["n_iter"][p, s, f], out["converged"][p, s, f] = n_iter, conv
        out["correct"][p, s, splits[f][1]] = hit
    return out
