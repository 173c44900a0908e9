"""The activations an SAE is trained and evaluated on: one hook, every sample of a dataset, under one mode.

`collect(model, df, hook, mode)` runs each sample once (batched by exact token length, no padding)
with `run_with_cache` on `hook` and keeps the positions `positions` names:
- `fed` (default): the positions the mode feeds a carried state into (t >= its first fed position);
  for `fusion.*` hooks the only positions where the hook holds a state (zeros elsewhere);
- `all`: every position;
- `final`: the last position only (what the probes and the causal tests read).
Rows are ordered by (token length, dataset row, position); `index` says which sample and position
each row is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.modes import Mode, parse_mode

POSITIONS = ("fed", "all", "final")


def token_batches(df: pd.DataFrame, batch_size: int):
    """(dataset rows, tokens [B, T]) batches of one token length each, in (length, row) order."""
    lengths = np.array([len(t) for t in df["token_ids"]])
    for T in sorted(set(lengths.tolist())):
        rows = np.flatnonzero(lengths == T)
        for s in range(0, len(rows), batch_size):
            sel = rows[s : s + batch_size]
            yield sel, torch.tensor(np.stack([np.asarray(df["token_ids"].iloc[i], dtype=np.int64) for i in sel]))


def position_range(mode: Mode, T: int, positions: str) -> range:
    if positions not in POSITIONS:
        raise FbtError(f"positions '{positions}': expected one of {', '.join(POSITIONS)}")
    if positions == "final":
        return range(T - 1, T)
    if positions == "all":
        return range(T)
    first = mode.first_fed_position(T)
    return range(min(first, T), T)


@torch.no_grad()
def collect(
    model, df: pd.DataFrame, hook: str, mode: str = "recurrent:1", positions: str = "fed", batch_size: int = 64
) -> tuple[torch.Tensor, pd.DataFrame]:
    """([rows, d] float32 activations of `hook`, index frame with `row` (in df) and `position`)."""
    mode = parse_mode(mode)  # a public entry: names accepted
    if hook not in model.hook_dict:
        raise FbtError(f"--hook {hook}: not a hook of this model (e.g. fusion.hook_feedback, blocks.0.hook_resid_pre)")
    device = next(model.parameters()).device
    acts, rows, pos = [], [], []
    for sel, tokens in token_batches(df.reset_index(drop=True), batch_size):
        T = tokens.shape[1]
        keep = position_range(mode, T, positions)
        if len(keep) == 0:
            continue
        _, cache = model.run_with_cache(tokens.to(device), mode=mode, names_filter=hook)
        if hook not in cache:
            raise FbtError(
                f"--hook {hook}: does not fire under mode {mode} (fusion hooks need a mode that carries a state)"
            )
        x = cache[hook][:, keep.start : keep.stop]  # [B, P, d]
        acts.append(x.reshape(-1, x.shape[-1]).float().cpu())
        rows.append(np.repeat(sel, len(keep)))
        pos.append(np.tile(np.arange(keep.start, keep.stop), len(sel)))
    if not acts:
        raise FbtError(f"--hook {hook} under {mode}: no positions to collect ({positions}) in this dataset")
    return torch.cat(acts), pd.DataFrame({"row": np.concatenate(rows), "position": np.concatenate(pos)})


def saelens_metadata(index: pd.DataFrame, dataset: str) -> dict:
    """SAELens's metadata fields for the activations `collect` read (its index frame): `context_size`,
    the longest sample's token count (samples vary in length; each one contributes its last
    position, so that is the largest position + 1); `prepend_bos` False (the samples' token ids are
    fed as stored, nothing is prepended); `dataset_path`, the dataset it read."""
    return {"context_size": int(index["position"].max()) + 1, "prepend_bos": False, "dataset_path": str(dataset)}
