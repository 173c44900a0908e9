"""Index arithmetic of the expanded sequence (eq. 1, 3, 4), shared by the model, tests and probes.

Conventions: tokens are 0-based Python positions (negative counts from the end, -1 = final token);
streams are 1-based, k = 1..n, as in the source. Token i's stream k sits at physical position
t = i·n + (k − 1) of the nL-long sequence (eq. 1 with 0-based t and i), so every hook of a Hidden
Decoding model fires with [batch, n·pos, ...] tensors and
`act[:, stream_position(-1, k, n)]` is the final token's stream k.
"""

from __future__ import annotations

import torch


def stream_position(token: int, stream: int, n: int) -> int:
    """Physical position of `token`'s stream `stream` (1..n); a negative token gives a negative
    position that indexes from the end in the same way (token -1, stream n -> -1)."""
    if not 1 <= stream <= n:
        raise ValueError(f"stream must be in 1..{n}, got {stream}")
    return token * n + stream - 1


def stream_slice(stream: int, n: int) -> slice:
    """Positions of stream `stream` across all tokens: `act[:, stream_slice(n, n)]` is the last stream."""
    if not 1 <= stream <= n:
        raise ValueError(f"stream must be in 1..{n}, got {stream}")
    return slice(stream - 1, None, n)


def split_streams(x: torch.Tensor, n: int, dim: int = 1) -> torch.Tensor:
    """[..., n·L, ...] -> [..., L, n, ...] at `dim` (the stream axis holds k - 1)."""
    dim = dim % x.dim()
    size = x.shape[dim]
    if size % n:
        raise ValueError(f"dimension {dim} has {size} positions, not a multiple of n = {n}")
    return x.unflatten(dim, (size // n, n))


def token_index(t: torch.Tensor, n: int) -> torch.Tensor:
    """i(t) of eq. 3 for 0-based physical positions (0-based tokens)."""
    return torch.div(t, n, rounding_mode="floor")


def stream_index(t: torch.Tensor, n: int) -> torch.Tensor:
    """s(t) of eq. 3 for 0-based physical positions (1-based streams)."""
    return t % n + 1


def stream_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, n: int, cross: bool, window: int | None) -> torch.Tensor:
    """Allowed (query, key) pairs [q, k] over physical positions.

    Intra-stream (eq. 4): t' <= t and s(t') = s(t). Cross-stream: t' <= t (the base model's causal
    pattern over the whole expanded sequence). A sliding `window` counts tokens, not positions: a
    query sees the keys of its own token and the window-1 tokens before it, so the layer covers the
    same tokens as in the base model (with n = 1 both masks are the base model's).
    """
    allowed = k_pos[None, :] <= q_pos[:, None]
    if not cross:
        allowed &= stream_index(k_pos, n)[None, :] == stream_index(q_pos, n)[:, None]
    if window is not None:
        allowed &= (token_index(q_pos, n)[:, None] - token_index(k_pos, n)[None, :]) < window
    return allowed


def stream_depth(stream: int, depth: int, n_layers: int) -> int:
    """Combined probe depth of (stream k in 1..n, layer depth d in 0..L), stream-major: the probe
    table of a Hidden Decoding model runs its `depth` column over (stream, layer)."""
    return (stream - 1) * (n_layers + 1) + depth


def split_stream_depth(combined, n_layers: int):
    """(stream, layer depth) of a combined depth (ints or arrays)."""
    return combined // (n_layers + 1) + 1, combined % (n_layers + 1)
