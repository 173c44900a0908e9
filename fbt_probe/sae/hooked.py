"""SAEs spliced into a model the SAELens way: `add_sae`, `reset_saes`, `run_with_saes`,
`run_with_cache_with_saes`, `run_with_hooks_with_saes` and the `saes` context, with SAELens's names
and semantics (`sae_lens.HookedSAETransformer`), as functions of the model.

`add_sae(model, sae)` replaces the HookPoint at `sae.hook_name` (the folder's
`metadata.hook_name`) by a module that runs the SAE, then calls `model.setup()`: `model.hook_dict`
then holds the SAE's hook points as `<hook_name>.hook_sae_input`, `.hook_sae_acts_pre`,
`.hook_sae_acts_post`, `.hook_sae_recons`, `.hook_sae_error` (with the error term) and
`.hook_sae_output`, and `<hook_name>` itself is gone until `reset_saes` puts the original HookPoint
back. Caches, `run_with_hooks` and `transformer_lens.patching` see these names like any other hook.
Without the error term the activation is replaced by the SAE's reconstruction; with it
(`use_error_term=True`) the SAE's output equals its input, so the model computes what it computes
without the SAE, and an edit of the latents changes the activation by the decoder's image of the
edit only.

Modes. A spliced SAE is an edit like any hook, so the model's hook rule applies to it (docs/modes.md,
"Hooks under feedback"): under a mode that carries a state the default (exact) rule runs the mode's
exact iteration with the SAE in every pass, and its reconstruction or latent edit reaches the states
carried into later positions exactly as in the serial run (`serial=True`, the SAE in every chunk);
`serial=False` keeps it in the one analysed pass, whose carried states are the model's own.

Two departures from SAELens, both refusals where SAELens would go on silently: a hook name the model
does not have, and an SAE without a hook name, raise `FbtError` (SAELens logs a warning and attaches
nothing). The SAE computes in its own dtype and hands the model back a tensor of the model's dtype.

`with_sae_methods(model)` binds these functions onto one model instance, so SAELens code
(`model.add_sae(sae)`, `model.run_with_saes(tokens, saes=[sae])`, ...) runs unchanged; the model's
class is left as it is.
"""

from __future__ import annotations

import contextlib
import types

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from fbt_probe.errors import FbtError
from fbt_probe.sae.model import SparseAutoencoder


class SAESplice(nn.Module):
    """The module at a hook point while an SAE is attached there. The SAE is held outside the
    module tree (its parameters stay out of the model's `parameters()` and `state_dict()`); its hook
    points are children, so `model.setup()` names them `<hook_name>.hook_sae_*`."""

    def __init__(self, sae: SparseAutoencoder, use_error_term: bool, hook_point: HookPoint):
        super().__init__()
        self.__dict__["sae"] = sae
        self.__dict__["hook_point"] = hook_point  # the model's own, put back by reset_saes
        self.__dict__["always_hooked"] = True  # the model's hooked pass calls it although no hook is attached
        self.use_error_term = bool(use_error_term)
        for name in SparseAutoencoder.HOOK_POINTS:
            setattr(self, name, getattr(sae, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sae = self.sae
        if x.shape[-1] != sae.cfg.d_in:
            raise FbtError(
                f"SAE at {self.hook_point.name}: the activation's last dimension is {x.shape[-1]}, the SAE's d_in {sae.cfg.d_in}"
            )
        return sae(x.to(sae.W_enc.dtype), use_error_term=self.use_error_term).to(x.dtype)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, last = name.split(".")
    obj = model
    for part in path:
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj, last


def acts_to_saes(model: nn.Module) -> dict[str, SparseAutoencoder]:
    """{hook name: SAE} of the SAEs attached to `model` (SAELens's `acts_to_saes`)."""
    return {name: m.sae for name, m in model.named_modules() if isinstance(m, SAESplice)}


def _splices(model: nn.Module) -> dict[str, SAESplice]:
    return {name: m for name, m in model.named_modules() if isinstance(m, SAESplice)}


def add_sae(model: nn.Module, sae: SparseAutoencoder, use_error_term: bool | None = None) -> None:
    """Attach `sae` at its hook (`sae.hook_name`) until `reset_saes`; an SAE already there is
    replaced. `use_error_term` None keeps the SAE's own setting (`sae.use_error_term`)."""
    if not isinstance(sae, SparseAutoencoder):
        raise FbtError(
            f"add_sae: expected a SparseAutoencoder (SparseAutoencoder.load(folder)), got {type(sae).__name__}"
        )
    name = sae.hook_name
    if not name:
        raise FbtError(
            "add_sae: the SAE names no hook (set sae.cfg.metadata['hook_name'], e.g. 'fusion.hook_feedback')"
        )
    splices = _splices(model)
    if name in splices:
        _reset(model, name, splices[name])
    elif not isinstance(model.hook_dict.get(name), HookPoint):
        raise FbtError(f"add_sae: {name} is not a hook point of this model (see model.hook_dict)")
    hp = model.hook_dict[name]
    parent, attr = _parent(model, name)
    setattr(parent, attr, SAESplice(sae, sae.use_error_term if use_error_term is None else use_error_term, hp))
    model.setup()


def _reset(model: nn.Module, name: str, splice: SAESplice) -> None:
    parent, attr = _parent(model, name)
    setattr(parent, attr, splice.hook_point)
    model.setup()
    splice.sae.setup()  # the SAE's hook points get back their own names


def reset_saes(model: nn.Module, act_names: str | list[str] | None = None) -> None:
    """Detach the SAEs at `act_names` (default: every attached SAE), putting the original hook points back."""
    splices = _splices(model)
    names = list(splices) if act_names is None else [act_names] if isinstance(act_names, str) else list(act_names)
    unknown = [n for n in names if n not in splices]
    if unknown:
        raise FbtError(
            f"reset_saes: no SAE is attached at {', '.join(unknown)} (attached: {', '.join(splices) or 'none'})"
        )
    for n in names:
        _reset(model, n, splices[n])


@contextlib.contextmanager
def saes(
    model: nn.Module,
    saes: SparseAutoencoder | list[SparseAutoencoder] = (),
    reset_saes_end: bool = True,
    use_error_term: bool | None = None,
):
    """Attach `saes` for the block; on exit (with `reset_saes_end`) the SAEs it attached are removed
    and those they replaced are attached again, each with its own error-term setting."""
    saes = [saes] if isinstance(saes, SparseAutoencoder) else list(saes)
    previous = []
    try:
        for sae in saes:
            before = _splices(model).get(sae.hook_name)
            add_sae(model, sae, use_error_term)
            previous.append((sae.hook_name, before))
        yield model
    finally:
        if reset_saes_end:
            for name, before in reversed(previous):
                now = _splices(model).get(name)
                if now is not None:
                    _reset(model, name, now)
                if before is not None:
                    add_sae(model, before.sae, before.use_error_term)


def run_with_saes(
    model: nn.Module,
    *model_args,
    saes: SparseAutoencoder | list[SparseAutoencoder] = (),
    reset_saes_end: bool = True,
    use_error_term: bool | None = None,
    **model_kwargs,
):
    """`model(*model_args, **model_kwargs)` with `saes` attached (SAELens's `run_with_saes`)."""
    with _saes(model, saes, reset_saes_end, use_error_term):
        return model(*model_args, **model_kwargs)


def run_with_cache_with_saes(
    model: nn.Module,
    *model_args,
    saes: SparseAutoencoder | list[SparseAutoencoder] = (),
    reset_saes_end: bool = True,
    use_error_term: bool | None = None,
    **kwargs,
):
    """`model.run_with_cache(...)` with `saes` attached: (output, cache); the cache holds the SAE's
    hook points as `<hook_name>.hook_sae_*` (SAELens's `run_with_cache_with_saes`)."""
    with _saes(model, saes, reset_saes_end, use_error_term):
        return model.run_with_cache(*model_args, **kwargs)


def run_with_hooks_with_saes(
    model: nn.Module,
    *model_args,
    saes: SparseAutoencoder | list[SparseAutoencoder] = (),
    reset_saes_end: bool = True,
    fwd_hooks=(),
    bwd_hooks=(),
    reset_hooks_end: bool = True,
    clear_contexts: bool = False,
    **model_kwargs,
):
    """`model.run_with_hooks(...)` with `saes` attached (SAELens's `run_with_hooks_with_saes`)."""
    with _saes(model, saes, reset_saes_end, None):
        return model.run_with_hooks(
            *model_args,
            fwd_hooks=list(fwd_hooks),
            bwd_hooks=list(bwd_hooks),
            reset_hooks_end=reset_hooks_end,
            clear_contexts=clear_contexts,
            **model_kwargs,
        )


_saes = saes  # the run_* functions take a keyword argument of the same name


def with_sae_methods(model: nn.Module) -> nn.Module:
    """Bind `add_sae`, `reset_saes`, `run_with_saes`, `run_with_cache_with_saes`,
    `run_with_hooks_with_saes` and `saes` onto this model instance (and `acts_to_saes` as a method:
    `model.acts_to_saes()`); returns the model."""
    for fn in (add_sae, reset_saes, run_with_saes, run_with_cache_with_saes, run_with_hooks_with_saes, acts_to_saes):
        setattr(model, fn.__name__, types.MethodType(fn, model))
    model.saes = types.MethodType(_saes, model)
    return model
