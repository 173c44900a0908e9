"""A sparse autoencoder over one hook's activations, saved in SAELens's on-disk format.

    encode:  f(x) = σ((x − b_dec) W_enc + b_enc)        W_enc [d_in, d_sae], b_enc [d_sae]
    decode:  x̂ = f W_dec + b_dec                         W_dec [d_sae, d_in], b_dec [d_in]

σ is the architecture's activation:
- `topk`: keep the k largest pre-activations of each row, ReLU them, zero the rest (Gao et al. 2024);
- `jumprelu`: z · 1[z > θ] with one learned threshold θ per latent (Rajamanoharan et al. 2024).

A folder holds `cfg.json` and `sae_weights.safetensors` with the field and tensor names SAELens 6
reads (`sae_lens.SAE.load_from_disk`): `architecture`, `d_in`, `d_sae`, `dtype`, `device`,
`apply_b_dec_to_input` (true: b_dec is subtracted before encoding), `normalize_activations` ("none"),
`reshape_activations` ("none"), `k` for topk, `metadata` (hook, model, mode, training record, and
SAELens's `model_name`, `hook_name`, `context_size`, `prepend_bos`, `dataset_path`; the mode also as
`model_from_pretrained_kwargs: {"default_mode": MODE}`, the field SAELens reads the model's setup
from). `load` reads a folder SAELens wrote as well (`SAE.save_model`, architectures topk and jumprelu;
a TopK's `rescale_acts_by_decoder_norm` is folded into the weights as SAELens folds it).

The SAE is a TransformerLens `HookedRootModule` with SAELens's hook points, each run only while a
hook is attached to it: `hook_sae_input` (x), `hook_sae_acts_pre` (the pre-activations),
`hook_sae_acts_post` (the latents f), `hook_sae_recons` (x̂), `hook_sae_error` (x − x̂, only with the
error term) and `hook_sae_output` (what `forward` returns). With `use_error_term` the output is
x̂ + (x − x̂_clean), where x̂_clean is the reconstruction computed with every hook off and without
gradient: the output equals the input (exactly, see `forward`), and an edit of the latents changes
it by the decoder's image of the edit only (SAELens's semantics). `fbt_probe.sae.hooked` splices an SAE into a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from fbt_probe.engine.hooks import has_hooks, hooked
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
        if self.metadata.get("mode") is not None:
            # SAELens reads how to set the model up from `model_from_pretrained_kwargs` (and warns
            # that the model should be built with them): here the mode the activations were read
            # under, which the model takes as `model.default_mode` (or `with model.mode(...)`).
            cfg["metadata"].setdefault("model_from_pretrained_kwargs", {"default_mode": str(self.metadata["mode"])})
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
        if cfg.get("reshape_activations", "none") != "none":
            raise FbtError(
                f"{where}: reshape_activations '{cfg['reshape_activations']}': only 'none' (an SAE over one hook's last dimension)"
            )
        if cfg["architecture"] == "topk" and "k" not in cfg:
            raise FbtError(f"{where}: field 'k' missing (a topk SAE's active latents per row)")
        dtype = str(cfg.get("dtype", "float32")).removeprefix("torch.")  # SAELens before 6 wrote "torch.float32"
        if dtype not in DTYPES:
            raise FbtError(f"{where}: SAE field 'dtype' '{dtype}': expected one of {', '.join(DTYPES)}")
        meta = {k: v for k, v in (cfg.get("metadata") or {}).items() if not k.startswith("sae_lens_")}
        for key in ("d_in", "d_sae", "k"):
            if key in cfg and (not isinstance(cfg[key], int) or isinstance(cfg[key], bool)):
                raise FbtError(f"{where}: field '{key}': expected an integer, got {cfg[key]!r}")
        try:
            return cls(cfg["d_in"], cfg["d_sae"], cfg["architecture"], cfg.get("k", 8), dtype, meta)
        except FbtError as e:
            raise FbtError(f"{where}: {e}") from None


class SparseAutoencoder(HookedRootModule):
    HOOK_POINTS = (
        "hook_sae_input",
        "hook_sae_acts_pre",
        "hook_sae_acts_post",
        "hook_sae_recons",
        "hook_sae_error",
        "hook_sae_output",
    )

    def __init__(self, cfg: SAEConfig, use_error_term: bool = False):
        super().__init__()
        self.cfg = cfg
        self.use_error_term = use_error_term
        dt = getattr(torch, cfg.dtype)
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dt))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dt))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, dtype=dt))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dt))
        if cfg.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dt))
        for name in self.HOOK_POINTS:
            setattr(self, name, HookPoint())
        self.setup()

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] -> [..., d_sae]: (x − b_dec) W_enc + b_enc (no hook points)."""
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.cfg.architecture == "topk":
            vals, idx = pre.topk(self.cfg.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, idx, vals.relu())
        return pre.relu() * (pre > self.threshold).to(pre.dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d_in] -> [..., d_sae] latents, through `hook_sae_input`, `hook_sae_acts_pre`, `hook_sae_acts_post`."""
        pre = hooked(self.hook_sae_acts_pre, self.pre_acts(hooked(self.hook_sae_input, x)))
        return hooked(self.hook_sae_acts_post, self.activate(pre))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """[..., d_sae] -> [..., d_in]: f W_dec + b_dec, through `hook_sae_recons`."""
        return hooked(self.hook_sae_recons, f @ self.W_dec + self.b_dec)

    def forward(self, x: torch.Tensor, use_error_term: bool | None = None) -> torch.Tensor:
        """The reconstruction x̂, or with the error term (default `self.use_error_term`) x̂ + e with
        e = x − x̂_clean (hooks off, no gradient), e passing `hook_sae_error`. Written as
        x + (x̂ − x̂_clean) + (e_hooked − e): the same value and the same gradient (through x̂ only),
        and exactly `x` in floating point while no hook changes anything."""
        out = self.decode(self.encode(x))
        if self.use_error_term if use_error_term is None else use_error_term:
            with torch.no_grad():
                edited = any(has_hooks(getattr(self, n)) for n in self.HOOK_POINTS[:4])
                clean = self.activate(self.pre_acts(x)) @ self.W_dec + self.b_dec if edited else out.detach()
                error = x - clean
                shift = hooked(self.hook_sae_error, error) - error
            out = x.detach() + (out - clean) + shift
        return hooked(self.hook_sae_output, out)

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
        if sae.cfg.architecture == "topk" and raw.get("rescale_acts_by_decoder_norm", False):
            sae.fold_decoder_norms()
        return sae

    @torch.no_grad()
    def fold_decoder_norms(self) -> None:
        """SAELens's TopK with `rescale_acts_by_decoder_norm` multiplies the pre-activations by the
        decoder row norms n and divides the latents by them before decoding; W_enc·n, b_enc·n and
        W_dec/n compute the same latents and reconstruction with the plain formulas (up to rounding;
        SAELens folds the same way). Computed in float64."""
        n = self.W_dec.double().norm(dim=-1).clamp_min(1e-8)
        self.W_enc.copy_(self.W_enc.double() * n)
        self.b_enc.copy_(self.b_enc.double() * n)
        self.W_dec.copy_(self.W_dec.double() / n[:, None])


def is_sae_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / CFG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()
