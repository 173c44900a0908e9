"""The latent-feedback model: backbone, fusion, modes, decoding, checkpoints, Qwen3 interop."""

from fbt_probe.model.decoding import generate
from fbt_probe.model.modes import Mode, parse_mode, parse_modes
from fbt_probe.model.transformer import FeedbackTransformer, HookContext

__all__ = ["FeedbackTransformer", "HookContext", "Mode", "generate", "parse_mode", "parse_modes"]
