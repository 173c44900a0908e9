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
    """' (seeds 0-2: mean 0.91, range 0.88-0.95, between-seed 95 % CI [..])', ' (seeds 0-2: 1.00 on every
    seed)' where the seeds agree to the quoted digits (no zero-width interval), or '' when the table
    lacks the number or has one seed. `spec` formats the numbers (".2g" for a ratio that spans orders
    of magnitude)."""
    g = rows(table, model, quantity, task, mode)
    if len(g) < 2:
        return ""
    seeds = sorted(int(s) for s in g["seed"])
    label = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))
    v = g["value"]
    if f"{v.min():{spec}}" == f"{v.max():{spec}}":  # no spread to quote: a t interval would have zero width
        return f" (seeds {label}: {v.max():{spec}} on every seed)"
    lo, hi = between_seeds(v.to_numpy(dtype=float), is_proportion(quantity))
    return (
        f" (seeds {label}: mean {v.mean():{spec}}, range {v.min():{spec}}-{v.max():{spec}}, "
        f"between-seed 95 % CI [{lo:{spec}}, {hi:{spec}}])"
    )


PROPORTIONS = ("answer-accuracy", "answer-choice", "depth0-decodability", "depth-accuracy")


def is_proportion(quantity: str) -> bool:
    """A headline quantity that is an accuracy (bounded by [0, 1]); a normalized effect or a ratio is not."""
    return quantity.startswith(PROPORTIONS)


def between_seeds_text(values, proportion: bool) -> str:
    """'[lo, hi]' of `between_seeds` for the seeds table, '' with fewer than two seeds or none apart."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]  # a seed whose study lacks the number
    if len(v) < 2:
        return ""
    lo, hi = (f"{x:.3g}" for x in between_seeds(v, proportion))
    return "" if lo == hi else f"[{lo}, {hi}]"


def between_seeds(values, proportion: bool) -> tuple[float, float]:
    """The t interval of the mean over training seeds (n - 1 degrees of freedom: three seeds give
    a wide one), cut to [0, 1] for an accuracy (`proportion`); a normalized effect or a ratio can
    leave [0, 1], so its interval is not cut."""
    v = np.asarray(values, dtype=float)
    n, m = len(v), float(v.mean())
    half = float(student.ppf(0.975, n - 1) * v.std(ddof=1) / np.sqrt(n))
    lo, hi = m - half, m + half
    if proportion:
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    return lo, hi


def combine(out: Path, seeds: list[int]) -> pd.DataFrame:
    frames = [pd.read_csv(seed_folder(out, s) / "headline.csv") for s in seeds]
    return pd.concat(frames, ignore_index=True).sort_values(["seed", *KEY], kind="stable").reset_index(drop=True)
