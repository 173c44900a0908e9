"""Training on several processes (torchrun): DDP (default) or FSDP2 over the same objective, and
the device each process trains on (`process_device`: --device auto | cpu | cuda).

Every rank draws the same global step (`batches_for_step`: a function of (seed, step)), takes its
contiguous block of each micro-batch's rows (`distributed.split_rows`), and scales its loss so that
the gradient the engine averages over ranks is the single-process step's gradient:

    rank loss = L(rank's rows) * (rank's weight / step weight) * world size

(L is a weighted mean, so this sums every row's weighted loss once over all ranks, as one process
does). A rank with no row of a micro-batch still runs one row of it with scale 0: every rank runs
the same forwards and backwards, as DDP's last synchronising backward and FSDP's all-gathers need.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from fbt_probe import distributed
from fbt_probe.config import check_device
from fbt_probe.errors import FbtError
from fbt_probe.training.objective import multipass_loss


class Objective(nn.Module):
    """The training objective as a module's forward: DDP and FSDP act on `forward` calls."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, targets, weights, K: int, lam: float, has_state):
        return multipass_loss(self.model, tokens, targets, weights, K, lam, has_state)


def wrap(model: nn.Module, fsdp: bool = False) -> nn.Module:
    """The engine a rank calls: DDP around the objective, or the objective with every block and
    then the rest sharded by FSDP2 (`fully_shard`: parameters become DTensor shards)."""
    objective = Objective(model)
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(objective)
    from torch.nn.parallel import DistributedDataParallel as DDP

    # unused parameters: the fusion weights on a one-pass step (their gradient stays None, as alone)
    return DDP(objective, find_unused_parameters=True)


DEVICES = ("auto", "cpu", "cuda")


def process_device(device: str) -> str:
    """`--device` auto | cpu | cuda as the torch device this process uses: auto is cuda when CUDA
    is available, else cpu; cuda is this process's GPU, cuda:LOCAL_RANK (cuda:0 alone). No CUDA on
    the machine (or fewer GPUs than local ranks) is a one-line FbtError."""
    if device not in DEVICES:
        raise FbtError(f"--device '{device}': expected one of {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    check_device("cuda")
    return check_device(f"cuda:{distributed.world().local_rank}")


def local_rows(n: int) -> tuple[slice, bool]:
    """(this rank's rows of an n-row micro-batch, whether they are real or the scale-0 stand-in)."""
    w = distributed.world()
    rows = distributed.split_rows(n, w.size, w.rank)
    if len(rows) == 0:
        return slice(0, 1), False
    return slice(rows.start, rows.stop), True


def rank_share(weights: torch.Tensor, rows: slice, real: bool, total: float) -> float:
    """The share of the step's loss this rank's rows carry. One process weighs micro-batch m by
    sum(w_m) / total (in the weights' dtype) and averages within it by the float64 sum (`weighted_ce`);
    a rank takes that share times its rows' part of the float64 sum, so the ranks add up to it."""
    if not real:
        return 0.0
    part = float(weights[rows].double().sum()) / float(weights.double().sum())
    return float(weights.sum()) / total * part


def no_sync(engine: nn.Module, last: bool):
    """Accumulate without communicating until the step's last micro-batch (DDP); FSDP2 reduces
    every backward (its averaged gradients add up to the same sum)."""
    if last or not hasattr(engine, "no_sync"):
        return contextlib.nullcontext()
    return engine.no_sync()


def full_state_dict(engine: nn.Module, model: nn.Module, fsdp: bool) -> dict[str, torch.Tensor] | None:
    """The model's full state dict on rank 0 (None elsewhere); with FSDP2 gathered from the
    shards (a collective: every rank calls it)."""
    if not fsdp:
        return model.state_dict() if distributed.world().main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(engine, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k.removeprefix("model."): v for k, v in full.items()} if distributed.world().main else None


class Consolidated:
    """What `save_checkpoint` reads of a model (its config and state dict), from a full state dict."""

    def __init__(self, cfg, state: dict[str, torch.Tensor]):
        self.cfg, self._state = cfg, state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def _param_names(model: nn.Module) -> list[str]:
    """Parameter names in the index order of `make_optimizer`'s groups (matrices, then the rest)."""
    named = list(model.named_parameters())
    return [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]


def optimizer_state(engine: nn.Module, model: nn.Module, opt, fsdp: bool) -> dict | None:
    """The optimizer's full state dict on rank 0, index-keyed as one process saves it (so any world
    size resumes it); with FSDP2 gathered from the shards (a collective)."""
    if not fsdp:
        return opt.state_dict() if distributed.world().main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(engine, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not distributed.world().main:
        return None
    index = {f"model.{n}": i for i, n in enumerate(_param_names(model))}
    groups = [{**g, "params": [index[p] for p in g["params"]]} for g in full["param_groups"]]
    return {"state": {index[k]: v for k, v in full["state"].items()}, "param_groups": groups}


def load_optimizer_state(engine: nn.Module, model: nn.Module, opt, state: dict) -> None:
    """Load an index-keyed full optimizer state (`optimizer_state`) into an FSDP2-sharded optimizer.
    A parameter without state is one no step has updated yet (the fusion weights while every step
    so far had one pass): it stays without state, as in the run that was not interrupted."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [f"model.{n}" for n in _param_names(model)]
    if sorted(len(g["params"]) for g in state["param_groups"]) != sorted(
        len(g["params"]) for g in opt.param_groups
    ) or any(not 0 <= int(i) < len(names) for i in state["state"]):
        raise FbtError("train_state.pt: the optimizer state does not match the model's parameters")
    full = {
        "state": {names[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
    }
    # strict=False: a parameter without saved state is not an error. Loading first gives every
    # parameter a state (a step at lr 0: step count 1, zero moments); those without saved state lose
    # it again, or their first real update would be bias-corrected as Adam's second
    set_optimizer_state_dict(engine, opt, full, options=StateDictOptions(full_state_dict=True, strict=False))
    for name, p in engine.named_parameters():
        if name not in full["state"]:
            opt.state.pop(p, None)
    for group, saved in zip(opt.param_groups, state["param_groups"]):  # as saved (the loader turns betas into a list)
        group.update({k: v for k, v in saved.items() if k != "params"})
