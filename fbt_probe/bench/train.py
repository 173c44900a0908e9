"""`fbt-probe bench train`: training tokens per second of `fbt-probe train --corpus` against a plain
PyTorch loop over the same model, the same windows and the same objective, hooks off.

The plain loop is what a researcher would write by hand: draw `rows` windows of `seq_len` tokens
from the stored corpus array, run K Jacobi passes with the model's own `feedback_pass` (pass k fuses
the right-shifted states of pass k - 1), sum eq. 12's losses, backward, clip, AdamW step. Ours is
`run_training` itself (the schedule drawn per step, the prefix mix, noise, checkpoints every 100
steps, validation every 100 steps), at `constant:K`. Each is timed per step after `warmup` steps;
the table gives the median step's data tokens per second (a K-pass step counts its tokens once).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fbt_probe.engine.dispatch import use_path
from fbt_probe.loading import load_model
from fbt_probe.provenance import provenance
from fbt_probe.training import TrainConfig, run_training
from fbt_probe.training.lm import corpus_of


def _plain_steps(cfg: TrainConfig, K: int, steps: int, vocab: int) -> list[float]:
    model = load_model(cfg.preset, seed=cfg.seed, d_vocab=vocab, feedback_noise=cfg.noise)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    arr = corpus_of(cfg).arrays["train"]
    rows, T = cfg.tokens_per_step // cfg.seq_len, cfg.seq_len
    rng = np.random.default_rng(cfg.seed)
    has = torch.arange(T) >= 1
    model.train()
    times = []
    with use_path(model, "auto"):
        for _ in range(steps):
            t0 = time.perf_counter()
            starts = rng.integers(0, len(arr) - T, size=rows)
            block = torch.from_numpy(np.stack([arr[s : s + T + 1] for s in starts]).astype(np.int64))
            x, y = block[:, :-1], block[:, 1:]
            states, losses = None, []
            for _k in range(K):
                state, logits = model.feedback_pass(x, states, None if states is None else has)
                losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
                states = model.shift_states(state)
            loss = losses[0] if K == 1 else losses[0] + sum(losses[1:]) / (K - 1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            opt.step()
            times.append(time.perf_counter() - t0)
    return times


def _ours_steps(cfg: TrainConfig, K: int, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = dict(cfg.__dict__)
        run.update(schedule=f"constant:{K}", steps=steps, baseline=False, corpus_sha256=None)
        t = TrainConfig(**run)
        start = time.perf_counter()
        run_training(t, Path(tmp) / "run", progress=False)
        wall = time.perf_counter() - start
        log = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r["step_s"] for r in log], wall


def run_train_bench(
    corpus: str, preset: str, seq_len: int, tokens_per_step: int, passes, steps: int, warmup: int
) -> dict:
    cfg = TrainConfig(preset=preset, corpus=corpus, seq_len=seq_len, tokens_per_step=tokens_per_step, eval_every=10**9)
    vocab = corpus_of(cfg).tokenizer().get_vocab_size()
    data_tokens = (tokens_per_step // seq_len) * seq_len
    rows = []
    for K in passes:
        plain = _plain_steps(cfg, K, steps, vocab)[warmup:]
        ours, wall = _ours_steps(cfg, K, steps)
        ours = ours[warmup:]
        p, o = statistics.median(plain), statistics.median(ours)
        rows.append(
            {
                "passes": K,
                "plain_tokens_per_s": data_tokens / p,
                "ours_tokens_per_s": data_tokens / o,
                "ratio_plain_over_ours": p and o / p,
                "plain_step_s": p,
                "ours_step_s": o,
                "ours_wall_s_with_checkpoints": wall,
            }
        )
    return {
        "benchmark": "train",
        "config": {
            "corpus": corpus,
            "preset": preset,
            "seq_len": seq_len,
            "tokens_per_step": tokens_per_step,
            "steps": steps,
            "warmup": warmup,
            "threads": torch.get_num_threads(),
        },
        "rows": rows,
        "provenance": provenance(),
    }


def to_markdown(result: dict) -> str:
    c = result["config"]
    lines = [
        f"Training on the corpus, {c['preset']}, {c['tokens_per_step'] // c['seq_len']} windows x {c['seq_len']} "
        f"tokens per step, {c['threads']} torch thread(s); median of {c['steps'] - c['warmup']} steps after "
        f"{c['warmup']} warm-up.",
        "",
        "| passes K | plain loop tokens/s | fbt-probe train tokens/s | ours / plain step time |",
        "|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['passes']} | {r['plain_tokens_per_s']:,.0f} | {r['ours_tokens_per_s']:,.0f} | "
            f"{r['ratio_plain_over_ours']:.2f}x |"
        )
    return "\n".join(lines) + "\n"
