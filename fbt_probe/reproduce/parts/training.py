"""The study's models under --train (stages `train-feedback`, `train-baseline`), and how models
retrained here compare with the shipped ones of the preset (a finding)."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.loading import checkpoint_hash
from fbt_probe.reference import names, record
from fbt_probe.reproduce.config import (
    LM_MODELS,
    LM_SCHEDULES,
    STANDARD,
    ReproConfig,
    is_lm,
    lm_train_config,
    shipped_name,
    train_config,
)
from fbt_probe.reproduce.part import Part
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import answer_accuracy
from fbt_probe.training import run_training
from fbt_probe.training.resume import differing, normal, recorded

RECORD_ONLY = ("fork", "fork_sha256", "corpus_sha256")  # what a run records of where it came from, not how it trains


def train_run(
    tcfg, folder: Path, stage: str, stop_at: int | None = None, fork: Path | None = None, eval_pairs: int = 16
) -> None:
    """Train a study model in `folder`, resuming the run there when it has a training state: only a
    run of this stage's own training config (a run of another recipe, seed or task mix is refused in
    one line, naming the first field that differs). `stop_at`, `fork` and `eval_pairs` (the pairs per
    cell of the run's own accuracy log) as `run_training`'s."""
    resume = (folder / "train_state.pt").is_file()
    if resume:
        saved = recorded(folder)[0]
        given = {f.name: getattr(tcfg, f.name) for f in dataclasses.fields(tcfg) if f.name not in RECORD_ONLY}
        diff = differing(saved, given)
        if diff:
            k = diff[0]
            raise FbtError(
                f"{folder / 'config.json'}: field 'train.{k}' is {normal(saved, k)!r}, the stage {stage} trains with "
                f"{normal(tcfg, k)!r}: not this study's run; pass --force {stage} to train it afresh (replaces it)"
            )
    run_training(
        tcfg,
        folder,
        resume=resume,
        force=not resume,
        progress=True,
        eval_pairs=eval_pairs,
        stop_at=stop_at,
        fork=None if resume else fork,
    )


def stage_train(cfg: ReproConfig, out: Path, name: str) -> None:
    train_run(train_config(cfg, name == "baseline"), out / "models" / name, f"train-{name}", eval_pairs=log_pairs(cfg))


def log_pairs(cfg: ReproConfig) -> int:
    """Pairs per cell of a study model's own accuracy log (its metrics.jsonl): the quick study, a
    pipeline check whose `eval` stage measures the model, logs a few; the study the default 16."""
    return 4 if cfg.quick else 16


def stage_one_pass(cfg: ReproConfig, out: Path) -> None:
    """An LM seed's shared one-pass steps: the baseline's run to the recipe's one-pass steps (models/one-pass)."""
    stop = cfg.lm_recipe["one_pass_steps"]
    train_run(lm_train_config(cfg, "baseline"), out / "models" / "one-pass", "train-one-pass", stop_at=stop)


def stage_train_lm(cfg: ReproConfig, out: Path, name: str) -> None:
    """LM `name` from the shared one-pass steps (`--fork`) to the end: bit for bit its own run from scratch."""
    train_run(lm_train_config(cfg, name), out / "models" / name, f"train-{name}", fork=out / "models" / "one-pass")


def lm_stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    key = {**ck, "corpus": cfg.corpus, "recipe": cfg.lm_recipe}
    st = [
        Stage(
            "train-one-pass",
            key,
            [out / "models" / "one-pass"],
            partial(stage_one_pass, cfg, out),
            resumable=True,
            rank=1,
        )
    ]
    for name in LM_MODELS:
        st.append(
            Stage(
                f"train-{name}",
                {**key, "schedule": LM_SCHEDULES[name]},
                [out / "models" / name],
                partial(stage_train_lm, cfg, out, name),
                after=["train-one-pass"],
                resumable=True,
                rank=1,
            )
        )
    return st


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if cfg.model or cfg.shipped:
        return []
    if is_lm(cfg):
        return lm_stages(cfg, out, ck)
    return [
        Stage(
            f"train-{name}",
            {**ck, "steps": cfg.steps},
            [out / "models" / name],
            partial(stage_train, cfg, out, name),
            resumable=True,
            rank=1,
        )
        for name in cfg.models()
    ]


def shipped_comparison(cfg: ReproConfig, out: Path, seeds=None) -> list[str]:
    """For a study that trained its own models (--train): how they compare with the shipped ones of
    the same preset -- identical bytes, or held-out standard accuracy side by side."""
    if cfg.shipped or cfg.model:
        return []
    lines = []
    for m in cfg.models():
        name = shipped_name(cfg, m)
        if name not in names():
            continue
        rec = record(name)
        mine = checkpoint_hash(out / "models" / m)
        if mine == rec["checkpoint_sha256"]:
            lines.append(
                f"The retrained {m} model is byte-identical to the shipped `ref:{name}` (sha256 {mine[:12]}...)."
            )
            continue
        ship = pd.DataFrame(rec["accuracy"]["rows"])
        ship = ship[ship["mode"] == STANDARD].groupby("task")[["correct", "n"]].sum()
        parts = []
        for task in [t for t in cfg.modes if t in ship.index]:
            p, lo, hi, _, _ = answer_accuracy(out, m, task)
            s = ship.loc[task, "correct"] / ship.loc[task, "n"]
            parts.append(
                f"{task} {p:.2f} [{lo:.2f}, {hi:.2f}] vs {s:.2f}"
                + ("" if lo - 1e-9 <= s <= hi + 1e-9 else " (outside)")
            )
        same = (
            "seed and steps"
            if (rec["seed"], rec["steps"]) == (cfg.seed, cfg.steps)
            else f"seed {rec['seed']} and {rec['steps']} steps (here {cfg.seed} and {cfg.steps})"
        )
        lines.append(
            f"The retrained {m} model differs from the shipped `ref:{name}` (trained with {same} on "
            f"{rec.get('cpu', 'another machine')}); held-out standard accuracy here vs shipped: "
            + "; ".join(parts)
            + "."
        )
    return lines


PART = Part("training", stages=stages, findings=shipped_comparison)
