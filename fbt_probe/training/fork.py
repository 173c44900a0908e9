"""Forking a run: start from another run's step-N checkpoint and optimizer state, where the two
configs are the same but for their pass schedule and every step up to N trained one pass (the
baseline's steps, or a feedback run's `one_pass_steps`). Those N steps are then this run's, bit
for bit, so the baseline and the feedback runs of one seed share them instead of training them
three times (`one_pass_steps`: the paper's runs too start multi-pass training from a one-pass
checkpoint)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, sha256_file
from fbt_probe.tasks.tokenizer import tokenizer_json
from fbt_probe.training.checkpoint import load_run
from fbt_probe.training.config import TrainConfig

# what may differ between a run and the run it forks: the passes (the forked steps all trained one)
FREE = {"schedule", "baseline", "one_pass_steps", "fork", "fork_sha256"}


@dataclass
class Forked:
    model: object
    optimizer: dict
    step: int
    sha256: str


def load_fork(source, cfg: TrainConfig, tokenizer) -> Forked:
    """The checkpoint of run folder `source` to continue as a run of `cfg`, checked for exactness."""
    source = Path(source)
    model, saved, opt_state, step = load_run(source)
    where = f"--fork {source}"
    a, b = saved.to_dict(), cfg.to_dict()
    differ = sorted(k for k in set(a) | set(b) if k not in FREE and a.get(k) != b.get(k))
    if differ:
        k = differ[0]
        raise FbtError(
            f"{where}: field '{k}' is {a.get(k)!r} there and {b.get(k)!r} here; a fork continues a run of the "
            "same config but for its pass schedule"
        )
    one_pass_there = saved.steps if saved.baseline else saved.one_pass_steps
    if not step <= min(one_pass_there, cfg.one_pass_steps if not cfg.baseline else cfg.steps):
        raise FbtError(
            f"{where}: the run is at step {step}; a fork needs every step so far trained one pass in both runs "
            f"(here --one-pass-steps {cfg.one_pass_steps}, there {one_pass_there}): pass --one-pass-steps {step} or more"
        )
    if step >= cfg.steps:
        raise FbtError(f"{where}: the run is at step {step}, not before this run's last step ({cfg.steps})")
    if (source / "tokenizer.json").read_text() != tokenizer_json(tokenizer):
        raise FbtError(f"{source / 'tokenizer.json'}: not this run's tokenizer")
    model.cfg = model.cfg.replace(feedback_noise=cfg.noise)
    return Forked(model, opt_state, step, sha256_file(source / "model.safetensors"))


def copy_log(source: Path, out: Path, step: int) -> None:
    """The forked run's log lines up to `step`, as the first lines of this run's."""
    path = Path(source) / "metrics.jsonl"
    lines = [l for l in path.read_text().splitlines() if l and json.loads(l)["step"] <= step] if path.is_file() else []
    with atomic_path(out / "metrics.jsonl") as tmp:
        tmp.write_text("".join(l + "\n" for l in lines))
