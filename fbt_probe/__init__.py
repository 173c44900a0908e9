"""fbt-probe: interpretability toolkit for latent-feedback ("full-bandwidth") transformers."""
from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def load_model(source: str | Path, device: str = "cpu", seed: int = 0, **overrides):
    """A preset name (random init from `seed`, config fields overridable), `ref:<name>` (a reference
    model shipped with the package, `fbt-probe model refs`), a checkpoint folder of
    ours (latent-feedback or Hidden Decoding), a nanochat latent-feedback checkpoint folder
    (model_<step>.pt + meta_<step>.json, the last step; `fbt_probe.model.nanochat_import`), or a
    Qwen3-format folder (config.json + safetensors; fresh fusion weights are added). Returned in eval mode (no training noise on carried states);
    training calls `.train()` itself."""
    import torch

    from fbt_probe.config import PRESETS, check_device, preset
    from fbt_probe.errors import FbtError
    from fbt_probe.model.checkpoint import is_own_checkpoint, load_checkpoint
    from fbt_probe.model.transformer import FeedbackTransformer

    check_device(device)
    from fbt_probe.reference import resolve

    source = resolve(source)  # ref:<name>: a shipped reference model, hashes verified
    if isinstance(source, str) and source in PRESETS:
        cfg = preset(source, device=device, **overrides)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return FeedbackTransformer(cfg).to(device).eval()
    folder = Path(source)
    if not folder.is_dir():
        raise FbtError(f"{source}: neither a preset ({', '.join(sorted(PRESETS))}) nor a model folder")
    from fbt_probe.hidden.checkpoint import is_hidden_checkpoint, load_hidden

    if is_hidden_checkpoint(folder):  # a Hidden Decoding run (DESIGN.md §9)
        return load_hidden(folder, device=device)
    if is_own_checkpoint(folder):
        return load_checkpoint(folder, device=device)
    model = _load_other_kind(folder, device, seed)
    if model is not None:
        return model
    from fbt_probe.model.hf import import_qwen3

    return import_qwen3(folder, seed=seed).to(device).eval()


def _load_other_kind(folder: Path, device: str, seed: int):
    """Checkpoint kinds imported on the fly (None: not one of them). One place to add a kind."""
    from fbt_probe.model.nanochat_import import is_nanochat_folder, load_nanochat

    if is_nanochat_folder(folder):
        return load_nanochat(folder, device=device, seed=seed).eval()
    return None
