"""How well an SAE stands in for its hook: reconstruction, sparsity, dead latents, loss recovered.

- FVU = Σ‖x − x̂‖² / Σ‖x − mean(x)‖² over the rows given; L0 = mean active latents per row; dead =
  latents active on none of the rows.
- **Loss recovered** (per task and mode): the hook at the positions the mode feeds a state into is
  replaced by the SAE's reconstruction (`sae`) or by the dataset's mean activation (`mean`, the
  ablation that anchors 0), and the answer's cross-entropy CE (label word at the final position)
  and logit difference LD (own − other label word) are read:
      recovered_ce = (CE_mean − CE_sae) / (CE_mean − CE_clean),
      recovered_ld = (LD_sae − LD_mean) / (LD_clean − LD_mean);
  1 = the reconstruction loses nothing the model uses. Intervals: the normal group bootstrap of the
  ratio of sums (`ratio_ci`: groups resampled, θ ± 1.96 · sd; docs/statistics.md). A fraction is
  reported only where its denominator, the mean cost of the mean ablation (CE_mean − CE_clean, in
  nats; LD_clean − LD_mean, in logits), has its group-bootstrap interval above `RECOVERED_GAP`:
  where the mean ablation costs the answer nothing there is nothing to recover, and a ratio over
  that near-zero cost is noise (0.041 [−8.1, 8.2]). Such a row's fraction is NaN and its `ce_gap` /
  `ld_gap` columns (with their interval) say why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.interventions.pairs import label_token_ids
from fbt_probe.sae.data import position_range, token_batches
from fbt_probe.stats import N_BOOT, group_bootstrap_ratios

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile
RECOVERED_GAP = 0.1  # nats (CE) or logits (LD): the mean ablation's cost must clear this for a recovered fraction


@torch.no_grad()
def reconstruction(sae, x: torch.Tensor, chunk: int = 65_536) -> dict:
    """FVU, L0 and dead latents of `sae` on rows `x`, `chunk` rows at a time (the codes of every row
    at once would be rows × d_sae floats)."""
    x = x.to(sae.W_enc.dtype)
    err = torch.zeros((), dtype=torch.float64)
    l0 = torch.zeros((), dtype=torch.float64)
    active = torch.zeros(sae.cfg.d_sae, dtype=torch.int64)
    for s in range(0, x.shape[0], chunk):
        xs = x[s : s + chunk]
        f = sae.encode(xs)
        err += (xs - sae.decode(f)).double().pow(2).sum()
        on = f > 0
        l0 += on.sum(1).double().sum()
        active += on.sum(0)
    var = (x - x.mean(0)).double().pow(2).sum().clamp_min(1e-30)
    return {
        "rows": int(x.shape[0]),
        "fvu": float(err / var),
        "l0": float(l0 / max(x.shape[0], 1)),
        "dead_latents": int((active == 0).sum()),
        "d_sae": int(sae.cfg.d_sae),
    }


def _replace(values_fn, start: int):
    def hook(x, hook=None):
        x = x.clone()
        x[:, start:] = values_fn(x[:, start:])
        return x

    return hook


@torch.no_grad()
def loss_recovered_rows(model, sae, df: pd.DataFrame, hook: str, modes, mean_act: torch.Tensor, batch_size: int = 64):
    """One row per sample x mode: CE and LD under clean, sae and mean replacement."""
    ids = label_token_ids(df)
    df = df.reset_index(drop=True)
    device = next(model.parameters()).device
    out = []
    for mode in modes:
        for sel, tokens in token_batches(df, batch_size):
            tokens = tokens.to(device)
            T = tokens.shape[1]
            start = position_range(mode, T, "fed").start
            if start >= T:
                continue
            sub = df.iloc[sel]
            pair = np.array([ids[str(t)] for t in sub["task"]])
            lab = sub["label"].to_numpy().astype(int)
            tgt = torch.as_tensor(pair[np.arange(len(sel)), lab], device=device)
            oth = torch.as_tensor(pair[np.arange(len(sel)), 1 - lab], device=device)
            conds = {
                "clean": [],
                "sae": [(hook, _replace(lambda v: sae(v.to(sae.W_enc.dtype)).to(v.dtype), start))],
                "mean": [(hook, _replace(lambda v: mean_act.to(v.dtype).expand_as(v), start))],
            }
            rec = {"row": sel, "task": sub["task"].to_numpy(), "group_id": sub["group_id"].to_numpy(), "mode": mode}
            rec["length_knob"] = sub["length_knob"].to_numpy()
            for name, hooks in conds.items():
                logits = model.run_with_hooks(tokens, mode=mode, serial=False, fwd_hooks=hooks)[:, -1].double()
                lp = torch.log_softmax(logits, -1)
                idx = torch.arange(len(sel), device=device)
                rec[f"ce_{name}"] = (-lp[idx, tgt]).cpu().numpy()
                rec[f"ld_{name}"] = (logits[idx, tgt] - logits[idx, oth]).cpu().numpy()
            out.append(pd.DataFrame(rec))
    return pd.concat(out, ignore_index=True)


def ratio_ci(num: np.ndarray, den: np.ndarray, groups, n_boot: int = N_BOOT, seed: int = 0):
    """(Σnum/Σden, low, high): the normal bootstrap interval θ ± z·sd of the ratio over group
    resamples (docs/statistics.md; `stats.group_bootstrap_ratios`). A ratio of sums is skewed with few
    groups, and a BCa or percentile interval can then exclude its own estimate; this one is centred
    on it by construction, so no interval is ever widened to contain its estimate. NaN bounds with
    fewer than two groups or a resample whose denominator is zero."""
    return group_bootstrap_ratios([num], [den], [np.asarray(groups)], n_boot, seed=seed)[0][:3]


def loss_recovered(rows: pd.DataFrame, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Per task x mode: the mean CE / LD of each condition and the recovered fractions with CIs."""
    out = []
    for (task, mode), g in rows.groupby(["task", "mode"], sort=True):
        r = {"task": task, "mode": mode, "samples": len(g), "groups": int(g["group_id"].nunique())}
        for c in ("clean", "sae", "mean"):
            r[f"ce_{c}"] = float(g[f"ce_{c}"].mean())
            r[f"ld_{c}"] = float(g[f"ld_{c}"].mean())
        for what, num, den in (
            ("ce", g["ce_mean"] - g["ce_sae"], g["ce_mean"] - g["ce_clean"]),
            ("ld", g["ld_sae"] - g["ld_mean"], g["ld_clean"] - g["ld_mean"]),
        ):
            ((v, lo, hi, gap, gap_lo, gap_hi),) = group_bootstrap_ratios(
                [num.to_numpy()], [den.to_numpy()], [g["group_id"].to_numpy()], n_boot, seed=seed, min_den=RECOVERED_GAP
            )
            r.update({f"recovered_{what}": v, f"recovered_{what}_low": lo, f"recovered_{what}_high": hi})
            r.update({f"{what}_gap": gap, f"{what}_gap_low": gap_lo, f"{what}_gap_high": gap_hi})
        out.append(r)
    return pd.DataFrame(out)
