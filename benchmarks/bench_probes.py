"""Probe-sweep benchmark (issue 5): the project's CPU path vs scikit-learn defaults in one loop.

    python benchmarks/bench_probes.py --out /tmp/bench/probes.md           # 25 depths x 5 folds, D = 1536
    python benchmarks/bench_probes.py --depths 3 --d 64 --n 200            # a quick check
    python benchmarks/bench_probes.py --torch                              # also the batched torch path

Prints a Markdown table (the BENCHMARKS.md section) and, with --out, writes it and FILE.json
(full result with provenance).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from fbt_probe.bench_probes import bench_probe_sweep, to_markdown
    from fbt_probe.errors import FbtError
    from fbt_probe.io import atomic_path, refuse_existing

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1600, help="samples (pairs of two)")
    ap.add_argument("--d", type=int, default=1536, help="activation width D")
    ap.add_argument("--depths", type=int, default=25)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=-1, help="joblib workers of the CPU path (-1: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch", action="store_true", help="also time the batched torch path")
    ap.add_argument("--device", default=None, help="device of the torch path (default: cuda if available)")
    ap.add_argument("--out", type=Path, default=None, help="Markdown file to write (+ FILE.json)")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    args = ap.parse_args(argv)
    try:
        if args.out is not None:
            refuse_existing(args.out, args.force)
        result = bench_probe_sweep(args.n, args.d, args.depths, args.folds, args.jobs, args.seed, args.torch,
                                   args.device)
    except FbtError as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        return 2
    text = to_markdown(result)
    print(text)
    if args.out is not None:
        with atomic_path(args.out) as tmp:
            tmp.write_text(text)
        with atomic_path(Path(f"{args.out}.json")) as tmp:
            tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.out} and {args.out}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
