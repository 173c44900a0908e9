"""How a pass calls its hook points. `hk(hook_point, x)` is passed down every forward: `hooked`
in a hooked pass (the hook point runs only when something is attached to it) and `silent` in a
silent pass (carried-state computations, prefix caches: hooks off, docs/modes.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn.modules import module as M
from transformer_lens.hook_points import HookPoint

Hk = Callable[[HookPoint, torch.Tensor], torch.Tensor]


def hooked(hp: HookPoint, x: torch.Tensor) -> torch.Tensor:
    return hp(x) if has_hooks(hp) else x  # no module dispatch where nothing is attached


def silent(hp: HookPoint, x: torch.Tensor) -> torch.Tensor:
    return x


def has_hooks(hp: nn.Module) -> bool:
    """Whether calling `hp` would run any hook (its own, a global module hook, or an instance-level
    `forward` such as nnsight installs to observe the module), or `hp` is a module that stands in
    for a hook point and must always run (`always_hooked`: an SAE spliced in, `fbt_probe.sae.hooked`)."""
    return bool(
        "always_hooked" in hp.__dict__  # an instance attribute: no lookup through nn.Module.__getattr__
        or "forward" in hp.__dict__
        or hp._forward_hooks
        or hp._forward_pre_hooks
        or hp._backward_hooks
        or hp._backward_pre_hooks
        or M._global_forward_hooks
        or M._global_forward_pre_hooks
        or M._global_backward_hooks
        or M._global_backward_pre_hooks
    )


@dataclass(frozen=True)
class HookContext:
    """What `model.hook_context` says while a hooked pass runs."""

    phase: str  # "final" (the one hooked pass), "prefix", "step" or "pass" (serial runs)
    positions: range  # the sequence positions the firing tensors cover
    pass_index: int = 1  # Jacobi pass (1-based); 1 elsewhere
