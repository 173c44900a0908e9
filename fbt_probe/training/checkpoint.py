"""Run folders: config.json (model + train config + provenance), model.safetensors, tokenizer.json,
train_state.pt (optimizer state and step, for resume) and metrics.jsonl."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import legacy_version, save_checkpoint
from fbt_probe.io import atomic_path, read_json, sha256_file
from fbt_probe.loading import CHECKPOINT_LOADERS
from fbt_probe.provenance import provenance
from fbt_probe.reference import resolve
from fbt_probe.training.config import TrainConfig


def save_run(
    model, opt, cfg: TrainConfig, out: Path, step: int, world_size: int = 1, device: str = "cpu", curriculum=None
) -> None:
    """Write the run's checkpoint and train state; `opt` an optimizer or its (full) state dict,
    `world_size` the processes that trained it and `device` where (config.json's provenance);
    `curriculum` the steps at which the k curriculum advanced (train state field `curriculum`).
    Every tensor is written from the CPU, so a run trained on a GPU loads and resumes on a CPU."""
    # torch.save names the zip's records after the file it writes to (here a random temporary name);
    # a buffer's records are always "archive/...", so identical runs write identical bytes
    buffer = io.BytesIO()
    state = tree_map(
        lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, opt if isinstance(opt, dict) else opt.state_dict()
    )
    extra = {} if curriculum is None else {"curriculum": [int(s) for s in curriculum]}
    torch.save({"step": step, "optimizer": state, **extra}, buffer)
    with atomic_path(out / "train_state.pt") as tmp:
        tmp.write_bytes(buffer.getvalue())
    tok = out / "tokenizer.json"
    save_checkpoint(
        model,
        out,
        None,
        extra={
            "train": cfg.to_dict(),
            "step": step,
            "tokenizer_sha256": _sha(tok),
            "provenance": provenance(seed=cfg.seed, world_size=world_size, device=device),
        },
    )


def _sha(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None


def load_trained(source) -> tuple:
    """(model, TrainConfig, folder) of a run folder or a shipped `ref:<name>` (verified), without the
    train state: what evaluation and diagnostics need (a shipped model has no optimizer state)."""

    out = Path(resolve(str(source)))
    meta = read_json(out / "config.json", "run config")
    if not isinstance(meta, dict) or "train" not in meta:
        raise FbtError(f"{out / 'config.json'}: field 'train' missing (not a training run folder)")
    cfg = TrainConfig.from_dict(
        meta["train"],
        source=f"{out / 'config.json'}: field 'train'",
        legacy=legacy_version(meta.get("fbt_probe_format")) == 1,
    )  # train fields changed only after /1
    model = CHECKPOINT_LOADERS[cfg.arch](out)
    if meta.get("tokenizer_sha256") != _sha(out / "tokenizer.json"):
        raise FbtError(f"{out / 'tokenizer.json'}: does not match the tokenizer the run was trained with")
    return model, cfg, out


def load_run(out: Path):
    """(model, TrainConfig, optimizer state dict, step) of a run folder, checked for consistency."""
    model, cfg, _ = load_trained(out)
    meta = read_json(out / "config.json", "run config")
    state_path = out / "train_state.pt"
    if not state_path.is_file():
        raise FbtError(f"{state_path}: train state not found (cannot resume)")
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt pickle/zip
        raise FbtError(f"{state_path}: corrupt train state ({type(exc).__name__})") from None
    check_train_state(state, state_path)
    if state["step"] != meta.get("step"):
        raise FbtError(f"{out}: train_state.pt is at step {state['step']} but config.json at {meta.get('step')}")
    return model, cfg, state["optimizer"], state["step"]


def check_train_state(state, path: Path) -> None:
    """The structure `save_run` writes: {'step': int, 'optimizer': an optimizer state dict}."""

    def bad(what: str):
        return FbtError(f"{path}: {what} (not a train state fbt-probe wrote; cannot resume)")

    if not isinstance(state, dict):
        raise bad(f"expected an object with 'step' and 'optimizer', got a {type(state).__name__}")
    for key in ("step", "optimizer"):
        if key not in state:
            raise bad(f"field '{key}' missing")
    if isinstance(state["step"], bool) or not isinstance(state["step"], int) or state["step"] < 0:
        raise bad(f"field 'step' must be an integer >= 0, got {state['step']!r}")
    opt = state["optimizer"]
    if not isinstance(opt, dict):
        raise bad(f"field 'optimizer' must be an optimizer state, got a {type(opt).__name__}")
    for key, kind in (("state", dict), ("param_groups", list)):
        if not isinstance(opt.get(key), kind):
            raise bad(f"field 'optimizer.{key}' missing or not a {kind.__name__}")
    if not opt["param_groups"] or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) for g in opt["param_groups"]
    ):
        raise bad("field 'optimizer.param_groups' must list groups with their 'params'")
    at = state.get("curriculum", [])
    if not isinstance(at, list) or not all(isinstance(s, int) and 0 < s <= state["step"] for s in at):
        raise bad("field 'curriculum' must list the steps (1..step) at which the k curriculum advanced")


def load_curriculum(out: Path) -> list[int]:
    """The steps at which the run's k curriculum advanced, as its train state records them."""
    state = torch.load(Path(out) / "train_state.pt", map_location="cpu", weights_only=True)
    return list(state.get("curriculum", []))


def truncate_metrics(out: Path, step: int) -> None:
    """Drop log lines past `step` (written after the last checkpoint of an interrupted run)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return
    keep = [l for l in path.read_text().splitlines() if l and json.loads(l)["step"] <= step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(l + "\n" for l in keep))
