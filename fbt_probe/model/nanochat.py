"""The backbone extras of nanochat-style checkpoints (`fbt_probe.formats.nanochat` reads them), on
the `FeedbackTransformer`. Each is a `ModelConfig` field whose default is the identity, so a model
that leaves them alone has none of these parameters or hook points and computes exactly what it did.

| field              | parameters                            | hook points                          |
|--------------------|---------------------------------------|--------------------------------------|
| embed_norm         | -                                     | hook_embed_normed [batch, pos, d_model] |
| smear              | smear_gate.weight [1, c], smear_lambda [1] | hook_smear [batch, pos, d_model] (the smeared plain input) |
| x0_mixing          | resid_lambdas [L], x0_lambdas [L]     | blocks.{l}.hook_resid_mix            |
| backout_layer      | backout_lambda [1]                    | hook_backout (the stream ln_final reads) |
| tie_embeddings off | unembed.weight [d_vocab, d_model]     | -                                    |
| value_embed_layers | blocks.{l}.attn.value_embed / ve_gate | blocks.{l}.attn.hook_value_embed     |

Where a state is carried, the fused vector replaces the whole plain input (norm and smear included)
and is x0 of every layer's mixing: x0 is what `blocks.0.hook_resid_pre` holds, so a patch there
reaches every layer, as a change of the model's input does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.errors import FbtError


def add_extras(model, cfg) -> None:
    """Register the parameters and hook points of the configured extras on `model`."""
    D, V, L = cfg.d_model, cfg.d_vocab, cfg.n_layers
    if not cfg.tie_embeddings:
        model.unembed = nn.Linear(D, V, bias=False)
    if cfg.embed_norm:
        model.hook_embed_normed = HookPoint()  # [batch, pos, d_model]  weightless RMSNorm of e_t
    if cfg.smear:
        model.smear_gate = nn.Linear(cfg.smear_channels, 1, bias=False)
        model.smear_lambda = nn.Parameter(torch.zeros(1))
        model.hook_smear = HookPoint()  # [batch, pos, d_model]  x_t + λ σ(W_s x_t[:c]) x_{t-1}: the plain input
    if cfg.x0_mixing:
        model.resid_lambdas = nn.Parameter(torch.ones(L))
        model.x0_lambdas = nn.Parameter(torch.zeros(L))
    if cfg.backout_layer is not None:
        model.backout_lambda = nn.Parameter(torch.zeros(1))
        model.hook_backout = HookPoint()  # [batch, pos, d_model]  h^L - λ_b · (output of block backout_layer)


@torch.no_grad()
def init_extras(model) -> None:
    """The extras' scalars at their identity values (matrices are drawn with the others)."""
    cfg = model.cfg
    if cfg.smear:
        model.smear_lambda.zero_()
    if cfg.x0_mixing:
        model.resid_lambdas.fill_(1.0)
        model.x0_lambdas.zero_()
    if cfg.backout_layer is not None:
        model.backout_lambda.zero_()


def _norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), None, eps)


def plain_input(model, tokens: torch.Tensor, e: torch.Tensor, start: int, cache, hk) -> torch.Tensor:
    """The layer-0 input without feedback of positions start..: norm(e) (if `embed_norm`), then the
    smear of the previous position's normed embedding into each position >= 1. A chunk that starts
    after position 0 reads the previous token from the KV cache."""
    cfg = model.cfg
    x = e
    if cfg.embed_norm:
        x = hk(model.hook_embed_normed, _norm(e, cfg.rms_eps))
    if not cfg.smear:
        return x
    if start > 0:
        tok = None if cache is None else cache.token_at(start - 1)
        if tok is None:
            raise FbtError(
                f"smear: position {start} needs the token before it, which the KV cache does not hold "
                "(build the cache with the model's own prefill)"
            )
        before = model.token_embedding(tok[:, None])
        before = _norm(before, cfg.rms_eps) if cfg.embed_norm else before
        prev, cur = torch.cat([before, x[:, :-1]], dim=1), x
        return hk(model.hook_smear, cur + _smear_gate(model, cur) * prev)
    if x.shape[1] == 1:
        return hk(model.hook_smear, x)
    cur = x[:, 1:]
    return hk(model.hook_smear, torch.cat([x[:, :1], cur + _smear_gate(model, cur) * x[:, :-1]], dim=1))


def _smear_gate(model, x: torch.Tensor) -> torch.Tensor:
    """[batch, pos, 1] λ·σ(W_s x[..., :c])."""
    return model.smear_lambda * torch.sigmoid(model.smear_gate(x[..., : model.cfg.smear_channels]))


def trunk_with_extras(
    model, x: torch.Tensor, start: int, cache, hk, tokens: torch.Tensor | None, stop: int | None = None
) -> torch.Tensor:
    """Blocks 0..stop-1 (default all) with x0 mixing and / or backout (the model's `_trunk`
    otherwise); the backout applies once every block has run."""
    cfg = model.cfg
    x0, kept = None, None
    stop = cfg.n_layers if stop is None else stop
    for l, block in enumerate(model.blocks[:stop]):
        if cfg.x0_mixing:
            x = hk(block.hook_resid_pre, x)
            x0 = x if x0 is None else x0
            x = block(x, start, cache, hk, tokens, mix=(model.resid_lambdas[l], model.x0_lambdas[l], x0))
        else:
            x = block(x, start, cache, hk, tokens)
        if l == cfg.backout_layer:
            kept = x
    if kept is not None and stop == cfg.n_layers:
        x = hk(model.hook_backout, x - model.backout_lambda * kept)
    return x
