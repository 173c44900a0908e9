"""The probe sweep: for each task x mode x length, a probe at every depth x fold, with controls,
written as one tidy table (one row per model, task, mode, length, depth, fold, metric)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fbt_probe.activations import ActivationStore
from fbt_probe.config import check_device
from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, write_json
from fbt_probe.marker import named_outputs
from fbt_probe.probes.estimator import LinearProbe
from fbt_probe.probes.fit_cpu import fit_cells_sklearn
from fbt_probe.probes.fit_torch import fit_cells_torch
from fbt_probe.probes.splits import CV_KINDS, TooFewGroupsError, control_labels, grouped_splits, majority_baseline
from fbt_probe.provenance import provenance

BACKENDS = ("auto", "sklearn", "torch")
METRICS = ("accuracy", "train_accuracy", "majority_baseline", "control_accuracy", "selectivity")
KEY_COLUMNS = ("model", "task", "mode", "length", "depth", "hook", "fold")
TABLE_FILE, CSV_FILE, SUMMARY_FILE, PROVENANCE_FILE, SAMPLES_FILE = (
    "probes.parquet",
    "probes.csv",
    "probes_summary.csv",
    "probes.provenance.json",
    "probes_samples.parquet",
)
SAMPLE_COLUMNS = ("task", "mode", "length", "depth", "fold", "row", "pair_id", "group_id", "label", "correct")


@dataclass(frozen=True)
class ProbeConfig:
    n_splits: int = 4
    """Folds of grouped K-fold CV (4: the paper's appendix F)."""
    cv: str = "group"
    """"group" (GroupKFold) or "stratified-group" (StratifiedGroupKFold: majority baseline near 0.5)."""
    C: float = 1.0
    """Inverse L2 strength of the logistic regression."""
    max_iter: int = 1000
    tol: float = 1e-4
    """Stop when max |gradient| of the mean-normalized objective is below this (as sklearn's lbfgs)."""
    backend: str = "auto"
    """"sklearn" (lbfgs, 1 BLAS thread per fit, joblib over cores), "torch" (all depths x folds of a
    condition in one batched L-BFGS, on CUDA when present), "auto" (torch on CUDA, else sklearn)."""
    n_jobs: int = -1
    """Worker processes of the sklearn backend (-1: every core this process may use)."""
    device: str | None = None
    """Device of the torch backend (default: cuda if available, else cpu)."""
    control: bool = True
    """Also fit the control task (labels permuted across groups) and report selectivity."""
    seed: int = 0
    chance_tolerance: float = 0.05
    """Depth 0 under `standard` is flagged when its mean accuracy differs from the majority baseline by more."""
    skip_small_cells: bool = True
    """In a sweep, skip (and flag) a cell with fewer groups than folds instead of failing; e.g. memory
    with 0 distractors has a single scratch context. A sweep where every cell is skipped fails."""

    def __post_init__(self) -> None:
        if self.cv not in CV_KINDS:
            raise FbtError(f"probe config: field 'cv' must be one of {CV_KINDS}, got {self.cv!r}")
        if self.backend not in BACKENDS:
            raise FbtError(f"probe config: field 'backend' must be one of {BACKENDS}, got {self.backend!r}")
        if not self.C > 0 or self.max_iter < 1 or not self.tol > 0:
            raise FbtError("probe config: C, max_iter and tol must be positive")
        if isinstance(self.n_splits, bool) or not isinstance(self.n_splits, int) or self.n_splits < 2:
            raise FbtError(f"probe config: field 'n_splits' (--folds) must be an integer >= 2, got {self.n_splits!r}")

        check_device(self.device)

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "torch" if torch.cuda.is_available() else "sklearn"


@dataclass(frozen=True)
class SweepResult:
    table: pd.DataFrame
    """Tidy: KEY_COLUMNS + metric, value, n_train, n_test."""
    flags: tuple = ()
    """Problems a reader must see (dicts with task, mode, length, depth, message)."""
    config: ProbeConfig = field(default_factory=ProbeConfig)
    provenance: dict = field(default_factory=dict)
    samples: pd.DataFrame | None = None
    """Per sample, depth and cell: the held-out prediction right (1) or wrong (0) in the fold that tests
    it (`SAMPLE_COLUMNS`; `row` and `pair_id` are the dataset's). What a paired comparison of two
    models on the same samples resamples (docs/statistics.md)."""

    def summary(self) -> pd.DataFrame:
        return summarize(self.table)


def fit_cells(X, labels, splits, cfg: ProbeConfig) -> dict[str, np.ndarray]:
    """Dispatch to the configured backend; arrays [P, S, F]."""
    if cfg.resolved_backend() == "torch":
        return fit_cells_torch(X, labels, splits, C=cfg.C, max_iter=cfg.max_iter, tol=cfg.tol, device=cfg.device)
    return fit_cells_sklearn(X, labels, splits, C=cfg.C, max_iter=cfg.max_iter, tol=cfg.tol, n_jobs=cfg.n_jobs)


def probe_condition(
    X,
    y,
    groups,
    cfg: ProbeConfig = ProbeConfig(),
    *,
    depths=None,
    hooks=None,
    key: dict | None = None,
    samples: list | None = None,
) -> tuple[pd.DataFrame, list[dict]]:
    """Probe one cell's activations X [P, N, D] (P depths) against labels y [N] with group ids.

    Returns (tidy rows, flags). `key` fills the model/task/mode/length columns. With `samples` (a
    list), appends the cell's per-sample held-out correctness: one row per depth and sample (`sample`:
    its index in the cell) with its fold, group, label and `correct` (the main task's probe)."""
    key = {"model": "", "task": "", "mode": "", "length": -1, **(key or {})}
    where = f"{key['task']} {key['mode']} length {key['length']}".strip()
    X = np.asarray(X)
    if X.ndim != 3 or X.shape[1] != len(y):
        raise FbtError(f"{where}: activations must be [depths, samples, d] with {len(y)} samples, got {X.shape}")
    depths = list(range(X.shape[0])) if depths is None else list(depths)
    hooks = [""] * len(depths) if hooks is None else list(hooks)
    bad = ~np.isfinite(X).all(axis=(1, 2))
    if bad.any():
        raise FbtError(
            f"{where}: NaN/inf activations at depth {depths[int(np.argmax(bad))]} "
            f"({hooks[int(np.argmax(bad))] or 'no hook name'})"
        )
    y, groups = np.asarray(y), np.asarray(groups).astype(str)
    splits = grouped_splits(y, groups, cfg.n_splits, cfg.cv, cfg.seed, where=where)
    labels = np.stack([y, control_labels(y, groups, cfg.seed)]) if cfg.control else y[None]
    fits = fit_cells(X, labels, splits, cfg)
    majority = majority_baseline(y, splits)
    rows = []
    for p, (depth, hook) in enumerate(zip(depths, hooks)):
        for f, (train, test) in enumerate(splits):
            metrics = {
                "accuracy": fits["accuracy"][p, 0, f],
                "train_accuracy": fits["train_accuracy"][p, 0, f],
                "majority_baseline": majority[f],
            }
            if cfg.control:
                metrics["control_accuracy"] = fits["accuracy"][p, 1, f]
                metrics["selectivity"] = metrics["accuracy"] - metrics["control_accuracy"]
            for metric, value in metrics.items():
                rows.append(
                    {
                        **key,
                        "depth": int(depth),
                        "hook": hook,
                        "fold": f,
                        "metric": metric,
                        "value": float(value),
                        "n_train": len(train),
                        "n_test": len(test),
                    }
                )
    table = pd.DataFrame(rows, columns=[*KEY_COLUMNS, "metric", "value", "n_train", "n_test"])
    if samples is not None:
        samples.append(_sample_rows(fits["correct"][:, 0], splits, y, groups, depths, key))
    flags = _depth0_flags(X, depths, fits["accuracy"][:, 0].mean(-1), majority.mean(), key, cfg)
    if not fits["converged"].all():
        flags.append(
            {
                **_flag_key(key),
                "depth": None,
                "message": f"{int((~fits['converged']).sum())} of "
                f"{fits['converged'].size} fits did not converge within max_iter={cfg.max_iter}",
            }
        )
    return table, flags


def _sample_rows(correct: np.ndarray, splits, y, groups, depths, key: dict) -> pd.DataFrame:
    """correct [P, N] -> one row per depth x tested sample (depth-major, samples in cell order)."""
    fold = np.full(len(y), -1)
    for f, (_, test) in enumerate(splits):
        fold[test] = f
    tested = np.flatnonzero(fold >= 0)
    P, n = correct.shape[0], len(tested)
    return pd.DataFrame(
        {
            "task": key["task"],
            "mode": key["mode"],
            "length": int(key["length"]),
            "depth": np.repeat(np.asarray(depths, dtype=np.int64), n),
            "fold": np.tile(fold[tested], P),
            "sample": np.tile(tested, P),
            "group_id": np.tile(groups[tested], P),
            "label": np.tile(np.asarray(y)[tested], P),
            "correct": correct[:, tested].reshape(-1).astype(np.int8),
        }
    )


def _flag_key(key: dict) -> dict:
    return {k: key[k] for k in ("model", "task", "mode", "length")}


def _depth0_flags(X, depths, acc_mean, majority_mean, key, cfg) -> list[dict]:
    """Depth 0 under `standard` is chance by construction (every sample ends with the same token)."""
    if key["mode"] != "standard" or 0 not in depths:
        return []
    p = depths.index(0)
    flags = []
    spread = float(np.ptp(X[p], axis=0).max())
    if spread > 0:
        flags.append(
            {
                **_flag_key(key),
                "depth": 0,
                "message": f"depth-0 vectors under standard differ across "
                f"samples (max spread {spread:.3g}): do all samples end with the same token?",
            }
        )
    if abs(acc_mean[p] - majority_mean) > cfg.chance_tolerance:
        flags.append(
            {
                **_flag_key(key),
                "depth": 0,
                "message": f"depth-0 standard accuracy {acc_mean[p]:.3f} is "
                f"not at chance (majority baseline {majority_mean:.3f})",
            }
        )
    return flags


def probe_sweep(store, cfg: ProbeConfig = ProbeConfig(), *, modes=None, progress=None) -> SweepResult:
    """Probe every (mode, task, length) cell of an `ActivationStore` (or its folder)."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    store.verify()  # every shard, before any fit
    model = store.manifest["model"]["source"]
    cells = [c for c in store.conditions() if modes is None or c[0] in modes]
    tables, flags, samples = [], [], []
    for n, (mode, task, length) in enumerate(cells):
        X, rows, targets = store.load(mode, task, length)
        key = {"model": model, "task": task, "mode": mode, "length": length}
        depths = [t.depth if t.depth is not None else -1 for t in targets]
        try:
            table, cell_flags = probe_condition(
                X,
                rows["label"].to_numpy(),
                rows["group_id"].to_numpy(),
                cfg,
                depths=depths,
                hooks=[t.hook for t in targets],
                key=key,
                samples=samples,
            )
        except TooFewGroupsError as exc:
            if not cfg.skip_small_cells:
                raise
            flags.append(
                {**_flag_key(key), "depth": None, "message": "skipped: " + exc.format_message().split(": ", 1)[-1]}
            )
            continue
        tables.append(table)
        flags.extend(cell_flags)
        cell = samples[-1]
        ids = rows.iloc[cell["sample"].to_numpy()]
        samples[-1] = cell.assign(row=ids["row"].to_numpy(), pair_id=ids["pair_id"].to_numpy())[list(SAMPLE_COLUMNS)]
        if progress is not None:
            progress(n + 1, len(cells), (mode, task, length))
    if not tables:
        raise FbtError(f"{store.path}: no cell could be probed ({flags[0]['message'] if flags else 'no cells'})")
    prov = provenance(
        config=dataclasses.asdict(cfg),
        seed=cfg.seed,
        backend=cfg.resolved_backend(),
        activations=str(store.path),
        model_hash=store.manifest["model"]["hash"],
        dataset_hash=store.manifest["dataset"]["hash"],
        flags=flags,
    )
    return SweepResult(
        pd.concat(tables, ignore_index=True), tuple(flags), cfg, prov, pd.concat(samples, ignore_index=True)
    )


def fit_direction(store, mode: str, task: str, length: int, depth: int, C: float = 1.0):
    """A probe fitted on every sample of one cell, as a frozen `ProbeDirection` (for interventions:
    erase or steer along it). `meta` records the cell and the training accuracy."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    X, rows, targets = store.load(mode, task, length)
    depths = [t.depth for t in targets]
    if depth not in depths:
        raise FbtError(f"{store.path}: mode '{mode}' has no depth {depth} (has {depths})")
    p = depths.index(depth)
    if not np.isfinite(X[p]).all():
        raise FbtError(f"{store.path}: {task} {mode} length {length}: NaN/inf activations at depth {depth}")
    y = rows["label"].to_numpy()
    probe = LinearProbe(C=C).fit(X[p], y)
    return probe.export(
        hook=targets[p].hook,
        task=task,
        mode=mode,
        length=int(length),
        depth=int(depth),
        position=targets[p].position,
        train_accuracy=float(probe.score(X[p], y)),
        model_hash=store.manifest["model"]["hash"],
    )


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Mean, spread (std, min, max) and fold count of each metric over folds."""
    keys = [c for c in KEY_COLUMNS if c != "fold"] + ["metric"]
    g = table.groupby(keys, sort=True, dropna=False)["value"]
    return g.agg(mean="mean", std="std", min="min", max="max", n_folds="count").reset_index()


COMMAND = "probe"  # the writer of the tables in their folder's marker


def write_results(result: SweepResult, out_dir: str | Path, force: bool = False) -> dict[str, Path]:
    """probes.parquet, probes.csv, probes_summary.csv, probes.provenance.json and (with per-sample
    results) probes_samples.parquet in `out_dir` (which other stages may share); existing files are
    refused without `force`, and with it replaced only where the folder's marker lists them as
    written by `probe`, unchanged (`fbt_probe.marker.refuse_named`)."""
    out_dir = Path(out_dir)
    paths = {
        "table": out_dir / TABLE_FILE,
        "csv": out_dir / CSV_FILE,
        "summary": out_dir / SUMMARY_FILE,
        "provenance": out_dir / PROVENANCE_FILE,
    }
    if result.samples is not None:
        paths["samples"] = out_dir / SAMPLES_FILE
    with named_outputs(list(paths.values()), COMMAND, force):
        with atomic_path(paths["table"]) as tmp:
            result.table.to_parquet(tmp, index=False)
        with atomic_path(paths["csv"]) as tmp:
            result.table.to_csv(tmp, index=False)
        with atomic_path(paths["summary"]) as tmp:
            result.summary().to_csv(tmp, index=False)
        if result.samples is not None:
            with atomic_path(paths["samples"]) as tmp:
                result.samples.to_parquet(tmp, index=False)
        write_json(paths["provenance"], {**result.provenance, "files": {k: v.name for k, v in paths.items()}})
    return paths
