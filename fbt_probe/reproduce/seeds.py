"""Findings over training seeds.

Each study writes its headline numbers as one tidy table (`OUT/headline.csv`, from
`report.headline`). `reproduce --train --seeds N` runs the study once per seed (`OUT/seed-S/`),
stacks their tables (`OUT/seeds.csv`) and rewrites every seed's report. The training seed is the
unit of a claim: each headline number is quoted as its mean over the seeds with the between-seed
interval, each seed's value and this seed's within-run interval beside it (`quote`), and each rule
is applied to every seed's own rows (`per_seed`, then `rules.stated`). The shipped reference models
come with the table of their preset's seeds (`fbt_probe/reference/seeds-<preset>.csv`), so a study of
them quotes every seed without training anything.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student

from fbt_probe.io import sha256_file
from fbt_probe.stats import MIN_GROUPS

KEY = ["model", "quantity", "task", "mode"]
N_GROUPS = "n_groups"  # the headline column counting a number's groups (absent from tables written before it)


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


PROPORTIONS = (
    "answer-accuracy",
    "answer-choice",
    "depth0-decodability",
    "depth-accuracy",
    "carried-state-decodability",
    "depth1-L-decodability",
    "depth0-variant",
    "swap-accuracy",
    "swap-follows",
    "bypass-accuracy",
    "mean-state-accuracy",
    "zero-input-accuracy",
    "depth-swap-accuracy",
    "das-",
)


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


def with_own(kind: pd.DataFrame | None, own: pd.DataFrame | None, seed: int) -> pd.DataFrame | None:
    """The rows every seed's numbers are read from: the seeds table of this study's kind with this
    study's seed's rows replaced by its own headline rows (`own`, the same numbers where the table was
    made from this study; this study's where it was not)."""
    frames = []
    if kind is not None and len(kind):
        frames.append(kind[kind["seed"] != seed])
    if own is not None and len(own):
        frames.append(own.assign(seed=seed))
    if not frames:
        return None
    t = pd.concat(frames, ignore_index=True)
    if N_GROUPS not in t.columns:
        t[N_GROUPS] = np.nan
    return t


def seed_numbers(table: pd.DataFrame | None, model: str, quantity: str, task: str, mode: str) -> dict:
    """{seed: (value, ci_low, ci_high, n_groups or None)} of one headline number."""
    g = rows(table, model, quantity, task, mode)
    out = {}
    for r in g.itertuples():
        n = getattr(r, N_GROUPS, float("nan"))
        out[int(r.seed)] = (float(r.value), float(r.ci_low), float(r.ci_high), None if n != n else int(n))
    return dict(sorted(out.items()))


def _label(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))


def within(lo: float, hi: float, spec: str = ".2f") -> str:
    """'within run [lo, hi]', or what stands for an interval that has none or prints with zero width."""
    if lo != lo or hi != hi:
        return "no within-run interval"
    if f"{lo:{spec}}" == f"{hi:{spec}}":
        return "no spread within the run"
    return f"within run [{lo:{spec}}, {hi:{spec}}]"


def quote(
    table: pd.DataFrame | None,
    model: str,
    quantity: str,
    task: str,
    mode: str,
    seed: int,
    own: tuple | None = None,
    spec: str = ".2f",
) -> str:
    """A headline number as the findings quote it, the training seed being the unit: the mean over the
    seeds that have it, in bold, with its between-seed t interval, then each seed's value and this
    seed's within-run interval (`spec` formats them; ".2g" for a ratio over orders of magnitude):

        **0.31** [-0.30, 0.92] (mean over seeds 0-2: 0.41 / 0.49 / 0.03; seed 0 within run [0.38, 0.44])
        **1.00** on every seed (seeds 0-2; seed 0 within run [0.81, 1.00])
        **0.41** [0.38, 0.44] (one seed's: seed 0, within run)

    `own` (value, low, high[, groups]): this seed's number where the table lacks it. 'n/a' without any
    number."""
    got = seed_numbers(table, model, quantity, task, mode)
    if seed not in got and own is not None and own[0] == own[0]:
        n = own[3] if len(own) > 3 and own[3] == own[3] else None
        got[seed] = (float(own[0]), float(own[1]), float(own[2]), None if n is None else int(n))
    if not got:
        return "n/a"
    few = [n for _, _, _, n in got.values() if n is not None and n < MIN_GROUPS]
    if few:  # the floor on evidence: a number over fewer groups is listed, not quoted
        return f"too few groups ({min(few)}; at least {MIN_GROUPS})"
    if len(got) == 1:
        ((s, (v, lo, hi, _)),) = got.items()
        if lo != lo or f"{lo:{spec}}" == f"{hi:{spec}}":
            return f"**{v:{spec}}** (one seed's: seed {s}{'' if lo != lo else ', no spread within the run'})"
        return f"**{v:{spec}}** [{lo:{spec}}, {hi:{spec}}] (one seed's: seed {s}, within run)"
    seeds = sorted(got)
    vals = np.array([got[s][0] for s in seeds])
    mine = got.get(seed)
    run = f"; seed {seed} {within(mine[1], mine[2], spec)}" if mine is not None else ""
    if f"{vals.min():{spec}}" == f"{vals.max():{spec}}":
        return f"**{vals.max():{spec}}** on every seed (seeds {_label(seeds)}{run})"
    lo, hi = between_seeds(vals, is_proportion(quantity))
    each = " / ".join(f"{x:{spec}}" for x in vals)
    return f"**{vals.mean():{spec}}** [{lo:{spec}}, {hi:{spec}}] (mean over seeds {_label(seeds)}: {each}{run})"


def per_seed(table: pd.DataFrame | None, keys: dict, seed: int | None = None, own: dict | None = None) -> dict:
    """{seed: {name: (value, low, high, n)}} for every seed of `table` that has every number of `keys`
    (name -> (model, quantity, task, mode)); `own` ({name: number}) stands for this study's `seed` where
    the table lacks it (a study without a seeds table or headline rows). Seeds lacking a number map to
    None, so that a finding can say which seeds the table does not cover."""
    nums = {name: seed_numbers(table, *key) for name, key in keys.items()}
    seeds = set().union(*(set(v) for v in nums.values())) if nums else set()
    if seed is not None and own is not None:
        seeds.add(seed)
    out = {}
    for s in sorted(seeds):
        got = {name: v[s] for name, v in nums.items() if s in v}
        if s == seed and own is not None:
            got = {**{k: tuple(v) for k, v in own.items() if v is not None}, **got}
        out[s] = got if len(got) == len(keys) else None
    return out
