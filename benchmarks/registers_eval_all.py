"""Held-out Std accuracy of a state dict on EVERY query register (docs/research/register-binding.md,
"Dense supervision and a curriculum: R10–R21"), per cell and per query register at knob 8 (every
pair of each held-out group; `eval_samples` takes one pair per group, before commit 40f814c always
the query of register 0).

    python benchmarks/registers_eval_all.py STATE.pt [GROUPS_PER_CELL]
"""
import sys

import numpy as np
import torch

torch.set_num_threads(1)
from fbt_probe.loading import load_model  # noqa: E402
from fbt_probe.tasks import build_tokenizer, generate, load_spec  # noqa: E402
from fbt_probe.training.config import TrainConfig  # noqa: E402
from fbt_probe.training.data import heldout  # noqa: E402
from fbt_probe.training.evaluate import answer_accuracy  # noqa: E402

tok = build_tokenizer()
model = load_model("tiny", seed=0, d_vocab=tok.get_vocab_size())
model.load_state_dict(torch.load(sys.argv[1]))
model.eval()
groups = int(sys.argv[2]) if len(sys.argv) > 2 else 16
cfg = TrainConfig(tasks=("registers", "registers-count"))
out = {}
for task in cfg.tasks:
    spec = load_spec(task)
    df = generate(spec, groups=groups, seed=10_000, tokenizer=tok, contexts=heldout(cfg))
    df["q"] = df.text.str.extract(r"query = r(\d)")[0].astype(int)
    for knob, cell in df.groupby("length_knob"):
        cell = cell.reset_index(drop=True)
        acc = answer_accuracy(model, cell, tok, modes=("standard",))
        # per query register as well
        per_q = []
        for q, c in cell.groupby("q"):
            per_q.append(answer_accuracy(model, c.reset_index(drop=True), tok, modes=("standard",))["accuracy"].iloc[0])
        key = f"{'rc' if task == 'registers-count' else 'rw'}{knob}"
        if knob == 8:
            print(key, "by query register:", [round(float(x), 2) for x in per_q])
        out[key] = (round(float(acc["accuracy"].iloc[0]), 3), int(acc["n"].iloc[0]), round(float(np.min(per_q)), 3))
print(sys.argv[1], " ".join(f"{k}={v[0]}(n={v[1]},worst-q={v[2]})" for k, v in out.items()))
