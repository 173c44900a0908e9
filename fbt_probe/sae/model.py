"""A sparse autoencoder over one hook's activations, saved in SAELens's on-disk format.

    encode:  f(x) = σ((x − b_dec) W_enc + b_enc)        W_enc [d_in, d_sae], b_enc [d_sae]
    decode:  x̂ = f W_dec + b_dec                         W_dec [d_sae, d_in], b_dec [d_in]

σ is the architecture's activation:
- `topk`: keep the k largest pre-activations of each row, ReLU them, zero the rest (Gao et al. 2024);
- `jumprelu`: z · 1[z > θ] with one learned threshold θ per latent (Rajamanoharan et al. 2024).

A folder holds `cfg.json` and `sae_weights.safetensors` with the field and tensor names SAELens 6
reads (`sae_lens.SAE.load_from_disk`): `architecture`, `d_in`, `d_sae`, `dtype`, `device`,
`apply_b_dec_to_input` (true: b_dec is subtracted before encoding), `normalize_activations` ("none"),
`reshape_activations` ("none"), `k` for topk, `metadata` (hook, model, mode, training record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from fbt_probe.errors import FbtError
from fbt_probe.marker import output_dir

ARCHITECTURES = ("topk", "jumprelu")
DTYPES = ("float32", "float64", "float16", "bfloat16")
CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
COMMAND = "sae train"  # the output marker's command
KIND = "an SAE folder written by fbt-probe sae train"
SAELENS_FORMAT = "6.0.0"  # the cfg.json layout (SAELens >= 6 reads it without conversion)


@dataclass(frozen=True)
class SAEConfig:
    d_in: int
    d_sae: int
    architecture: str = "topk"
    k: int = 8  # topk: active latents per row
    dtype: str = "float32"
    metadata: dict = field(default_factory=dict)  # hook_name, model_name, mode, training record

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise FbtError(f"SAE architecture '{self.architecture}': expected one of {', '.join(ARCHITECTURES)}")
        if self.dtype not in DTYPES:
            raise FbtError(f"SAE field 'dtype' {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.d_in < 1 or self.d_sae < 1:
            raise FbtError(f"SAE d_in {self.d_in}, d_sae {self.d_sae}: expected positive widths")
        if self.architecture == "topk" and not 1 <= self.k <= self.d_sae:
            raise FbtError(f"SAE k {self.k}: expected 1 <= k <= d_sae ({self.d_sae})")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors an SAE of this config holds, by name."""
        shapes = {"W_enc": (self.d_in, self.d_sae), "b_enc": (self.d_sae,), "W_dec": (self.d_sae, self.d_in)}
        shapes["b_dec"] = (self.d_in,)
        if self.architecture == "jumprelu":
            shapes["threshold"] = (self.d_sae,)
        return shapes

    def to_saelens(self) -> dict:
        cfg = {
            "architecture": self.architecture,
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": self.dtype,
            "device": "cpu",
            "apply_b_dec_to_input": True,
            "normalize_activations": "none",
            "reshape_activations": "none",
            "metadata": {"sae_lens_version": SAELENS_FORMAT, "sae_lens_training_version": None, **self.metadata},
        }
        if self.architecture == "topk":
            cfg.update(k=self.k, rescale_acts_by_decoder_norm=False)
        return cfg

    @classmethod
    def from_saelens(cls, cfg: dict, where: str) -> "SAEConfig":
        for key in ("architecture", "d_in", "d_sae"):
            if key not in cfg:
                raise FbtError(f"{where}: field '{key}' missing (expected an SAE cfg.json in SAELens's format)")
        if cfg.get("apply_b_dec_to_input", True) is not True or cfg.get("normalize_activations", "none") != "none":
            raise FbtError(f"{where}: expected apply_b_dec_to_input true and normalize_activations 'none'")
        meta = {k: v for k, v in (cfg.get("metadata") or {}).items() if not k.startswith("sae_lens_")}
        for key in ("d_in", "d_sae", "k"):
            if key in cfg and (not isinstance(cfg[key], int) or isinstance(cfg[key], bool)):
                raise FbtError(f"{where}: field '{key}': expected an integer, got {cfg[key]!r}")
        try:
            return cls(
                cfg["d_in"], cfg["d_sae"], cfg["architecture"], cfg.get("k", 8), cfg.get("dtype", "float32"), meta
            )
        except FbtError as e:
            raise FbtError(f"{where}: {e}") from None


class SparseAutoencoder(nn.Module):
    def __init__(self, cfg: SAEConfig):
        super().__init__()
        self.cfg = cfg
        dt = getattr(torch, cfg.dtype)
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dt))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dt))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, dtype=dt))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dt))
        if cfg.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dt))

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] -> [..., d_sae]: (x − b_dec) W_enc + b_enc."""
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.cfg.architecture == "topk":
            vals, idx = pre.topk(self.cfg.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, idx, vals.relu())
        return pre.relu() * (pre > self.threshold).to(pre.dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.pre_acts(x))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """[..., d_sae] -> [..., d_in]: f W_dec + b_dec."""
        return f @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    @property
    def hook_name(self) -> str | None:
        return self.cfg.metadata.get("hook_name")

    # ----------------------------------------------------------------- disk
    def save(self, folder: str | Path, force: bool = False) -> Path:
        """Write cfg.json + sae_weights.safetensors into `folder` (built in a temporary sibling, marked
        as `sae train`'s output; `force` replaces only such a folder, keeping files it did not write)."""
        folder = Path(folder)
        bad = [n for n, t in self.state_dict().items() if not bool(torch.isfinite(t).all())]
        if bad:  # refused before the folder is touched: a diverged SAE is no output
            raise FbtError(
                f"{folder}: the SAE's tensor '{bad[0]}' holds non-finite values (training diverged); "
                "nothing written (lower --lr)"
            )
        with output_dir(folder, COMMAND, force=force, kind=KIND) as tmp:
            tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(tensors, str(tmp / WEIGHTS_FILE))
            (tmp / CFG_FILE).write_text(json.dumps(self.cfg.to_saelens(), indent=2, sort_keys=True) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "SparseAutoencoder":
        folder = Path(folder)
        if not is_sae_folder(folder):
            raise FbtError(f"{folder}: not an SAE folder (expected {CFG_FILE} and {WEIGHTS_FILE})")
        try:
            raw = json.loads((folder / CFG_FILE).read_text())
        except json.JSONDecodeError as e:
            raise FbtError(f"{folder / CFG_FILE}: not JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(raw, dict):
            raise FbtError(f"{folder / CFG_FILE}: expected a JSON object (an SAE cfg.json in SAELens's format)")
        cfg = SAEConfig.from_saelens(raw, str(folder / CFG_FILE))
        try:
            state = load_file(str(folder / WEIGHTS_FILE))
        except Exception as e:  # safetensors' own error types: a truncated file, a pickle, not a header
            raise FbtError(
                f"{folder / WEIGHTS_FILE}: not a readable safetensors file ({type(e).__name__}: {str(e)[:120]})"
            ) from None
        want = cfg.shapes()  # compared before the SAE is allocated
        got = {k: tuple(v.shape) for k, v in state.items()}
        if want != got:
            raise FbtError(f"{folder / WEIGHTS_FILE}: tensors {got} do not match cfg.json (expected {want})")
        for name, t in state.items():
            if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                raise FbtError(
                    f"{folder / WEIGHTS_FILE}: tensor '{name}' holds non-finite values or is not floating point "
                    f"(dtype {t.dtype}); expected finite weights (retrain the SAE)"
                )
        sae = cls(cfg)
        sae.load_state_dict(state)
        return sae


def is_sae_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / CFG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()
