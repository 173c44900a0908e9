"""The KV cache: per-layer key and value buffers written in place, which every cached pass (prefill,
serial steps, prefix reuse, decoding) reads and extends."""

from __future__ import annotations

import torch


class KVCache:
    """Keys (after QK-norm and RoPE) and values per layer, in buffers [batch, n_kv_heads, capacity,
    d_head] allocated once (capacity known up front; doubled if a write reaches past it) and written
    in place; positions < `length` are valid. The layout is the same with or without feedback: only
    the inputs that produced the entries differ. Under autograd (inputs that require grad) the
    entries are concatenated out of place instead, so gradients can flow through several steps."""

    def __init__(self, n_layers: int, capacity: int = 0):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.lengths = [0] * n_layers  # per layer: a pass writes layer by layer
        self.capacity = capacity
        self.tokens: torch.Tensor | None = None  # [batch, capacity] token ids (kept when the model smears)

    @classmethod
    def empty(cls, n_layers: int, capacity: int = 0) -> "KVCache":
        return cls(n_layers, capacity)

    @classmethod
    def from_tensors(cls, keys, values, tokens: torch.Tensor | None = None) -> "KVCache":
        """A cache holding exactly these per-layer [batch, n_kv_heads, pos, d_head] tensors (not
        copied): the first append grows into a new buffer, so the given tensors are never written.
        `tokens` [batch, >= pos]: the token ids of those positions (needed by a smearing model)."""
        cache = cls(len(keys), 0)
        cache.keys, cache.values = list(keys), list(values)
        cache.lengths = [k.shape[2] for k in keys]
        cache.capacity = min(cache.lengths, default=0)
        if tokens is not None:
            cache.tokens = tokens[:, : cache.capacity].clone()
        return cache

    def write_tokens(self, start: int, tokens: torch.Tensor) -> None:
        """Remember the ids of positions start..start+pos-1 (tokens: [batch, pos])."""
        end = start + tokens.shape[1]
        if self.tokens is None or self.tokens.shape[1] < end or self.tokens.shape[0] != tokens.shape[0]:
            grown = tokens.new_zeros(tokens.shape[0], max(end, self.capacity))
            if self.tokens is not None and self.tokens.shape[0] == tokens.shape[0]:
                n = min(start, self.tokens.shape[1])
                grown[:, :n] = self.tokens[:, :n]
            self.tokens = grown
        self.tokens[:, start:end] = tokens

    def token_at(self, pos: int) -> torch.Tensor | None:
        """[batch] the id remembered at `pos`, or None when this cache never saw it."""
        if self.tokens is None or pos >= self.tokens.shape[1]:
            return None
        return self.tokens[:, pos]

    @property
    def length(self) -> int:
        return self.lengths[0]

    def rewind(self, length: int) -> "KVCache":
        """Forget positions >= `length` (their slots are overwritten by the next writes)."""
        if length > min(self.lengths):
            raise ValueError(f"rewind to {length}: the cache holds {min(self.lengths)} positions")
        self.lengths = [length] * len(self.lengths)
        return self

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [batch, new_pos, n_kv_heads, d_head] -> every valid key and value [batch, n_kv_heads,
        pos, d_head] (views of the buffers)."""
        B, P, KV, dh = k.shape
        L = self.lengths[layer]
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # autograd through several steps (attribution patching through the carried states): out of
            # place, so no tensor that backward saved is overwritten by a later step's write
            kt, vt = k.transpose(1, 2), v.transpose(1, 2)
            if L:
                kt = torch.cat([self.keys[layer].narrow(2, 0, L), kt], 2)
                vt = torch.cat([self.values[layer].narrow(2, 0, L), vt], 2)
            self.keys[layer], self.values[layer] = kt, vt
            self.lengths[layer] = L + P
            return kt, vt
        buf = self.keys[layer]
        if buf is None or buf.shape[2] < L + P:
            cap = max(L + P, self.capacity, 2 * buf.shape[2] if buf is not None else 0)
            self.keys[layer], self.values[layer] = (
                self._grow(old, (B, KV, cap, dh), k, L) for old in (self.keys[layer], self.values[layer])
            )
            self.capacity = cap
        keys, values = self.keys[layer], self.values[layer]
        keys.narrow(2, L, P).copy_(k.transpose(1, 2))
        values.narrow(2, L, P).copy_(v.transpose(1, 2))
        self.lengths[layer] = L + P
        return keys.narrow(2, 0, L + P), values.narrow(2, 0, L + P)

    @staticmethod
    def _grow(old: torch.Tensor | None, shape: tuple, like: torch.Tensor, keep: int) -> torch.Tensor:
        new = torch.empty(shape, dtype=like.dtype, device=like.device)
        if old is not None and keep:
            new[:, :, :keep] = old[:, :, :keep]
        return new

    def _map(self, fn) -> "KVCache":
        """A new cache whose buffers are fn(valid part) (same capacity; fn may change the batch)."""
        out = KVCache(len(self.keys), self.capacity)
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is None:
                continue
            n = self.lengths[i]
            for src, dst in ((k, out.keys), (v, out.values)):
                part = fn(src[:, :, :n])
                buf = torch.empty((part.shape[0],) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
                buf[:, :, :n] = part
                dst[i] = buf
            out.lengths[i] = n
        if self.tokens is not None:
            out.tokens = fn(self.tokens[:, None, None, :])[:, 0, 0].clone()  # the same row map on [batch, 1, 1, pos]
        return out

    def fork(self) -> "KVCache":
        """An independent copy (writes to one do not reach the other)."""
        return self._map(lambda t: t)

    def select(self, rows: torch.Tensor) -> "KVCache":
        """The cache of batch rows `rows` (e.g. each row's pair partner), as a new cache."""
        return self._map(lambda t: t.index_select(0, rows))

    def repeat(self, n: int) -> "KVCache":
        """n replicas of the batch, replica-major (the order of `tokens.repeat(n, 1)`)."""
        return self._map(lambda t: t.repeat(n, 1, 1, 1))

    def copy_from(self, other: "KVCache", lo: int, hi: int) -> None:
        """Positions lo..hi-1 of every layer from `other` (same batch and layout)."""
        if other.tokens is not None:
            self.write_tokens(lo, other.tokens[:, lo:hi])
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for a, b in zip(mine, theirs):
                if a is not None:
                    a[:, :, lo:hi] = b[:, :, lo:hi]
