"""Checkpoint folders of our own: config.json (+ `fbt_probe_format`), model.safetensors, tokenizer.json."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fbt_probe.config import ModelConfig
from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, read_json, sha256_file, write_json
from fbt_probe.model.meta import on_meta
from fbt_probe.model.transformer import FeedbackTransformer

FORMAT = "fbt-probe/3"
"""config.json records every field of the model's config class (`model.arch` names the class when
it is not the plain `ModelConfig`; and every TrainConfig field, for a run). Records written while
every config carried the nanochat extras hold them at identity values: `ModelConfig.from_format_3`
drops those."""
LEGACY_FORMAT = "fbt-probe/1"  # written before qk_norm_init / fusion_norm_init existed: config.LEGACY_MODEL_DEFAULTS
FORMAT_2 = "fbt-probe/2"  # the fields of format 1 and those two
FORMATS = (FORMAT, FORMAT_2, LEGACY_FORMAT)


def legacy_version(fmt) -> int:
    """The version of format `fmt` (1, 2 or 3), which `ModelConfig.from_dict` reads it by."""
    return {LEGACY_FORMAT: 1, FORMAT_2: 2, FORMAT: 3}.get(fmt, 0)


def save_checkpoint(
    model, folder: str | Path, tokenizer_path: str | Path | None = None, extra: dict | None = None
) -> Path:
    """Write (atomically, file by file) config.json, model.safetensors and, if given, tokenizer.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
    if tokenizer_path is not None:
        src = Path(tokenizer_path)
        if src.resolve() != (folder / "tokenizer.json").resolve():
            with atomic_path(folder / "tokenizer.json") as tmp:
                tmp.write_bytes(src.read_bytes())
    # the tensors are written from the CPU, so the config says cpu whatever device the model was on
    write_json(
        folder / "config.json",
        {"fbt_probe_format": FORMAT, "model": model.cfg.replace(device="cpu").to_dict(), **(extra or {})},
    )
    return folder


def is_own_checkpoint(folder: Path) -> bool:
    cfg = Path(folder) / "config.json"
    return cfg.is_file() and _meta(cfg).get("fbt_probe_format") in FORMATS


def _meta(path: Path) -> dict:
    meta = read_json(path, "checkpoint config")
    if not isinstance(meta, dict):
        raise FbtError(f"{path}: expected a JSON object")
    return meta


def read_config(folder: Path, config_cls=ModelConfig) -> tuple[dict, "ModelConfig"]:
    """(config.json as a dict, its model config), complete or a one-line error naming the missing field."""
    path = Path(folder) / "config.json"
    meta = _meta(path)
    fmt = meta.get("fbt_probe_format")
    if fmt not in FORMATS:
        raise FbtError(
            f"{path}: field 'fbt_probe_format' is {fmt!r}; expected one of {list(FORMATS)} "
            "(not an fbt-probe checkpoint, or written by another version)"
        )
    if "model" not in meta:
        raise FbtError(f"{path}: field 'model' missing (not an fbt-probe checkpoint)")
    return meta, config_cls.from_dict(meta["model"], source=str(path), legacy=legacy_version(fmt))


def load_checkpoint(folder: str | Path, device: str = "cpu", model_cls=FeedbackTransformer, config_cls=ModelConfig):
    """The model of a checkpoint folder of ours (a `model_cls` of a `config_cls`), in eval mode."""
    folder = Path(folder)
    cfg = read_config(folder, config_cls)[1].replace(device=device)
    return build_from_weights(model_cls, cfg, folder / "model.safetensors").to(device).eval()


def build_from_weights(model_cls, cfg, weights: Path):
    """`model_cls(cfg)` with the tensors of `weights`, checked against the config (one-line errors)."""
    state = read_weights(weights)
    _check_shapes(model_cls, cfg, state, weights)  # before the model is allocated: a config may ask for terabytes
    model = model_cls(cfg)
    _load_state(model, state, weights)
    return model


def _check_shapes(model_cls, cfg, state: dict[str, torch.Tensor], weights: Path) -> None:
    """The config against the tensors, without allocating the model: first the layer count (a
    model of 10^9 layers takes long to build even empty), then every shape of a model built on
    torch's meta device (no memory)."""
    layers = {k.split(".")[1] for k in state if k.startswith("blocks.")}
    n = getattr(cfg, "n_layers", None)
    if layers and isinstance(n, int) and n != len(layers):
        raise FbtError(
            f"{weights.parent / 'config.json'}: field 'n_layers' is {n}, but {weights.name} holds {len(layers)} "
            "layers; the config does not describe these weights"
        )
    try:
        with on_meta():
            shell = model_cls(cfg)
    except FbtError:
        raise
    except Exception:  # a model family that cannot be built without memory: the shapes are checked after
        return
    _compare(shell.state_dict(), state, weights)


def read_weights(weights: Path) -> dict[str, torch.Tensor]:
    """The tensors of a model.safetensors file; a one-line FbtError if it is missing or corrupt."""
    if not weights.is_file():
        raise FbtError(f"{weights}: model weights not found")
    try:
        return load_file(str(weights))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise FbtError(f"{weights}: corrupt safetensors file ({exc})") from None


def _load_state(model, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = model.state_dict()
    _compare(expected, state, source)
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def _compare(expected: dict, state: dict[str, torch.Tensor], source: Path) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise FbtError(
            f"{source}: tensors do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, t in state.items():
        if t.shape != expected[name].shape:
            raise FbtError(
                f"{source}: tensor '{name}' has shape {tuple(t.shape)}, config expects {tuple(expected[name].shape)}"
            )


def checkpoint_hash(folder: str | Path) -> str:
    """sha256 of model.safetensors: the model identity recorded in every result's provenance
    (`fbt_probe.loading.checkpoint_hash` also takes a nanochat folder)."""
    return sha256_file(Path(folder) / "model.safetensors")
