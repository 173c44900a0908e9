"""The GLU cross fusion (eq. 3-4): u_t = RMSNorm_f((W_U h_{t-1}) ⊙ σ(W_G e_t)).

The carried state is on the value path and the token on the gate, so dropping the state drops
the whole input (a symmetric e + W h could learn W -> 0 and ignore the feedback).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.config import ModelConfig
from fbt_probe.engine import fast as fast_path
from fbt_probe.engine.fast import Hk
from fbt_probe.model.components import RMSNorm
from fbt_probe.numerics import fusion_reference


class Fusion(nn.Module):
    """New parameters: W_U, W_G (2·D², no bias) and the fusion norm's D weights.

    Initialisation: W_U, W_G ~ N(0, init_std) like every other matrix (so σ(W_G e) starts near 0.5);
    the fusion norm's weight starts at the mean RMS of the embedding rows (set by the model after
    the embedding is initialised), so a fused input starts at the scale of a plain embedding.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.d_model
        self.W_U = nn.Linear(D, D, bias=False)  # value path: the carried state
        self.W_G = nn.Linear(D, D, bias=False)  # gate path: the token embedding
        self.norm = RMSNorm(D, cfg.rms_eps)
        self.hook_feedback = HookPoint()  # [batch, pos, d_model]  carried h_{t-1}; zeros where none
        self.hook_value = HookPoint()  # [batch, pos, d_model]  the state's path: W_U h_{t-1}
        self.hook_gate = HookPoint()  # [batch, pos, d_model]  σ(W_G e_t)
        self.hook_out = HookPoint()  # [batch, pos, d_model]  u_t (the plain input where no state is carried)

    def gate(self, embed: torch.Tensor) -> torch.Tensor:
        """σ(W_G e) of token embeddings e [..., d_model] (what `hook_gate` holds): the gate, written
        once. The engine's lean step calls this; the kernels' gate table is tested equal to it."""
        return torch.sigmoid(F.linear(embed, self.W_G.weight))

    def forward(
        self,
        state: torch.Tensor,
        embed: torch.Tensor,
        has_state: torch.Tensor,
        hk: Hk,
        plain: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """state, embed: [batch, pos, d_model]; has_state: bool [pos] or [batch, pos], or None when
        every position takes the carried state (a decode step). `plain`: the input where no state is
        carried (default: `embed`)."""
        fused = self.fuse(hk(self.hook_feedback, state), embed, hk)
        plain = embed if plain is None else plain
        if has_state is None:
            return hk(self.hook_out, fused)
        mask = has_state if has_state.dim() == 2 else has_state[None, :]
        return hk(self.hook_out, torch.where(mask[..., None], fused, plain))

    def fuse(self, state: torch.Tensor, embed: torch.Tensor, hk: Hk) -> torch.Tensor:
        """RMSNorm_f((W_U h) ⊙ σ(W_G e)) [batch, pos, d_model] (`fbt_probe.engine.fast.fusion`: the
        Triton kernel on CUDA where it applies)."""
        value = hk(self.hook_value, self.W_U(state))
        gate = hk(self.hook_gate, self.gate(embed))
        fast = fast_path.fusion(self, value, gate)
        if fast is not None:
            return fast
        return fusion_reference(value, gate, self.norm.weight, self.norm.eps)
