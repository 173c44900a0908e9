"""What the parts' findings, sections and headlines read: the study's result tables and the numbers
drawn from them with their intervals (`fbt_probe.stats`: the resampling unit of every number is
named there). Nothing here runs a model."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

from fbt_probe.probes.robustness import pooled_by_variant
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import LM_PRESETS, RECURRENT_1, STANDARD
from fbt_probe.reproduce.part import PAIRED_MODEL
from fbt_probe.reproduce.rules import paired as paired_rule
from fbt_probe.reproduce.seeds import seed_numbers
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


def answer_accuracy(out: Path, model: str, task: str, mode: str = STANDARD) -> tuple[float, float, float, int, int]:
    """(accuracy over every length's samples, Wilson low, high, samples, groups); the Wilson interval
    has n = `answer_groups` (docs/statistics.md)."""
    return _share(eval_table(out), "correct", model, task, mode)


def choice_accuracy(
    out: Path, model: str, task: str, mode: str = STANDARD
) -> tuple[float, float, float, int, int] | None:
    """As `answer_accuracy` (value, Wilson low, high, samples, groups), for the two-way choice between
    the label words (None: an eval table written before the choice was measured)."""
    acc = eval_table(out)
    return _share(acc, "choice_correct", model, task, mode) if "choice_correct" in acc.columns else None


def _share(acc: pd.DataFrame, column: str, model: str, task: str, mode: str) -> tuple[float, float, float, int, int]:
    """(share of `column`'s counts over every length's samples, Wilson low, high, samples, groups)."""
    g = acc[(acc["model"] == model) & (acc["task"] == task) & (acc["mode"] == mode)]
    c, n = int(g[column].sum()), int(g["n"].sum())
    if n == 0:
        return (*wilson(c, n), n, 0)
    groups = answer_groups(g)
    return (*group_wilson(c / n, groups), n, groups)


def depth0(out: Path, model: str, task: str, mode: str) -> tuple[float, float, float]:
    """Depth-0 probe accuracy pooled over the length x fold cells, Wilson interval at n = groups."""
    return depth0_number(out, model, task, mode)[:3]


def depth0_number(out: Path, model: str, task: str, mode: str) -> tuple[float, float, float, int]:
    """`depth0` with the groups it pools: (value, low, high, groups)."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    return r["value"], r["ci_low"], r["ci_high"], r["groups"]


def carried_state_number(out: Path, model: str, task: str) -> tuple[float, float, float, int]:
    """The probe on the carried state h(T-1) (pseudo-mode `carried-state`), pooled over its cells:
    (value, Wilson low, high, groups)."""
    r = pooled_accuracy(out, probe_cells(out, model, task, "carried-state", depth=None), task)
    return r["value"], r["ci_low"], r["ci_high"], r["groups"]


def depth_mean_number(out: Path, model: str, task: str, mode: str, depths) -> tuple[float, float, float, int]:
    """Probe accuracy over `depths` pooled (every depth's cells, the same samples at each depth, so the
    mean over depths), with the Wilson interval at n = the groups pooled: what Fig. 7b's rule reads."""
    cells = probe_cells(out, model, task, mode, depth=None)
    r = pooled_accuracy(out, cells[cells["depth"].isin(list(depths))], task)
    return r["value"], r["ci_low"], r["ci_high"], r["groups"]


def depth0_scope(out: Path, model: str, task: str, mode: str = RECURRENT_1) -> str:
    """'pooled over lengths 0, 8, 32: 1152 held-out predictions of 64 groups'."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    if not r["n"]:
        return ""
    return (
        f"pooled over length{'s' if len(r['lengths']) > 1 else ''} {', '.join(map(str, r['lengths']))}: "
        f"{r['n']} held-out predictions of {r['groups']} groups"
    )


def swap_effect(out: Path, model: str, task: str, condition: str = "state") -> tuple[float, float, float, int] | None:
    """The pooled (length_knob = -1) normalized swap effect (a ratio of means over pairs) with its
    groups; `per_length` gives each length. None where not run or where the pairs have no gap."""
    s = _summary(out, model, "feedback-swap")
    if s is None:
        return None
    g = s[
        (s["length_knob"] == -1) & (s["metric"] == "normalized") & (s["task"] == task) & (s["condition"] == condition)
    ]
    if g.empty or g["mean"].isna().all():
        return None
    r = g.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]), int(r.get("n_groups", r["n_pairs"]))


def swap_pairs(out: Path, model: str, task: str, metric: str, by_label: bool = False) -> pd.DataFrame:
    """The feedback swap's per-pair values of `metric` (condition `state`, every length; with
    `by_label` one value per pair and receiving sample's label): group_id, length_knob, [label], value."""
    r = _summary(out, model, "feedback-swap", "rows")
    if r is None:
        return pd.DataFrame(columns=["group_id", "length_knob", "label", "value"])
    r = r[(r["task"] == task) & (r["condition"] == "state") & (r["metric"] == metric) & r["value"].notna()]
    keys = ["group_id", "length_knob", "pair_id"] + (["label"] if by_label else [])
    return r.groupby(keys, as_index=False)["value"].mean()


def swap_ratio_pairs(out: Path, model: str, task: str) -> pd.DataFrame:
    """The feedback swap's normalized effect per pair as the two sums of a ratio of means: group_id,
    length_knob, value (the pair's mean patched − corrupt) and den (its mean clean − corrupt), the
    tiny-gap pairs left out (as the summaries)."""
    r = _summary(out, model, "feedback-swap", "rows")
    cols = ["group_id", "length_knob", "value", "den"]
    if r is None:
        return pd.DataFrame(columns=cols)
    r = r[(r["task"] == task) & (r["condition"] == "state") & (r["metric"] == "normalized") & r["value"].notna()]
    if r.empty:
        return pd.DataFrame(columns=cols)
    gap = r["clean_logit_diff"] - r["corrupt_logit_diff"]
    r = r.assign(value=r["value"] * gap, den=gap)
    return r.groupby(["group_id", "length_knob", "pair_id"], as_index=False)[["value", "den"]].mean()[cols]


def summary_number(
    out: Path, model: str, exp: str, task: str, condition: str, metric: str = "accuracy", decoding: str = "prefill"
) -> tuple[float, float, float, int] | None:
    """(mean, low, high, groups) of one experiment's summary row pooled over lengths (or its one
    length), prefill decoding; None where not run."""
    s = _summary(out, model, exp)
    if s is None:
        return None
    g = s[(s["task"] == task) & (s["condition"] == condition) & (s["metric"] == metric)]
    if "decoding" in g.columns:
        g = g[g["decoding"] == decoding]
    if "position" in g.columns:
        g = g[g["position"] == -1]
    rows = g[g["length_knob"] == -1] if (g["length_knob"] == -1).any() else g
    if len(rows) != 1 or rows["mean"].isna().all():
        return None
    r = rows.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]), int(r.get("n_groups", r["n_pairs"]))


def paired_gap(out: Path, what: str, task: str) -> str:
    """The `gap` note of a paired row ('no gap: baseline'), '' where none."""
    p = Path(out) / "results" / "paired" / "paired.parquet"
    if not p.is_file():
        return ""
    t = _paired_table(p, p.stat().st_mtime)
    t = t[(t["what"] == what) & (t["task"] == task)]
    if t.empty or "gap" not in t.columns:
        return ""
    rows = t[t["length_knob"] == -1] if (t["length_knob"] == -1).any() else t
    return str(rows["gap"].iloc[0] or "")


PAIRED_MODEL_ROWS = "paired"  # the headline rows' mode of a paired difference


def paired_stated(cfg, out: Path, seeds, task: str, what: str, words: str) -> rules.Verdict:
    """Rule `paired` on each training seed's feedback − baseline (this study's from its `paired` table,
    the others from their headline rows), stated over seeds (`rules.stated`)."""
    own = paired_diff(out, what, task)
    key = (PAIRED_MODEL, f"paired-{what}", task, PAIRED_MODEL_ROWS)
    nums = seed_numbers(seeds, *key)
    if own is not None:
        nums[cfg.seed] = own
    gap = paired_gap(out, what, task)
    verdicts = {s: paired_rule(words, n, gap if s == cfg.seed else "") for s, n in nums.items()}
    verdicts = {s: v for s, v in verdicts.items() if v.verdict != "not-paired"}
    if not verdicts:
        return paired_rule(words, None)
    return rules.stated(verdicts, cfg.seed, f"{words}, feedback − baseline (paired)")


def paired_clause(out: Path, task: str, quantities, cfg=None, seeds=None) -> str:
    """'at depth 0: feedback − baseline **+0.12** [0.08, 0.16] (paired, n = 64 groups); ...' for each
    (what, words) the `paired` table has on `task` (rule `paired`), '' where it has none; with `cfg`,
    each stated over the training seeds (`paired_stated`)."""
    if cfg is not None:
        said = [paired_stated(cfg, out, seeds, task, what, words) for what, words in quantities]
    else:
        said = [
            paired_rule(words, paired_diff(out, what, task), paired_gap(out, what, task)) for what, words in quantities
        ]
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
