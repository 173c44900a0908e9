"""A part of the study: what one measurement adds to `fbt-probe reproduce`, in one shape.

A part is one module of `fbt_probe.reproduce.parts` holding a `PART`: its stages (each with its key,
outputs and the stages it waits for), the figures it draws from its tables, its finding sentences,
its report sections, its rows of the headline table and the captions of its figures. `reproduce`
walks `parts.PARTS` for each of these in registry order; adding a part is one new module and one
line in that registry (docs/architecture.md, "The study's parts"). Nothing in a part's figures,
findings, sections or headline runs a model: they read the tables its stages wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import pandas as pd

from fbt_probe.loading import checkpoint_hash, load_model
from fbt_probe.reproduce.config import ReproConfig, model_path
from fbt_probe.reproduce.stages import Stage

Job = tuple[str, str, pd.DataFrame, dict]  # (figure stem, registered figure, table, options)
HEADLINE = ["model", "quantity", "task", "mode", "value", "ci_low", "ci_high", "checkpoint_sha256", "n_groups"]
"""A headline row; `n_groups` counts the groups (documents for the contraction) a number rests on, NaN
where no count applies (the floor on evidence reads it, seed by seed)."""


class Section(NamedTuple):
    """One section of the report's tables: its title, Markdown body and the figure stems it shows."""

    title: str
    body: str
    figures: list[str] = []


def _none(*args) -> list:
    return []


def _empty_headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    return pd.DataFrame(columns=HEADLINE)


@dataclass(frozen=True)
class Part:
    """One part of the study (module docstring). Every callable has a no-op default."""

    name: str
    stages: Callable[[ReproConfig, Path, dict], list[Stage]] = _none
    """(cfg, out, common key) -> the part's stages; the key carries what every stage depends on."""
    figures: Callable[[ReproConfig, Path], list[Job]] = _none
    """(cfg, out) -> the figure jobs drawn from the part's tables (after every stage ran)."""
    findings: Callable[[ReproConfig, Path, pd.DataFrame | None], list[str]] = _none
    """(cfg, out, seeds table of this study's kind or None) -> finding sentences, in reading order."""
    sections: Callable[[ReproConfig, Path, list[str]], list[Section]] = _none
    """(cfg, out, the study's figure stems) -> the part's report sections."""
    headline: Callable[[ReproConfig, Path], pd.DataFrame] = _empty_headline
    """(cfg, out) -> the numbers its findings quote, `HEADLINE` columns (seeds.csv stacks them)."""
    captions: dict[str, str] = field(default_factory=dict)
    """Figure stem (without the model suffix) -> what the figure shows and how to read it."""
    criteria: tuple[str, ...] = ()
    """Names of the `rules.CRITERIA` its findings are worded by (the report prints them)."""


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a Markdown pipe table ("_(no rows)_" when empty)."""
    if df.empty:
        return "_(no rows)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def trained_stages(cfg: ReproConfig, name: str) -> list[str]:
    """The stage that trains study model `name` (none for a shipped model or a user checkpoint)."""
    return [] if cfg.model or cfg.shipped else [f"train-{name}"]


def headline_frame(rows: list[tuple], sha: dict[str, str]) -> pd.DataFrame:
    """Headline rows (model, quantity, task, mode, value, ci_low, ci_high[, n_groups]) with each model's
    checkpoint sha256 (a row of both models, `feedback-baseline`, gets the feedback model's)."""
    full = [tuple(r) + (float("nan"),) * (8 - len(r)) for r in rows]
    t = pd.DataFrame(full, columns=[*HEADLINE[:7], "n_groups"])
    models = t["model"].replace({PAIRED_MODEL: "feedback"})
    return t.assign(checkpoint_sha256=models.map(sha))[HEADLINE]


def model_hashes(cfg: ReproConfig, out: Path, names=None) -> dict[str, str]:
    """Each study model's checkpoint sha256 (`names`, default `cfg.models()`): the identity every
    headline row and result table carries."""
    return {n: checkpoint_hash(model_path(cfg, out, n)) for n in (cfg.models() if names is None else names)}


PAIRED_MODEL = "feedback-baseline"  # the headline rows of a paired difference (feedback − baseline)

MODEL_WORDS = {"feedback": "feedback model", "baseline": "no-feedback baseline"}
"""How figure titles and captions name the study's models (a figure of one model must say which)."""


def study_model(cfg: ReproConfig, out: Path, name: str):
    """Study model `name` loaded on the study's device."""
    return load_model(str(model_path(cfg, out, name)), device=cfg.device)
