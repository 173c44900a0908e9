"""fbt_probe.engine: every fast path of the model, behind the rules of `dispatch` (docs/architecture.md).

The model (`fbt_probe.model`) is the reference arithmetic; each module here computes a piece of
it faster, and `dispatch` says in one place which runs for a call and why. The model reaches the
fast paths through one seam, `fast`: at each site it calls `fast.<site>(self, ...)`, which returns
the fast result or None, and on None runs its own arithmetic. Besides `fast`, the model imports
from here only what is not a speed choice: `hooks` (how a pass calls its hook points), `cache`
(the KV cache a step appends to) and `schedule` (a mode's chunks); nothing else in `model/`
imports the engine.

    fast.py         the seam: one function per site of the model (projections, QK-norm and RoPE,
                    attention, output projection, gate/up, fusion, long silent passes, serial
                    step and scan), the fast result or None
    dispatch.py     the rules: attention path, fused projections, lean step, CUDA-graph scan,
                    fusion kernel; `use_path` pins a model to the reference or to one path
    attention.py    SDPA (general mask, decode step, sliding window) and the materialised pattern
    fused.py        weights fused from parameters (one GEMM for q/k/v, gate/up), cached on the module
    step.py         the lean serial step (`DecodePlan`) over a KV cache or static buffers
    graph_scan.py   the silent serial scan as one captured CUDA graph replayed per position
    schedule.py     a mode's chunks under each hook rule (`Schedule`), and `run_chunk`, the one
                    place the hook context is set
    prefix.py       prefix reuse: positions before an edit computed once, hooks off, then forked
    cache.py        the KV cache (in-place buffers; fork, select, repeat for prefix reuse)
    hooks.py        `hooked` / `silent`: how a pass calls its hook points; `HookContext`
    (fbt_probe.kernels: the Triton fusion kernel, reached through `fast.fusion` and `dispatch.fusion`)

tests/test_engine.py runs every path against the reference over one grid of configs. Nothing here
imports the model: the paths read the module attributes they need.
"""
