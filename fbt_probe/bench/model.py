"""`fbt-probe bench model`: where a researcher waits on the model itself, on this machine's CPU.

- `standard` forward at T × batch (default 1,024 × 8), and its peak memory;
- `full` (the exact serial recurrence through the KV cache, then the hooked final pass) at the same
  shape and at batch 1: time, ratio to `standard`, and time per serial step (full time / (T - 1));
- `run_with_cache` over a plain forward (batch 8 × 256) on the residual hooks and on every hook
  (every hook includes `hook_pattern`, which takes the explicit attention path).

`--device cuda`: the same measurements on the GPU (each timed call ends in a synchronize), `full`
both ways: with the serial step captured as a CUDA graph (`fbt_probe/engine/graph_scan.py`, the default) and
with the eager lean step (`model.cuda_graphs = False`); peak memory is the CUDA allocator's peak.

Times are medians of `repeats` runs after one warm-up; ratios come from the same run. Peak memory
is measured in a fresh child process per shape (its VmHWM after the call, and how far the call
raised it above the loaded model warmed up on a short input), so one measurement's peak does not
hide another's.
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import subprocess
import sys
import time

import torch

from fbt_probe.loading import load_model
from fbt_probe.provenance import provenance


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _median_of(fn, repeats: int, device="cpu") -> float:
    fn()  # warm-up: first-call allocations and kernel selection
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _tokens(V: int, batch: int, T: int, seed: int, device="cpu") -> torch.Tensor:
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(seed)).to(device)


def cuda_peak_memory(model, mode: str, tokens: torch.Tensor) -> dict:
    """The CUDA allocator's peak during one call, and how far it rose above the loaded model."""
    _sync(tokens.device)
    torch.cuda.reset_peak_memory_stats(tokens.device)
    before = torch.cuda.memory_allocated(tokens.device)
    model(tokens, mode=mode)
    _sync(tokens.device)
    peak = torch.cuda.max_memory_allocated(tokens.device)
    return {"rss_mb": round(peak / 2**20, 1), "added_mb": round((peak - before) / 2**20, 1)}


def peak_rss_mb() -> float:
    """This process's peak RSS in MB: VmHWM (Linux: the high-water mark of this process image
    only; ru_maxrss would also count the RSS of the parent that started it), else ru_maxrss."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_PEAK_CHILD = """
import json, sys, torch
import fbt_probe as fp
from fbt_probe.bench.model import peak_rss_mb as rss
preset, mode, batch, T, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
model = fp.load_model(preset).eval()
tokens = lambda n: torch.randint(0, model.cfg.d_vocab, (batch, n), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(tokens(8), mode=mode)
    before = rss()
    model(tokens(T), mode=mode)
print(json.dumps({"rss_mb": rss(), "added_mb": rss() - before}))
"""


def peak_memory(preset: str, mode: str, batch: int, T: int) -> dict:
    """Peak RSS of one `model(tokens, mode=mode)` call, in a fresh Python process: its ru_maxrss,
    and how far the call raised it above the loaded, warmed-up model."""
    args = [sys.executable, "-c", _PEAK_CHILD, preset, mode, str(batch), str(T), str(torch.get_num_threads())]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return {k: round(v, 1) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


@torch.no_grad()
def run_model_bench(
    preset: str = "tiny",
    batch: int = 8,
    seq: int = 1024,
    full_batches=(8, 1),
    cache_batch: int = 8,
    cache_seq: int = 256,
    repeats: int = 3,
    memory: bool = True,
    device: str = "cpu",
) -> dict:
    dev = torch.device(device)
    model = load_model(preset, device=device).eval()
    V = model.cfg.d_vocab
    med = lambda fn, n=repeats: _median_of(fn, n, dev)  # noqa: E731
    toks = _tokens(V, batch, seq, 0, dev)
    std = med(lambda: model(toks))
    prefill = {"batch": batch, "T": seq, "standard_s": std, "full": []}
    for b in full_batches:
        one = _tokens(V, b, seq, 1, dev)
        s = std if b == batch else med(lambda: model(one))
        f = med(lambda: model(one, mode="full"))
        rec = {
            "batch": b,
            "standard_s": s,
            "full_s": f,
            "full_over_standard": f / s,
            "per_step_ms": f / (seq - 1) * 1e3,
        }
        if dev.type == "cuda":  # the same scan without the captured graph: the eager lean step
            model.cuda_graphs = False
            e = med(lambda: model(one, mode="full"))
            model.cuda_graphs = True
            rec.update(eager_full_s=e, eager_per_step_ms=e / (seq - 1) * 1e3, graph_speedup=e / f)
        prefill["full"].append(rec)
    if memory:
        if dev.type == "cuda":
            prefill["peak_memory"] = {m: cuda_peak_memory(model, m, toks) for m in ("standard", "full")}
        else:
            prefill["peak_memory"] = {m: peak_memory(preset, m, batch, seq) for m in ("standard", "full")}
    small = _tokens(V, cache_batch, cache_seq, 2, dev)
    plain = med(lambda: model(small), repeats * 3)
    resid = med(lambda: model.run_with_cache(small, names_filter=lambda n: "hook_resid" in n), repeats * 3)
    every = med(lambda: model.run_with_cache(small), repeats * 3)
    n_tok = cache_batch * cache_seq
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return {
        "preset": preset,
        "device": dev.type,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "machine": machine,
        "prefill": prefill,
        "cache": {
            "batch": cache_batch,
            "seq": cache_seq,
            "plain_s": plain,
            "resid_s": resid,
            "all_s": every,
            "plain_tokens_per_s": n_tok / plain,
            "resid_over_plain": resid / plain,
            "all_over_plain": every / plain,
        },
        "provenance": provenance(),
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f} ms" if s >= 0.1 else f"{s * 1e3:.2f} ms"


def to_markdown(r: dict) -> str:
    p, c = r["prefill"], r["cache"]
    lines = [
        f"### Model ({r['preset']}, {r['device']}: {r.get('machine', '?')}, {r['threads']} threads; medians of {r['repeats']} runs)",
        "",
        "| what | batch | T | time | / standard | per serial step |",
        "|---|---:|---:|---:|---:|---:|",
        f"| `standard` | {p['batch']} | {p['T']} | {_ms(p['standard_s'])} | 1.00× | – |",
    ]
    for f in p["full"]:
        label = "`full` (CUDA graph)" if "eager_full_s" in f else "`full`"
        lines.append(
            f"| {label} | {f['batch']} | {p['T']} | {_ms(f['full_s'])} | {f['full_over_standard']:.2f}× "
            f"(standard at batch {f['batch']}: {f['standard_s'] * 1e3:,.1f} ms) | {f['per_step_ms']:.3f} ms |"
        )
        if "eager_full_s" in f:
            lines.append(
                f"| `full` (eager lean step) | {f['batch']} | {p['T']} | {_ms(f['eager_full_s'])} | "
                f"{f['eager_full_s'] / f['standard_s']:.2f}× (graph {f['graph_speedup']:.2f}× faster) | "
                f"{f['eager_per_step_ms']:.3f} ms |"
            )
    if "peak_memory" in p:
        where = (
            "the CUDA allocator's peak; added = over the loaded model"
            if r["device"] == "cuda"
            else "fresh process; added = over the loaded model"
        )
        lines += [
            "",
            f"Peak {'memory' if r['device'] == 'cuda' else 'RSS'} of one call at batch {p['batch']} × {p['T']} ({where}):",
            "",
        ]
        lines += [
            f"- `{m}`: {v['rss_mb']:,.0f} MB (added {v['added_mb']:,.0f} MB)" for m, v in p["peak_memory"].items()
        ]
    lines += [
        "",
        f"| run_with_cache, batch {c['batch']} × {c['seq']} | time | / plain forward |",
        "|---|---:|---:|",
        f"| plain forward | {c['plain_s'] * 1e3:.1f} ms | 1.00× |",
        f"| residual hooks (`hook_resid_*`) | {c['resid_s'] * 1e3:.1f} ms | {c['resid_over_plain']:.2f}× |",
        f"| every hook (incl. `hook_pattern`) | {c['all_s'] * 1e3:.1f} ms | {c['all_over_plain']:.2f}× |",
    ]
    return "\n".join(lines) + "\n"
