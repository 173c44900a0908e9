"""`train --resume` continues the recorded run: the options a resume names are checked against the
run's config.json, and the steps default to the recorded total."""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.io import read_json
from fbt_probe.marker import MARKER
from fbt_probe.training.config import TrainConfig


class RunFinished(Exception):
    """The run to resume has trained every step it records (nothing to do)."""


def recorded(out: Path) -> tuple[TrainConfig, int]:
    """(TrainConfig, step) config.json of run folder `out` records."""
    out = Path(out)
    path = out / "config.json"
    if not path.is_file():
        hint = "; it stopped before its first checkpoint: start it again with --force" if unfinished_run(out) else ""
        left = interrupted_replacement(out)
        if left is not None:  # a forced run trains beside the old folder and is swapped in only when finished
            hint = (
                f"; a --force run of it was interrupted at its step-{left[1]} checkpoint in {left[0]}: "
                f"move that folder over {out} to resume it"
            )
        raise FbtError(f"{out}: no run to resume (config.json missing){hint}")
    meta = read_json(path, "run config")
    if not isinstance(meta, dict) or "train" not in meta:
        raise FbtError(f"{path}: field 'train' missing (not a training run folder)")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise FbtError(f"{path}: field 'step' missing or not an integer >= 0 (got {step!r})")
    return TrainConfig.from_dict(meta["train"], source=f"{path}: field 'train'"), step


def interrupted_replacement(out: Path) -> tuple[Path, int] | None:
    """(folder, step) of the latest checkpoint a `--force` run of `out` left in its temporary sibling
    when it was killed before the swap (the folder `fbt_probe.io.temp_sibling` names), or None."""
    found = []
    for tmp in Path(out).parent.glob(f".{glob.escape(Path(out).name)}.*.tmp"):
        try:
            found.append((recorded(tmp)[1], tmp))
        except FbtError:  # no checkpoint there yet, or not a run
            continue
    if not found:
        return None
    step, tmp = max(found)
    return tmp, step


def resume_config(out: Path, given: dict, steps: int | None) -> TrainConfig:
    """The config a resume of `out` trains with: the recorded one, to `steps` (default: the recorded
    total; a larger total trains on past it). `given`: the train config fields the command named;
    one that differs from the record is refused, named by its option. Raises `RunFinished` when the
    run has trained every step it would train to."""
    saved, step = recorded(out)
    where = f"--resume {out}"
    differ = differing(saved, given)
    if differ:
        shown = ", ".join(
            f"--{f.replace('_', '-')} {_show(given[f])} (recorded: {_show(normal(saved, f))})" for f in differ
        )
        raise FbtError(
            f"{where}: {shown}: a resume continues the recorded run; leave the option out, "
            "or train a new run in another --out"
        )
    if steps is not None and steps < saved.steps:
        raise FbtError(
            f"{where}: --steps {steps}: the run records {saved.steps} steps; resume trains to them "
            "(leave --steps out) or past them"
        )
    total = saved.steps if steps is None else steps
    if step >= total:
        raise RunFinished(
            f"{out}: the run is finished ({step} of {total} steps); pass --steps N (more than {total}) to train on"
        )
    return saved if total == saved.steps else dataclasses.replace(saved, steps=total)


def differing(saved: TrainConfig, given: dict) -> list[str]:
    """The fields of `given` whose value differs from the record's, compared as the run's own values
    are (a schedule by its K:p list, so 'paper' equals the list it names)."""
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(TrainConfig)})
    assert not unknown, unknown
    try:  # the record with the named values, normalised as the run's own were ('paper' = its K:p list)
        probe = dataclasses.replace(saved, **given)
    except FbtError:  # the named values do not make a valid config with the record's: compare them as given
        return [f for f in given if given[f] != getattr(saved, f)]
    return [f for f in given if normal(probe, f) != normal(saved, f)]


def normal(cfg: TrainConfig, field: str):
    return str(cfg.pass_mix) if field == "schedule" else getattr(cfg, field)


def _show(value) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}:{v:g}" for k, v in value.items())
    return str(value)


RUN_ENTRIES = {"tokenizer.json", "metrics.jsonl", MARKER}
RUN_FILES = {"tokenizer.json", "metrics.jsonl", "config.json", "model.safetensors", "train_state.pt"}


def unfinished_run(folder: Path) -> bool:
    """`folder` is a training run stopped before its first checkpoint: the tokenizer the trainer
    writes first, perhaps its log, and temporary files (hidden, `.tmp`) of a checkpoint being written."""
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "tokenizer.json").is_file():
        return False
    return all(e.name in RUN_ENTRIES or e.name.startswith(".") and e.name.endswith(".tmp") for e in folder.iterdir())
