"""SAELens as the oracle of our SAE format: `make saelens-check`.

SAELens 6 pins transformer-lens < 4 and this package needs >= 4, so the check runs in two
environments. `write DIR` (this package's venv): trains a TopK and a JumpReLU SAE on planted data,
saves them with `SparseAutoencoder.save`, and stores inputs with our encodings and reconstructions.
`check DIR` (a venv with sae-lens): opens both with `sae_lens.SAE.load_from_disk` and exits non-zero
unless its encode and decode equal ours (float32, max |difference| <= 1e-6)."""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ARCHS = ("topk", "jumprelu")


def write(folder: Path) -> None:
    from fbt_probe.sae import SAETrainConfig, train_sae

    g = torch.Generator().manual_seed(0)
    D = torch.nn.functional.normalize(torch.randn(48, 32, generator=g), dim=1)
    codes = (torch.rand(4000, 48, generator=g) < 0.06) * (0.5 + torch.rand(4000, 48, generator=g))
    x = codes @ D + 0.3
    out = {"x": x[:500]}
    for a in ARCHS:
        sae, _ = train_sae(x, SAETrainConfig(architecture=a, expansion=2, k=3, steps=300, lr=3e-3))
        sae.save(folder / f"sae-{a}", force=True)
        with torch.no_grad():
            out[f"enc_{a}"], out[f"rec_{a}"] = sae.encode(x[:500]), sae(x[:500])
    save_file(out, str(folder / "inputs.safetensors"))


def check(folder: Path) -> int:
    from sae_lens import SAE

    d, bad = load_file(str(folder / "inputs.safetensors")), 0
    for a in ARCHS:
        sae = SAE.load_from_disk(str(folder / f"sae-{a}"), device="cpu")
        with torch.no_grad():
            enc = sae.encode(d["x"])
            rec = sae.decode(enc)
        de, dr = float((enc - d[f"enc_{a}"]).abs().max()), float((rec - d[f"rec_{a}"]).abs().max())
        ok = de <= 1e-6 and dr <= 1e-6 and bool((enc > 0).any())
        bad += not ok
        print(
            f"{a}: SAELens {type(sae).__name__}, max |encode diff| {de:.2e}, max |decode diff| {dr:.2e}: {'ok' if ok else 'FAIL'}"
        )
    return bad


if __name__ == "__main__":
    where = Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    sys.exit(write(where) if sys.argv[1] == "write" else check(where))
