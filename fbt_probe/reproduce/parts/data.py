"""The probe datasets (stage `data`): the appendix-F tasks as minimal pairs, drawn from contexts held
out of the training of every study model, in the study's tokenizer."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

from fbt_probe.io import atomic_dir
from fbt_probe.reproduce.config import ReproConfig, study_contexts
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.part import Part
from fbt_probe.reproduce.stages import Stage
from fbt_probe.tasks import generate, load_spec, write_dataset
from fbt_probe.training.data import heldout


def stage_data(cfg: ReproConfig, out: Path) -> None:
    """Probe datasets from contexts held out of training (the same hash split the trainer uses)."""
    tok, ho = study_tokenizer(cfg), study_contexts(cfg, heldout)
    with atomic_dir(out / "data", force=True) as tmp:
        for task, knobs in cfg.knobs.items():
            spec = dataclasses.replace(load_spec(task), length_grid=tuple(knobs))
            df = generate(spec, groups=cfg.groups[task], seed=cfg.seed + 101, tokenizer=tok, contexts=ho)
            write_dataset(df, tmp, tok, force=True)


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    key = {**ck, "groups": cfg.groups, "knobs": cfg.knobs, "protocol": "appendix-F"}
    return [Stage("data", key, [out / "data"], partial(stage_data, cfg, out), rank=0)]


PART = Part("data", stages=stages)
