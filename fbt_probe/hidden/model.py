"""The Hidden Decoding transformer (second source document, eq. 1-4) on the same backbone blocks.

Each token x_i becomes n streams E_1(x_i), ..., E_n(x_i) (one embedding table per stream),
interleaved into an nL-long sequence with contiguous RoPE positions 0..nL-1 (eq. 1). One causal
pass runs the unchanged `Block`s; only their attention mask differs: intra-stream layers see earlier
positions of the same stream (eq. 4), cross-stream layers see every earlier position (the base
model's own pattern, sliding or global). The next-token head reads only each token's last stream
(eq. 2). The KV cache keeps every stream's keys and values.

Hooks: the feedback model's names (`hook_embed`, `blocks.{l}.*`, `ln_final.hook_normalized`), each
firing once per forward with [batch, n·pos, ...] tensors; `fbt_probe.hidden.streams` addresses
token i's stream k (`stream_position`, `stream_slice`, `split_streams`). There are no `fusion.*`
hooks and no feedback modes.
"""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.hooks import Hk, hooked, silent
from fbt_probe.errors import FbtError
from fbt_probe.hidden.config import HiddenConfig
from fbt_probe.hidden.streams import stream_mask, stream_slice
from fbt_probe.model.components import Attention, Block, HookedRMSNorm
from fbt_probe.tokens import check_tokens


class StreamAttention(Attention):
    """The backbone's attention (same weights, same hooks) with the stream-factorized mask."""

    def __init__(self, cfg: HiddenConfig, layer_type: str, cross: bool):
        super().__init__(cfg, layer_type)
        self.n_streams = cfg.n_streams
        self.cross = cross

    def mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return stream_mask(q_pos, k_pos, self.n_streams, self.cross, self.window)


class StreamBlock(Block):
    def __init__(self, cfg: HiddenConfig, layer: int, cross: bool):
        super().__init__(cfg, layer)
        self.attn = StreamAttention(cfg, cfg.resolved_layer_types[layer], cross)


class HiddenDecodingTransformer(HookedRootModule):
    def __init__(self, cfg: HiddenConfig):
        super().__init__()
        self.cfg = cfg
        n, cross = cfg.n_streams, set(cfg.resolved_cross_stream_layers)
        self.embeds = nn.ModuleList(nn.Embedding(cfg.d_vocab, cfg.d_model) for _ in range(n))  # E_1..E_n
        self.hook_embed = HookPoint()  # [batch, n*pos, d_model]  S_t = E_{s(t)}(x_{i(t)}) (eq. 1)
        self.blocks = nn.ModuleList(StreamBlock(cfg, l, l in cross) for l in range(cfg.n_layers))
        self.ln_final = HookedRMSNorm(cfg.d_model, cfg.rms_eps)  # hook_normalized: [batch, n*pos, d_model]
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)  # shared head g_θ (untied from E_k)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=cfg.init_std)
        self.setup()
        self.to(dtype=getattr(torch, cfg.dtype))

    @property
    def n_streams(self) -> int:
        return self.cfg.n_streams

    @classmethod
    @torch.no_grad()
    def from_base(cls, base, n_streams: int = 2, cross_stream_layers=None) -> "HiddenDecodingTransformer":
        """Warm start from a `FeedbackTransformer`: same blocks and final norm, every E_k and the head
        copied from the base embedding (the fusion is dropped). With n = 1 this is the base model."""
        model = cls(HiddenConfig.from_base(base.cfg, n_streams, cross_stream_layers))
        src = base.state_dict()
        state = {
            name: src["embed.weight"] if name.startswith(("embeds.", "unembed.")) else src[name]
            for name in model.state_dict()
        }
        model.load_state_dict(state)
        return model.to(device=base.embed.weight.device, dtype=base.embed.weight.dtype)

    # ----------------------------------------------------------------- primitives
    def expand(self, tokens: torch.Tensor, hk: Hk = silent) -> torch.Tensor:
        """tokens [batch, pos] -> interleaved stream embeddings [batch, n*pos, d_model] (eq. 1)."""
        e = torch.stack([E(tokens) for E in self.embeds], dim=2)  # [batch, pos, n, d_model]
        return hk(self.hook_embed, e.flatten(1, 2))

    def _run(self, tokens: torch.Tensor, start: int, cache: KVCache | None, hk: Hk) -> torch.Tensor:
        """Expanded pass from physical position `start`; returns the final norm [batch, n*pos, d_model]."""
        x = self.expand(tokens, hk)
        for block in self.blocks:  # contiguous RoPE positions start..start + n*pos - 1
            x = block(x, start, cache, hk)
        return self.ln_final(x, hk)

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        return self.unembed(normed[:, stream_slice(self.n_streams, self.n_streams)])  # last stream only (eq. 2)

    # ----------------------------------------------------------------- public
    def forward(self, tokens: torch.Tensor, mode: str | None = None) -> torch.Tensor:
        """tokens [batch, pos] -> next-token logits [batch, pos, d_vocab] read at each token's last
        stream (eq. 2), so losses and accuracies use the same targets as the base model."""
        if mode is not None and str(mode) != "standard":
            raise FbtError(f"mode '{mode}': a hidden-decoding model has no feedback modes (only 'standard')")
        return self._head(self._run(check_tokens(tokens, self.cfg), 0, None, hooked))

    def stream_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits at every physical position [batch, n*pos, d_vocab] (for inspection; only the
        last stream is trained)."""
        return self.unembed(self._run(tokens, 0, None, hooked))

    def prefill_cache(self, tokens: torch.Tensor, hk: Hk = silent) -> tuple[KVCache, torch.Tensor]:
        """(KV cache holding all n*pos positions, logits [batch, pos, d_vocab])."""
        cache = KVCache(self.cfg.n_layers, self.n_streams * tokens.shape[1])
        return cache, self._head(self._run(tokens, 0, cache, hk))

    def step(self, token: torch.Tensor, cache: KVCache, hk: Hk = silent) -> torch.Tensor:
        """Append one token's n streams to the cache; token [batch] -> logits [batch, d_vocab]."""
        return self._head(self._run(token[:, None], cache.length, cache, hk))[:, 0]

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, n_new: int) -> torch.Tensor:
        """Greedy continuation with the KV cache: [batch, pos] -> [batch, pos + n_new]."""
        tokens = check_tokens(tokens, self.cfg)
        if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 0:
            raise FbtError(f"n_new: expected an integer >= 0, got {n_new!r}")
        cache, logits = self.prefill_cache(tokens)
        out, nxt = [tokens], logits[:, -1].argmax(-1)
        for _ in range(n_new):
            out.append(nxt[:, None])
            nxt = self.step(nxt, cache).argmax(-1)
        return torch.cat(out, dim=1)

    def feedback_pass(self, *args, **kwargs):
        raise FbtError("a hidden-decoding model has no feedback passes (it is trained and run in one pass)")

    jacobi_passes = embed_fuse = feedback_pass  # every walk of feedback passes (fbt_probe.engine.walk) refuses


def attended_pairs(model, n_tokens: int) -> list[int]:
    """Allowed (query, key) pairs of each layer's mask on `n_tokens` tokens: the attention cost,
    counted rather than timed. Works for the base model too (n = 1: `n_tokens` positions)."""
    pos = torch.arange(n_tokens * getattr(model.cfg, "n_streams", 1))
    return [int(block.attn.mask(pos, pos).sum()) for block in model.blocks]
