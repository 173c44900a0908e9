"""`model.run_with_cache(tokens, mode=..., serial=True)`: every chunk of the serial computation,
put back together as [batch, pos, ...].

TransformerLens's own cache stores `cache[name] = tensor`, so a hook that fires once per serial chunk
would keep only the last chunk. Here each firing is recorded with `model.hook_context` and placed:

- `recurrent:k`, `full`: the standard prefix ([batch, P, ...]) and each step ([batch, 1, ...]) fill
  positions 0..T-1. `hook_pattern` [batch, heads, query, key] gets each chunk's query rows; a step's
  row covers keys 0..t and the keys after t are 0, as in the masked one-pass pattern. The `fusion.*`
  hooks do not fire in the standard prefix, which has no fusion: their prefix positions are NaN.
- `jacobi:K`: every pass covers every position. `cache[name]` holds pass K (the activations the
  one-pass cache holds) and `cache[f"{name}.pass{k}"]` pass k, for k = 1..K.
- a mode with nothing serial (`standard`): the ordinary cache.
"""

from __future__ import annotations

import torch

from fbt_probe.errors import FbtError
from fbt_probe.modes import parse_mode
from fbt_probe.surface.tl_native import FeedbackActivationCache, is_text


def _keep(names_filter):
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if callable(names_filter):
        return names_filter
    wanted = set(names_filter)
    return lambda name: name in wanted


def run_with_serial_cache(
    model,
    tokens,
    mode=None,
    *,
    names_filter=None,
    device=None,
    remove_batch_dim: bool = False,
    incl_bwd: bool = False,
    pos_slice=None,
    reset_hooks_end: bool = True,
    clear_contexts: bool = False,
    return_type: str | None = "logits",
    **forward_kwargs,
):
    """(output, ActivationCache) of `model(tokens, mode, serial=True, return_type=...)` (see module doc)."""
    if incl_bwd or pos_slice is not None:
        raise FbtError(
            "run_with_cache(serial=True): incl_bwd and pos_slice are not supported; leave serial unset "
            "(the exact rule: the whole gradient in [batch, pos, ...]), or collect with hooks and model.hook_context"
        )
    if is_text(tokens):
        tokens = model.to_tokens(tokens)  # once: the run and the stitching read the same ids
    keep = _keep(names_filter)
    chunks: dict[str, list] = {}

    def save(x, hook):
        ctx = model.hook_context
        chunks.setdefault(hook.name, []).append((ctx, x.detach().to(device) if device is not None else x.detach()))
        return x

    mode = model.default_mode if mode is None else parse_mode(mode)  # a public entry: strings accepted
    names = [name for name in model.hook_dict if keep(name)]
    with model.hooks(
        fwd_hooks=[(name, save) for name in names], reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts
    ):
        out = model(tokens, mode=mode, serial=True, return_type=return_type, **forward_kwargs)
    cache: dict[str, torch.Tensor] = {}
    T = tokens.shape[1]
    for name, parts in chunks.items():
        cache.update(_assemble(name, parts, T))
    if remove_batch_dim:
        B = next(iter(cache.values())).shape[0] if cache else 1
        if B != 1:
            raise FbtError(f"run_with_cache: remove_batch_dim needs batch size 1, got {B}")
        cache = {k: v[0] for k, v in cache.items()}
    return out, FeedbackActivationCache(cache, model, has_batch_dim=not remove_batch_dim, mode=mode)


def _assemble(name: str, parts: list, T: int) -> dict[str, torch.Tensor]:
    phases = {ctx.phase if ctx is not None else "final" for ctx, _ in parts}
    if phases == {"final"}:
        return {name: parts[-1][1]}
    if phases == {"pass"}:
        out = {f"{name}.pass{ctx.pass_index}": x for ctx, x in parts}
        out[name] = max(parts, key=lambda p: p[0].pass_index)[1]
        return out
    first = parts[0][1]
    if name.endswith(("hook_pattern", "hook_attn_scores")):  # [batch, heads, query, key]
        past = 0.0 if name.endswith("hook_pattern") else float("-inf")  # keys a chunk cannot see
        full = first.new_full((*first.shape[:2], T, T), past)
        for ctx, x in parts:
            full[:, :, ctx.positions.start : ctx.positions.stop, : x.shape[-1]] = x
        return {name: full}
    full = first.new_full((first.shape[0], T, *first.shape[2:]), float("nan"))
    for ctx, x in parts:
        full[:, ctx.positions.start : ctx.positions.stop] = x
    return {name: full}
