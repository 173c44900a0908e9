"""NanochatTransformer: the `FeedbackTransformer` with the backbone extras of nanochat-style
checkpoints (`fbt_probe.formats.nanochat.checkpoint` reads them). Each is a `NanochatConfig` field
whose default is the identity; a model that leaves one alone has none of its parameters or hook points.

| field              | parameters                            | hook points                          |
|--------------------|---------------------------------------|--------------------------------------|
| embed_norm         | -                                     | hook_embed_normed [batch, pos, d_model] |
| smear              | smear_gate.weight [1, c], smear_lambda [1] | hook_smear [batch, pos, d_model] (the smeared plain input) |
| x0_mixing          | resid_lambdas [L], x0_lambdas [L]     | blocks.{l}.hook_resid_mix            |
| backout_layer      | backout_lambda [1]                    | hook_backout (the stream ln_final reads) |
| tie_embeddings off | unembed.weight [d_vocab, d_model]     | -                                    |
| value_embed_layers | blocks.{l}.attn.value_embed / ve_gate | blocks.{l}.attn.hook_value_embed     |

and, without parameters of their own: weightless norms (`norm_weights`), the fusion variants
(`fusion`), ReLU² MLPs (`mlp_act`), RoPE by -θ (`rope_sign`), QK-norm after RoPE and a constant QK
scale, a soft cap on the logits. Where a state is carried, the fused vector replaces the whole plain
input (norm and smear included) and is x0 of every layer's mixing: x0 is what
`blocks.0.hook_resid_pre` holds, so a patch there reaches every layer, as a change of the input does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.hooks import Hk
from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.config import NanochatConfig
from fbt_probe.model.components import MLP, Attention, Block, HookedRMSNorm, RMSNorm, RotaryTable, ScaledRMSNorm
from fbt_probe.model.fusion import Fusion
from fbt_probe.model.transformer import FeedbackTransformer


def _norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), None, eps)


class NanochatAttention(Attention):
    """Weightless QK-norms, RoPE by -θ, QK-norm after RoPE and a constant QK scale, and on the layers
    of `value_embed_layers` a token-indexed value embedding gated per KV head (ResFormer-style)."""

    def __init__(self, cfg: NanochatConfig, layer_type: str, layer: int = -1):
        super().__init__(cfg, layer_type, layer)
        KV, dh = cfg.n_key_value_heads, cfg.d_head
        if not cfg.norm_weights:
            self.q_norm = RMSNorm(dh, cfg.rms_eps, weight=False)
            self.k_norm = RMSNorm(dh, cfg.rms_eps, weight=False)
        self.rope = RotaryTable(dh, cfg.rope_theta, cfg.n_ctx, cfg.rope_sign)
        self.custom_qk = cfg.qk_norm_after_rope or not cfg.norm_weights or cfg.qk_scale != 1.0
        self.value_embed = self.ve_gate = None
        if layer in cfg.value_embed_layers:
            self.value_embed = nn.Embedding(cfg.d_vocab, KV * dh)
            self.ve_gate = nn.Linear(cfg.value_embed_gate_channels, KV, bias=False)
            self.hook_value_embed = (
                HookPoint()
            )  # [batch, pos, n_kv_heads, d_head]  3σ(W x[:c]) · E_v(token), added to v

    def values(self, v, x, tokens, layer, hk):
        if self.value_embed is None:
            return v
        if tokens is None:
            raise ValueError(f"layer {layer} adds a value embedding: its forward needs the tokens")
        B, P, KV, dh = v.shape
        ve = self.value_embed(tokens).view(B, P, KV, dh)
        gate = 3 * torch.sigmoid(self.ve_gate(x[..., : self.cfg.value_embed_gate_channels]))  # [batch, pos, n_kv_heads]
        return v + hk(self.hook_value_embed, gate[..., None] * ve)

    def position(self, q, k, qk, start):
        if not self.custom_qk:
            return super().position(q, k, qk, start)
        if self.cfg.qk_norm_after_rope:
            q, k = self.q_norm(self.rope.apply(q, start)), self.k_norm(self.rope.apply(k, start))
        else:
            q, k = self.rope.apply(self.q_norm(q), start), self.rope.apply(self.k_norm(k), start)
        s = self.cfg.qk_scale
        return (q, k) if s == 1.0 else (q * s, k * s)


class NanochatMLP(MLP):
    """`mlp_act="relu2"`: down(relu(up x)²), no gate projection (hook_pre: up x; hook_post: relu(pre)²)."""

    def __init__(self, cfg: NanochatConfig):
        super().__init__(cfg, gated=cfg.mlp_act != "relu2")

    def post(self, x: torch.Tensor, hk: Hk) -> torch.Tensor:
        if self.gated:
            return super().post(x, hk)
        return hk(self.hook_post, F.relu(hk(self.hook_pre, self.up_proj(x))).square())


class NanochatBlock(Block):
    """Weightless norms (`norm_weights` off) and, with `x0_mixing`, the input
    resid_lambdas[l]·x + x0_lambdas[l]·x0 (`hook_resid_mix`)."""

    attention_cls = NanochatAttention
    mlp_cls = NanochatMLP

    def __init__(self, cfg: NanochatConfig, layer: int):
        super().__init__(cfg, layer)
        if cfg.x0_mixing:
            self.hook_resid_mix = HookPoint()  # [batch, pos, d_model]  resid_lambdas[l]·resid_pre + x0_lambdas[l]·x0

    @staticmethod
    def norm(cfg: NanochatConfig) -> ScaledRMSNorm:
        return HookedRMSNorm(cfg.d_model, cfg.rms_eps, cfg.norm_weights)

    def forward(self, x, start, cache, hk, tokens=None, mix: tuple | None = None):
        """`mix` (x0 mixing): (resid lambda, x0 lambda, x0), with x already through `hook_resid_pre`
        (the trunk fires it: block 0's is x0)."""
        if mix is None:
            return super().forward(x, start, cache, hk, tokens)
        lam_r, lam_x, x0 = mix
        return self.sublayers(hk(self.hook_resid_mix, lam_r * x + lam_x * x0), start, cache, hk, tokens)


class NanochatFusion(Fusion):
    """`fusion` other than "glu" selects one of nanochat's variants (weightless norms; see
    `NanochatConfig.fusion`): "gate_product" keeps W_U, W_G; "linear_addition" has W_U and W_T (token
    path); "concat_projection" has one W_C [D, 2D] over [norm(h); norm(e)]."""

    def __init__(self, cfg: NanochatConfig):
        nn.Module.__init__(self)  # the parameters of the configured variant only
        self.cfg = cfg
        self.kind = cfg.fusion
        D = cfg.d_model
        if self.kind == "concat_projection":
            self.W_C = nn.Linear(2 * D, D, bias=False)  # [norm(h); norm(e)] -> D
        else:
            self.W_U = nn.Linear(D, D, bias=False)  # value path: the carried state
        if self.kind in ("glu", "gate_product"):
            self.W_G = nn.Linear(D, D, bias=False)  # gate path: the token embedding
        if self.kind == "linear_addition":
            self.W_T = nn.Linear(D, D, bias=False)  # token path, added
        self.norm = RMSNorm(D, cfg.rms_eps, weight=self.kind == "glu")
        self.hook_feedback = HookPoint()  # [batch, pos, d_model]  carried h_{t-1}; zeros where none
        self.hook_value = HookPoint()  # [batch, pos, d_model]  W_U h_{t-1} (concat: W_C[:, :D] norm(h))
        if self.kind in ("glu", "gate_product"):
            self.hook_gate = HookPoint()  # [batch, pos, d_model]  σ(W_G e_t) (gate_product: σ(W_G norm(e_t)))
        else:
            self.hook_token = HookPoint()  # [batch, pos, d_model]  W_T norm(e) (concat: W_C[:, D:] norm(e))
        self.hook_out = HookPoint()  # [batch, pos, d_model]  u_t (the plain input where no state is carried)

    def gate(self, embed: torch.Tensor) -> torch.Tensor:
        if self.kind == "glu":
            return super().gate(embed)
        if self.kind == "gate_product":
            return torch.sigmoid(self.W_G(_norm(embed, self.cfg.rms_eps)))
        raise FbtError(f"model config: field 'fusion' is '{self.kind}', which has no gate")

    def fuse(self, state: torch.Tensor, embed: torch.Tensor, hk: Hk) -> torch.Tensor:
        if self.kind == "glu":
            return super().fuse(state, embed, hk)
        eps = self.cfg.rms_eps
        if self.kind == "concat_projection":
            D, W = self.cfg.d_model, self.W_C.weight
            value = hk(self.hook_value, F.linear(_norm(state, eps), W[:, :D]))
            return self.norm(value + hk(self.hook_token, F.linear(_norm(embed, eps), W[:, D:])))
        value = hk(self.hook_value, self.W_U(state))
        if self.kind == "gate_product":
            return self.norm(value * hk(self.hook_gate, self.gate(embed)))
        return self.norm(value + hk(self.hook_token, self.W_T(_norm(embed, eps))))


class NanochatTransformer(FeedbackTransformer):
    """The latent-feedback model with nanochat's extras (module doc); `cfg` is a `NanochatConfig`."""

    fusion_cls = NanochatFusion
    block_cls = NanochatBlock
    paper_backbone = False

    @staticmethod
    def final_norm(cfg: NanochatConfig) -> HookedRMSNorm:
        return HookedRMSNorm(cfg.d_model, cfg.rms_eps, cfg.norm_weights)

    def add_extras(self) -> None:
        cfg = self.cfg
        D, V, L = cfg.d_model, cfg.d_vocab, cfg.n_layers
        if not cfg.tie_embeddings:
            self.unembed = nn.Linear(D, V, bias=False)
        if cfg.embed_norm:
            self.hook_embed_normed = HookPoint()  # [batch, pos, d_model]  weightless RMSNorm of e_t
        if cfg.smear:
            self.smear_gate = nn.Linear(cfg.smear_channels, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
            self.hook_smear = HookPoint()  # [batch, pos, d_model]  x_t + λ σ(W_s x_t[:c]) x_{t-1}: the plain input
        if cfg.x0_mixing:
            self.resid_lambdas = nn.Parameter(torch.ones(L))
            self.x0_lambdas = nn.Parameter(torch.zeros(L))
        if cfg.backout_layer is not None:
            self.backout_lambda = nn.Parameter(torch.zeros(1))
            self.hook_backout = HookPoint()  # [batch, pos, d_model]  h^L - λ_b · (output of block backout_layer)

    @torch.no_grad()
    def init_weights(self) -> None:
        """The backbone's initialisation; the extras' scalars at their identity values."""
        super().init_weights()
        cfg = self.cfg
        if cfg.smear:
            self.smear_lambda.zero_()
        if cfg.x0_mixing:
            self.resid_lambdas.fill_(1.0)
            self.x0_lambdas.zero_()
        if cfg.backout_layer is not None:
            self.backout_lambda.zero_()

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """e_t: the looked-up embedding times `embed_scale`."""
        e = self.embed(tokens)
        return e if self.cfg.embed_scale == 1.0 else e * self.cfg.embed_scale

    def plain_input(self, tokens, e, start: int, cache: KVCache | None, hk: Hk) -> torch.Tensor:
        """norm(e) (if `embed_norm`), then the smear of the previous position's normed embedding into
        each position >= 1. A chunk that starts after position 0 reads the previous token from the
        KV cache, which remembers this chunk's tokens for the next one."""
        cfg = self.cfg
        x = e
        if cfg.embed_norm:
            x = hk(self.hook_embed_normed, _norm(e, cfg.rms_eps))
        if not cfg.smear:
            return x
        if start > 0:
            tok = None if cache is None else cache.token_at(start - 1)
            if tok is None:
                raise FbtError(
                    f"smear: position {start} needs the token before it, which the KV cache does not hold "
                    "(build the cache with the model's own prefill)"
                )
            before = self.token_embedding(tok[:, None])
            before = _norm(before, cfg.rms_eps) if cfg.embed_norm else before
            prev, cur = torch.cat([before, x[:, :-1]], dim=1), x
            out = hk(self.hook_smear, cur + self._smear_gate(cur) * prev)
        elif x.shape[1] == 1:
            out = hk(self.hook_smear, x)
        else:
            cur = x[:, 1:]
            out = hk(self.hook_smear, torch.cat([x[:, :1], cur + self._smear_gate(cur) * x[:, :-1]], dim=1))
        if cache is not None:
            cache.write_tokens(start, tokens)  # the next chunk's smear reads the token before it
        return out

    def _smear_gate(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, pos, 1] λ·σ(W_s x[..., :c])."""
        return self.smear_lambda * torch.sigmoid(self.smear_gate(x[..., : self.cfg.smear_channels]))

    def trunk(self, x, start, cache, hk, tokens=None, stop: int | None = None) -> torch.Tensor:
        """Blocks 0..stop-1 (default all) with x0 mixing and / or backout; the backout applies once
        every block has run."""
        cfg = self.cfg
        if not cfg.x0_mixing and cfg.backout_layer is None:
            return super().trunk(x, start, cache, hk, tokens, stop)
        x0, kept = None, None
        stop = cfg.n_layers if stop is None else stop
        for l, block in enumerate(self.blocks[:stop]):
            if cfg.x0_mixing:
                x = hk(block.hook_resid_pre, x)
                x0 = x if x0 is None else x0
                x = block(x, start, cache, hk, tokens, mix=(self.resid_lambdas[l], self.x0_lambdas[l], x0))
            else:
                x = block(x, start, cache, hk, tokens)
            if l == cfg.backout_layer:
                kept = x
        if kept is not None and stop == cfg.n_layers:
            x = hk(self.hook_backout, x - self.backout_lambda * kept)
        return x

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.cfg.tie_embeddings else self.unembed.weight

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits, soft-capped at `logit_softcap` when set."""
        logits = super().head(normed)
        cap = self.cfg.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)
