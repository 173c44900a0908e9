"""Compare the tables of two `fbt-probe reproduce` reports number by number (`fbt-probe bench diff-reports`).

Reads the "## Tables" section of each report.md (up to "## What was run": provenance and timings
differ between runs by design) and compares it token by token. A text token must match exactly. A
number must match to within `ulps` units in its last printed place: 0.758 against 0.759 is one
unit. A report re-made by code that computes the same functions to float rounding differs by at
most one unit where a rounding boundary falls between the two runs; a speed-up that changes a
result shows as more, or as text.
"""

from __future__ import annotations

import re
from pathlib import Path

from fbt_probe.errors import FbtError

NUMBER = re.compile(r"^[+\-−]?\d[\d,]*(\.\d+)?(e[+\-]?\d+)?%?$")
TOKEN = re.compile(r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-]?\d+)?%?|[^\s\d+\-−]+|[+\-−]")
MAX_LISTED = 50


def tables(path: Path) -> list[tuple[int, str]]:
    """(line number, token) of the report's tables section."""
    path = Path(path)
    if not path.is_file():
        raise FbtError(f"{path}: report not found (expected a report.md of fbt-probe reproduce)")
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## Tables")), None)
    if start is None:
        raise FbtError(f"{path}: no '## Tables' section (expected a report.md of fbt-probe reproduce)")
    stop = next((i for i, line in enumerate(lines) if line.startswith("## What was run")), len(lines))
    return [(i + 1, tok) for i in range(start, stop) for tok in TOKEN.findall(lines[i])]


def value(tok: str) -> tuple[float, float]:
    """(value, one unit in its last printed place)."""
    t = tok.replace("−", "-").replace(",", "").rstrip("%")
    mantissa = t.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exp = int(t.split("e")[1]) if "e" in t else 0
    return float(t), 10.0 ** (exp - decimals)


def diff_reports(old: Path, new: Path, ulps: float = 1.0) -> tuple[list[str], int]:
    """(lines to print: each difference, then a summary; the number of differences beyond `ulps` or in text)."""
    a, b = tables(old), tables(new)
    out, bad, numbers, off_by = [], 0, 0, []
    if len(a) != len(b):
        out.append(f"token count differs: {len(a)} vs {len(b)}")
        bad += 1
    for (la, ta), (lb, tb) in zip(a, b):
        if NUMBER.match(ta) and NUMBER.match(tb):
            numbers += 1
            (va, ua), (vb, ub) = value(ta), value(tb)
            units = abs(va - vb) / max(ua, ub)
            if units > 1e-9:
                off_by.append(units)
            if units > ulps + 1e-9:
                out.append(f"line {la}/{lb}: {ta} vs {tb} ({units:.1f} units)")
                bad += 1
        elif ta != tb:
            out.append(f"line {la}/{lb}: text '{ta}' vs '{tb}'")
            bad += 1
        if bad > MAX_LISTED:
            out.append(f"(stopping after {MAX_LISTED} differences)")
            break
    out.append(
        f"{numbers} numbers compared; {len(off_by)} differ (max {max(off_by, default=0):.1f} units in the last "
        f"printed place); {bad} differences beyond {ulps:g} unit(s) or in text"
    )
    return out, bad
