"""fbt_probe.engine: every fast path of the model and the walk of a mode's chunks, behind the rules
of `dispatch` (docs/architecture.md).

The model (`fbt_probe.model`) is the reference arithmetic; each module here computes a piece of
it faster, and `dispatch` says in one place which runs for a call and why. The model imports one
module of the engine, the seam `fast`: at each site it calls `fast.<site>(self, ...)`, which
returns the fast result or None, and on None runs its own arithmetic; `fast` also re-exports what
else the model uses (the walk, the schedule, the hook calls, the KV cache).

    fast.py         the seam: one function per site of the model, the fast result or None
    walk.py         the executable schedule: `Walk` runs any list of chunks (feeds each, runs it,
                    carries its top state on), calling the model only through `Primitives`
    schedule.py     a mode's chunks under each hook rule (`Schedule`); `run_chunk` sets the hook context
    dispatch.py     the rules: attention path, fused projections, lean step, CUDA-graph scan,
                    fusion kernel; `use_path` pins a model to the reference or to one path
    attention.py    SDPA (general mask, decode step, sliding window) and the materialised pattern
    fused.py        weights fused from parameters (one GEMM for q/k/v, gate/up), cached on the module
    step.py         the lean serial step (`DecodePlan`) over a KV cache or static buffers
    graph_scan.py   the silent serial scan as one captured CUDA graph replayed per position
    prefix.py       prefix reuse: positions before an edit walked once, hooks off, then forked
    cache.py        the KV cache (in-place buffers; fork, select, repeat for prefix reuse)
    hooks.py        `hooked` / `silent`: how a pass calls its hook points; `HookContext`
    (fbt_probe.kernels: the Triton fusion kernel, reached through `fast.fusion` and `dispatch.fusion`)

tests/test_engine.py runs every path against the reference over one grid of configs. Nothing here
imports the model or uses more of it than `walk.Primitives` declares (tests/test_walk.py).
"""
