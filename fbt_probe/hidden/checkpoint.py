"""Hidden Decoding checkpoints: the same folder layout as the feedback model's (config.json with
`fbt_probe_format`, model.safetensors, tokenizer.json), with `arch: hidden-decoding` in `model`."""

from __future__ import annotations

from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import FORMATS, build_from_weights, read_config, save_checkpoint
from fbt_probe.hidden.config import ARCH, HiddenConfig
from fbt_probe.hidden.model import HiddenDecodingTransformer
from fbt_probe.io import read_json

__all__ = ["is_hidden_checkpoint", "load_hidden", "save_checkpoint"]


def is_hidden_checkpoint(folder: str | Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    meta = read_json(cfg, "checkpoint config")
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        return False
    return meta.get("fbt_probe_format") in FORMATS and meta["model"].get("arch") == ARCH


def load_hidden(folder: str | Path, device: str = "cpu"):
    folder = Path(folder)
    if not is_hidden_checkpoint(folder):
        raise FbtError(f"{folder / 'config.json'}: not a hidden-decoding checkpoint (model.arch is not '{ARCH}')")
    cfg = read_config(folder, HiddenConfig)[1].replace(device=device)
    return build_from_weights(HiddenDecodingTransformer, cfg, folder / "model.safetensors").to(device).eval()
