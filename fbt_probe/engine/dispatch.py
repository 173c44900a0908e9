"""Which computation runs, decided here and nowhere else.

The model (`fbt_probe.model`) is the reference: every line of it is the paper's arithmetic. Each
rule below picks, for one call, either that reference or a fast path of this package that computes
the same function (float64: equal to 1e-12; float32: rounding only; tests/test_engine.py runs every
path against the reference over one grid of configs). A path is taken only where nothing can
observe the difference: no hook that would see an intermediate the path does not form, no autograd
where the path holds detached weights.

    rule           paths (first that applies)                       why
    attention      explicit      module.path == "explicit"          the reference, op for op
                   materialized  hook_pattern has a hook            the hook must see the pattern
                   sdpa-decode   one query seeing every key so far  no mask, no repeated KV heads
                   sdpa-windowed a sliding window that bites        O(pos * window) work
                   sdpa          everything else                    no [T, T] scores formed
    projection     fused         path "auto", no autograd           one GEMM for q/k/v, gate/up
                   split         otherwise                          one GEMM per projection
    step           plan          hooks off, no autograd, path       the lean serial step (step.py)
                                 "auto", float32/64, the paper's
                                 backbone (model.paper_backbone),
                                 no feedback noise
                   module        otherwise                          the model's own forward
    scan           graphed       a plan, CUDA, >= MIN_STEPS steps   one CUDA graph replayed (graph_scan.py)
                   eager         otherwise
    fusion         kernel        CUDA, Triton, large enough         one Triton launch (fbt_probe.kernels)
                   reference     otherwise

A module's `path` is "auto" (the rules), "explicit" (the reference) or, for tests and benchmarks, the
name of one attention path (forced; a call the forced path cannot compute raises).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

import fbt_probe.kernels as kernels

ATTENTION_PATHS = ("explicit", "materialized", "sdpa-decode", "sdpa-windowed", "sdpa")
PATHS = ("auto",) + ATTENTION_PATHS


def attention(
    path: str, plain_mask: bool, window: int | None, P: int, K: int, start: int, k_start: int, pattern_hooked: bool
) -> str:
    """The attention path of one call: P queries at positions start.., K keys at k_start.. .
    `plain_mask`: the causal (and window) mask of the base model, not a subclass's own (Hidden
    Decoding); `pattern_hooked`: a hook is attached to `hook_pattern` in a hooked pass."""
    if path not in PATHS:
        raise ValueError(f"path '{path}': expected one of {PATHS}")
    if path != "auto":
        why = attention_refusal(path, plain_mask, window, P, K, start, k_start, pattern_hooked)
        if why:
            raise ValueError(f"path '{path}' cannot compute this call: {why}")
        return path
    if pattern_hooked:
        return "materialized"
    if plain_mask and P == 1 and k_start + K == start + 1:
        return "sdpa-decode"
    if plain_mask and window is not None and start + P - 1 - k_start >= window:
        return "sdpa-windowed"
    return "sdpa"


def attention_refusal(
    path: str, plain_mask: bool, window: int | None, P: int, K: int, start: int, k_start: int, pattern_hooked: bool
) -> str | None:
    """Why a forced attention path cannot compute this call (None: it can)."""
    if pattern_hooked and path not in ("explicit", "materialized"):
        return "hook_pattern has a hook and this path forms no pattern"
    if path == "sdpa-decode" and not (plain_mask and P == 1 and k_start + K == start + 1):
        return "it needs one query that sees every key up to itself under the base model's mask"
    if path == "sdpa-windowed" and not (plain_mask and window is not None):
        return "it needs a sliding-window layer under the base model's mask"
    return None


def fused_projection(module) -> bool:
    """One GEMM for several projections (q/k/v; gate/up) and the depth scale folded into the output
    weight: the fused weights are detached, so only without autograd."""
    return module.path != "explicit" and not torch.is_grad_enabled()


def step(model) -> str:
    """'plan' (the lean serial step, `step.DecodePlan`) or 'module' (the model's forward) for the
    silent serial steps of `model` as it is now."""
    if torch.is_grad_enabled():
        return "module"  # autograd through the steps: the plan holds detached weights
    if model.embed.weight.dtype not in (torch.float32, torch.float64):
        return "module"  # half types normalise in float32 and cast back: the module path has those casts
    if model.training and model.cfg.feedback_noise > 0:
        return "module"  # the carried state gets fresh noise: the module path draws it
    if not model.paper_backbone:
        return "module"  # a family with backbone extras (nanochat's): the plan computes the paper's model only
    if any(b.attn.path != "auto" or b.mlp.path != "auto" for b in model.blocks):
        return "module"  # a path was asked for: the module runs it
    return "plan"


MIN_STEPS = 8
"""Shorter scans run eagerly: a capture costs about as much as a few eager steps."""


def scan(has_plan: bool, cuda_graphs: bool, cache, tokens: torch.Tensor, start: int, n: int) -> str:
    """'graphed' (n steps replayed from one captured CUDA graph) or 'eager' for a silent serial scan
    of positions start..start+n-1."""
    if has_plan and cuda_graphs and tokens.is_cuda and n >= MIN_STEPS and buffers_ready(cache, start, n):
        return "graphed"
    return "eager"


def buffers_ready(cache, start: int, n: int) -> bool:
    """The cache holds exactly positions < start in buffers with room for n more."""
    if any(b is None for b in cache.keys + cache.values) or any(L != start for L in cache.lengths):
        return False
    return min(b.shape[2] for b in cache.keys + cache.values) >= start + n


FUSED_MIN_ROWS = 16_384
"""Rows (batch x positions) from which a call that needs autograd runs the Triton kernel (through the
custom op, whose dispatch costs tens of microseconds of Python); fewer take the eager reference,
because below this size the dispatch costs more than the kernel saves: on an H200 the op measured
0.31-0.99x eager from 1 to 4,096 rows and 7.3x at 16,384 (docs/research/fusion-kernel-gpu.md).
Calls that need no autograd launch the kernel directly (`glu_fusion_direct`) at every size: one
launch against the ~6 of the eager reference."""


def use_kernel(rows: int, kernel_runs_here: bool, autograd: bool = True) -> bool:
    """The size rule of the fusion: the fused kernel only where it runs and the call is large enough
    to win (any size without autograd, `FUSED_MIN_ROWS` with it)."""
    return kernel_runs_here and (rows >= FUSED_MIN_ROWS or not autograd)


def fusion(x: torch.Tensor, *others: torch.Tensor):
    """The Triton entry point for this fusion call when the kernel can run on it and wins at its
    size, else None (the reference): `glu_fusion_direct` when no autograd is needed and nothing is
    being compiled, else the op."""
    if not x.is_cuda:
        return None
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *others))
    autograd = needs_grad or torch.compiler.is_compiling()
    if not use_kernel(x.numel() // max(x.shape[-1], 1), True, autograd):
        return None
    if not kernels.fast_fusion_available(x.device):
        return None
    return kernels.glu_fusion if autograd else kernels.glu_fusion_direct


@contextmanager
def use_path(model, path: str):
    """Every module of `model` that takes a path (its attentions and MLPs: a `path` attribute) on
    `path` inside the block: "auto" (the rules above), "explicit" (the reference arithmetic, op for
    op: einsum attention, one GEMM per projection) or one attention path by name (tests, benchmarks)."""
    if path not in PATHS:
        raise ValueError(f"path '{path}': expected one of {PATHS}")
    mods = [m for m in model.modules() if isinstance(vars(m).get("path"), str)]
    before = [m.path for m in mods]
    for m in mods:
        m.path = path
    try:
        yield model
    finally:
        for m, old in zip(mods, before):
            m.path = old
