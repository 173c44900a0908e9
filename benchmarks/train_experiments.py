"""The training experiments behind the `tiny` preset's defaults (docs/research/qk-norm-gain-and-lr.md
and docs/research/completion-dependable.md; the current time of W8: BENCHMARKS.md, "Other
trainings"): each named run trains with `run_training`, evaluates held-out Std accuracy every
`eval_every` steps and prints one line per evaluation.

    python benchmarks/train_experiments.py M6 --out /tmp/exp          # one experiment
    python benchmarks/train_experiments.py --list

The model overrides patch the `tiny` preset in this process only (e.g. the QK-norm gain before it
became the preset's default)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

QK1 = {"qk_norm_init": 1.0}
QK3 = {"qk_norm_init": 3.0}
MIX = ("completion", "memory", "registers")
SHARES = {"completion": 0.5, "memory": 0.25, "registers": 0.25}
EXPERIMENTS = {  # name: (train config overrides, model overrides, what it tests)
    "E1": ({"tasks": ("completion",), "steps": 300}, QK1, "completion alone, QK gain 1"),
    "E2": ({"tasks": ("completion",), "steps": 400}, {**QK1, "n_key_value_heads": 4}, "completion alone, no GQA"),
    "E3": ({"tasks": ("completion",), "steps": 400, "lr": 5e-3}, QK1, "completion alone, lr 5e-3"),
    "V1": ({"tasks": ("completion",), "knobs": {"completion": [0]}, "steps": 600}, QK1, "completion at 0 distractors, gain 1"),
    "V3": ({"tasks": ("completion",), "knobs": {"completion": [0]}, "steps": 600}, QK3, "completion at 0 distractors, gain 3"),
    "A": ({"tasks": ("completion", "memory"), "steps": 600}, QK1, "completion + memory, gain 1"),
    "M2": ({"tasks": MIX, "steps": 400}, {"qk_norm_init": 2.0}, "three tasks, gain 2"),
    "M3": ({"tasks": MIX, "steps": 800}, QK3, "three tasks, gain 3, lr 2e-3"),
    "B3": ({"tasks": MIX, "steps": 400, "baseline": True}, QK3, "three tasks, baseline (1 pass), gain 3"),
    "M4": ({"tasks": MIX, "steps": 800, "one_pass_steps": 400}, QK3, "three tasks, gain 3, one pass for 400 steps"),
    "M5": ({"tasks": MIX, "steps": 600, "lr": 1e-3}, QK3, "three tasks, gain 3, lr 1e-3, 600 steps"),
    "M6": ({"tasks": MIX, "steps": 800, "lr": 1e-3, "eval_every": 100}, QK3, "three tasks, gain 3, lr 1e-3, 800 steps"),
    "W1": ({"tasks": MIX, "steps": 600, "eval_every": 100}, {"fusion_norm_init": 1.0}, "default, fusion norm weight starts at 1"),
    "W2": ({"tasks": MIX, "steps": 600, "eval_every": 100, "lr": 2e-3}, {"fusion_norm_init": 1.0}, "W1 with lr 2e-3"),
    "W3": ({"tasks": ("completion", "memory"), "steps": 600, "eval_every": 100}, {"fusion_norm_init": 1.0}, "W1 without registers"),
    "W4": ({"tasks": MIX, "steps": 600, "eval_every": 100, "task_shares": SHARES}, {"fusion_norm_init": 1.0},
           "W1 with half the tokens on completion, a quarter each on memory and registers"),
    "W5": ({"tasks": MIX, "steps": 600, "eval_every": 100, "task_shares": SHARES}, {},
           "default (fusion norm at embedding RMS) with W4's task shares"),
    "W6": ({"tasks": MIX, "steps": 800, "eval_every": 100, "task_shares": SHARES}, {"fusion_norm_init": 1.0}, "W4 for 800 steps"),
    "W8": ({"tasks": MIX, "steps": 800, "eval_every": 100, "task_shares": SHARES, "answer_share": 0.5}, {"fusion_norm_init": 1.0},
           "W6 with the answer at half of every document's loss weight"),
    "W9": ({"tasks": MIX, "steps": 600, "eval_every": 100, "task_shares": SHARES, "answer_share": 0.5}, {"fusion_norm_init": 1.0},
           "W8 for 600 steps"),
    "W7": ({"tasks": MIX, "steps": 600, "eval_every": 100, "task_shares": SHARES, "lr": 2e-3}, {"fusion_norm_init": 1.0},
           "W4 at lr 2e-3"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", choices=sorted(EXPERIMENTS))
    ap.add_argument("--out", type=Path, default=Path("runs/train-experiments"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        for k, (t, m, what) in EXPERIMENTS.items():
            print(f"{k:4s} {what}: train {t}, model {m}")
        return 0
    import fbt_probe.config as C
    from fbt_probe.training import TrainConfig, run_training
    from fbt_probe.training.config import equal_cell_shares

    train, model, _ = EXPERIMENTS[args.name]
    C.PRESETS["tiny"] = C.PRESETS["tiny"].replace(**model)
    if "task_shares" not in train:  # every run before W4 drew every (task, length) cell with the same share of tokens
        train = {**train, "task_shares": equal_cell_shares(train["tasks"], train.get("knobs"))}
    train = {"answer_share": None, **train}  # every run before W8 weighted the answer as 20 text tokens
    cfg = TrainConfig(**{"eval_every": 50, "save_every": 10**9, **train, "seed": args.seed})
    out = args.out / (args.name if args.seed == 0 else f"{args.name}-s{args.seed}")
    t0 = time.perf_counter()
    run_training(cfg, out, force=True, progress=False, eval_pairs=32)
    print(f"{args.name}: {time.perf_counter() - t0:.0f} s in all (training steps + evaluations)")
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if any(k.startswith("acc_") for k in r):
            print(r["step"], " ".join(f"{k[4:]}={v:.2f}" for k, v in r.items() if k.startswith("acc_")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
