"""Hidden Decoding checkpoints: the same folder layout as the feedback model's (config.json with
`fbt_probe_format`, model.safetensors, tokenizer.json), with `arch: hidden-decoding` in `model`."""
from __future__ import annotations

from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.hidden.config import ARCH, HiddenConfig
from fbt_probe.io import read_json
from fbt_probe.model.checkpoint import FORMAT, save_checkpoint

__all__ = ["is_hidden_checkpoint", "load_hidden", "save_checkpoint"]


def is_hidden_checkpoint(folder: str | Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    meta = read_json(cfg, "checkpoint config")
    return meta.get("fbt_probe_format") == FORMAT and (meta.get("model") or {}).get("arch") == ARCH


def load_hidden(folder: str | Path, device: str = "cpu"):
    from fbt_probe.hidden.model import HiddenDecodingTransformer
    from fbt_probe.model.checkpoint import build_from_weights

    folder = Path(folder)
    meta = read_json(folder / "config.json", "checkpoint config")
    if (meta.get("model") or {}).get("arch") != ARCH:
        raise FbtError(f"{folder / 'config.json'}: not a hidden-decoding checkpoint (model.arch is not '{ARCH}')")
    cfg = HiddenConfig.from_dict(meta["model"], source=str(folder / "config.json")).replace(device=device)
    return build_from_weights(HiddenDecodingTransformer, cfg, folder / "model.safetensors").to(device).eval()
