"""The logit lens along a serial task's steps: does the answer form step by step?

At step j's token of a one-token-a-step compose task (chain-s3, chain-a5), the logit lens (final
norm + tied unembedding, `lenses.logit_lens`) reads at each depth the answer the model would give
if the query came now: the label-1 word's logit minus the label-0 word's. The running label
y_j = [p_j accepted] is the task's answer after j steps (`tasks.checker.compose_points`); `choice`
is the share of samples whose lens logit difference has y_j's sign, with the Wilson interval at
n = words, beside chance (the commoner running label's share)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.interventions.pairs import label_token_ids
from fbt_probe.lens.lenses import logit_lens
from fbt_probe.probes.running import activations_by_mode
from fbt_probe.stats import group_wilson

LENS_COLUMNS = [
    "mode", "length_knob", "step", "depth", "choice", "ci_low", "ci_high", "chance", "mean_logit_diff",
    "n_samples", "n_groups",
]  # fmt: skip


def running_lens(
    model, df: pd.DataFrame, spec, tok, modes=("standard", "full"), depths=None, activations: tuple | None = None
) -> pd.DataFrame:
    """A row per mode x length knob x step x depth (`LENS_COLUMNS`; see module doc). `activations`:
    `probes.running.activations_by_mode`'s, already taken (the probe table reads the same)."""
    depths, by_mode = activations or activations_by_mode(model, df, spec, tok, modes, depths)
    lo_id, hi_id = label_token_ids(df, tok)[spec.task]
    dtype = next(model.parameters()).dtype
    rows = []
    for mode, by_knob in by_mode.items():
        for knob, (acts, points, groups) in by_knob.items():
            with torch.no_grad():
                logits = logit_lens(model, torch.as_tensor(acts, dtype=dtype))  # [depths, N, k, V]
            ld = (logits[..., hi_id] - logits[..., lo_id]).double().numpy()
            y = np.isin(points[:, 1:], spec.accept)  # [N, k]: the answer after each step
            n_groups = len(np.unique(groups))
            for j in range(1, y.shape[1] + 1):
                chance = float(max(y[:, j - 1].mean(), 1 - y[:, j - 1].mean()))
                for i, d in enumerate(depths):
                    p, lo, hi = group_wilson(float(np.mean((ld[i, :, j - 1] > 0) == y[:, j - 1])), n_groups)
                    rows.append((mode, int(knob), j, int(d), p, lo, hi, chance,
                                 float(ld[i, :, j - 1].mean()), len(y), n_groups))  # fmt: skip
    return pd.DataFrame(rows, columns=LENS_COLUMNS)
