"""Extraction throughput, one process vs torchrun with two (BENCHMARKS.md, "Several processes").

    flock /tmp/fbt-heavy.lock .venv/bin/python benchmarks/bench_extract_ranks.py [--groups 12] [--runs 5]

Generates completion + memory minimal pairs, then times `fbt-probe extract ref:tiny-feedback` (modes
standard,recurrent:1 + carried-state) as whole commands (start-up included): one process with one
thread, one process with two threads, and `torchrun --standalone --nproc_per_node 2` with one thread
each. Checks the shards of every run are byte-identical to those of the first run with as many
threads per process (a matmul's last bits may depend on the thread count); prints medians and ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def shards(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob("shards/**/*.safetensors"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-extract-ranks."))
    cli = [sys.executable, "-m", "fbt_probe"]
    subprocess.run(cli + ["tasks", "generate", "completion", "memory", "--groups", str(args.groups),
                          "--out", str(root / "data")], check=True, capture_output=True)
    extract = ["extract", "ref:tiny-feedback", str(root / "data"), "--modes", "standard,recurrent:1"]
    setups = {
        "1 process x 1 thread": (cli, 1),
        "1 process x 2 threads": (cli, 2),
        "torchrun 2 processes x 1 thread": ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                             "--nproc_per_node=2", "-m", "fbt_probe"], 1),
    }
    times, reference = {k: [] for k in setups}, {}
    for run in range(args.runs):
        for name, (prefix, threads) in setups.items():
            out = root / "acts"
            t0 = time.perf_counter()
            subprocess.run(prefix + extract + ["--out", str(out)], check=True, capture_output=True,
                           env={**os.environ, "OMP_NUM_THREADS": str(threads)})
            times[name].append(time.perf_counter() - t0)
            got = shards(out)  # byte-identical among runs with the same threads per process
            reference.setdefault(threads, got)
            assert got == reference[threads], f"{name}: shards differ from the first {threads}-thread run's"
            n = json.loads((out / "manifest.json").read_text())["n_samples"]
            shutil.rmtree(out)
            print(f"run {run + 1}: {name}: {times[name][-1]:.1f} s", flush=True)
    base = statistics.median(times["1 process x 1 thread"])
    print(f"\n{n} samples, {len(reference[1])} shards, byte-identical in every run of the same threads per process")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<34} median {med:6.1f} s  ({n / med:5.1f} samples/s, x{base / med:.2f} vs 1x1)  "
              f"runs: {', '.join(f'{t:.1f}' for t in ts)}")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
