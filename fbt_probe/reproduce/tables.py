"""What the report and the findings both read: the study's result tables and their intervals
(`fbt_probe.stats`: the resampling unit of every number is named there)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

from fbt_probe.stats import group_wilson

PAPER_DEPTH0 = {"completion": 0.996, "memory": 1.0}  # one-step recurrent prefill, depth 0 (Fig. 7a)
SETTING = (
    "The models here are small transformers trained on these tasks and probed on held-out contexts; the "
    "paper probed its 1B general language model, so its numbers are a reference point, not a replication "
    "target."
)
CHECKPOINT_SETTING = (
    "The tasks are probed on held-out contexts, in the checkpoint's tokenizer; a model not trained on these "
    "tasks may answer them at chance, and the paper's numbers (its 1B general language model) are a "
    "reference point, not a target."
)


def _summary(out: Path, name: str, exp: str, table: str = "summary") -> pd.DataFrame | None:
    """An intervention experiment's `summary` (or `rows`) table of model `name`, None where not run."""
    p = out / "results" / "interventions" / name / exp / f"{table}.parquet"
    return pd.read_parquet(p) if p.is_file() else None


@lru_cache(maxsize=64)
def _groups(data: Path, task: str, mtime: float) -> pd.DataFrame:
    return pd.read_parquet(data / f"{task}.parquet", columns=["group_id", "length_knob"])


@lru_cache(maxsize=8)
def _probe_table(path: Path, mtime: float) -> pd.DataFrame:
    """A study's probes.parquet, read once per version (the findings and headline ask it per number)."""
    return pd.read_parquet(path)


def n_groups(out: Path, task: str, lengths) -> int:
    """Distinct groups of `task`'s samples at `lengths` (the study's dataset); 0 without it."""
    f = Path(out) / "data" / f"{task}.parquet"
    if not f.is_file():
        return 0
    d = _groups(f.parent, task, f.stat().st_mtime)
    return int(d[d["length_knob"].isin(list(lengths))]["group_id"].nunique())


def pooled_accuracy(out: Path, cells: pd.DataFrame, task: str) -> dict:
    """Probe accuracy pooled over `cells` (rows of one metric, length x fold): correct / tested
    samples, with the Wilson interval at n = distinct groups (`fbt_probe.stats.group_wilson`)."""
    if cells.empty:
        return {
            "value": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "n": 0,
            "groups": 0,
            "lengths": [],
        }
    n = float(cells["n_test"].sum())
    p = tested_mean(cells)
    lengths = sorted(int(x) for x in cells["length"].unique())
    g = n_groups(out, task, lengths)
    _, lo, hi = group_wilson(p, g) if g else (p, float("nan"), float("nan"))
    return {"value": p, "ci_low": lo, "ci_high": hi, "n": int(n), "groups": g, "lengths": lengths}


@lru_cache(maxsize=8)
def _eval_table(path: Path, mtime: float) -> pd.DataFrame:
    return pd.read_parquet(path)


def eval_table(out: Path) -> pd.DataFrame:
    """The study's answer-accuracy table (read once per version; the findings ask it per number)."""
    p = Path(out) / "eval" / "accuracy.parquet"
    return _eval_table(p, p.stat().st_mtime)


def tested_mean(cells: pd.DataFrame) -> float:
    """Probe accuracy pooled over cells: correct over tested samples (NaN without cells)."""
    n = float(cells["n_test"].sum()) if len(cells) else 0.0
    return float((cells["value"] * cells["n_test"]).sum() / n) if n else float("nan")


def probe_table(out: Path, model: str) -> pd.DataFrame:
    """Model `model`'s probes.parquet of the study (read once per version), empty without one."""
    p = Path(out) / "results" / "probes" / model / "probes.parquet"
    if not p.is_file():
        return pd.DataFrame(columns=["task", "mode", "depth", "metric", "value", "n_test", "length"])
    return _probe_table(p, p.stat().st_mtime)


def probe_cells(
    out: Path, model: str, task: str, mode: str, depth: int | None = 0, metric: str = "accuracy"
) -> pd.DataFrame:
    """The probe table's cells of one task × mode × metric at `depth` (None: every depth)."""
    t = probe_table(out, model)
    keep = (t["task"] == task) & (t["mode"] == mode) & (t["metric"] == metric)
    return t[keep if depth is None else keep & (t["depth"] == depth)]


def per_length(summary: pd.DataFrame | None, task: str, condition: str, metric: str = "normalized") -> pd.DataFrame:
    """The summary's rows of one task x condition x metric, one per length (the pooled row left out)."""
    if summary is None:
        return pd.DataFrame()
    g = summary[
        (summary["task"] == task)
        & (summary["condition"] == condition)
        & (summary["metric"] == metric)
        & (summary["length_knob"] != -1)
    ]
    return g.sort_values("length_knob")


@lru_cache(maxsize=8)
def _paired_table(path: Path, mtime: float) -> pd.DataFrame:
    return pd.read_parquet(path)


def paired_diff(out: Path, what: str, task: str, length_knob: int = -1) -> tuple[float, float, float, int] | None:
    """(feedback − baseline, low, high, shared groups) of the `paired` stage's table (results/paired):
    pooled over lengths (-1) or at one length; None where the study has no such row. A quantity
    measured at one length has no pooled row: that length's row stands for it."""
    p = Path(out) / "results" / "paired" / "paired.parquet"
    if not p.is_file():
        return None
    t = _paired_table(p, p.stat().st_mtime)
    t = t[(t["what"] == what) & (t["task"] == task)]
    rows = t[t["length_knob"] == length_knob]
    if rows.empty and length_knob == -1 and t["length_knob"].nunique() == 1:
        rows = t
    if rows.empty:
        return None
    r = rows.iloc[0]
    return float(r["difference"]), float(r["ci_low"]), float(r["ci_high"]), int(r["n_groups"])
