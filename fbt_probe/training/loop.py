"""One straight-line training loop (nanoGPT-sized) with the multi-pass objective of eq. 12:

    L = L_1 + λ/(K-1) Σ_{k=2..K} L_k         (gradients not detached; K ~ schedule per batch)

where pass 1 is standard and pass k fuses the right-shifted carried states of pass k-1 (jacobi:K).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import torch
from rich.progress import TextColumn

from fbt_probe import distributed
from fbt_probe.engine.dispatch import use_path
from fbt_probe.errors import FbtError
from fbt_probe.progress import bar
from fbt_probe.training import parallel
from fbt_probe.training.checkpoint import save_run
from fbt_probe.training.config import FULL_PASSES, TrainConfig
from fbt_probe.training.data import batches_for_step, step_seed
from fbt_probe.training.objective import multipass_loss


def prefix_mask(rows: int, ctx: int, share: float, gen: torch.Generator) -> torch.Tensor:
    """has_state [rows, ctx]: position >= 1, except that a `share` of rows keep a random prompt
    prefix plain (as at inference, where the prompt is prefilled without feedback)."""
    pos = torch.arange(ctx)[None, :].expand(rows, ctx)
    prefix = torch.randint(1, max(2, ctx), (rows, 1), generator=gen)
    keep = torch.rand(rows, 1, generator=gen) < share
    start = torch.where(keep, prefix, torch.ones_like(prefix))
    return pos >= start


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    start = cfg.decay_start
    t = max(0, step - start) / max(1, cfg.steps - start)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def train(
    model,
    tokenizer,
    cfg: TrainConfig,
    out: Path,
    start_step: int = 0,
    optimizer=None,
    progress=True,
    on_eval=None,
    fsdp: bool = False,
    stop_at: int | None = None,
    curriculum=None,
) -> dict:
    """Train `model` in place from `start_step` to `cfg.steps` (or only to `stop_at`, with a
    checkpoint there: the run resumes from it), checkpointing into `out`.

    Attention takes the explicit path throughout (steps and evaluations): the arithmetic the
    recorded runs were trained with, so a seed still gives the checkpoint docs/research/ and the
    reference report describe, byte for byte (the SDPA path would differ in the last float bits,
    and training amplifies that into a different model). A corpus run (`TrainConfig.corpus`, no
    recorded runs of the explicit arithmetic to keep) takes the engine's routes (SDPA attention),
    whose speed is the plain PyTorch loop's (BENCHMARKS.md); a seed still gives the same bytes at
    the same thread count.

    Under torchrun each rank takes its rows of every step (`fbt_probe.training.parallel`): DDP, or
    with `fsdp` the parameters, gradients and optimizer state sharded by FSDP2; rank 0 writes the
    log and the (consolidated) checkpoint.

    `curriculum` (a `fbt_probe.training.curriculum.Progress`, under `TrainConfig.k_curriculum`): the
    k each step draws up to; at the eval cadence its measure may advance it (on every rank, whose
    weights are the same under DDP), logged as the record's `curriculum` and saved in the train state."""
    with use_path(model, "explicit" if cfg.corpus is None else "auto"):
        return _train(model, tokenizer, cfg, out, start_step, optimizer, progress, on_eval, fsdp, stop_at, curriculum)


def _train(
    model,
    tokenizer,
    cfg: TrainConfig,
    out: Path,
    start_step: int,
    optimizer,
    progress,
    on_eval,
    fsdp,
    stop_at=None,
    curriculum=None,
) -> dict:
    world = distributed.world()
    if fsdp and not torch.distributed.is_initialized():
        raise FbtError(
            "--fsdp: shards the model over torchrun's processes; launch with torchrun "
            "(torchrun --nproc_per_node N -m fbt_probe train ... --fsdp)"
        )
    if fsdp and curriculum is not None and curriculum.cur.threshold is not None:
        raise FbtError(
            "--fsdp: no rank holds the whole model to measure the k curriculum's accuracy; replay a run's "
            "advances with the fixed form --k-curriculum 'k:step,...' or train under DDP"
        )
    opt = optimizer or make_optimizer(model, cfg)
    # DDP (or FSDP2) over the objective (training/parallel.py); alone: the model itself
    engine = parallel.wrap(model, fsdp) if world.several or fsdp else None
    if fsdp:  # the parameters are now DTensor shards: a new optimizer over them, the resumed state loaded in
        state, opt = (opt.state_dict() if optimizer is not None else None), make_optimizer(model, cfg)
        if state is not None:
            parallel.load_optimizer_state(engine, model, opt, state)
    log_path = out / "metrics.jsonl"
    model.train()
    if progress and world.main and start_step >= cfg.steps:
        print(f"train: already at step {start_step} of {cfg.steps} in {out}: nothing to train", flush=True)
    bar = _progress(cfg.steps, start_step) if progress and world.main and start_step < cfg.steps else None
    t0, tokens_seen = time.perf_counter(), 0
    try:
        end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        for step in range(start_step, end):
            max_k = None if curriculum is None else curriculum.k(step)
            rec, n_tok = _step(model, engine, opt, tokenizer, cfg, step, max_k)
            tokens_seen += n_tok
            if max_k is not None:
                rec["k"] = max_k
                if (step + 1) % cfg.eval_every == 0:  # a function of the step alone: a resume measures the same
                    model.eval()
                    measured = curriculum.update(model, step + 1)
                    model.train()
                    if measured is not None:
                        rec["curriculum"] = measured
            # under FSDP2 no rank holds the whole model between steps: evaluate the run afterwards (fbt-probe eval)
            if (
                on_eval is not None
                and world.main
                and not fsdp
                and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps)
            ):
                model.eval()
                rec.update(on_eval(model))
                model.train()
            if world.main:  # one log and one checkpoint, written by rank 0
                _append(log_path, rec)
            if (step + 1) % cfg.save_every == 0 or step + 1 in (cfg.steps, end):
                _save(engine, model, opt, cfg, out, step + 1, fsdp, curriculum)
            if bar:
                bar[0].update(
                    bar[1], completed=step + 1, loss=rec["loss"], tps=tokens_seen / (time.perf_counter() - t0)
                )
    finally:
        model.eval()
        if bar:
            bar[0].stop()
    return {"seconds": time.perf_counter() - t0, "tokens": tokens_seen}


def _step(model, engine, opt, tokenizer, cfg: TrainConfig, step: int, max_k: int | None = None) -> tuple[dict, int]:
    """One optimizer step: K drawn from the pass mix, eq. 12 summed over the step's micro-batches
    (each rank its rows), clipped; returns (its log record, the positions that predicted a token)."""
    world = distributed.world()
    # every random draw of a step derives from (seed, step[, rank]): a resumed run continues bit for bit
    torch.manual_seed(step_seed(cfg.seed, step, "noise" if world.main else f"noise:{world.rank}"))
    gen = torch.Generator().manual_seed(step_seed(cfg.seed, step, "draws"))
    K = cfg.pass_mix.draw(float(torch.rand(1, generator=gen)))  # drawn every step, so the stream of draws never shifts
    if cfg.baseline or step < cfg.one_pass_steps:
        K = 1
    micro = batches_for_step(cfg, tokenizer, step, max_k=max_k)
    total_w = sum(float(w.sum()) for _, _, w in micro)
    device = next(model.parameters()).device  # the batches are drawn on the CPU and moved there
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, step)
    ts = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    terms = 2 if K == FULL_PASSES else K  # the loss terms; `full`: pass 1 and the serial scan, each position once
    loss, parts = 0.0, [0.0] * terms
    for m, (tokens, targets, weights) in enumerate(micro):  # gradient accumulation over the step's cells
        has = prefix_mask(*tokens.shape, cfg.prefix_mix, gen)  # drawn for the whole micro-batch on every rank
        if engine is None:
            share, run = float(weights.sum()) / total_w, lambda *a: multipass_loss(model, *a)
        else:  # this rank's rows; scaled so the ranks' averaged gradient is the whole step's
            rows, real = parallel.local_rows(tokens.shape[0])
            share, run = parallel.rank_share(weights, rows, real, total_w), engine
            tokens, targets, weights, has = tokens[rows], targets[rows], weights[rows], has[rows]
        tokens, targets, weights, has = (t.to(device) for t in (tokens, targets, weights, has))
        with parallel.no_sync(engine, m == len(micro) - 1) if engine is not None else contextlib.nullcontext():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
                l, ps = run(tokens, targets, weights, K, cfg.lam, has)
            if not torch.isfinite(l):
                raise FbtError(f"training diverged at step {step}: loss is {l.item()}")
            (l * share * world.size).backward()
        loss += l.item() * share
        parts = [a + b.item() * share for a, b in zip(parts, ps)]
    if world.several:  # the logged loss is the whole step's, as one process logs it
        loss, *parts = (float(x) for x in _sum_ranks([loss, *parts]))
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    opt.step()
    n_tok = sum(t.shape[0] * (t.shape[1] - 1) for t, _, _ in micro) * terms  # positions that predict a token (unpadded)
    seconds = time.perf_counter() - ts
    rec = {"step": step + 1, "loss": loss, "passes": K, "pass_losses": parts, "lr": lr_at(cfg, step)}
    return {**rec, "grad_norm": float(gnorm), "step_s": seconds, "tokens_per_s": n_tok / max(seconds, 1e-9)}, n_tok


def _save(engine, model, opt, cfg: TrainConfig, out: Path, step: int, fsdp: bool, curriculum=None) -> None:
    """The checkpoint, written once by rank 0 (FSDP2: consolidated from the shards first)."""
    world = distributed.world()
    advanced = None if curriculum is None or curriculum.cur.threshold is None else list(curriculum.advanced)
    if not fsdp:
        if world.main:
            save_run(
                model, opt, cfg, out, step, world_size=world.size, device=str(model.cfg.device), curriculum=advanced
            )
    else:
        full, opt_state = (
            parallel.full_state_dict(engine, model, True),
            parallel.optimizer_state(engine, model, opt, True),
        )
        if world.main:
            save_run(
                parallel.Consolidated(model.cfg, full),
                opt_state,
                cfg,
                out,
                step,
                world_size=world.size,
                device=str(model.cfg.device),
            )
    distributed.barrier()


def _sum_ranks(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, so the logged loss keeps its digits)."""
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return t.tolist()


def _append(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _progress(total: int, done: int):
    return bar(
        "train",
        total,
        done,
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        loss=float("nan"),
        tps=0.0,
    )
