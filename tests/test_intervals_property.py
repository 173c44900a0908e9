"""The interval property, everywhere: a proportion with n >= 1 has ci_low < ci_high, every estimate
lies inside its interval, and no code widens an interval to contain its estimate.

Three parts: (a) every committed table with ci_low/ci_high columns and the committed report's
tables; (b) the summarizing code paths on small synthetic inputs, the proportions checked against
the Wilson closed form written out here (and scipy); (c) a scan of fbt_probe/'s source for a
min/max that combines an interval bound with an estimate (`lo = min(lo, theta)`).
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "tiny" / "report.md"
Z = 1.959963984540054
# what a proportion is called in the tables: metric names of the summaries, quantities of the
# seeds tables, report column headers
PROPORTION_NAMES = ("accuracy", "acc.", "decodability", "iia", "choice", "top1", "top-1")
TOL = 1e-9


def wilson(p: float, n: int) -> tuple[float, float]:
    """The Wilson score interval at proportion p and n draws, written out (independent of stats.py)."""
    c = 1 + Z**2 / n
    centre = (p + Z**2 / (2 * n)) / c
    half = Z / c * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2))
    return max(0.0, centre - half), min(1.0, centre + half)


def is_proportion(name: str) -> bool:
    """A proportion's name; a paired feedback − baseline difference (`paired-*`, e.g.
    `paired-swap-accuracy`) is a difference of two, in [-1, 1], whose group bootstrap has no width
    exactly where every group's difference is the same (the findings then say "in every group")."""
    name = str(name).lower()
    return not name.startswith("paired-") and any(k in name for k in PROPORTION_NAMES)


def violations(t: pd.DataFrame, value: str, name: pd.Series, n: pd.Series | None = None) -> list[str]:
    """Rows of `t` that break the property: an estimate outside its interval (any row with an
    interval), or a proportion with a value (and n >= 1, where the table has n) whose interval is
    missing or has no width."""
    bad = []
    for i, r in t.iterrows():
        v, lo, hi = float(r[value]), float(r["ci_low"]), float(r["ci_high"])
        has = lo == lo and hi == hi
        if has and not lo - TOL <= v <= hi + TOL:
            bad.append(f"row {i}: {v} outside [{lo}, {hi}]")
        counted = n is None or float(n.loc[i]) >= 1
        if is_proportion(name.loc[i]) and v == v and counted and not (has and lo < hi):
            bad.append(f"row {i} ({name.loc[i]}): proportion {v} with interval [{lo}, {hi}]")
    return bad


def table_violations(t: pd.DataFrame) -> list[str]:
    value = next(c for c in ("value", "mean", "fraction") if c in t.columns)
    name = next((t[c] for c in ("metric", "quantity") if c in t.columns), pd.Series("", index=t.index))
    n = next((t[c] for c in ("n_groups", "groups", "n_pairs", "n") if c in t.columns), None)
    return violations(t, value, name, n)


# ----------------------------------------------------------------------------- (a) committed tables
def committed_tables() -> list[Path]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    out = []
    for f in files.splitlines():
        if re.search(r"\.(csv|parquet)$", f) and f.startswith(("reports/", "fbt_probe/reference/")):
            p = ROOT / f
            t = pd.read_parquet(p) if f.endswith(".parquet") else pd.read_csv(p)
            if {"ci_low", "ci_high"} <= set(t.columns):
                out.append(p)
    return out


def test_the_table_check_catches_a_zero_width_proportion_and_an_estimate_outside():
    t = pd.DataFrame(
        {
            "metric": ["accuracy", "accuracy", "normalized", "normalized", "accuracy"],
            "mean": [1.0, 0.5, 0.0, 0.3, 0.0],
            "ci_low": [1.0, 0.3, 0.0, 0.4, float("nan")],
            "ci_high": [1.0, 0.7, 0.0, 0.6, float("nan")],
            "n_groups": [10, 10, 10, 10, 0],
        }
    )
    bad = table_violations(t)
    # the zero-width accuracy and the estimate outside; not the zero-width continuous row, not n = 0
    assert len(bad) == 2 and "row 0 (accuracy)" in bad[0] and "row 3: 0.3 outside" in bad[1]


def test_every_committed_table_with_intervals_has_the_property():
    tables = committed_tables()
    assert tables, "fbt_probe/reference/seeds-tiny.csv is committed and has ci_low/ci_high"
    for p in tables:
        t = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
        assert table_violations(t) == [], p


NUM = r"-?\d+(?:\.\d+)?"
CELL = re.compile(rf"^\**({NUM})\**\s*\[({NUM}),\s*({NUM})\]$")


def report_proportion_cells(text: str) -> list[tuple[str, float, float, float]]:
    """(column header, estimate, low, high) of every 'x [lo, hi]' cell of a Markdown table column
    whose header names a proportion."""
    out, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        for h, c in zip(header, cells):
            m = CELL.match(c)
            if m and is_proportion(h):
                out.append((h, *map(float, m.groups())))
    return out


def test_the_report_check_reads_proportion_columns_only():
    text = "| task | accuracy | normalized |\n|---|---|---|\n| a | 1.00 [1.00, 1.00] | 0.00 [0.00, 0.00] |\n"
    assert report_proportion_cells(text) == [("accuracy", 1.0, 1.0, 1.0)]


def test_no_proportion_in_the_committed_report_has_a_zero_width_interval():
    cells = report_proportion_cells(REPORT.read_text())
    assert len(cells) > 50
    zero = [c for c in cells if not c[2] < c[3]]
    assert zero == []


# ----------------------------------------------------------------------------- (b) the code paths
def synthetic_long(seed: int = 0) -> pd.DataFrame:
    """Long rows of `interventions.metrics.summarize`: two lengths, groups of 1-3 pairs, each pair
    two samples; proportions all right, all wrong, one sample of each pair right, and random;
    continuous metrics with spread and constant, one condition a single group."""
    rng = np.random.default_rng(seed)
    rows = []
    for cond, n_groups in (("many", 6), ("one-group", 1), ("one-pair", 1)):
        for length in (0, 8):
            pair = 0
            for g in range(n_groups):
                for _ in range(1 if cond == "one-pair" else int(rng.integers(1, 4))):
                    pair += 1
                    for s in range(2):
                        base = {
                            "experiment": "feedback-swap",
                            "condition": cond,
                            "task": "completion",
                            "length_knob": length,
                            "position": -1,
                            "pair_id": f"{cond}-{length}-{pair}",
                            "group_id": f"g{g}",  # groups recur at every length
                            "tiny_gap": False,
                        }
                        vals = {
                            "accuracy": 1.0,
                            "choice": 0.0,
                            "iia": float(s),  # every pair: one sample right, one wrong
                            "iia_choice": float(rng.random() < 0.7),
                            "probe_accuracy": float(rng.random() < 0.9),
                            "normalized": float(rng.normal(0.5, 0.2)),
                            "logit_diff": 2.0,
                            "kl": float(rng.gamma(2.0)),
                        }
                        rows += [{**base, "metric": k, "value": v} for k, v in vals.items()]
    return pd.DataFrame(rows)


PROPORTION_METRICS = {"accuracy", "choice", "iia", "iia_choice", "probe_accuracy"}


def check_rows(s: pd.DataFrame, long: pd.DataFrame, keys: list[str]) -> int:
    """Every summary row has its estimate inside its interval; every proportion row equals the
    Wilson interval written out here at n = its distinct groups. Returns the proportion rows seen."""
    seen = 0
    for _, r in s.iterrows():
        if r["metric"] == "normalized" and r["mean"] != r["mean"]:  # not reported: no estimate, no interval
            assert r["ci_low"] != r["ci_low"] and r["ci_high"] != r["ci_high"], r.to_dict()
            continue
        assert r["ci_low"] - TOL <= r["mean"] <= r["ci_high"] + TOL, r.to_dict()
        if r["metric"] not in PROPORTION_METRICS | {"top1"}:
            continue
        sel = long[(long["metric"] == r["metric"]) & (long["eval"] if "eval" in long else True)]
        for k in keys:
            if k != "metric" and not (k == "length_knob" and r[k] == -1):
                sel = sel[sel[k] == r[k]]
        p = sel.groupby("pair_id")["value"].mean().mean()
        n = sel["group_id"].nunique()
        assert n >= 1 and r["ci_low"] < r["ci_high"], r.to_dict()
        assert r["mean"] == pytest.approx(p)
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(wilson(p, n), abs=1e-12), r.to_dict()
        assert r["n_groups"] == n and r["interval"] == "wilson"
        seen += 1
    return seen


def test_summarize_gives_every_proportion_a_wilson_interval_over_groups():
    from fbt_probe.interventions.metrics import summarize

    long = synthetic_long()
    s = summarize(long, n_boot=200)
    assert check_rows(s, long, ["experiment", "condition", "task", "length_knob", "metric"]) == 5 * 3 * 3
    # the degenerate cases: all right, all wrong, every pair half right; a single group (n = 1)
    acc = s[(s.metric == "accuracy") & (s.condition == "many") & (s.length_knob == 0)].iloc[0]
    assert acc["mean"] == 1.0 and acc["ci_high"] == 1.0 and acc["ci_low"] < 1.0
    iia = s[(s.metric == "iia") & (s.condition == "many") & (s.length_knob == 8)].iloc[0]
    assert iia["mean"] == 0.5 and iia["ci_low"] < 0.5 < iia["ci_high"]
    one = s[(s.metric == "choice") & (s.condition == "one-pair") & (s.length_knob == 0)].iloc[0]
    assert one["n_groups"] == 1 and one["ci_low"] == 0.0 and one["ci_high"] == pytest.approx(wilson(0.0, 1)[1])
    # continuous metrics keep the group bootstrap; a constant has no spread to show
    ld = s[(s.metric == "logit_diff") & (s.condition == "many")]
    assert (ld["interval"] == "group-bootstrap").all() and (ld["ci_low"] == ld["ci_high"]).all()
    norm = s[(s.metric == "normalized") & (s.condition == "many")]
    assert (norm["ci_low"] < norm["ci_high"]).all() and (norm["interval"] == "group-bootstrap-ratio").all()
    # a ratio of means has no interval over one group, and with a stated gap no estimate either
    single = s[(s.metric == "normalized") & s.condition.isin(["one-group", "one-pair"])]
    assert single["mean"].isna().all() and single["ci_low"].isna().all()
    assert table_violations(s) == []


def test_wilson_matches_scipy_where_the_share_is_a_count():
    from scipy.stats import binomtest

    from fbt_probe.stats import group_proportion

    for k, n in [(0, 1), (1, 1), (0, 8), (8, 8), (10, 10), (3, 7), (19, 20)]:
        p, lo, hi, m = group_proportion(np.r_[np.ones(k), np.zeros(n - k)], np.arange(n))
        ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert m == n and (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-9) and lo < hi
        assert lo <= p <= hi


def test_lens_summary_gives_top1_a_wilson_interval_over_groups():
    from fbt_probe.lens.sweep import summarize_lens

    rng = np.random.default_rng(1)
    rows = []
    for g in range(5):
        for pair in range(2):
            for s in range(2):
                base = {
                    "task": "memory",
                    "length_knob": 8,
                    "mode": "standard",
                    "pass_index": 1,
                    "lens": "logit",
                    "depth": 0,
                    "pair_id": f"p{g}-{pair}",
                    "group_id": f"g{g}",
                    "eval": True,
                }
                rows.append({**base, "metric": "top1", "value": 1.0})  # every sample right
                rows.append({**base, "metric": "p_correct", "value": float(rng.uniform(0.4, 0.6))})
    long = pd.DataFrame(rows)
    s = summarize_lens(long, n_boot=200)
    assert check_rows(s, long, ["task", "length_knob", "mode", "pass_index", "lens", "depth", "metric"]) == 2
    top = s[s.metric == "top1"].iloc[0]
    assert top["mean"] == 1.0 and top["ci_low"] == pytest.approx(wilson(1.0, 5)[0]) and top["n_groups"] == 5
    assert table_violations(s) == []


def test_answer_accuracy_counts_groups_not_samples(tmp_path):
    from fbt_probe.reproduce.tables import answer_accuracy

    (tmp_path / "eval").mkdir()
    pd.DataFrame(
        {
            "model": "feedback",
            "task": "completion",
            "mode": "standard",
            "length_knob": [0, 8, 32],
            "correct": [32, 32, 32],
            "n": [32, 32, 32],
            "groups": [16, 16, 16],
        }
    ).to_parquet(tmp_path / "eval" / "accuracy.parquet")
    p, lo, hi, n, groups = answer_accuracy(tmp_path, "feedback", "completion")
    assert (p, n, groups) == (1.0, 96, 16) and lo < hi == 1.0
    assert lo == pytest.approx(wilson(1.0, 16)[0])  # n = the 16 groups, not the 96 samples


def test_ratio_ci_contains_its_estimate_even_when_the_resamples_are_skewed():
    from fbt_probe.sae.metrics import ratio_ci

    rng = np.random.default_rng(2)
    for seed in range(20):
        groups = np.repeat(np.arange(4), 3)
        num = rng.lognormal(0, 1.5, size=12)  # heavy right tail: a percentile interval can miss theta
        den = rng.lognormal(0, 1.5, size=12)
        theta, lo, hi = ratio_ci(num, den, groups, n_boot=300, seed=seed)
        assert lo <= theta <= hi and lo < hi


# ----------------------------------------------------------------------------- (c) no widening
BOUND = re.compile(r"^(lo|hi|low|high|lower|upper|ci_lo|ci_hi|ci_low|ci_high)$|_(lo|hi|low|high|lower|upper)$")
ESTIMATE = re.compile(r"^(theta|est|estimate|mean|value|p|point|fraction|rho|stat|m|mu|v)$|_(mean|estimate|est)$")


def _name(node: ast.AST) -> str | None:
    """The name an argument reads: `x`, `obj.x`, `r["x"]`; None for any other expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) and len(node.args) == 1:
        fn = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        return _name(node.args[0]) if fn in ("float", "int") else None  # min(lo, float(theta))
    return None


def widenings(source: str, filename: str = "<src>") -> list[str]:
    """`min`/`max` (also np.minimum/np.maximum/fmin/fmax) calls whose arguments name both an
    interval bound and an estimate: the pattern that makes an interval contain its estimate by
    construction."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        fn = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if fn not in ("min", "max", "minimum", "maximum", "fmin", "fmax"):
            continue
        args = list(node.args)
        if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
            args = list(args[0].elts)  # min([lo, theta])
        names = [n for n in map(_name, args) if n]
        if any(BOUND.search(n) for n in names) and any(ESTIMATE.search(n) for n in names):
            out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_scan_catches_widening_and_leaves_other_min_max_alone():
    bad = """
lo, hi = min(lo, theta), max(hi, theta)
low = np.minimum(r["ci_low"], r["mean"])
x = min([ci_lo, float(est)])
"""
    assert len(widenings(bad)) == 4
    fine = """
lo = max(0.0, mid - half)
ticks = range(min(lo, slo), max(hi, shi) + 1)
share = min(max(share, 1 / (n + 1)), n / (n + 1))
top = max(float(shown["ci_high"].max()), 1.0)
"""
    assert widenings(fine) == []


def test_no_code_widens_an_interval_to_contain_its_estimate():
    files = sorted((ROOT / "fbt_probe").rglob("*.py"))
    assert any(p.name == "metrics.py" and p.parent.name == "sae" for p in files)
    found = [w for p in files for w in widenings(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []
