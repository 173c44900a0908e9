"""Activations of a Hidden Decoding model at the final token's streams 1..n and every depth, written
as an activation folder that `fbt_probe.activations.ActivationStore` reads and
`fbt_probe.probes.probe_sweep` probes unchanged.

A "depth" can be a stream: the folder has one mode, `standard` (the model's only one), whose targets
are the final token's stream k at probe depth d (0 = input embedding E_k(x), d >= 1 = output of
block d-1), numbered stream-major: depth = (k-1)(L+1) + d (`stream_depth`). The probe table's
`depth` column therefore runs over (stream, layer); `split_stream_depth` (and `fbt_probe.figures.
hidden`) undo it, and the `hook` column keeps the plain hook name.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hidden.streams import stream_position
from fbt_probe.hooks import depth_name
from fbt_probe.io import atomic_dir, atomic_path, refuse_existing, sha256_file, write_json

MODE = "standard"


def stream_depth(stream: int, depth: int, n_layers: int) -> int:
    """Combined probe depth of (stream k in 1..n, layer depth d in 0..L)."""
    return (stream - 1) * (n_layers + 1) + depth


def split_stream_depth(combined, n_layers: int):
    """(stream, layer depth) of a combined depth (ints or arrays)."""
    return combined // (n_layers + 1) + 1, combined % (n_layers + 1)


def stream_targets(model) -> list:
    from fbt_probe.activations import Target

    L, n = model.cfg.n_layers, model.cfg.n_streams
    return [Target(f"stream.{k}.depth.{d}", depth_name(d), stream_position(-1, k, n), stream_depth(k, d, L))
            for k in range(1, n + 1) for d in range(L + 1)]


def _dataset(dataset) -> tuple[pd.DataFrame, str, list[str]]:
    if isinstance(dataset, pd.DataFrame):
        df = dataset.reset_index(drop=True)
        blob = json.dumps([[list(map(int, ids)), int(y), str(g)] for ids, y, g in
                           zip(df["token_ids"], df["label"], df["group_id"])])
        return df, hashlib.sha256(blob.encode()).hexdigest(), ["<DataFrame>"]
    from fbt_probe.tasks import load_dataset

    path = Path(dataset)
    files = sorted(path.glob("*.manifest.json")) if path.is_dir() else [path]
    if not files:
        raise FbtError(f"{path}: no dataset (*.parquet with its .manifest.json) in this folder")
    frames = [load_dataset(f) for f in files]
    digest = hashlib.sha256("".join(fr.attrs["manifest"]["sha256"] for fr in frames).encode()).hexdigest()
    return pd.concat(frames, ignore_index=True), digest, [str(f) for f in files]


def _model(model, device: str | None):
    from fbt_probe.activations import state_hash

    if isinstance(model, (str, Path)):
        from fbt_probe.hidden.checkpoint import load_hidden
        from fbt_probe.model.checkpoint import checkpoint_hash

        return load_hidden(model, device=device or "cpu"), str(model), checkpoint_hash(model)
    if device is not None:
        model = model.to(device)
    return model, type(model).__name__, state_hash(model)


@torch.no_grad()
def extract_streams(model, dataset, out_dir, *, batch_size: int = 16, shard_rows: int = 256, dtype: str = "float32",
                    device: str | None = None, force: bool = False):
    """Extract (see module doc) and return the `ActivationStore`. `model`: a hidden-decoding model or
    checkpoint folder; `dataset`: a DataFrame, a dataset file or a folder of them."""
    from fbt_probe.activations import DTYPES, FORMAT, SAMPLE_COLUMNS, ActivationStore, is_activation_folder
    from fbt_probe.config import check_device

    out_dir = Path(out_dir)
    own = dict(own=is_activation_folder, kind="an activation folder")
    refuse_existing(out_dir, force, **own)  # before anything is loaded
    check_device(device)
    if dtype not in DTYPES:
        raise FbtError(f"dtype '{dtype}': expected one of {sorted(DTYPES)}")
    model, source, model_hash = _model(model, device)
    if getattr(model.cfg, "arch", None) != "hidden-decoding":
        raise FbtError(f"{source}: not a hidden-decoding model (use fbt_probe.activations.extract)")
    model.eval()
    df, data_hash, paths = _dataset(dataset)
    missing = {"token_ids", *SAMPLE_COLUMNS} - set(df.columns)
    if missing:
        raise FbtError(f"{paths[0]}: dataset lacks column(s) {sorted(missing)}")
    if df.empty:
        raise FbtError(f"{paths[0]}: the dataset has no rows; nothing to extract")
    with atomic_dir(out_dir, force, **own) as tmp:  # built beside OUT, swapped in when complete
        _extract_into(tmp, model, df, source, model_hash, data_hash, paths, batch_size, shard_rows, dtype)
    return ActivationStore(out_dir)


def _extract_into(out_dir: Path, model, df, source, model_hash, data_hash, paths, batch_size, shard_rows, dtype) -> None:
    from fbt_probe.activations import DTYPES, FORMAT, SAMPLE_COLUMNS

    targets = stream_targets(model)
    dev = next(model.parameters()).device
    (out_dir / "shards" / MODE).mkdir(parents=True)
    shards = []
    for (T, task), index in df.groupby(["n_tokens", "task"], sort=True).groups.items():
        rows = sorted(int(r) for r in index)
        for s in range(0, len(rows), shard_rows):
            part = rows[s: s + shard_rows]
            name = f"shards/{MODE}/{task}-T{int(T):05d}-{s // shard_rows:03d}.safetensors"
            _write_shard(model, df, part, targets, batch_size, DTYPES[dtype], dev, out_dir / name)
            shards.append({"file": name, "mode": MODE, "task": task, "n_tokens": int(T), "rows": part,
                           "sha256": sha256_file(out_dir / name)})
    samples = df[list(SAMPLE_COLUMNS)].copy()
    samples.insert(0, "row", np.arange(len(df), dtype=np.int64))
    with atomic_path(out_dir / "samples.parquet") as tmp:
        samples.to_parquet(tmp, index=False)
    cfg = model.cfg
    from fbt_probe.provenance import provenance

    write_json(out_dir / "manifest.json", {
        "format": FORMAT, "modes": [MODE], "dtype": dtype, "n_samples": len(df), "shards": shards,
        "model": {"source": source, "hash": model_hash, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                  "arch": cfg.arch, "n_streams": cfg.n_streams,
                  "cross_stream_layers": list(cfg.resolved_cross_stream_layers)},
        "dataset": {"paths": paths, "hash": data_hash},
        "depth": "stream-major: depth = (stream - 1) * (n_layers + 1) + layer depth",
        "targets": {MODE: [t.to_dict() for t in targets]},
        "provenance": provenance(model_hash=model_hash, dataset_hash=data_hash),
    })


def _write_shard(model, df, rows, targets, batch_size, dtype, device, path: Path) -> None:
    from safetensors.torch import save_file

    from fbt_probe.activations import FORMAT, collect

    parts: dict[str, list[torch.Tensor]] = {t.key: [] for t in targets}
    for i in range(0, len(rows), batch_size):
        batch = rows[i: i + batch_size]
        tokens = torch.tensor(np.stack([np.asarray(df.at[r, "token_ids"]) for r in batch]), dtype=torch.long, device=device)
        for key, value in collect(model, tokens, MODE, targets, dtype).items():
            parts[key].append(value)
    tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
    bad = [k for k, v in tensors.items() if not torch.isfinite(v.float()).all()]
    if bad:
        raise FbtError(f"{path.name}: non-finite activations at '{bad[0]}' (NaN/inf in the model)")
    tensors["row"] = torch.tensor(rows, dtype=torch.int64)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"fbt_probe": json.dumps({"format": FORMAT, "mode": MODE})})
