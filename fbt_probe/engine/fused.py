"""Weights derived from parameters for the fused projections (`dispatch.fused_projection`), cached
on the module they belong to (a plain attribute, not in the state dict) and rebuilt whenever one
of their parameters changes. `fast` multiplies by them and `step.DecodePlan` takes the same tensors."""

from __future__ import annotations

from functools import partial

import torch


class FusedWeight:
    """A weight derived from parameters (default: cat along the output dim, one GEMM instead of
    several), rebuilt whenever one of them changes (data pointer or in-place version). Detached:
    for passes without autograd only."""

    def __init__(self, build=None):
        self.build = build or cat  # module-level functions and partials: the model stays picklable
        self.key, self.weight = None, None

    def __call__(self, *weights: torch.Tensor) -> torch.Tensor:
        key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
        if key != self.key:
            with torch.no_grad():
                self.weight, self.key = self.build(*(w.detach() for w in weights)), key
        return self.weight


def cat(*weights: torch.Tensor) -> torch.Tensor:
    return torch.cat(weights)


def expand_cat(*weights: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """[d] gains -> [sum(rows), d]: gain i repeated rows[i] times (one per head)."""
    return torch.cat([w.expand(n, w.shape[-1]) for w, n in zip(weights, rows)])


def cached(module, name: str, build, *weights: torch.Tensor) -> torch.Tensor:
    """The weight `name` of `module`, `build(*weights)` (None: `cat`), kept on the module until one
    of `weights` changes."""
    store = module.__dict__.setdefault("_fused_weights", {})
    if name not in store:
        store[name] = FusedWeight(build)
    return store[name](*weights)


def qkv(attn) -> torch.Tensor:
    """[(H + 2 KV) d_head, d_model] the query, key and value projections stacked: one GEMM."""
    return cached(attn, "qkv", None, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)


def qk_gain(attn) -> torch.Tensor:
    """[H + KV, d_head] the QK-norm gains, one row per query head then per key head."""
    rows = (attn.cfg.n_heads, attn.cfg.n_key_value_heads)
    return cached(attn, "qk_gain", partial(expand_cat, rows=rows), attn.q_norm.weight, attn.k_norm.weight)


def gate_up(mlp) -> torch.Tensor:
    """[2 d_mlp, d_model] the MLP's gate and up projections stacked: one GEMM."""
    return cached(mlp, "gate_up", None, mlp.gate_proj.weight, mlp.up_proj.weight)


def out_scaled(module, proj: torch.nn.Linear) -> torch.Tensor:
    """The output projection's weight times the module's depth scale (`out_scale`): one op fewer per call."""
    return cached(module, "out_scaled", partial(torch.mul, other=module.out_scale), proj.weight)
