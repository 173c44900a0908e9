"""What the shared training loop needs for a Hidden Decoding run: the model to start from, the
single-pass loss of eq. 2 and a validation loss (there are no feedback passes to report)."""
from __future__ import annotations

from pathlib import Path

import torch

from fbt_probe.errors import FbtError


def hidden_loss(model, tokens: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Eq. 2: next-token cross-entropy read only at each token's last stream (`model(tokens)` is
    already those logits), with the base model's targets and loss weights."""
    from fbt_probe.training.loop import weighted_ce

    return weighted_ce(model(tokens), targets, weights)


def initial_model(cfg, vocab: int, init: str | Path | None):
    """A fresh model from `cfg.preset`, a warm start from a standard checkpoint (every E_k copied
    from its embedding), or a hidden-decoding checkpoint with the same number of streams."""
    import fbt_probe as fp
    from fbt_probe.hidden.checkpoint import is_hidden_checkpoint, load_hidden
    from fbt_probe.hidden.config import HiddenConfig
    from fbt_probe.hidden.model import HiddenDecodingTransformer

    if init is None:
        from fbt_probe.config import preset

        hcfg = HiddenConfig.from_base(preset(cfg.preset, d_vocab=vocab), cfg.streams, cfg.cross_stream_layers)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return HiddenDecodingTransformer(hcfg)
    if is_hidden_checkpoint(init):
        model = load_hidden(init)
        if model.cfg.n_streams != cfg.streams:
            raise FbtError(f"{init}: a hidden-decoding checkpoint with {model.cfg.n_streams} streams, not {cfg.streams}")
        return model
    return HiddenDecodingTransformer.from_base(fp.load_model(str(init)), cfg.streams, cfg.cross_stream_layers)


@torch.no_grad()
def val_loss(model, cfg, tokenizer, rows: int = 16) -> dict:
    """Eq.-2 loss on packed held-out documents (the feedback runs' `val_loss_pass1` counterpart)."""
    from fbt_probe.training.evaluate import validation_batch

    tokens, targets, weights = validation_batch(cfg, tokenizer, rows=rows)
    return {"val_loss": hidden_loss(model, tokens, targets, (weights > 0).float()).item()}
