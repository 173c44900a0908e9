"""The issue-7 fusion benchmark on a CUDA machine, in one call (no install needed).

    python3 benchmarks/bench_fusion_gpu.py [OUT_DIR]        (default OUT_DIR: reports/bench)

Writes OUT_DIR/fusion-gpu.md (the tables of `fbt-probe bench fusion` at the defaults: D = 1536,
rows 1..64k, bf16, decode share of paper-1b at batch 1/8/64 with a 2048-token cache) plus a
num_warps sweep of the kernel, and OUT_DIR/fusion-gpu.md.json (everything, with provenance).
It imports only fbt_probe.bench.fusion (not the CLI), so it runs on an image without
transformer-lens; the real-model decode step is then reported as an import error.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package from this checkout, installed or not (fbt_probe.kernels is inside it)

import importlib  # noqa: E402

import torch  # noqa: E402

from fbt_probe.bench.fusion import FusionBenchConfig, make_timer, run_fusion_bench, to_markdown  # noqa: E402
from fbt_probe.bench.report import save_report  # noqa: E402


def warps_sweep(d: int = 1536, rows=(64, 4096, 65536), warps=(1, 2, 4, 8, 16)) -> tuple[list[str], list[dict]]:
    """Median time of the kernel per num_warps (the launcher's heuristic picks one)."""
    kmod = importlib.import_module("fbt_probe.kernels.glu_fusion")
    timer = make_timer(torch.device("cuda"), 100.0)
    lines = ["", f"#### Kernel num_warps sweep (D = {d}, bf16; default = {kmod._num_warps(kmod.triton.next_power_of_2(d))})", "",
             "| rows | " + " | ".join(f"{w} warps µs" for w in warps) + " |", "|---:|" + "---:|" * len(warps)]
    records = []
    for n in rows:
        v = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)
        g = torch.rand(n, d, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
        times = [timer(lambda: kmod._launch(v, g, None, w, 1e-6, num_warps=nw)) for nw in warps]
        records.append({"rows": n, "times_s": dict(zip(warps, times))})
        lines.append(f"| {n} | " + " | ".join(f"{t * 1e6:.1f}" for t in times) + " |")
    return lines, records


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "reports" / "bench"
    if not torch.cuda.is_available():
        print("no CUDA device: use `fbt-probe bench fusion` for the CPU reference numbers", file=sys.stderr)
        return 2
    result = run_fusion_bench(FusionBenchConfig(device="cuda"))
    text = to_markdown(result)
    try:
        lines, sweep = warps_sweep()
        result["warps_sweep"] = sweep
        text += "\n".join(lines) + "\n"
    except Exception as exc:  # the sweep is extra: keep the main tables
        text += f"\nnum_warps sweep failed: {type(exc).__name__}: {exc}\n"
    md, side = save_report(result, text, out_dir / "fusion-gpu.md", force=True)
    print(text)
    print(f"wrote {md} and {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
