"""Checkpoints in the nanochat reproduction's format (model_<step>.pt + meta_<step>.json), random weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fbt_probe.formats.nanochat.checkpoint import config_from_meta, read_model_config, to_theirs
from fbt_probe.formats.nanochat.model import NanochatTransformer

# sequence_len 256: their short window is ceil(256 / 4 / 128) * 128 = 128 keys before the query
META = dict(
    sequence_len=256,
    vocab_size=70,
    n_layer=4,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    window_pattern="SSSL",
    latent_feedback=True,
    latent_feedback_mode="gate_product",
    weight_tying=False,
)


def random_state(seed: int = 0, identity: bool = False, **meta) -> tuple[dict, dict]:
    """(model_config, their state dict): random matrices (padding rows and dormant fusion matrices
    random too); the scalars random unless `identity` (smear 0, resid 1, x0 0, backout 0, value
    embeddings 0: every extra an identity)."""
    mc = read_model_config({"model_config": {**META, **meta}}, "test")
    cfg = config_from_meta(mc, "test")
    g = torch.Generator().manual_seed(seed)
    model = NanochatTransformer(cfg)
    state = to_theirs(model)
    out = {}
    for k, t in state.items():
        if k == "lm_head.weight" and cfg.tie_embeddings:
            continue
        scale = 0.8 if "wte" in k or "value_embeds" in k else t.shape[-1] ** -0.5 if t.dim() == 2 else 0.3
        out[k] = torch.randn(t.shape, generator=g) * scale
    if cfg.tie_embeddings:
        out["transformer.wte.weight"] *= 0.001 / 0.8
        out["lm_head.weight"] = out["transformer.wte.weight"]
    L = cfg.n_layers
    if identity:
        out.update(
            resid_lambdas=torch.ones(L),
            x0_lambdas=torch.zeros(L),
            smear_lambda=torch.zeros(1),
            backout_lambda=torch.zeros(1),
        )
        for k in out:
            if k.startswith("value_embeds."):
                out[k] = torch.zeros_like(out[k])
    else:
        out["resid_lambdas"] = 1 + 0.2 * torch.randn(L, generator=g)
    return mc, out


def write_nanochat(
    folder: Path, mc: dict, state: dict, step: int = 1200, extra_meta: dict | None = None, prefix: str = ""
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({prefix + k: v for k, v in state.items()}, folder / f"model_{step:06d}.pt")
    meta = {"step": step, "model_config": mc, **(extra_meta or {})}
    (folder / f"meta_{step:06d}.json").write_text(json.dumps(meta))
    return folder
