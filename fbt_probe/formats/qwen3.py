"""Conversion between this model (depth scaling off) and Qwen3-format checkpoint folders
(`config.json` + safetensors, as written by `transformers.Qwen3ForCausalLM.save_pretrained`).

Import adds fresh fusion weights (see `Fusion` for their initialisation) unless the folder carries a
`fusion.safetensors` written by our export, and sets `feedback_source="post_norm"`: an imported
checkpoint has no depth scaling, so its pre-norm top state is not O(1).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import NoReturn

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from fbt_probe.config import ModelConfig, arch_of
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import _load_state, read_weights
from fbt_probe.io import atomic_path, read_json, write_json
from fbt_probe.model.transformer import FeedbackTransformer

_REQUIRED = object()
_BLOCK_MAP = {  # ours -> Qwen3, inside a layer
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "ln1.weight": "input_layernorm.weight",
    "ln2.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}


def _name_map(n_layers: int) -> dict[str, str]:
    names = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.norm.weight"}
    for l in range(n_layers):
        for ours, theirs in _BLOCK_MAP.items():
            names[f"blocks.{l}.{ours}"] = f"model.layers.{l}.{theirs}"
    return names


def _refuse(source: str, field: str, why: str) -> NoReturn:
    raise FbtError(f"{source}: field '{field}' {why}")


def _need(hf: dict, source: str, field: str, kind: str = "int", default=_REQUIRED):
    """A typed field: missing (without a default) or of the wrong type is a one-line error."""
    if field not in hf or hf[field] is None:
        if default is _REQUIRED:
            _refuse(source, field, "missing (a Qwen3 config.json records it)")
        return default
    v = hf[field]
    if kind == "int" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        raise FbtError(f"{source}: field '{field}': expected an integer >= 1, got {v!r}")
    if kind == "number" and not (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0):
        raise FbtError(f"{source}: field '{field}': expected a number > 0, got {v!r}")
    return v


def _rope_theta(hf: dict, source: str) -> float:
    """Refuse the Qwen3 features this model does not have; the RoPE base of what is left."""
    if hf.get("model_type") != "qwen3":
        _refuse(source, "model_type", f"is {hf.get('model_type')!r}; only 'qwen3' can be imported")
    if not hf.get("tie_word_embeddings", False):
        _refuse(source, "tie_word_embeddings", "must be true (this model ties input and output embeddings)")
    if hf.get("attention_bias", False):
        _refuse(source, "attention_bias", "must be false (no attention biases in this model)")
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(source, "hidden_act", f"is {hf.get('hidden_act')!r}; only 'silu' is supported")
    rope = hf.get("rope_parameters") or {}
    if hf.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        _refuse(source, "rope_parameters", "uses RoPE scaling; only plain RoPE ('default') is supported")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    if not (isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0):
        _refuse(source, "rope_theta", f"must be a number > 0, got {theta!r}")
    return float(theta)


def _attention_layout(hf: dict, source: str, n_layers: int) -> tuple[int | None, list]:
    """The sliding window and each layer's attention type (`layer_types`, else the older
    `use_sliding_window` / `max_window_layers` pair)."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    layer_types = hf.get("layer_types")
    if layer_types is None:
        layer_types = [
            "sliding_attention" if window is not None and i >= hf.get("max_window_layers", 28) else "full_attention"
            for i in range(n_layers)
        ]
    if "sliding_attention" in layer_types and window is None:
        window = hf.get("sliding_window")
        if window is None:
            _refuse(source, "sliding_window", "is null but layer_types has sliding layers")
    if not isinstance(layer_types, list):
        _refuse(source, "layer_types", f"must be a list of {n_layers} layer types, got {layer_types!r}")
    return window, layer_types


def config_from_qwen3(hf: dict, source: str = "config.json") -> ModelConfig:
    """Translate a Qwen3 config dict; refuse what this model cannot represent."""
    if not isinstance(hf, dict):
        raise FbtError(f"{source}: expected a JSON object (a Qwen3 config)")
    theta = _rope_theta(hf, source)
    need = partial(_need, hf, source)
    n_layers = need("num_hidden_layers")
    vocab, d_model, d_mlp, n_heads = (
        need("vocab_size"),
        need("hidden_size"),
        need("intermediate_size"),
        need("num_attention_heads"),
    )
    n_kv = need("num_key_value_heads", default=n_heads)
    d_head = need("head_dim", default=None)
    if d_head is None:
        if d_model % n_heads:
            why = f"missing, and hidden_size {d_model} is not a multiple of num_attention_heads {n_heads}"
            _refuse(source, "head_dim", why)
        d_head = d_model // n_heads
    n_ctx, eps = need("max_position_embeddings", default=2048), need("rms_norm_eps", "number", default=1e-6)
    window, layer_types = _attention_layout(hf, source, n_layers)
    try:
        return ModelConfig(
            d_vocab=vocab,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_key_value_heads=n_kv,
            d_head=d_head,
            d_mlp=d_mlp,
            n_ctx=n_ctx,
            window=window,
            layer_types=tuple(layer_types),
            rope_theta=theta,
            rms_eps=float(eps),
            depth_scaling="none",
            feedback_source="post_norm",
        )
    except FbtError as exc:
        raise FbtError(f"{source}: {exc.format_message()}") from None


def config_to_qwen3(cfg: ModelConfig) -> dict:
    if cfg.depth_scaling != "none":
        raise FbtError(f"model config: field 'depth_scaling' is {cfg.depth_scaling!r}; only 'none' is a Qwen3 function")
    if arch_of(cfg) == "nanochat":  # its backbone extras have no Qwen3 counterpart
        raise FbtError("model config: field 'arch' is 'nanochat'; only the paper's backbone is a Qwen3 function")
    types = list(cfg.resolved_layer_types)
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg.d_vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_mlp,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_key_value_heads,
        "head_dim": cfg.d_head,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.n_ctx,
        "rms_norm_eps": cfg.rms_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": "sliding_attention" in types,
        "sliding_window": cfg.window,
        "max_window_layers": cfg.n_layers,
        "layer_types": types,
        "torch_dtype": cfg.dtype,
    }


def _shard_files(folder: Path) -> list[str]:
    """The safetensors files of a Qwen3 folder; an index may only name files inside the folder."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    meta = read_json(index, "safetensors index")
    weight_map = meta.get("weight_map") if isinstance(meta, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise FbtError(f"{index}: field 'weight_map': expected an object of tensor name -> file name")
    root = folder.resolve()
    for name in sorted(set(weight_map.values())):
        target = (folder / name).resolve()
        if Path(name).is_absolute() or target.parent != root:
            raise FbtError(f"{index}: shard file {name!r} is outside {folder} (an index names files in its own folder)")
    return sorted(set(weight_map.values()))


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    state = {}
    for name in _shard_files(folder):
        path = folder / name
        if not path.is_file():
            raise FbtError(f"{path}: weights file not found")
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise FbtError(f"{path}: corrupt safetensors file ({exc})") from None
    return state


def import_qwen3(folder: str | Path, seed: int = 0):
    folder = Path(folder)
    cfg = config_from_qwen3(read_json(folder / "config.json", "Qwen3 config"), str(folder / "config.json"))
    state = _read_weights(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FeedbackTransformer(cfg)
    ours, expected = {}, model.state_dict()
    for mine, theirs in _name_map(cfg.n_layers).items():
        if theirs not in state:
            raise FbtError(f"{folder}: tensor '{theirs}' missing from the safetensors files")
        if tuple(state[theirs].shape) != tuple(expected[mine].shape):
            raise FbtError(
                f"{folder}: tensor '{theirs}' has shape {tuple(state[theirs].shape)}, config expects "
                f"{tuple(expected[mine].shape)} (config.json and the weights disagree)"
            )
        ours[mine] = state[theirs]
    if "lm_head.weight" in state and not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
        raise FbtError(f"{folder}: 'lm_head.weight' differs from the embedding although embeddings are tied")
    model.load_state_dict({k: v.to(model.embed.weight.dtype) for k, v in ours.items()}, strict=False)
    fusion = folder / "fusion.safetensors"
    if fusion.is_file():
        _load_state(model.fusion, read_weights(fusion), fusion)
    else:
        model.reset_fusion_norm()
    return model


def is_qwen3_folder(folder: Path) -> bool:
    """A folder holding a Qwen3 config.json (what export writes and import reads)."""
    cfg = Path(folder) / "config.json"
    try:
        meta = read_json(cfg) if cfg.is_file() else None
    except FbtError:
        return False
    return isinstance(meta, dict) and meta.get("model_type") == "qwen3"


def export_qwen3(model, folder: str | Path, force: bool = False) -> Path:
    """Write a Qwen3-format folder; the fusion weights go to `fusion.safetensors` beside it
    (ignored by transformers, restored by our import)."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not force:
        raise FbtError(f"{folder}: already exists and is not empty; refusing to overwrite (pass --force)")
    hf_cfg = config_to_qwen3(model.cfg)
    folder.mkdir(parents=True, exist_ok=True)
    sd = model.state_dict()
    tensors = {theirs: sd[mine].detach().contiguous().cpu() for mine, theirs in _name_map(model.cfg.n_layers).items()}
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    fusion = {k: v.detach().contiguous().cpu() for k, v in model.fusion.state_dict().items()}
    with atomic_path(folder / "fusion.safetensors") as tmp:
        save_file(fusion, str(tmp))
    write_json(folder / "config.json", hf_cfg)
    return folder
