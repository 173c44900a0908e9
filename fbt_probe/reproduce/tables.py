"""What the report and the findings both read: the study's result tables and one interval rule."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

PAPER_DEPTH0 = {"completion": 0.996, "memory": 1.0}  # one-step recurrent prefill, depth 0 (Fig. 7a)


def _summary(out: Path, name: str, exp: str) -> pd.DataFrame | None:
    p = out / "results" / "interventions" / name / exp / "summary.parquet"
    return pd.read_parquet(p) if p.is_file() else None


def mean_ci(values) -> tuple[float, float, float]:
    """Mean over cells (length x fold) and a normal 95 % interval over them, clipped to [0, 1]."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        m = v.mean() if len(v) else float("nan")
        return m, m, m
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v))
    return v.mean(), max(0, v.mean() - half), min(1, v.mean() + half)
