"""Writing a benchmark report: the Markdown table and, beside it, the full result as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from fbt_probe.io import atomic_path
from fbt_probe.marker import named_outputs

COMMAND = "bench"  # the writer of a report's files in its folder's marker


def report_paths(out: str | Path) -> list[Path]:
    """The Markdown report and, beside it, its JSON result."""
    out = Path(out)
    return [out, out.with_name(out.name + ".json")]


def save_report(result: dict, markdown: str, out: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write the Markdown report to `out` and the full result (provenance included) to `out`.json,
    atomically, as `bench`'s named outputs (recorded in their folder's marker); refuses to replace
    either unless `force`, and then only files the marker lists as the benchmark's, unchanged."""
    out, side = report_paths(out)
    with named_outputs([out, side], COMMAND, force):
        with atomic_path(side) as tmp:
            tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
        with atomic_path(out) as tmp:
            tmp.write_text(markdown)
    return out, side
