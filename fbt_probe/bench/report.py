"""Writing a benchmark report: the Markdown table and, beside it, the full result as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from fbt_probe.io import atomic_path, refuse_existing


def save_report(result: dict, markdown: str, out: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write the Markdown report to `out` and the full result (provenance included) to `out`.json,
    atomically; refuses to replace either unless `force`."""
    out = Path(out)
    side = out.with_name(out.name + ".json")
    refuse_existing(out, force)
    refuse_existing(side, force)
    with atomic_path(side) as tmp:
        tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    with atomic_path(out) as tmp:
        tmp.write_text(markdown)
    return out, side
