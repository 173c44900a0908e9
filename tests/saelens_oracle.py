"""SAELens as the oracle of our SAE format, both ways, and of the error-term semantics: `make saelens-check`.

SAELens 6 pins transformer-lens < 4 and this package needs >= 4, so the check runs in two
environments, in three steps over one folder DIR:
- `write DIR` (this package's venv): trains a TopK and a JumpReLU SAE on planted data, saves them
  with `SparseAutoencoder.save`, and stores inputs with our encodings and reconstructions.
- `check DIR` (a venv with sae-lens): opens both with `sae_lens.SAE.load_from_disk` and fails
  unless its encode and decode equal ours; stores SAELens's output of each with the error term on
  and one latent zeroed by a hook on `hook_sae_acts_post`; then writes a TopK SAE (with
  `rescale_acts_by_decoder_norm`, decoder rows not of unit norm) and a JumpReLU SAE of its own with
  `SAE.save_model`, and stores its encodings and reconstructions of the same inputs.
- `read DIR` (this package's venv): opens SAELens's folders with `SparseAutoencoder.load` and fails
  unless our encode and decode equal SAELens's, and unless our error-term output under the same
  latent edit equals SAELens's.
Float32 throughout; "equal" is max |difference| <= 1e-6 (the folded TopK: 1e-5, see `TOL`)."""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ARCHS = ("topk", "jumprelu")
TOL = {"topk": 1e-5, "jumprelu": 1e-6}  # SAELens-written: the TopK's decoder norms are folded in (rounding)
EDITED = 0  # the row whose largest latent the edit zeroes


def _latent(enc: torch.Tensor) -> int:
    return int(enc[EDITED].argmax())


def write(folder: Path) -> int:
    from fbt_probe.sae import SAETrainConfig, train_sae

    g = torch.Generator().manual_seed(0)
    D = torch.nn.functional.normalize(torch.randn(48, 32, generator=g), dim=1)
    codes = (torch.rand(4000, 48, generator=g) < 0.06) * (0.5 + torch.rand(4000, 48, generator=g))
    x = codes @ D + 0.3
    out = {"x": x[:500]}
    for a in ARCHS:
        sae, _ = train_sae(x, SAETrainConfig(architecture=a, expansion=2, k=3, steps=300, lr=3e-3))
        sae.cfg.metadata["hook_name"] = "blocks.0.hook_resid_post"
        sae.save(folder / f"sae-{a}", force=True)
        with torch.no_grad():
            out[f"enc_{a}"], out[f"rec_{a}"] = sae.encode(x[:500]), sae(x[:500])
    save_file(out, str(folder / "inputs.safetensors"))
    return 0


def _saelens_own(arch: str, d_in: int, seed: int):
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    meta = SAEMetadata(model_name="oracle", hook_name="blocks.0.hook_resid_post", context_size=16, prepend_bos=False)
    if arch == "topk":
        sae = TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=2 * d_in, k=3, rescale_acts_by_decoder_norm=True, metadata=meta))
    else:
        sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=2 * d_in, metadata=meta))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name != "W_dec" else 0.7))
        if arch == "jumprelu":
            sae.threshold.copy_(0.1 + 0.3 * torch.rand(sae.cfg.d_sae, generator=g))
    return sae


def check(folder: Path) -> int:
    import warnings

    from sae_lens import SAE

    d, bad, out = load_file(str(folder / "inputs.safetensors")), 0, {}
    for a in ARCHS:
        sae = SAE.load_from_disk(str(folder / f"sae-{a}"), device="cpu")
        with torch.no_grad():
            enc = sae.encode(d["x"])
            rec = sae.decode(enc)
            j = _latent(enc)

            def zero(acts, hook, j=j):
                acts = acts.clone()
                acts[EDITED, j] = 0
                return acts

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # use_error_term set on the SAE itself
                sae.use_error_term = True
            out[f"edit_{a}"] = sae.run_with_hooks(d["x"], fwd_hooks=[("hook_sae_acts_post", zero)])
        de, dr = float((enc - d[f"enc_{a}"]).abs().max()), float((rec - d[f"rec_{a}"]).abs().max())
        ok = de <= 1e-6 and dr <= 1e-6 and bool((enc > 0).any())
        bad += not ok
        print(
            f"ours {a} in SAELens {type(sae).__name__}: max |encode diff| {de:.2e}, max |decode diff| {dr:.2e}: {'ok' if ok else 'FAIL'}"
        )
    for i, a in enumerate(ARCHS):
        sae = _saelens_own(a, d["x"].shape[1], seed=10 + i)
        sae.save_model(folder / f"saelens-{a}")
        with torch.no_grad():
            out[f"sl_enc_{a}"] = sae.encode(d["x"])
            out[f"sl_rec_{a}"] = sae.decode(out[f"sl_enc_{a}"])
        print(
            f"SAELens wrote saelens-{a} ({type(sae).__name__}, L0 {float((out[f'sl_enc_{a}'] > 0).sum(1).float().mean()):.1f})"
        )
    save_file(out, str(folder / "saelens-outputs.safetensors"))
    return bad


def read(folder: Path) -> int:
    from fbt_probe.sae import SparseAutoencoder

    d, s, bad = load_file(str(folder / "inputs.safetensors")), load_file(str(folder / "saelens-outputs.safetensors")), 0
    for a in ARCHS:
        sae = SparseAutoencoder.load(folder / f"saelens-{a}")
        with torch.no_grad():
            enc = sae.encode(d["x"])
            rec = sae.decode(enc)
        de, dr = float((enc - s[f"sl_enc_{a}"]).abs().max()), float((rec - s[f"sl_rec_{a}"]).abs().max())
        same_support = bool(((enc > 0) == (s[f"sl_enc_{a}"] > 0)).all())
        ok = de <= TOL[a] and dr <= TOL[a] and same_support and bool((enc > 0).any())
        bad += not ok
        print(
            f"SAELens's {a} in ours: max |encode diff| {de:.2e}, max |decode diff| {dr:.2e}, same active latents {same_support}: {'ok' if ok else 'FAIL'}"
        )
        ours = SparseAutoencoder.load(folder / f"sae-{a}")
        with torch.no_grad():
            j = _latent(ours.encode(d["x"]))

            def zero(acts, hook, j=j):
                acts = acts.clone()
                acts[EDITED, j] = 0
                return acts

            edit = ours.run_with_hooks(d["x"], fwd_hooks=[("hook_sae_acts_post", zero)], use_error_term=True)
        dx = float((edit - s[f"edit_{a}"]).abs().max())
        moved = float((edit - d["x"]).abs().max())
        ok = dx <= 1e-6 and moved > 1e-3  # the edit moves the output, and both move it alike
        bad += not ok
        print(
            f"{a} error term with latent {j} zeroed: max |ours - SAELens| {dx:.2e} (the edit moves the output by {moved:.2e}): {'ok' if ok else 'FAIL'}"
        )
    return bad


if __name__ == "__main__":
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    sys.exit({"write": write, "check": check, "read": read}[sys.argv[1]](where))
