"""Compare the tables of two reproduction reports number by number.

    python benchmarks/diff_reports.py OLD/report.md NEW/report.md [--ulps 1]

Reads the "## Tables" section of each report.md (up to "## What was run": provenance and timings
differ between runs by design) and compares it token by token. A text token must match exactly. A
number must match to within `ulps` units in the last printed place: 0.758 against 0.759 is one
unit. A report re-made by code that computes the same functions to float rounding differs by at
most one unit where a rounding boundary falls between the two runs. Prints every difference and a
summary line. The exit status is 1 when a text token or the number of tokens differs, or when a
number is off by more than `ulps` units.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NUMBER = re.compile(r"^[+\-−]?\d[\d,]*(\.\d+)?(e[+\-]?\d+)?%?$")
TOKEN = re.compile(r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-]?\d+)?%?|[^\s\d+\-−]+|[+\-−]")


def tables(path: Path) -> list[tuple[int, str]]:
    """(line number, token) of the tables section."""
    lines = path.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("## Tables"))
    stop = next((i for i, l in enumerate(lines) if l.startswith("## What was run")), len(lines))
    return [(i + 1, tok) for i in range(start, stop) for tok in TOKEN.findall(lines[i])]


def value(tok: str) -> tuple[float, float]:
    """(value, one unit in its last printed place)."""
    t = tok.replace("−", "-").replace(",", "").rstrip("%")
    mantissa = t.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exp = int(t.split("e")[1]) if "e" in t else 0
    return float(t), 10.0 ** (exp - decimals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--ulps", type=float, default=1.0, help="allowed difference in units of the last printed place")
    args = ap.parse_args()
    a, b = tables(args.old), tables(args.new)
    bad, numbers, off_by = 0, 0, []
    if len(a) != len(b):
        print(f"token count differs: {len(a)} vs {len(b)}")
        bad += 1
    for (la, ta), (lb, tb) in zip(a, b):
        if NUMBER.match(ta) and NUMBER.match(tb):
            numbers += 1
            (va, ua), (vb, ub) = value(ta), value(tb)
            units = abs(va - vb) / max(ua, ub)
            if units > 1e-9:
                off_by.append(units)
            if units > args.ulps + 1e-9:
                print(f"line {la}/{lb}: {ta} vs {tb} ({units:.1f} units)")
                bad += 1
        elif ta != tb:
            print(f"line {la}/{lb}: text '{ta}' vs '{tb}'")
            bad += 1
            if bad > 50:
                print("(stopping after 50 differences)")
                break
    print(f"{numbers} numbers compared; {len(off_by)} differ (max {max(off_by, default=0):.1f} units in the last "
          f"printed place); {bad} differences beyond {args.ulps:g} unit(s) or in text")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
