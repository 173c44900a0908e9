"""A standalone register-training loop around the package's `tiny` model, objective
(`multipass_loss`), optimizer (`make_optimizer`) and clip: the loop of runs R10–R19, V1–V5 and the
P-runs on register documents (P1–P4, P7–P10) of docs/research/register-binding.md.

Documents are built directly as token ids in the package's task language (checked against
`fbt_probe.tasks.words_of` once at start): writes `r{i} = {v}`, scratch lines, then Q queries
`query = r{i}` / `Value:` + answer word, each answer supervised. Held-out evaluation uses the
package's own `eval_samples` / `answer_accuracy` on registers-count (m = 1,2,4,8) and registers
(2/4/8 writes), i.e. exactly the numbers `run_training` logs (register 0 only before commit
40f814c, rotating over the registers since); with --all-queries every query register of
`--eval-pairs` held-out groups per cell.

    python benchmarks/registers_dense.py --name R12 --m 2 --writes wpr:1,wpr:2 --scratch 0 --queries 2 \
        --batch 64 --steps 400 --save runs/registers-dense/R12.pt
    (the other runs: docs/research/register-binding.md, "Dense supervision and a curriculum: R10–R21";
    one JSON line per evaluation in --log-dir)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

torch.set_num_threads(1)

from fbt_probe.loading import load_model  # noqa: E402
from fbt_probe.model.components import use_path  # noqa: E402
from fbt_probe.tasks import build_tokenizer  # noqa: E402
from fbt_probe.tasks.tokenizer import words_of  # noqa: E402
from fbt_probe.training.config import TrainConfig, parse_schedule  # noqa: E402
from fbt_probe.training.data import heldout  # noqa: E402
from fbt_probe.training.evaluate import answer_accuracy, eval_samples  # noqa: E402
from fbt_probe.training.loop import make_optimizer, prefix_mask  # noqa: E402
from fbt_probe.training.objective import multipass_loss  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--name", required=True)
p.add_argument("--m", default="2", help="comma list of register counts drawn per document")
p.add_argument("--writes", default="16", help="comma list: total assignments per document (or 'wpr:K' = K writes per register)")
p.add_argument("--scratch", default="8", help="comma list of scratch-line counts (0 = none)")
p.add_argument("--queries", type=int, default=1, help="final queries per document (distinct registers when possible)")
p.add_argument("--batch", type=int, default=32, help="documents per step")
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--warmup", type=int, default=100)
p.add_argument("--cosine", action="store_true", help="cosine to 10%% (default: constant after warmup)")
p.add_argument("--lm", type=float, default=0.0, help="weight of the mean text-token loss beside the mean answer loss")
p.add_argument("--feedback", action="store_true", help="paper schedule (default: baseline, K = 1)")
p.add_argument("--eval-every", type=int, default=100)
p.add_argument("--eval-pairs", type=int, default=32)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--minutes", type=float, default=18.0, help="stop after this wall time")
p.add_argument("--qk", type=float, default=None, help="qk_norm_init override")
p.add_argument("--depth-scaling", default=None, help="ModelConfig.depth_scaling override ('none': plain residual branches)")
p.add_argument("--wd", type=float, default=0.01)
p.add_argument("--save", default=None)
p.add_argument("--log-dir", default="runs/registers-dense")
p.add_argument("--mix", default=None, help="space-separated kinds m:writes:scratch[:weight] (overrides --m/--writes/--scratch); "
               "each step's documents are grouped by kind into micro-batches")
p.add_argument("--reg-offset", type=int, default=0, help="control: register i is written r{i+offset} (10: register ids are tokens 10-17, never the value digits)")
p.add_argument("--all-queries", action="store_true", help="evaluate every query register (eval-pairs = groups per cell)")
p.add_argument("--random-names", action="store_true", help="register names drawn from 0-7 (not always 0..m-1)")
p.add_argument("--init", default=None, help="state dict to start from")
p.add_argument("--values", type=int, default=2, help="V1-: values drawn from 0..N-1 in a share of the documents, answered by the value token itself")
p.add_argument("--eval-mode", default="standard", help="decoding mode of train_fmt and --agree (a feedback model: e.g. recurrent:1)")
p.add_argument("--agree", action="store_true", help="with --steps 1 --lr 0: also report how often the answer equals the last value written")
p.add_argument("--value-share", type=float, default=0.0, help="share of documents with --values values (the rest binary, answered zero/one)")
a = p.parse_args()

tok = build_tokenizer()
V = tok.get_vocab()
ID = lambda w: V[w]  # noqa: E731
NL, EQ, COL, R, SCR, PLUSEQ, QRY, VAL = (ID(w) for w in ("\n", "=", ":", "r", "scratch", "+=", "query", "Value"))
DIG = [ID(str(d)) for d in range(100)]
WORD = [ID("zero"), ID("one")]
RDIG = [ID(str(d + a.reg_offset)) for d in range(10)]
cfg = TrainConfig(tasks=("registers", "registers-count"), baseline=not a.feedback, seed=a.seed, lr=a.lr)
HO = heldout(cfg)
ms = [int(x) for x in a.m.split(",")]
scratches = [int(x) for x in a.scratch.split(",")]
rng = np.random.default_rng(1000 + a.seed)


def heldout_hit(m, writes, s, w_total):
    """Would this schedule be a held-out group (same format as registers / registers-count)?"""
    vals = [v for _, v in writes]
    if vals[0]:
        vals = [1 - v for v in vals]
    width = max(1, ((2 * m - 1).bit_length() + 3) // 4)
    tail = "".join(format(2 * reg + v, f"0{width}x") for (reg, _), v in zip(writes, vals))
    w = w_total // m
    return any(f"{t}:m{m}w{w}S{s}:{tail}" in HO for t in ("registers", "registers-count"))


def make_doc(m, n_writes, n_scr, n_q):
    while True:
        if n_writes.startswith("wpr:"):
            k = int(n_writes[4:])
            order = rng.permutation(np.repeat(np.arange(m), k)).tolist()
        else:
            n = int(n_writes)
            order = (rng.permutation(np.repeat(np.arange(m), n // m)).tolist() if n % m == 0
                     else rng.integers(0, m, n).tolist())
        if a.random_names:  # the m registers get distinct random names from 0-7, so every name is trained equally
            names = rng.choice(max(8, m), size=m, replace=False).tolist()
            order = [names[r] for r in order]
        many = a.value_share > 0 and rng.random() < a.value_share
        writes = [(r, int(rng.integers(0, a.values if many else 2))) for r in order]
        s = int(rng.integers(0, 10))
        if many and any(v > 1 for _, v in writes):
            break
        many = False
        if not heldout_hit(m, writes, s, len(writes)):
            break
    ids = []
    for r, v in writes:
        ids += [R, RDIG[r], EQ, DIG[v], NL]
    if n_scr:
        ids += [SCR, EQ, DIG[s], NL] + [SCR, PLUSEQ, DIG[0], NL] * (n_scr - 1)
    latest = dict(writes)
    written = sorted(latest)
    qs = rng.permutation(written).tolist()
    qs = (qs * (n_q // len(qs) + 1))[:n_q] if n_q > len(qs) else qs[:n_q]
    rng.shuffle(qs)
    ans = []
    for i, q in enumerate(qs):
        ids += [QRY, EQ, R, RDIG[q], NL, VAL, COL]
        ans.append(len(ids))
        ids += [DIG[latest[q]] if many else WORD[latest[q]], NL]
    LAST.append(DIG[writes[-1][1]] if many else WORD[writes[-1][1]])  # the last value written, as its answer token
    return ids, ans


LAST: list = []  # --agree: the answer token of each drawn document's last write
# the ids agree with the package's tokenization of the same text
_ids, _ = make_doc(2, "4", 2, 1)
_text = " ".join({v: k for k, v in V.items()}[i] for i in _ids).replace(" \n ", "\n").replace(" :", ":")
assert [V[w] for w in words_of(_text)] == _ids[: len(words_of(_text))], _text


KINDS = None
if a.mix:
    KINDS = []
    for k in a.mix.split():
        parts = k.split(":")
        if parts[1] == "wpr":
            parts = [parts[0], "wpr:" + parts[2]] + parts[3:]
        KINDS.append((int(parts[0]), parts[1], int(parts[2]), float(parts[3]) if len(parts) > 3 else 1.0))
    KW = np.array([k[3] for k in KINDS]) / sum(k[3] for k in KINDS)


def batches():
    if KINDS is None:
        return [batch()]
    counts = np.bincount(rng.choice(len(KINDS), size=a.batch, p=KW), minlength=len(KINDS))
    return [batch([KINDS[i][:3]] * int(n)) for i, n in enumerate(counts) if n]


def batch(kinds=None):
    docs = []
    if kinds is None:
        kinds = [(int(rng.choice(ms)), str(rng.choice(a.writes.split(","))), int(rng.choice(scratches))) for _ in range(a.batch)]
    for m, w, sc in kinds:
        docs.append(make_doc(m, w, sc, a.queries))
    L = max(len(d) for d, _ in docs)
    toks = torch.zeros(len(docs), L, dtype=torch.long)
    tw = torch.zeros(len(docs), L)
    aw = torch.zeros(len(docs), L)
    for i, (d, ans) in enumerate(docs):
        toks[i, : len(d)] = torch.tensor(d)
        tw[i, : len(d) - 1] = 1.0
        for p_ in ans:
            aw[i, p_ - 1] = 1.0
            tw[i, p_ - 1] = 0.0
    targets = torch.cat([toks[:, 1:], torch.zeros(len(docs), 1, dtype=torch.long)], 1)
    w = aw / aw.sum() * (aw.sum() / a.batch / a.queries if KINDS is not None else 1.0)
    if a.lm > 0:
        w = w + a.lm * tw / tw.sum()
    return toks, targets, w


over = {"feedback_noise": cfg.noise}
if a.depth_scaling is not None:
    over["depth_scaling"] = a.depth_scaling
if a.qk is not None:
    over["qk_norm_init"] = a.qk
model = load_model(cfg.preset, seed=a.seed, d_vocab=tok.get_vocab_size(), **over)
cfg_opt = TrainConfig(tasks=cfg.tasks, lr=a.lr, weight_decay=a.wd)
if a.init:
    model.load_state_dict(torch.load(a.init))
opt = make_optimizer(model, cfg_opt)
sched = parse_schedule("constant:1" if not a.feedback else cfg.schedule)
def all_query_samples(groups):
    """Held-out samples with EVERY query register (eval_samples keeps only each group's first pair: register 0)."""
    import pandas as pd
    from fbt_probe.tasks import generate, load_spec
    frames = [generate(load_spec(t), groups=groups, seed=10_000, tokenizer=tok, contexts=HO) for t in cfg.tasks]
    return pd.concat(frames, ignore_index=True)


samples = all_query_samples(a.eval_pairs) if a.all_queries else eval_samples(cfg, tok, pairs=a.eval_pairs)
gen = torch.Generator().manual_seed(a.seed)
torch.manual_seed(a.seed)


def lr_at(step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    if not a.cosine:
        return a.lr
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def evaluate():
    model.eval()
    acc = answer_accuracy(model, samples, tok, modes=("standard",))
    with torch.no_grad():  # accuracy on a fresh training-format batch (in distribution)
        hit = []
        for toks, targets, w in batches():
            pred = model(toks, mode=a.eval_mode).argmax(-1)
            sel = w >= 0.5 * w.max()  # the answer positions (each answer outweighs every text token)
            hit += (pred[sel] == targets[sel]).tolist()
        indist = float(np.mean(hit))
        if a.agree:  # share of answers that equal the last value written (one micro-batch, all its answers)
            LAST.clear()
            (toks, targets, w), = batches()
            pred = model(toks, mode=a.eval_mode).argmax(-1)
            rows, cols = torch.nonzero(w >= 0.5 * w.max(), as_tuple=True)
            last = torch.tensor(LAST)[rows]
            print(json.dumps({"right": round(float((pred[rows, cols] == targets[rows, cols]).float().mean()), 3),
                              "equals_last_write": round(float((pred[rows, cols] == last).float().mean()), 3),
                              "last_write_is_right": round(float((targets[rows, cols] == last).float().mean()), 3),
                              "right_where_last_write_is_right": round(float((pred[rows, cols] == targets[rows, cols])[targets[rows, cols] == last].float().mean()), 3),
                              "right_elsewhere": round(float((pred[rows, cols] == targets[rows, cols])[targets[rows, cols] != last].float().mean()), 3)}))
    model.train()
    return {"train_fmt": round(indist, 3), **{f"{'rc' if r.task == 'registers-count' else 'rw'}{r.length_knob}": round(r.accuracy, 3) for r in acc.itertuples()}}


os.makedirs(a.log_dir, exist_ok=True)
log = open(os.path.join(a.log_dir, f"{a.name}.jsonl"), "w")
log.write(json.dumps({"args": vars(a), "cmd": "python benchmarks/registers_dense.py " + " ".join(os.sys.argv[1:])}) + "\n")
t0, tstep, run_loss, run_acc = time.time(), 0.0, 0.0, 0.0
model.train()
with use_path(model, "auto"):
    for step in range(a.steps):
        micro = batches()
        K = sched.draw(float(torch.rand(1, generator=gen)))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ts = time.time()
        opt.zero_grad(set_to_none=True)
        total = sum(float(w.sum()) for _, _, w in micro)
        loss = 0.0
        for toks, targets, w in micro:
            has = prefix_mask(*toks.shape, cfg.prefix_mix, gen)
            l_, parts = multipass_loss(model, toks, targets, w, K, cfg.lam, has)
            (l_ * float(w.sum()) / total).backward()
            loss += l_.item() * float(w.sum()) / total
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tstep += time.time() - ts
        run_loss = 0.95 * run_loss + 0.05 * loss if step else loss
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps or time.time() - t0 > a.minutes * 60:
            rec = {"step": step + 1, "loss": round(run_loss, 4), "wall": round(time.time() - t0, 1), "step_s": round(tstep, 1), **evaluate()}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if time.time() - t0 > a.minutes * 60:
                break
if a.save:
    torch.save(model.state_dict(), a.save)
