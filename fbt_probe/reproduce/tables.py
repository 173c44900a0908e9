"""What the parts' findings, sections and headlines read: the study's result tables and the numbers
drawn from them with their intervals (`fbt_probe.stats`: the resampling unit of every number is
named there). Nothing here runs a model."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

from fbt_probe.probes.robustness import pooled_by_variant
from fbt_probe.reproduce.config import LM_PRESETS, RECURRENT_1, STANDARD
from fbt_probe.reproduce.rules import fmt
from fbt_probe.reproduce.rules import paired as paired_rule
from fbt_probe.stats import group_wilson, wilson

PAPER_DEPTH0 = {"completion": 0.996, "memory": 1.0}  # one-step recurrent prefill, depth 0 (Fig. 7a)
SETTING = (
    "The models here are small transformers trained on these tasks and probed on held-out contexts; the "
    "paper probed its 1B general language model, so its numbers are a reference point, not a replication "
    "target."
)
LM_SETTING = (
    "The models here are general language models trained on a corpus of Python source and English prose by "
    "next-token prediction, never on these tasks, which they read in context (as the paper probed its 1B model); "
    "at 1.35 M parameters they may answer the tasks at chance, and the paper's numbers are a reference point, not "
    "a target."
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


DEPTH0_CI = "Wilson 95 % CI with n = groups (a group's samples counted as one draw)"


PAIRED_TABLE = "table *Feedback − baseline, paired*"


def answer_groups(g: pd.DataFrame) -> int:
    """The n of a pooled answer accuracy: the most distinct groups of one length cell. Samples are
    not independent (the two of a pair share a context) and a group may recur at every length
    (completion and memory), so the groups of one cell are the draws the pooling can count on. An
    eval table without `groups` counts pairs (half its samples)."""
    if "groups" in g.columns and g["groups"].notna().all():
        return int(g["groups"].max()) if len(g) else 0
    return int(g["n"].max()) // 2 if len(g) else 0


def answer_accuracy(out: Path, model: str, task: str, mode: str = STANDARD) -> tuple[float, float, float, int]:
    """(accuracy over every length's samples, Wilson low, high, samples); the Wilson interval has
    n = `answer_groups` (docs/statistics.md)."""
    acc = eval_table(out)
    g = acc[(acc["model"] == model) & (acc["task"] == task) & (acc["mode"] == mode)]
    c, n = int(g["correct"].sum()), int(g["n"].sum())
    if n == 0:
        return (*wilson(c, n), n)
    return (*group_wilson(c / n, answer_groups(g)), n)


def choice_accuracy(out: Path, model: str, task: str, mode: str = STANDARD) -> tuple[float, float, float, int] | None:
    """As `answer_accuracy`, for the two-way choice between the label words (None: an eval table
    written before the choice was measured)."""
    acc = eval_table(out)
    if "choice_correct" not in acc.columns:
        return None
    g = acc[(acc["model"] == model) & (acc["task"] == task) & (acc["mode"] == mode)]
    c, n = int(g["choice_correct"].sum()), int(g["n"].sum())
    if n == 0:
        return (*wilson(c, n), n)
    return (*group_wilson(c / n, answer_groups(g)), n)


def depth0(out: Path, model: str, task: str, mode: str) -> tuple[float, float, float]:
    """Depth-0 probe accuracy pooled over the length x fold cells, Wilson interval at n = groups."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    return r["value"], r["ci_low"], r["ci_high"]


def depth0_scope(out: Path, model: str, task: str, mode: str = RECURRENT_1) -> str:
    """'pooled over lengths 0, 8, 32: 1152 held-out predictions of 64 groups'."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    if not r["n"]:
        return ""
    return (
        f"pooled over length{'s' if len(r['lengths']) > 1 else ''} {', '.join(map(str, r['lengths']))}: "
        f"{r['n']} held-out predictions of {r['groups']} groups"
    )


def swap_effect(out: Path, model: str, task: str, condition: str = "state") -> tuple[float, float, float] | None:
    """The pooled (length_knob = -1) normalized swap effect; `swap_by_length` gives each length."""
    s = _summary(out, model, "feedback-swap")
    if s is None:
        return None
    g = s[
        (s["length_knob"] == -1) & (s["metric"] == "normalized") & (s["task"] == task) & (s["condition"] == condition)
    ]
    if g.empty or g["mean"].isna().all():
        return None
    r = g.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])


def swap_by_length(out: Path, model: str, task: str, condition: str = "state") -> str:
    """'**0.56** [0.55, 0.57] at length 8 (10 pairs, 10 groups)', one entry per length run."""
    g = per_length(_summary(out, model, "feedback-swap"), task, condition)
    parts = [
        f"{fmt(r.mean, r.ci_low, r.ci_high)} at length {int(r.length_knob)} ({int(r.n_pairs)} pairs, "
        f"{int(getattr(r, 'n_groups', r.n_pairs))} groups)"
        for r in g.itertuples()
        if r.mean == r.mean
    ]
    return ", ".join(parts)


def swap_pairs(out: Path, model: str, task: str, metric: str, by_label: bool = False) -> pd.DataFrame:
    """The feedback swap's per-pair values of `metric` (condition `state`, every length; with
    `by_label` one value per pair and receiving sample's label): group_id, length_knob, [label], value."""
    r = _summary(out, model, "feedback-swap", "rows")
    if r is None:
        return pd.DataFrame(columns=["group_id", "length_knob", "label", "value"])
    r = r[(r["task"] == task) & (r["condition"] == "state") & (r["metric"] == metric) & r["value"].notna()]
    keys = ["group_id", "length_knob", "pair_id"] + (["label"] if by_label else [])
    return r.groupby(keys, as_index=False)["value"].mean()


def replacement_accuracy(out: Path, model: str, task: str, condition: str = "zero"):
    """(answer accuracy, Wilson low, high) with the carried state replaced (`state-replacement`),
    pooled over lengths; None where not run."""
    s = _summary(out, model, "state-replacement")
    if s is None:
        return None
    g = s[(s["task"] == task) & (s["condition"] == condition) & (s["metric"] == "accuracy") & (s["length_knob"] == -1)]
    if g.empty:
        return None
    r = g.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])


def depth_mean(out: Path, model: str, task: str, mode: str, depths) -> float:
    """Probe accuracy averaged over `depths` (each depth pooled over lengths and folds)."""
    vals = [tested_mean(c) for c in (probe_cells(out, model, task, mode, depth=d) for d in depths) if len(c)]
    return float(sum(vals) / len(vals)) if vals else float("nan")


def carried_state_accuracy(out: Path, model: str, task: str) -> float:
    """Probe accuracy on the carried state h(T-1) itself (pseudo-mode `carried-state`, its one depth)."""
    return tested_mean(probe_cells(out, model, task, "carried-state", depth=None))


def paired_clause(out: Path, task: str, quantities) -> str:
    """'at depth 0: feedback − baseline **+0.12** [0.08, 0.16] (paired, n = 64 groups); ...' for each
    (what, words) the `paired` table has on `task` (rule `paired`), '' where it has none."""
    said = [paired_rule(words, paired_diff(out, what, task)) for what, words in quantities]
    return "; ".join(v.sentence for v in said if v.verdict != "not-paired")


def variant_range(out: Path, model: str, task: str) -> tuple[float, float] | None:
    """(lowest, highest) pooled depth-0 `recurrent:1` accuracy over the robustness panel's probe variants."""
    p = out / "results" / "probes" / model / "robustness.parquet"
    if not p.is_file():
        return None
    t = pd.read_parquet(p)
    t = t[t["task"] == task]
    if t.empty:
        return None
    acc = pooled_by_variant(t)["accuracy"]
    return float(acc.min()), float(acc.max())


def depth0_modes(cfg, out: Path, model: str, task: str) -> list[str]:
    """The modes probed at depth 0 on `task`, in the study's order (the register suffixes as mapped;
    `carried-state` has no depth 0)."""
    t = probe_table(out, model)
    have = set(t[(t["task"] == task) & (t["depth"] == 0) & (t["metric"] == "accuracy")]["mode"])
    order = list(cfg.modes.get(task, []))
    return [m for m in order if m in have] + sorted(have - set(order))


def probe_depths(out: Path, model: str, task: str) -> list[int]:
    t = probe_table(out, model)
    return sorted(set(t[(t["task"] == task) & (t["mode"] != "carried-state")]["depth"]))


def study_kind(cfg) -> str:
    return "quick" if cfg.quick else "demo" if cfg.demo else "full"


def same_kind(seeds: pd.DataFrame | None, kind: str) -> pd.DataFrame | None:
    """The seeds table's rows from studies of this kind (a demo's numbers are not a full study's)."""
    if seeds is None or "study" not in seeds.columns:
        return seeds
    return seeds[seeds["study"] == kind]


def setting(cfg) -> str:
    """The sentence saying what the study's models are and how far the paper's numbers apply."""
    if cfg.model:
        return CHECKPOINT_SETTING
    return LM_SETTING if cfg.preset in LM_PRESETS else SETTING
