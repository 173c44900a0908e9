"""NanochatConfig: the backbone's `ModelConfig` plus nanochat's architecture extras.

A subclass (as `HiddenConfig` is), so that everything that reads `model.cfg` sees the usual backbone
fields, and a saved config.json carries `arch: nanochat` and the extras next to them. Each extra's
default is the identity: a config that leaves them alone computes the backbone's model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fbt_probe.config import ModelConfig, _checker, _is_int, _is_number, extras_away_from_identity

ARCH = "nanochat"
FUSIONS = ("glu", "gate_product", "concat_projection", "linear_addition")
MLP_ACTS = ("silu_glu", "relu2")


@dataclass(frozen=True)
class NanochatConfig(ModelConfig):
    arch: str = ARCH
    """Marks a checkpoint as nanochat's (a plain `ModelConfig` refuses these fields)."""
    fusion: str = "glu"
    """"glu": ours, RMSNorm_f((W_U h) ⊙ σ(W_G e)). nanochat's three variants, every norm weightless:
    "gate_product" norm(W_U h ⊙ σ(W_G norm(e))); "concat_projection" norm(W_C [norm(h); norm(e)]);
    "linear_addition" norm(W_U h + W_T norm(e)). The fused vector replaces the whole plain input."""
    norm_weights: bool = True  # False: every RMSNorm (blocks, final, QK, fusion) is a plain F.rms_norm, no gain
    embed_scale: float = 1.0  # the looked-up embedding is multiplied by this (nanochat's tied-embedding scale)
    embed_norm: bool = False  # the looked-up (scaled) embedding is RMS-normed (weightless) before layer 0
    smear: bool = False  # x_t += λ·σ(W_s x_t[:smear_channels])·x_{t-1} on the normed embeddings (t >= 1)
    smear_channels: int = 24
    x0_mixing: bool = False  # block l reads resid_lambdas[l]·x + x0_lambdas[l]·x0 (x0: block 0's input)
    value_embed_layers: tuple[int, ...] = ()  # layers adding a token-indexed value embedding, gated per KV head
    value_embed_gate_channels: int = 12  # gate = 3·σ(W_ve x[:channels]) on the attention input
    backout_layer: int | None = None  # None, or l: subtract backout_lambda · (output of block l) before ln_final
    mlp_act: str = "silu_glu"  # "relu2": down(relu(up x)²), no gate projection
    rope_sign: int = 1  # -1 rotates by -θ (nanochat's layout, the transpose of HF's)
    qk_norm_after_rope: bool = False  # q, k rotated first, then RMS-normed
    qk_scale: float = 1.0  # q and k multiplied by this after their norm (nanochat: 1.2)
    logit_softcap: float | None = None  # logits -> c·tanh(logits / c)
    tie_embeddings: bool = True  # False: a separate unembedding matrix `unembed.weight` [d_vocab, d_model]

    def __post_init__(self) -> None:
        super().__post_init__()
        check = _checker("nanochat config")
        check(self.arch == ARCH, "arch", f"'{ARCH}'")
        check(self.fusion in FUSIONS, "fusion", f"one of {FUSIONS}")
        check(self.mlp_act in MLP_ACTS, "mlp_act", f"one of {MLP_ACTS}")
        for name in ("norm_weights", "embed_norm", "smear", "x0_mixing", "qk_norm_after_rope", "tie_embeddings"):
            check(isinstance(getattr(self, name), bool), name, "true or false")
        for name in ("embed_scale", "qk_scale"):
            check(_is_number(getattr(self, name)) and getattr(self, name) > 0, name, "a number > 0")
        check(
            self.logit_softcap is None or (_is_number(self.logit_softcap) and self.logit_softcap > 0),
            "logit_softcap",
            "a number > 0 or null",
        )
        check(self.rope_sign in (1, -1) and _is_int(self.rope_sign), "rope_sign", "1 or -1")
        for name in ("smear_channels", "value_embed_gate_channels"):
            value = getattr(self, name)
            check(_is_int(value) and 1 <= value <= self.d_model, name, f"an integer in 1..{self.d_model}")
        layers = self.value_embed_layers
        check(
            isinstance(layers, (list, tuple))
            and all(_is_int(l) and 0 <= l < self.n_layers for l in layers)
            and len(set(layers)) == len(layers),
            "value_embed_layers",
            f"distinct layer indices in 0..{self.n_layers - 1}",
        )
        object.__setattr__(self, "value_embed_layers", tuple(sorted(layers)))
        check(
            self.backout_layer is None or (_is_int(self.backout_layer) and 0 <= self.backout_layer < self.n_layers),
            "backout_layer",
            f"null or a layer index in 0..{self.n_layers - 1}",
        )
        check(
            self.fusion == "glu" or not self.norm_weights,
            "norm_weights",
            f"false with fusion '{self.fusion}' (its norms are weightless)",
        )

    @classmethod
    def from_format_3(cls, d: dict, source: str) -> dict:
        """A record written before `arch` marked nanochat configs: the extras are there already."""
        return {"arch": ARCH, **d}

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["value_embed_layers"] = list(self.value_embed_layers)
        return d

    # What TransformerLens's `ActivationCache` methods read from `model.cfg`.
    @property
    def normalization_type(self) -> str:
        """ "RMS" (RMSNorm with a gain) or "RMSPre" (weightless): every norm of the model."""
        return "RMS" if self.norm_weights else "RMSPre"

    @property
    def act_fn(self) -> str:
        return "relu2" if self.mlp_act == "relu2" else "silu"

    @property
    def gated_mlp(self) -> bool:
        return self.mlp_act != "relu2"

    @property
    def nanochat_input(self) -> bool:
        """Whether the plain input is more than the looked-up embedding (norm, scale or smear)."""
        return self.embed_norm or self.smear or self.embed_scale != 1.0

    @property
    def extras(self) -> dict:
        """The extras that differ from their identity value (what makes this more than the backbone)."""
        return {name: getattr(self, name) for name in extras_away_from_identity(self.to_dict())}


def is_nanochat_record(model: dict) -> bool:
    """Whether a config.json `model` record is a nanochat model's: `arch` says so, or (a record
    written before `arch` marked them) an extra holds other than its identity value."""
    if "arch" in model:
        return model["arch"] == ARCH
    return bool(extras_away_from_identity(model))
