"""Configuration of a Hidden Decoding model: the backbone's `ModelConfig` plus the stream expansion.

A subclass (not a wrapper) so that everything that reads `model.cfg` (TransformerLens patching,
`fbt_probe.activations`, the checkpoint writer) sees the usual backbone fields, and a saved
`config.json` carries `arch`, `n_streams` and `cross_stream_layers` next to them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fbt_probe.config import ModelConfig, _checker, arch_of
from fbt_probe.errors import FbtError

ARCH = "hidden-decoding"


@dataclass(frozen=True)
class HiddenConfig(ModelConfig):
    arch: str = ARCH
    """Marks a checkpoint as Hidden Decoding (a plain `ModelConfig` refuses these fields)."""
    n_streams: int = 2
    """n: streams per token, each with its own embedding table E_k (eq. 1)."""
    cross_stream_layers: tuple[int, ...] | None = None
    """Layers (0-based) whose attention crosses streams; every other layer is intra-stream (eq. 4).
    None: the layers the base model makes global (the full-attention layers of a sliding/global
    pattern, else every `global_every`-th layer)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check = _checker("hidden-decoding config")
        check(self.arch == ARCH, "arch", f"'{ARCH}'")
        check(isinstance(self.n_streams, int) and self.n_streams >= 1, "n_streams", "an integer >= 1")
        if self.cross_stream_layers is not None:
            object.__setattr__(self, "cross_stream_layers", tuple(int(l) for l in self.cross_stream_layers))
            layers = self.cross_stream_layers
            check(
                all(0 <= l < self.n_layers for l in layers) and len(set(layers)) == len(layers),
                "cross_stream_layers",
                f"distinct layer indices in 0..{self.n_layers - 1}",
            )

    @property
    def resolved_cross_stream_layers(self) -> tuple[int, ...]:
        if self.cross_stream_layers is not None:
            return tuple(sorted(self.cross_stream_layers))
        types = self.resolved_layer_types
        if "sliding_attention" in types:
            return tuple(l for l, t in enumerate(types) if t == "full_attention")
        return tuple(l for l in range(self.n_layers) if (l + 1) % self.global_every == 0)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["cross_stream_layers"] = None if self.cross_stream_layers is None else list(self.cross_stream_layers)
        return d

    @classmethod
    def from_base(cls, base: ModelConfig, n_streams: int = 2, cross_stream_layers=None) -> "HiddenConfig":
        if arch_of(base) != "feedback":  # another family's extras are not wired into the stream model
            raise FbtError(
                f"hidden-decoding config: field 'arch' is {arch_of(base)!r}; Hidden Decoding runs on the "
                "paper's backbone only"
            )
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ModelConfig)}
        return cls(**fields, n_streams=n_streams, cross_stream_layers=cross_stream_layers)

    def base(self) -> ModelConfig:
        """The backbone's own config (what a warm start was taken from)."""
        return ModelConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)})
