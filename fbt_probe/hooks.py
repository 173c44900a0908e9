"""The one place hook names are built. Hook names are the contract between model, extraction,
probes and interventions (TransformerLens conventions)."""

from __future__ import annotations


def act_name(kind: str, layer: int | None = None) -> str:
    """The hook name of an activation (TransformerLens conventions, docs/model.md).

    Parameters
    ----------
    kind : str
        embed, resid_pre, resid_mid, resid_post, attn_out, mlp_out, q, k, v, pattern, z, mlp_pre,
        mlp_pre_linear, mlp_post, ln_final, fusion_feedback, fusion_value, fusion_gate, fusion_out.
    layer : int, optional
        The block, for the per-layer kinds.

    Returns
    -------
    str
        The name `run_with_cache` keys and `run_with_hooks` takes.

    Examples
    --------
    >>> act_name("resid_post", 3)
    'blocks.3.hook_resid_post'
    >>> act_name("fusion_gate"), act_name("pattern", 0)
    ('fusion.hook_gate', 'blocks.0.attn.hook_pattern')
    >>> depth_name(0), depth_name(2)
    ('blocks.0.hook_resid_pre', 'blocks.1.hook_resid_post')
    """
    top = {"embed": "hook_embed", "ln_final": "ln_final.hook_normalized"}
    if kind in top:
        return top[kind]
    if kind.startswith("fusion_"):
        return f"fusion.hook_{kind[len('fusion_') :]}"
    if layer is None:
        raise ValueError(f"act_name({kind!r}) needs a layer")
    if kind in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"):
        return f"blocks.{layer}.hook_{kind}"
    if kind in ("q", "k", "v", "pattern", "z"):
        return f"blocks.{layer}.attn.hook_{kind}"
    if kind in ("mlp_pre", "mlp_pre_linear", "mlp_post"):
        return f"blocks.{layer}.mlp.hook_{kind[len('mlp_') :]}"
    raise ValueError(f"unknown activation kind {kind!r}")


def depth_name(depth: int) -> str:
    """Probe depth d in 0..L: d = 0 is the model's input (blocks.0.hook_resid_pre, a plain embedding
    or a fused u_t); d >= 1 is the output of block d-1 (blocks.{d-1}.hook_resid_post)."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    return act_name("resid_pre", 0) if depth == 0 else act_name("resid_post", depth - 1)


def depth_names(n_layers: int) -> list[str]:
    return [depth_name(d) for d in range(n_layers + 1)]
