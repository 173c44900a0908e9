"""Typed, frozen configuration of the model. Presets are named instances."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fbt_probe.errors import FbtError

DEPTH_SCALING_RULES = ("none", "1/sqrt(2L)")
FEEDBACK_SOURCES = ("pre_norm", "post_norm")
LAYER_TYPES = ("full_attention", "sliding_attention")
FLOAT32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps: F.rms_norm's default eps in float32


@dataclass(frozen=True)
class ModelConfig:
    """Backbone (Qwen3-shaped) plus the latent-feedback fusion.

    Field names follow TransformerLens where it has one, because `transformer_lens.patching`
    reads `n_layers`, `n_heads`, `n_key_value_heads`, `d_model`, `d_head` and `device` from `model.cfg`.
    """

    d_vocab: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_key_value_heads: int = 2  # grouped-query attention: query head h reads KV head h // (n_heads / n_kv)
    d_head: int = 32
    d_mlp: int = 384  # SiLU-GLU hidden size
    n_ctx: int = 2048
    window: int | None = 256  # sliding attention: a query sees itself and the window-1 keys before it
    global_every: int = 2  # every global_every-th layer (1-based) attends globally
    layer_types: tuple[str, ...] | None = (
        None  # explicit per-layer pattern (e.g. from a Qwen3 import); overrides window/global_every
    )
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    depth_scaling: str = "1/sqrt(2L)"
    """Residual-branch scaling: "1/sqrt(2L)" multiplies every attention and MLP output by
    1/sqrt(2·n_layers), keeping the top residual O(1) rather than O(L); "none" is plain Qwen3."""
    feedback_source: str = "post_norm"
    """Which top-layer state is carried: "pre_norm" is h^L (the residual stream before the final
    norm, the paper's definition); "post_norm" is RMSNorm_final(h^L), whose scale stays near 1 in
    training (with h^L carried, its RMS grew to 9-40 in training and the normed state trained faster;
    docs/research/README.md)."""
    feedback_noise: float = 0.02  # U[-σ, σ] added to every carried state, in training mode only
    fast_fusion: bool = True  # use the CUDA kernel for the fusion epilogue when on CUDA and available
    init_std: float = 0.02
    qk_norm_init: float = 1.0
    """Initial gain of the per-head QK RMSNorms (Qwen3 and HF start them at 1). After QK-norm sharp
    attention must first grow the gains, so the tiny preset starts them at 3, as Henry et al. (2020,
    "Query-Key Normalization for Transformers") start the scale above 1: at gain 1 completion sat at
    chance for 1,000 steps, at 3 it learned in about 250 (docs/research/qk-norm-gain-and-lr.md).
    Loaded weights (checkpoints, Qwen3 imports) override it."""
    fusion_norm_init: float | None = None
    """Initial weight of the fusion RMSNorm (every entry). None: the mean RMS of the embedding rows, so
    a fused input starts at the scale of a plain embedding (right for a warm start from a trained
    checkpoint, whose layer 0 expects embedding-scale inputs). The tiny preset sets 1: trained from
    scratch, embedding-scale fused inputs unbalance the multi-pass gradients (a two-pass step's
    backbone gradient 12.6x a one-pass step's at initialisation, 1.6x at 1;
    docs/research/completion-dependable.md). Loaded weights override it."""
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        check = _checker("model config")
        for name in POSITIVE_INTS:
            check(_is_int(getattr(self, name)) and getattr(self, name) >= 1, name, "an integer >= 1")
        check(self.n_ctx <= MAX_N_CTX, "n_ctx", f"an integer 1..{MAX_N_CTX:,} (the context length), not {self.n_ctx:,}")
        check(self.window is None or _is_int(self.window), "window", "a positive integer or null")
        for name, low in (
            ("rope_theta", 0),
            ("rms_eps", 0),
            ("init_std", 0),
            ("feedback_noise", None),
            ("qk_norm_init", None),
        ):
            value = getattr(self, name)
            check(
                _is_number(value) and (low is None or value > low),
                name,
                "a number" + (f" > {low}" if low is not None else ""),
            )
        check(self.feedback_noise >= 0, "feedback_noise", "a number >= 0")
        check(
            self.fusion_norm_init is None or _is_number(self.fusion_norm_init), "fusion_norm_init", "a number or null"
        )
        check(isinstance(self.fast_fusion, bool), "fast_fusion", "true or false")
        check(self.dtype in DTYPES, "dtype", f"one of {DTYPES}")
        check(isinstance(self.device, str), "device", "a device name such as 'cpu' or 'cuda'")
        check(self.n_heads % self.n_key_value_heads == 0, "n_heads", "a multiple of n_key_value_heads")
        check(self.depth_scaling in DEPTH_SCALING_RULES, "depth_scaling", f"one of {DEPTH_SCALING_RULES}")
        check(self.feedback_source in FEEDBACK_SOURCES, "feedback_source", f"one of {FEEDBACK_SOURCES}")
        check(self.window is None or self.window >= 1, "window", "a positive integer or null")
        check(self.global_every >= 1, "global_every", ">= 1")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            check(len(self.layer_types) == self.n_layers, "layer_types", f"{self.n_layers} entries")
            check(all(t in LAYER_TYPES for t in self.layer_types), "layer_types", f"entries from {LAYER_TYPES}")
            check(
                self.window is not None or "sliding_attention" not in self.layer_types,
                "window",
                "set when a layer is sliding",
            )

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        if self.layer_types is not None:
            return self.layer_types
        if self.window is None:
            return ("full_attention",) * self.n_layers
        return tuple(
            "full_attention" if (l + 1) % self.global_every == 0 else "sliding_attention" for l in range(self.n_layers)
        )

    @property
    def residual_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.n_layers) if self.depth_scaling == "1/sqrt(2L)" else 1.0

    # What TransformerLens's `ActivationCache` methods read from `model.cfg` (read-only, not saved).
    @property
    def normalization_type(self) -> str:
        """ "RMS": every norm of the model is an RMSNorm with a gain."""
        return "RMS"

    @property
    def attn_only(self) -> bool:
        return False

    @property
    def original_architecture(self) -> str:
        """TransformerLens's field: the architecture family (read-only, not saved)."""
        return "FeedbackTransformer"

    @property
    def model_name(self) -> str:
        """TransformerLens's field: a name from the shape (the loaded source is `LoadedModel.source`)."""
        return f"fbt-{self.n_layers}L-{self.d_model}d"

    @property
    def final_rms(self) -> bool:
        return True

    @property
    def positional_embedding_type(self) -> str:
        return "rotary"

    @property
    def act_fn(self) -> str:
        return "silu"

    @property
    def gated_mlp(self) -> bool:
        return True

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    @property
    def default_prepend_bos(self) -> bool:
        return False  # the task tokenizer has no BOS token

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["layer_types"] = list(self.layer_types) if self.layer_types is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "config", legacy: int = 0) -> "ModelConfig":
        """The config a checkpoint recorded. Every field must be present: a missing one is an error,
        never a silent default. `legacy`: the version of an older format whose records differ (1:
        written before the initialisation-only fields, which get `LEGACY_MODEL_DEFAULTS`; 3: every
        model's record carried `FORMAT_3_EXTRAS`, see `from_format_3`)."""
        if not isinstance(d, dict):
            raise FbtError(f"{source}: field 'model': expected an object of model config fields")
        if legacy == 1:
            d = {**LEGACY_MODEL_DEFAULTS, **d}
        elif legacy == 3:
            d = cls.from_format_3(d, source)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise FbtError(f"{source}: unknown model config field(s) {unknown}")
        missing = [name for name in known if name not in d]
        if missing:
            raise FbtError(
                f"{source}: model config field '{missing[0]}' missing (a checkpoint records every "
                f"field{'' if len(missing) == 1 else f'; also missing: {missing[1:]}'})"
            )
        try:
            return cls(**d)
        except TypeError as exc:
            raise FbtError(f"{source}: {exc}") from None
        except FbtError as exc:  # name the file as well as the field
            raise FbtError(f"{source}: {exc.format_message()}") from None

    @classmethod
    def from_format_3(cls, d: dict, source: str) -> dict:
        """A format-3 record without `FORMAT_3_EXTRAS`, which must hold their identity values: any
        other value is a nanochat model's (`fbt_probe.formats.nanochat` reads those records)."""
        for name in extras_away_from_identity(d):
            raise FbtError(
                f"{source}: field '{name}' is {d[name]!r}: an extra of a nanochat model, which this "
                f"config ({cls.__name__}) does not have (fbt_probe.load_model reads such a folder)"
            )
        return {k: v for k, v in d.items() if k not in FORMAT_3_EXTRAS}

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


DTYPES = ("float32", "float64", "float16", "bfloat16")
MAX_N_CTX = (
    1 << 20
)  # 1,048,576 positions: far past any model here (paper-1b: 8,192); an absurd context is refused by name
POSITIVE_INTS = (
    "d_vocab",
    "d_model",
    "n_layers",
    "n_heads",
    "n_key_value_heads",
    "d_head",
    "d_mlp",
    "n_ctx",
    "global_every",
)
# Checkpoints of format fbt-probe/1 were written before these fields existed. Both only set the
# initial value of weights that a checkpoint stores (QK-norm gains, fusion norm), so the values at
# the time (Qwen3's gain 1; the mean embedding RMS) change nothing a loaded model computes.
LEGACY_MODEL_DEFAULTS = {"qk_norm_init": 1.0, "fusion_norm_init": None}
# Checkpoints of format fbt-probe/3 recorded these fields for every model, at these identity values
# unless the model was imported from nanochat (they are `fbt_probe.formats.nanochat.config`'s now).
FORMAT_3_EXTRAS = {
    "fusion": "glu",
    "norm_weights": True,
    "embed_scale": 1.0,
    "embed_norm": False,
    "smear": False,
    "smear_channels": 24,
    "x0_mixing": False,
    "value_embed_layers": (),
    "value_embed_gate_channels": 12,
    "backout_layer": None,
    "mlp_act": "silu_glu",
    "rope_sign": 1,
    "qk_norm_after_rope": False,
    "qk_scale": 1.0,
    "logit_softcap": None,
    "tie_embeddings": True,
}


def extras_away_from_identity(record: dict) -> list[str]:
    """The `FORMAT_3_EXTRAS` a config record holds at other than their identity values (a JSON
    list compares as the tuple it was written from)."""
    return [
        name
        for name, identity in FORMAT_3_EXTRAS.items()
        if name in record and (tuple(v) if isinstance(v := record[name], list) else v) != identity
    ]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def arch_of(obj) -> str:
    """The architecture of a model or model config ('feedback' unless the config says otherwise):
    the key of the per-architecture tables (loading, extraction, training)."""
    cfg = getattr(obj, "cfg", obj)
    return getattr(cfg, "arch", "feedback")


def check_device(device: str | None) -> str | None:
    """`device` if torch can use it on this machine (None passes), else a one-line FbtError."""
    if device is None:
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FbtError(f"device '{device}': expected cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "" if torch.version.cuda else ", a CPU-only build"
            raise FbtError(
                f"device '{device}': CUDA is not available on this machine (torch {torch.__version__}{build}); "
                "use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise FbtError(f"device '{device}': this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise FbtError(f"device '{device}': MPS is not available on this machine; use --device cpu")
    return device


def _checker(source: str):
    def check(ok: bool, name: str, expected: str) -> None:
        if not ok:
            raise FbtError(f"{source}: field '{name}' must be {expected}")

    return check


PRESETS: dict[str, ModelConfig] = {
    # 4 layers, d_model 128: trains on a 2-core CPU in minutes (2 layers never learned completion).
    "tiny": ModelConfig(qk_norm_init=3.0, fusion_norm_init=1.0),
    # tiny with twice the layers (8): the deeper no-feedback control of the carried-state runs on the
    # chain tasks (docs/training.md, "Training a model that needs its carried state").
    "tiny-deep": ModelConfig(n_layers=8, qk_norm_init=3.0, fusion_norm_init=1.0),
    # The general language model (fbt-probe train --corpus): the tiny shape over the corpus tokenizer's
    # vocabulary (d_vocab is set from the tokenizer when a run starts); why this size:
    # docs/research/general-lm-size.md.
    "small-lm": ModelConfig(qk_norm_init=3.0, fusion_norm_init=1.0),
    # The paper's 1B: 24 layers, D=1536, 16/8 heads, FFN 6656, vocab 100,352, ctx 8192, window 2048, every 6th global.
    "paper-1b": ModelConfig(
        d_vocab=100_352,
        d_model=1536,
        n_layers=24,
        n_heads=16,
        n_key_value_heads=8,
        d_head=96,
        d_mlp=6656,
        n_ctx=8192,
        window=2048,
        global_every=6,
        rope_theta=1_000_000.0,
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise FbtError(f"unknown preset '{name}'; expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
