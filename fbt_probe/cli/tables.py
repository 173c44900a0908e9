"""A measurement's table as a command's named outputs: Parquet, CSV and its provenance in JSON."""

from __future__ import annotations

from pathlib import Path

from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import atomic_path, write_json
from fbt_probe.marker import named_outputs
from fbt_probe.provenance import provenance


def table_paths(stem: Path) -> list[Path]:
    return [stem.with_suffix(suffix) for suffix in (".parquet", ".csv", ".json")]


def write_table(df, stem: Path, run, cfg, force: bool, *, command: str, extra: dict | None = None) -> None:
    """stem.parquet, stem.csv and stem.json (provenance: the run or runs, their checkpoint hashes,
    training configs and seeds, and `extra`) as `command`'s named outputs."""
    with named_outputs(table_paths(stem), command, force):
        with atomic_path(stem.with_suffix(".parquet")) as tmp:
            df.to_parquet(tmp, index=False)
        with atomic_path(stem.with_suffix(".csv")) as tmp:
            df.to_csv(tmp, index=False)
        if isinstance(run, list):  # several runs in one table: every field becomes a list
            fields = {
                "runs": [str(r) for r in run],
                "checkpoint_sha256": [checkpoint_hash(r) for r in run],
                "train_config": [c.to_dict() for c in cfg],
                "seed": [c.seed for c in cfg],
            }
        else:
            fields = {
                "run": str(run),
                "checkpoint_sha256": checkpoint_hash(run),
                "train_config": cfg.to_dict(),
                "seed": cfg.seed,
            }
        write_json(stem.with_suffix(".json"), provenance(**fields, **(extra or {})))
