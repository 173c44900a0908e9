"""Both fitting paths against plain scikit-learn `LogisticRegression` on the same splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fbt_probe.probes import ProbeConfig, control_labels, fit_cpu, grouped_splits, probe_condition
from fbt_probe.probes.fit_cpu import fit_cells_sklearn
from fbt_probe.probes.fit_torch import fit_cells_torch

TOL = 1e-6  # both sides converged tightly: held-out predictions then agree sample by sample


def hard_problem(n=360, d=48, depths=4, seed=0):
    """Noisy labels, weak and growing signal, a constant feature and a large offset: accuracies
    spread between chance and ~0.9, so many test samples sit near the decision boundary."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(n // 3), 3).astype(str)
    y = rng.integers(0, 2, n)
    u = rng.normal(size=d)
    X = rng.normal(size=(depths, n, d)) * rng.uniform(0.1, 5.0, size=d) + 10.0
    for p in range(depths):
        X[p] += 0.35 * p * np.outer(2 * y - 1, u)
    X[:, :, 0] = 3.0  # constant feature: scale 1 on both paths
    flip = rng.random(n) < 0.1
    return X.astype(np.float32), np.where(flip, 1 - y, y), groups


def plain_sklearn(X, labels, splits):
    """The reference: a plain StandardScaler + LogisticRegression per cell, in one loop."""
    out = np.zeros((X.shape[0], labels.shape[0], len(splits)))
    for p in range(X.shape[0]):
        for s in range(labels.shape[0]):
            for f, (tr, te) in enumerate(splits):
                clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, tol=TOL, max_iter=5000))
                out[p, s, f] = clf.fit(X[p][tr], labels[s][tr]).score(X[p][te], labels[s][te])
    return out


@pytest.fixture(scope="module")
def problem():
    X, y, groups = hard_problem()
    splits = grouped_splits(y, groups, n_splits=5)
    labels = np.stack([y, control_labels(y, groups)])
    return X, labels, splits, plain_sklearn(X, labels, splits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_torch_path_agrees_with_sklearn_on_every_cell(problem, dtype):
    X, labels, splits, reference = problem
    fits = fit_cells_torch(X, labels, splits, tol=TOL, max_iter=2000, device="cpu", dtype=dtype)
    assert fits["accuracy"].shape == reference.shape == (4, 2, 5)
    assert reference[-1, 0].mean() > 0.75 and reference[0, 0].mean() < 0.65  # a spread of accuracies
    assert np.abs(fits["accuracy"] - reference).max() <= 0.01
    assert fits["converged"].all()


def test_batched_torch_path_solves_the_same_problem(problem):
    X, labels, splits, _ = problem
    fits = fit_cells_torch(
        X, labels, splits, tol=1e-9, max_iter=5000, device="cpu", dtype=torch.float64, return_params=True
    )
    assert fits["converged"].all()
    tr, _ = splits[2]
    ref = make_pipeline(StandardScaler(), LogisticRegression(tol=1e-9, max_iter=5000)).fit(
        X[3][tr].astype(np.float64), labels[0][tr]
    )
    np.testing.assert_allclose(fits["weights"][3, 0, 2], ref[-1].coef_[0], atol=1e-5)
    np.testing.assert_allclose(fits["bias"][3, 0, 2], ref[-1].intercept_[0], atol=1e-5)
    np.testing.assert_allclose(fits["mean"][3, 2], ref[0].mean_, rtol=1e-6)


def test_cpu_path_agrees_with_sklearn_inline_and_over_workers(problem, monkeypatch):
    X, labels, splits, reference = problem
    inline = fit_cells_sklearn(X, labels, splits, tol=TOL, max_iter=5000, n_jobs=1)
    assert np.abs(inline["accuracy"] - reference).max() <= 0.01
    monkeypatch.setattr(fit_cpu, "INLINE_WORK", 0)  # force the joblib workers on this small problem
    workers = fit_cells_sklearn(X[:2], labels, splits, tol=TOL, max_iter=5000, n_jobs=2)
    np.testing.assert_array_equal(workers["accuracy"], inline["accuracy"][:2])


def test_sweep_backends_give_the_same_table(problem):
    X, labels, splits, _ = problem
    y, groups = labels[0], np.repeat(np.arange(X.shape[1] // 3), 3).astype(str)
    tables = [
        probe_condition(X, y, groups, ProbeConfig(backend=b, n_jobs=1, tol=TOL, max_iter=3000, device="cpu"))[0]
        for b in ("sklearn", "torch")
    ]
    diff = np.abs(tables[0].value.to_numpy() - tables[1].value.to_numpy())
    assert diff.max() <= 0.01 + 1e-12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_torch_path_agrees_on_cuda(problem):
    X, labels, splits, reference = problem
    fits = fit_cells_torch(X, labels, splits, tol=TOL, max_iter=2000, device="cuda")
    assert np.abs(fits["accuracy"] - reference).max() <= 0.01
