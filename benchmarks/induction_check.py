"""Can the `tiny` model learn a plain induction head on this budget (runs P5 and P6 of
docs/research/register-binding.md, "The induction warm-up: P1–P10")? Documents are N random tokens
(the numbers 0-99 of the task vocabulary), then 0 to --gap random filler tokens, then the N tokens
again; the loss is on the second copy only (each token there is the token after the previous
occurrence of the token before it). The random gap means no fixed-offset head can copy: only
content-based lookup (an induction head) can. The package's model, objective (K = 1), optimizer and
clip, as registers_dense.py.
Prints the accuracy on the second copy (first token excluded) every 100 steps.

    python benchmarks/induction_check.py --n 20 --steps 1500 --lr 3e-3
"""
from __future__ import annotations

import argparse
import json
import time

import torch

torch.set_num_threads(1)

from fbt_probe.loading import load_model  # noqa: E402
from fbt_probe.model.components import use_path  # noqa: E402
from fbt_probe.tasks import build_tokenizer  # noqa: E402
from fbt_probe.training.config import TrainConfig  # noqa: E402
from fbt_probe.training.loop import make_optimizer  # noqa: E402
from fbt_probe.training.objective import multipass_loss  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=20, help="random tokens per copy")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--gap", type=int, default=10, help="filler tokens between the copies: uniform in 0..gap")
p.add_argument("--steps", type=int, default=1500)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--save", default=None, help="state dict at the end (a start for registers_dense.py --init)")
a = p.parse_args()

tok = build_tokenizer()
V = tok.get_vocab()
NUM = torch.tensor([V[str(d)] for d in range(100)])
model = load_model("tiny", seed=a.seed, d_vocab=tok.get_vocab_size())
opt = make_optimizer(model, TrainConfig(lr=a.lr))
gen = torch.Generator().manual_seed(a.seed)


def batch():
    L = 2 * a.n + a.gap
    toks = NUM[torch.randint(0, 100, (a.batch, L), generator=gen)]
    w = torch.zeros(a.batch, L)
    gaps = torch.randint(0, a.gap + 1, (a.batch,), generator=gen)
    for r in range(a.batch):
        start = a.n + int(gaps[r])  # the second copy; whatever follows it is filler
        toks[r, start: start + a.n] = toks[r, : a.n]
        w[r, start: start + a.n - 1] = 1.0  # these positions predict the copy's tokens 2..n
    targets = torch.cat([toks[:, 1:], torch.zeros(a.batch, 1, dtype=torch.long)], 1)
    return toks, targets, w / w.sum()


t0 = time.time()
model.train()
with use_path(model, "auto"):
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / a.warmup)
        toks, targets, w = batch()
        opt.zero_grad(set_to_none=True)
        has = torch.zeros(toks.shape, dtype=torch.bool)
        loss, _ = multipass_loss(model, toks, targets, w, 1, 1.0, has)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            with torch.no_grad():
                toks, targets, w = batch()
                pred = model(toks, mode="standard").argmax(-1)
                acc = float((pred == targets)[w > 0].float().mean())
            print(json.dumps({"step": step + 1, "loss": round(loss.item(), 4), "acc_second_copy": round(acc, 3),
                              "wall": round(time.time() - t0, 1)}), flush=True)
if a.save:
    torch.save(model.state_dict(), a.save)
