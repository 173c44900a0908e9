"""Fig. 3 and Fig. 4 of a general language model (corpus runs): per held-out file, the loss and the
carried state's change after each Jacobi pass, as a long table, and its per-pass summary with the
interval over files (`fbt-probe diagnose passes`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.stats import group_bootstrap_means
from fbt_probe.training.config import TrainConfig
from fbt_probe.training.evaluate import pass_curves
from fbt_probe.training.lm import corpus_of, heldout_windows

BASELINE_PASSES = 5  # a baseline's passes beyond its standard one run an untrained fusion: Fig. 4's range only


def pass_table(run: str, model, cfg: TrainConfig, n_passes: int, batch: int = 16) -> pd.DataFrame:
    """One row per held-out file x pass k = 1..n_passes of run `run`: loss, change, norm."""
    if cfg.corpus is None:
        raise FbtError(f"{run}: not a corpus run (diagnose passes reads held-out files of the corpus it trained on)")
    tokens, targets, _ = heldout_windows(cfg)
    _, _, picked = corpus_of(cfg).document_windows("heldout", cfg.seq_len)
    docs = [corpus_of(cfg).documents[i][1] for i in picked]
    passes = min(n_passes, BASELINE_PASSES) if cfg.baseline else n_passes
    arr = pass_curves(model, tokens, targets, passes, batch)
    k = np.repeat(np.arange(1, passes + 1), len(docs))
    return pd.DataFrame(
        {
            "run": run,
            "schedule": "constant:1" if cfg.baseline else str(cfg.pass_mix),
            "seed": cfg.seed,
            "baseline": bool(cfg.baseline),
            "pass": k,
            "document": np.tile(docs, passes),
            "loss": arr["loss"].reshape(-1),
            "change": arr["change"].reshape(-1),
            "norm": arr["norm"].reshape(-1),
        }
    )


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """One row per run x pass: mean loss and state change over files with their percentile bootstrap
    interval (files resampled), and the number of files."""
    rows = []
    for (run, k), g in table.groupby(["run", "pass"], sort=False):
        (loss, lo, hi), (ch, clo, chi) = group_bootstrap_means([g["loss"].to_numpy(), g["change"].to_numpy()])
        first = g.iloc[0]
        rows.append(
            {
                "run": run,
                "schedule": first["schedule"],
                "seed": int(first["seed"]),
                "baseline": bool(first["baseline"]),
                "pass": int(k),
                "loss": loss,
                "loss_low": lo,
                "loss_high": hi,
                "change": ch,
                "change_low": clo,
                "change_high": chi,
                "documents": len(g),
            }
        )
    return pd.DataFrame(rows)
