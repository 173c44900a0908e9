"""The fast attention paths: the reference's function (`fbt_probe.model.components.Attention.
reference`) through fewer passes over the scores or none at all. `dispatch.attention` picks one.

Shapes throughout: q [batch, pos, n_heads, d_head] at positions start..; k, v [batch, n_kv_heads,
key_pos, d_head] at positions k_start..; the result z [batch, pos, n_heads, d_head]. `mask(q_pos,
k_pos)` is the layer's boolean [q, k] mask (the causal and window rule, or Hidden Decoding's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fbt_probe.numerics import is_half


def positions(P: int, K: int, start: int, k_start: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(start, start + P, device=device), torch.arange(k_start, k_start + K, device=device)


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys, in float32 for half types and in the scores' dtype otherwise."""
    return torch.softmax(scores, dim=-1, dtype=torch.float32 if is_half(scores.dtype) else None)


def materialized(q, k, v, start: int, k_start: int, mask, pattern_hook) -> torch.Tensor:
    """Every score materialised for `hook_pattern` ([batch, n_heads, q, k], through `pattern_hook`),
    with fewer passes over the [T, T] scores than the reference: a KV group's query heads share one
    matmul with its keys (no copies of the KV heads), the scale goes onto the queries and the mask
    is applied in place."""
    B, P, H, dh = q.shape
    KV, K = k.shape[1], k.shape[2]
    grouped = q.transpose(1, 2).reshape(B, KV, (H // KV) * P, dh) * dh**-0.5  # heads h = kv * rep + r
    scores = torch.matmul(grouped, k.transpose(-1, -2)).view(B, H, P, K)
    scores.masked_fill_(~mask(*positions(P, K, start, k_start, q.device)), float("-inf"))
    pattern = pattern_hook(softmax(scores).to(q.dtype))
    z = torch.matmul(pattern.reshape(B, KV, (H // KV) * P, K), v)  # [batch, n_kv_heads, rep * pos, d_head]
    return z.view(B, H, P, dh).transpose(1, 2)


def sdpa_decode(q, k, v, window: int | None) -> torch.Tensor:
    """One query that sees every key up to itself (a decode step): the heads of a KV group become
    its queries, so nothing is repeated and no mask is needed; a window keeps the last keys."""
    B, _, H, dh = q.shape
    KV, K = k.shape[1], k.shape[2]
    if window is not None and K > window:
        k, v = k[:, :, K - window :], v[:, :, K - window :]
    z = F.scaled_dot_product_attention(q.reshape(B, KV, H // KV, dh), k, v)
    return z.reshape(B, 1, H, dh)  # CUDA may return a non-contiguous layout


def sdpa(q, k, v, start: int, k_start: int, mask, plain_mask: bool, window: int | None) -> torch.Tensor:
    """Through `scaled_dot_product_attention`: no [T, T] scores kept, no copies of the KV heads.
    Queries and keys that start together under the base model's mask (no window biting: the
    dispatch sends those to `sdpa_windowed`) take the built-in causal mask; else the layer's mask."""
    B, P, H, dh = q.shape
    KV, K = k.shape[1], k.shape[2]
    attn_mask, causal = None, False
    if plain_mask and start == k_start and (window is None or start + P - 1 - k_start < window):
        causal = True
    else:
        attn_mask = mask(*positions(P, K, start, k_start, q.device))
    z = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=H != KV
    )
    return z.transpose(1, 2)


def sdpa_windowed(q, k, v, start: int, k_start: int, mask, window: int) -> torch.Tensor:
    """A sliding window that bites: blocks of `window` queries, each over only the (at most
    2 * window - 1) keys it can see, so the work is O(pos * window), not O(pos * keys)."""
    W, (P, K), H, KV = window, (q.shape[1], k.shape[2]), q.shape[2], k.shape[1]
    out = []
    for a in range(0, P, W):
        first, last = start + a, start + min(a + W, P) - 1  # the block's query positions
        lo, hi = max(k_start, first - W + 1), min(k_start + K, last + 1)  # the keys they can see
        out.append(
            F.scaled_dot_product_attention(
                q[:, a : a + W].transpose(1, 2),
                k[:, :, lo - k_start : hi - k_start],
                v[:, :, lo - k_start : hi - k_start],
                attn_mask=mask(*positions(last + 1 - first, hi - lo, first, lo, q.device)),
                enable_gqa=H != KV,
            )
        )
    return (out[0] if len(out) == 1 else torch.cat(out, dim=2)).transpose(1, 2)
