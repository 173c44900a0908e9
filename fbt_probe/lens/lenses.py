"""What each depth would predict: the logit lens and a tuned lens (Belrose et al. 2023), our own small
implementation for a model whose input may be its own previous top state.

logit lens at depth d:  logits_d = E · RMSNorm_final(resid_d)          (final norm + tied unembedding)
tuned lens at depth d:  logits_d = E · RMSNorm_final(resid_d + A_d resid_d + b_d)
One affine translator per depth d < L, started at the identity (A_d = 0, b_d = 0, so it starts as the
logit lens); at the top depth the translator is the identity, and both lenses equal the model's
logits there exactly. Translators are trained with KL(final logits ‖ lens logits) on activations of
held-out task text.
"""

from __future__ import annotations

import torch
from torch import nn

from fbt_probe.engine.hooks import silent


def logit_lens(model, resid: torch.Tensor) -> torch.Tensor:
    """[..., D] residual stream -> [..., d_vocab] logits through the final norm and the tied unembedding
    (the model's own `_top` operations, hooks silent)."""
    return model.head(model.ln_final(resid, silent))


class TunedLens(nn.Module):
    """Translators for depths 0..L-1 (depth L is the identity)."""

    def __init__(self, d_model: int, n_layers: int, dtype=torch.float32):
        super().__init__()
        self.n_layers = n_layers
        self.translators = nn.ModuleList(nn.Linear(d_model, d_model, dtype=dtype) for _ in range(n_layers))
        with torch.no_grad():
            for t in self.translators:
                t.weight.zero_()
                t.bias.zero_()

    def translate(self, resid: torch.Tensor, depth: int) -> torch.Tensor:
        return resid if depth >= self.n_layers else resid + self.translators[depth](resid)

    def forward(self, model, resid: torch.Tensor, depth: int) -> torch.Tensor:
        return logit_lens(model, self.translate(resid, depth))


def kl_to(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per-row KL(softmax(target) ‖ softmax(logits)) in nats; [..., V] x2 -> [...]."""
    dt = torch.float64 if torch.float64 in (target_logits.dtype, logits.dtype) else torch.float32
    lp = torch.log_softmax(target_logits.to(dt), -1)
    lq = torch.log_softmax(logits.to(dt), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def fit_tuned_lens(
    model,
    acts: dict[int, torch.Tensor],
    target: torch.Tensor,
    steps: int = 300,
    lr: float = 1e-3,
    batch: int = 2048,
    seed: int = 0,
) -> tuple[TunedLens, list[float]]:
    """Train one translator per depth. acts: {depth: [N, D]} residuals of N positions; target: [N, V]
    the logits those positions produced. Minibatches of `batch` positions drawn with `seed`; returns the
    lens and the mean training KL (over depths < L) per step."""
    D = next(iter(acts.values())).shape[-1]
    lens = TunedLens(D, model.cfg.n_layers, dtype=next(iter(acts.values())).dtype).to(target.device)
    opt = torch.optim.Adam(lens.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    N = target.shape[0]
    depths = [d for d in sorted(acts) if d < model.cfg.n_layers]
    history = []
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():  # only the translators learn
        p.requires_grad_(False)
    try:
        with torch.enable_grad():
            for _ in range(steps):
                idx = torch.randint(0, N, (min(batch, N),), generator=gen).to(target.device)
                opt.zero_grad()
                loss = sum(kl_to(target[idx], lens(model, acts[d][idx], d)).mean() for d in depths) / max(
                    len(depths), 1
                )
                loss.backward()
                opt.step()
                history.append(float(loss.detach()))
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)
    return lens, history
