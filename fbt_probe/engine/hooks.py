"""How a pass calls its hook points. `hk(hook_point, x)` is passed down every forward: `hooked`
in a hooked pass (the hook point runs only when something is attached to it) and `silent` in a
silent pass (carried-state computations, prefix caches: hooks off, docs/modes.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn.modules import module as torch_module
from transformer_lens.hook_points import HookPoint

from fbt_probe.errors import FbtError

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
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
    )


@dataclass(frozen=True)
class HookContext:
    """What `model.hook_context` says while a hooked pass runs."""

    phase: str  # "final" (the one hooked pass), "prefix", "step" or "pass" (serial runs), "exact"
    # (a pass of the exact rule), "backward" (a backward hook of the exact rule)
    positions: range  # the sequence positions the firing tensors cover
    pass_index: int = 1  # Jacobi pass / pass of the exact rule (1-based); 1 elsewhere
    n_passes: int = 1  # how many passes the run makes (the last one's activations are the mode's)


class GradTaps:
    """Backward hooks of TransformerLens hook points, fired once per backward with the gradient of
    the whole computation (TransformerLens's semantics), where a hooked run evaluates a hook point
    more than once (the exact rule's passes, `FeedbackTransformer.forward`).

    While open, every hook point with backward hooks has them lifted off the module and, in their
    place, a no-op forward hook (so every path still forms and calls the hook point). `hk` adds one
    zero leaf per hook point, of the activation's full shape, to the activation at every
    evaluation; autograd sums the gradients of all uses into that leaf and calls its hook once, and
    that hook calls the lifted backward hooks with the sum: d metric / d activation, the
    activation being perturbed wherever it is evaluated (in the exact rule, the serial run's)."""

    def __init__(self, hook_points, owner=None, context: "HookContext | None" = None):
        """`owner.hook_context` is `context` while the lifted hooks run (None again after)."""
        self.lifted: dict = {}
        self.placeholders = []
        self.leaves: dict = {}
        self.owner, self.context = owner, context
        for hp in hook_points:
            if hp._backward_hooks:
                self.lifted[hp] = dict(hp._backward_hooks)
                hp._backward_hooks.clear()
                self.placeholders.append(hp.register_forward_hook(_no_op))

    def __enter__(self) -> "GradTaps":
        return self

    def __exit__(self, *exc) -> None:
        for h in self.placeholders:
            h.remove()
        for hp, hooks in self.lifted.items():
            hp._backward_hooks.update(hooks)

    def hk(self, hp: HookPoint, x: torch.Tensor) -> torch.Tensor:
        if hp in self.lifted and torch.is_grad_enabled():
            leaf = self.leaves.get(hp)
            if leaf is None or leaf.shape != x.shape:
                leaf = self.leaves[hp] = x.new_zeros(x.shape, requires_grad=True)
                leaf.register_hook(lambda g, hp=hp, hooks=self.lifted[hp]: self._fire(hp, hooks, g))
            x = x + leaf
        return hooked(hp, x)

    def _fire(self, hp: HookPoint, hooks: dict, grad: torch.Tensor) -> None:
        if self.owner is not None:
            self.owner.hook_context = self.context
        try:
            for key, fn in hooks.items():
                if key not in hp._backward_hooks:  # removed since the forward (TransformerLens resets hooks)
                    continue
                if fn(hp, (grad,), (grad,)) is not None:
                    raise FbtError(
                        f"backward hook on {hp.name}: it returned a gradient; under a feedback mode a hook point "
                        "is evaluated in every pass of the exact rule, so an edited gradient has no single place "
                        "to go: read gradients in backward hooks, edit activations in forward hooks"
                    )
        finally:
            if self.owner is not None:
                self.owner.hook_context = None


def _no_op(module, inputs, output):
    return None
