"""The silent serial scan on a GPU: one step captured as a CUDA graph, replayed once per position.

A serial scan (`recurrent:k`, `full`) on a GPU is launch-bound: a `tiny` step is ~150 small kernels
(profiled on the H200), each a microsecond or two of GPU work behind more of Python and launch overhead. `GraphedScan` runs
`DecodePlan.run` at a device-side position (`AtTensor`: static KV buffers, `index_copy_` writes,
a masked attention over a prefix of the buffers, its width a bucket) and, on CUDA, captures one step (read the token
at `pos`, record the carried state, step, write the logits, `pos += 1`) as a CUDA graph; the scan is
then `n` replays with no host work between them. The fusion epilogue inside the graph is the Triton
kernel where it runs (one launch instead of ~6).

It computes the lean step's function (float64 on CPU, the same code run eagerly: equal to 1e-12,
tests/test_graph_scan.py, tests/test_engine.py; on CUDA: rounding only, the `gpu` tests). Taken by
the walk's silent scan (`walk.Walk`) where `dispatch.scan` says so (CUDA tensors, the plan applies, at least
`dispatch.MIN_STEPS` steps); `model.cuda_graphs = False` turns it off.
"""

from __future__ import annotations

import torch

from fbt_probe.engine import dispatch
from fbt_probe.engine.step import AtTensor, DecodePlan
from fbt_probe.numerics import fusion_reference

MIN_WIDTH = 64
"""The smallest attention width (KV slots read per step); the buckets double from it."""


class GraphedScan:
    """Positions start..start+n-1 of a silent serial scan over static buffers (all written in place):
    cache: the `KVCache` holding positions < start in buffers of capacity >= start + n;
    tokens [batch, T]; carried [batch, >= start + n, d_model] (gets the state entering each position);
    out [batch, >= start + n, d_vocab] (gets each position's logits); prev [batch, d_model] the state
    carried into position `start` (copied; `run` returns the state out of the last position).

    The attention reads a prefix of the buffers whose width is a bucket (`MIN_WIDTH`, twice that,
    ..., the capacity): one graph per bucket, so an early position does not read the whole capacity."""

    def __init__(self, plan: DecodePlan, cache, tokens, carried, out, prev, start: int, fused_epilogue: bool = True):
        self.plan, self.cache = plan, cache
        self.tokens, self.carried, self.out = tokens, carried, out
        self.prev = prev.clone()
        self.start = start
        self.pos = torch.full((1,), start, dtype=torch.long, device=tokens.device)
        for buf in cache.keys + cache.values:
            buf[:, :, start:].zero_()  # finite numbers where the mask reads nothing (see AtTensor)
        # the engine's fusion rule (`dispatch.fusion`): the directly launched Triton kernel on CUDA
        # without autograd, the reference elsewhere; decided once, when the step is captured
        self.epilogue = fusion_epilogue if fused_epilogue else fusion_reference
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def widths(self, n: int) -> list[tuple[int, int]]:
        """(width, steps) in order: each bucket's attention width and how many of the positions
        start..start+n-1 it serves (those with position < width, not served by a smaller one)."""
        capacity = min(b.shape[2] for b in self.cache.keys + self.cache.values)
        out, lo, width = [], self.start, min(MIN_WIDTH, capacity)
        end = self.start + n
        if end > capacity:
            raise ValueError(f"GraphedScan: positions up to {end} do not fit the cache's {capacity} slots")
        while lo < end:
            if width > lo:
                out.append((width, min(width, end) - lo))
                lo = min(width, end)
            width = min(2 * width, capacity)
        return out

    def body(self, width: int) -> None:
        """One position: the step at `pos` over the first `width` slots, its outputs written at
        `pos`, then `pos += 1`."""
        token = self.tokens.index_select(1, self.pos)[:, 0]
        self.carried.index_copy_(1, self.pos, self.prev[:, None])
        at = AtTensor(
            [k.narrow(2, 0, width) for k in self.cache.keys],
            [v.narrow(2, 0, width) for v in self.cache.values],
            self.pos,
            self.epilogue,
        )
        logits, state = self.plan.run(token, self.prev, at)
        self.out.index_copy_(1, self.pos, logits[:, None])
        self.prev.copy_(state)
        self.pos.add_(1)

    def run(self, n: int, graph: bool | None = None) -> torch.Tensor:
        """n steps; `graph` None: captured on CUDA, eager elsewhere. Returns the last state."""
        graph = self.tokens.is_cuda if graph is None else graph
        buckets = self.widths(n)
        if graph:
            self._capture([w for w, _ in buckets])
        for width, steps in buckets:
            for _ in range(steps):
                self.graphs[width].replay() if graph else self.body(width)
        for layer in range(len(self.cache.lengths)):
            self.cache.lengths[layer] = self.start + n
        return self.prev

    def _capture(self, widths: list[int]) -> None:
        """Per width: one warm-up step at `start` on a side stream (its writes are overwritten by the
        replays), the position and state restored, one step captured. The graphs share one memory
        pool: they are replayed one after another, in the order they were captured."""
        pos0, prev0 = self.pos.clone(), self.prev.clone()
        pool = None
        for width in widths:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.body(width)
            torch.cuda.current_stream().wait_stream(side)
            self.pos.copy_(pos0)
            self.prev.copy_(prev0)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.body(width)
            pool = g.pool()
            self.graphs[width] = g


def fusion_epilogue(value: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(value ⊙ gate) · weight by the engine's fusion rule: the Triton kernel where it runs."""
    return (dispatch.fusion(value, gate, weight) or fusion_reference)(value, gate, weight, eps)
