"""Findings over training seeds.

Each study writes its headline numbers as one tidy table (`OUT/headline.csv`, from
`findings.headline`). `reproduce --train --seeds N` runs the study once per seed (`OUT/seed-S/`),
stacks their tables (`OUT/seeds.csv`) and rewrites every seed's report so that each headline
finding quotes, beside its within-run CI, the mean and range over the seeds. The shipped reference
models come with the table of their preset's seeds (`fbt_probe/reference/seeds-<preset>.csv`), so a
study of them shows the spread without training anything.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student

from fbt_probe.io import sha256_file

KEY = ["model", "quantity", "task", "mode"]


def packaged(preset: str) -> Path:
    """The preset's shipped seeds table (package data of `fbt_probe.reference`)."""
    return Path(str(resources.files("fbt_probe.reference").joinpath(f"seeds-{preset}.csv")))


def seed_folder(out: Path, seed: int) -> Path:
    return Path(out) / f"seed-{seed}"


def spread_source(cfg, out: Path) -> Path | None:
    """The seeds table this study's findings quote: its multi-seed run's `seeds.csv` (a study in
    `OUT/seed-S/`), else, for a study of the shipped models, the packaged one; None without."""
    out = Path(out)
    here = out.parent / "seeds.csv"
    if out.name == f"seed-{cfg.seed}" and here.is_file():
        return here
    p = packaged(cfg.preset)
    return p if cfg.shipped and p.is_file() else None


def spread_table(cfg, out: Path) -> pd.DataFrame | None:
    src = spread_source(cfg, out)
    return None if src is None else pd.read_csv(src)


def source_key(cfg, out: Path) -> str | None:
    """Part of the report stage's key: a new seeds table redoes the report."""
    src = spread_source(cfg, out)
    return None if src is None else sha256_file(src)


def rows(table: pd.DataFrame | None, model: str, quantity: str, task: str, mode: str) -> pd.DataFrame:
    """The seeds table's rows of one headline number that have a value (none without a table)."""
    if table is None:
        return pd.DataFrame(columns=["seed", "value"])
    g = table[
        (table["model"] == model) & (table["quantity"] == quantity) & (table["task"] == task) & (table["mode"] == mode)
    ]
    return g.dropna(subset=["value"])


def spread(table: pd.DataFrame | None, model: str, quantity: str, task: str, mode: str, spec: str = ".2f") -> str:
    """' (seeds 0-2: mean 0.91, range 0.88-0.95)' or '' when the table lacks the number or has one seed.
    `spec` formats the numbers (".2g" for a ratio that spans orders of magnitude)."""
    g = rows(table, model, quantity, task, mode)
    if len(g) < 2:
        return ""
    seeds = sorted(int(s) for s in g["seed"])
    label = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))
    v = g["value"]
    lo, hi = between_seeds(v.to_numpy(dtype=float))
    return (
        f" (seeds {label}: mean {v.mean():{spec}}, range {v.min():{spec}}-{v.max():{spec}}, "
        f"between-seed 95 % CI [{lo:{spec}}, {hi:{spec}}])"
    )


def between_seeds(values) -> tuple[float, float]:
    """The t interval of the mean over training seeds (n - 1 degrees of freedom: three seeds give
    a wide one), cut to [0, 1] when every value lies there (an accuracy or a proportion)."""
    v = np.asarray(values, dtype=float)
    n, m = len(v), float(v.mean())
    half = float(student.ppf(0.975, n - 1) * v.std(ddof=1) / np.sqrt(n))
    lo, hi = m - half, m + half
    if ((v >= 0) & (v <= 1)).all():
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return lo, hi


def combine(out: Path, seeds: list[int]) -> pd.DataFrame:
    frames = [pd.read_csv(seed_folder(out, s) / "headline.csv") for s in seeds]
    return pd.concat(frames, ignore_index=True).sort_values(["seed", *KEY], kind="stable").reset_index(drop=True)
