"""What differs between architectures in training, looked up by `TrainConfig.arch` in `ARCHS`:
the model a run starts from, the validation losses it logs, and what `fbt-probe eval` reports.
(The objective is looked up by the model itself: `fbt_probe.training.loop.LOSSES`.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from fbt_probe.config import preset
from fbt_probe.errors import FbtError
from fbt_probe.hidden.checkpoint import is_hidden_checkpoint, load_hidden
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.hidden.config import HiddenConfig
from fbt_probe.hidden.loss import hidden_loss
from fbt_probe.hidden.model import HiddenDecodingTransformer
from fbt_probe.loading import load_model
from fbt_probe.model.meta import on_meta
from fbt_probe.model.transformer import FeedbackTransformer
from fbt_probe.training.config import TrainConfig
from fbt_probe.training.data import validation_batch
from fbt_probe.training.evaluate import loss_per_pass


def feedback_initial_model(cfg: TrainConfig, vocab: int, init: str | Path | None):
    """A fresh `cfg.preset` model (noise on the carried states from `cfg.noise`) or the checkpoint
    `init`, which must have the preset's parameter names and shapes (its vocabulary is checked
    against the tokenizer's by the caller)."""
    if init is None:
        return load_model(cfg.preset, seed=cfg.seed, d_vocab=vocab, feedback_noise=cfg.noise)
    model = load_model(str(init))
    _check_preset_shapes(model, cfg.preset, init)
    return model


def _check_preset_shapes(model, name: str, init) -> None:
    """FbtError unless `model`'s parameters have the names and shapes of preset `name` (built on the
    meta device: no memory, no initialisation)."""
    vocab = getattr(model.cfg, "d_vocab", None)
    with on_meta():
        want = {k: tuple(v.shape) for k, v in FeedbackTransformer(preset(name, d_vocab=vocab)).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if got != want:
        diff = next((k for k in want if want[k] != got.get(k)), None) or next(k for k in got if k not in want)
        raise FbtError(
            f"--init {init}: not a '{name}' model ({diff}: {got.get(diff, 'missing')} where the preset has "
            f"{want.get(diff, 'no such parameter')}); pass --preset of the model it was trained as"
        )


def hidden_initial_model(cfg: TrainConfig, vocab: int, init: str | Path | None):
    """A fresh model from `cfg.preset`, a warm start from a standard checkpoint (every E_k copied
    from its embedding), or a hidden-decoding checkpoint with the same number of streams."""
    if init is None:
        hcfg = HiddenConfig.from_base(preset(cfg.preset, d_vocab=vocab), cfg.streams, cfg.cross_stream_layers)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return HiddenDecodingTransformer(hcfg)
    if is_hidden_checkpoint(init):
        model = load_hidden(init)
        if model.cfg.n_streams != cfg.streams:
            raise FbtError(
                f"{init}: a hidden-decoding checkpoint with {model.cfg.n_streams} streams, not {cfg.streams}"
            )
        return model
    return HiddenDecodingTransformer.from_base(load_model(str(init)), cfg.streams, cfg.cross_stream_layers)


@torch.no_grad()
def hidden_val_loss(model, cfg: TrainConfig, tokenizer, max_passes: int = 1, rows: int = 16) -> dict:
    """Eq.-2 loss on packed held-out documents (the feedback runs' `val_loss_pass1` counterpart);
    there are no feedback passes, so `max_passes` is ignored."""
    tokens, targets, weights = validation_batch(cfg, tokenizer, rows=rows)
    return {"val_loss": hidden_loss(model, tokens, targets, (weights > 0).float()).item()}


@dataclass(frozen=True)
class Arch:
    initial_model: Callable[[TrainConfig, int, str | Path | None], torch.nn.Module]  # (cfg, vocab, init)
    val_losses: Callable[..., dict]  # (model, cfg, tokenizer, max_passes) -> {name: loss}
    eval_modes: tuple[str, ...] | None  # decodings of `fbt-probe eval` (None: answer_accuracy's default)
    val_label: str  # how `fbt-probe eval` names the losses
    kind: str | None = None  # how a model card names it (None: latent feedback, or its no-feedback baseline)
    needs_init: bool = False  # trained from a checkpoint its config does not record (no retrain line of its own)


ARCHS: dict[str, Arch] = {
    "feedback": Arch(feedback_initial_model, loss_per_pass, None, "validation loss per pass: "),
    HIDDEN_ARCH: Arch(
        hidden_initial_model,
        hidden_val_loss,
        ("standard",),
        "validation loss (one pass, last streams): ",
        kind="Hidden Decoding (n streams per token, one pass)",
        needs_init=True,
    ),
}
