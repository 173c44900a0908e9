"""The static-buffer serial step compiled on CPU (docs/research/rejected-speedups.md, "A compiled CPU
step"): per-step time of the lean loop, the static-buffer step run eagerly, and the same step
compiled per attention width.

    python benchmarks/bench_compiled_step.py          (tiny, batch 8, T = 1,024; ~2 minutes incl. compiling)
"""
import time

import torch
import fbt_probe as fp
from fbt_probe.model.graph_scan import GraphedScan
torch.set_num_threads(1)
m = fp.load_model("tiny").eval()
B, T = 8, 1024
x = torch.randint(0, m.cfg.d_vocab, (B, T))
def setup():
    cache, state, logits = m.prefill_cache(x[:, :1], capacity=T)
    carried = state.new_zeros(B, T, m.cfg.d_model); out = logits.new_zeros(B, T, logits.shape[-1])
    return GraphedScan(m.decode_plan(), cache, x, carried, out, state[:, -1], 1)
with torch.no_grad():
    # eager lean loop (KVCache, exact slices)
    t0 = time.perf_counter(); m.serial_scan(x, T - 1); print("lean loop per step ms", (time.perf_counter() - t0) / (T - 1) * 1e3, flush=True)
    s = setup(); t0 = time.perf_counter(); s.run(T - 1, graph=False); print("AtTensor eager per step ms", (time.perf_counter() - t0) / (T - 1) * 1e3, flush=True)
    s = setup()
    fns = {}
    for w, _ in s.widths(T - 1):
        fns[w] = torch.compile(lambda w=w: s.body(w), dynamic=False, fullgraph=False)
    tc = 0
    for w, n in s.widths(T - 1):
        t1 = time.perf_counter(); fns[w](); tc += time.perf_counter() - t1  # compile
        t1 = time.perf_counter()
        for _ in range(n - 1): fns[w]()
        dt = time.perf_counter() - t1
        print(f"width {w}: compiled {dt / max(n - 1, 1) * 1e3:.3f} ms/step over {n - 1} steps", flush=True)
    print("compile seconds", tc)
