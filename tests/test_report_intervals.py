"""Every interval the committed report quotes contains its estimate, and no pooled accuracy has a
zero-width interval (the report is regenerated from the study; this reads what is committed)."""

import re
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "reports" / "tiny" / "report.md"
NUM = r"-?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"(?<![\w.\[])\**({NUM})\**\s*\[({NUM}),\s*({NUM})\]")


def intervals(text: str) -> list[tuple[float, float, float, int]]:
    """(estimate, low, high, decimals) of every 'x [lo, hi]' in `text`."""
    out = []
    for m in INTERVAL.finditer(text):
        est = m.group(1)
        decimals = len(est.split(".")[1]) if "." in est else 0
        out.append((float(est), float(m.group(2)), float(m.group(3)), decimals))
    return out


def violations(text: str) -> list[str]:
    bad = []
    for est, lo, hi, d in intervals(text):
        tol = 0.5 * 10**-d + 1e-12  # the quoted numbers are rounded to d decimals
        if not lo - tol <= est <= hi + tol:
            bad.append(f"{est} [{lo}, {hi}]")
    return bad


def test_the_check_catches_an_estimate_outside_its_interval():
    assert violations("Spearman 0.79 [0.80, 0.99] and **0.56** [0.55, 0.57]") == ["0.79 [0.8, 0.99]"]
    assert violations("0.995 [0.990, 1.000]") == [] and len(intervals("a 1.00 [1.00, 1.00] b")) == 1


def test_every_interval_in_the_committed_report_contains_its_estimate():
    text = REPORT.read_text()
    assert len(intervals(text)) > 50
    assert violations(text) == []


def test_no_pooled_depth0_accuracy_has_a_zero_width_interval():
    rows = [
        line
        for line in REPORT.read_text().splitlines()
        if line.startswith("| feedback |") or line.startswith("| baseline |")
    ]
    depth0 = [r for r in rows if "(chance)" in r or "0.996" in r or "1.000 |" in r]
    assert depth0, "the depth-0 table is in the report"
    for r in depth0:
        for est, lo, hi, _ in intervals(r):
            assert hi > lo, r
