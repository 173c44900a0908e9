"""SAEs spliced into the model the SAELens way (`fbt_probe.sae.hooked`), float64, against hand
computations: the model run with a plain hook that does what the SAE should do at that hook point."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe.errors import FbtError
from fbt_probe.sae import SAEConfig, SparseAutoencoder
from fbt_probe.sae.data import collect, saelens_metadata
from fbt_probe.sae.hooked import (
    acts_to_saes,
    add_sae,
    reset_saes,
    run_with_cache_with_saes,
    run_with_hooks_with_saes,
    run_with_saes,
    with_sae_methods,
)
from tests.helpers import make_model, tokens

HOOK = "blocks.0.hook_resid_post"
MODES = ("standard", "recurrent:1")
ALL_MODES = (*MODES, "full", "jacobi:2")
TOL = 1e-12


def random_sae(d_in: int, architecture: str, hook: str = HOOK, seed: int = 0) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(d_in, 3 * d_in, architecture, 6, "float64", {"hook_name": hook}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
        if architecture == "jumprelu":
            sae.threshold.copy_(torch.rand(sae.cfg.d_sae, generator=g, dtype=torch.float64) * 0.2)
    return sae


@pytest.fixture(scope="module")
def setup():
    model = make_model()
    return model, tokens(2, 7), {a: random_sae(model.cfg.d_model, a) for a in ("topk", "jumprelu")}


def replace_by(fn):
    return lambda x, hook: fn(x)


@pytest.mark.parametrize("arch", ["topk", "jumprelu"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_run_with_saes_error_term_and_reconstruction(setup, mode, arch):
    model, tok, saes = setup
    sae = saes[arch]
    before = dict(model.hook_dict)
    with torch.no_grad():
        plain = model(tok, mode=mode)
        with_error = run_with_saes(model, tok, mode=mode, saes=[sae], use_error_term=True)
        recon = run_with_saes(model, tok, mode=mode, saes=[sae])
        hand = model.run_with_hooks(tok, mode=mode, fwd_hooks=[(HOOK, replace_by(lambda x: sae.decode(sae.encode(x))))])
    assert (with_error - plain).abs().max() <= TOL  # the SAE's output equals its input
    assert (recon - hand).abs().max() <= TOL
    assert (hand - plain).abs().max() > 1e-3  # the reconstruction is not the identity: the checks can fail
    assert model.hook_dict == before and isinstance(model.hook_dict[HOOK], type(before[HOOK]))
    assert acts_to_saes(model) == {}
    assert sorted(sae.hook_dict) == sorted(SparseAutoencoder.HOOK_POINTS)  # the SAE's own names are back
    assert sae.hook_sae_acts_post.name == "hook_sae_acts_post"


@pytest.mark.parametrize("arch", ["topk", "jumprelu"])
def test_error_term_value_gradient_and_error_hook(arch):
    """SAELens's output with the error term, x̂ + (x − x̂_clean).detach(): our value equals x exactly
    (in float32 too), the gradient flows through x̂ only, and a hook on hook_sae_error edits the output."""
    sae = random_sae(16, arch)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64).requires_grad_()
    out = sae(x, use_error_term=True)
    assert torch.equal(out, x.detach())
    assert torch.equal(sae.float()(x.detach().float(), use_error_term=True), x.detach().float())
    sae.double()
    (grad,) = torch.autograd.grad(out.pow(2).sum(), x)
    rec = sae(x)
    (want,) = torch.autograd.grad((rec + (x - rec).detach()).pow(2).sum(), x)
    assert (grad - want).abs().max() <= TOL and (want - 2 * x).abs().max() > 1e-2  # not the identity's gradient
    with torch.no_grad():
        zero_error = sae.run_with_hooks(x, fwd_hooks=[("hook_sae_error", lambda e, hook: 0 * e)], use_error_term=True)
        assert (zero_error - sae(x)).abs().max() <= TOL and (zero_error - x).abs().max() > 1e-2
        _, cache = sae.run_with_cache(x, use_error_term=True)
    assert (cache["hook_sae_error"] - (x - sae(x))).abs().max() <= TOL
    assert sorted(cache.keys()) == sorted(SparseAutoencoder.HOOK_POINTS)


@pytest.mark.parametrize("arch", ["topk", "jumprelu"])
@pytest.mark.parametrize("mode", MODES)
def test_cache_latents_and_a_latent_edit(setup, mode, arch):
    model, tok, saes = setup
    sae = saes[arch]
    with torch.no_grad():
        _, cache = run_with_cache_with_saes(model, tok, mode=mode, saes=[sae], use_error_term=True)
        _, ref = model.run_with_cache(tok, mode=mode, names_filter=HOOK)
        x = ref[HOOK]
        f = sae.encode(x)
        assert (cache[f"{HOOK}.hook_sae_acts_post"] - f).abs().max() <= TOL
        assert (cache[f"{HOOK}.hook_sae_input"] - x).abs().max() <= TOL
        assert (cache[f"{HOOK}.hook_sae_recons"] - sae.decode(f)).abs().max() <= TOL
        assert (cache[f"{HOOK}.hook_sae_error"] - (x - sae.decode(f))).abs().max() <= TOL
        assert (cache[f"{HOOK}.hook_sae_output"] - x).abs().max() <= TOL
        j = int(f[:, -1].abs().sum(0).argmax())  # a latent active at the final position
        assert f[:, -1, j].abs().max() > 0

        def zero(acts, hook):
            acts = acts.clone()
            acts[..., j] = 0
            return acts

        # without the error term the activation becomes the edited latents' reconstruction
        edited_recon = run_with_hooks_with_saes(
            model, tok, mode=mode, saes=[sae], fwd_hooks=[(f"{HOOK}.hook_sae_acts_post", zero)]
        )
        # with the error term (attached by add_sae) the edit moves the activation by −f_j W_dec[j]
        add_sae(model, sae, use_error_term=True)
        try:
            edited = model.run_with_hooks(tok, mode=mode, fwd_hooks=[(f"{HOOK}.hook_sae_acts_post", zero)])
        finally:
            reset_saes(model)

        def f0(h):  # the latents of the activation itself (under feedback the edit moves later positions' inputs)
            return zero(sae.encode(h), None)

        hand = model.run_with_hooks(
            tok,
            mode=mode,
            fwd_hooks=[(HOOK, replace_by(lambda h: sae.decode(f0(h)) + (h - sae.decode(sae.encode(h)))))],
        )
        hand_recon = model.run_with_hooks(tok, mode=mode, fwd_hooks=[(HOOK, replace_by(lambda h: sae.decode(f0(h))))])
        plain = model(tok, mode=mode)
    assert (edited - hand).abs().max() <= TOL
    assert (edited_recon - hand_recon).abs().max() <= TOL
    assert (edited - plain).abs().max() > 1e-6  # the edit does change the logits


def test_the_sae_reaches_the_carried_state(setup):
    """Under recurrent:1 an SAE at a layer-0 hook is an edit like any hook: the exact rule puts it
    in every pass, so the state carried into the final position is the SAE-edited one (equal to the
    serial run with the SAE in every chunk); serial=False keeps it in the one analysed pass."""
    model, tok, saes = setup
    sae = saes["topk"]
    with torch.no_grad():
        _, plain = model.run_with_cache(tok, mode="recurrent:1", names_filter="fusion.hook_feedback")
        _, spliced = run_with_cache_with_saes(
            model, tok, mode="recurrent:1", saes=[sae], names_filter="fusion.hook_feedback"
        )
        assert (spliced["fusion.hook_feedback"] - plain["fusion.hook_feedback"]).abs().max() > 1e-6
        serial = run_with_saes(model, tok, mode="recurrent:1", serial=True, saes=[sae])
        hand = model.run_with_hooks(
            tok,
            mode="recurrent:1",
            serial=True,
            fwd_hooks=[(HOOK, replace_by(lambda x: sae.decode(sae.encode(x))))],
        )
        exact = run_with_saes(model, tok, mode="recurrent:1", saes=[sae])
        one_pass = run_with_saes(model, tok, mode="recurrent:1", serial=False, saes=[sae])
    assert (serial - hand).abs().max() <= TOL
    assert (exact - serial).abs().max() <= TOL
    assert (serial[:, -1] - one_pass[:, -1]).abs().max() > 1e-6  # the one pass does not feed the SAE's state forward


def test_add_reset_nesting_and_bound_methods(setup):
    model, tok, saes = setup
    a, b = saes["topk"], saes["jumprelu"]
    n_params, keys = len(list(model.parameters())), set(model.state_dict())
    with torch.no_grad():
        plain = model(tok)
        only_b = run_with_saes(model, tok, saes=[b])
        model = with_sae_methods(model)
        model.add_sae(b)
        assert set(model.acts_to_saes()) == {HOOK} and model.acts_to_saes()[HOOK] is b
        assert len(list(model.parameters())) == n_params and set(model.state_dict()) == keys
        assert (model(tok) - only_b).abs().max() == 0
        # run_with_saes replaces b for the run, then attaches b again with its error-term setting
        assert (model.run_with_saes(tok, saes=[a], use_error_term=True) - plain).abs().max() <= TOL
        assert model.acts_to_saes()[HOOK] is b and (model(tok) - only_b).abs().max() == 0
        model.reset_saes()
        assert (model(tok) - plain).abs().max() == 0
        assert HOOK in model.hook_dict and f"{HOOK}.hook_sae_acts_post" not in model.hook_dict


def test_refusals(setup):
    model, tok, saes = setup
    nowhere = SparseAutoencoder(SAEConfig(model.cfg.d_model, 8, "topk", 2, "float64", {}))
    with pytest.raises(FbtError, match="names no hook"):
        add_sae(model, nowhere)
    with pytest.raises(FbtError, match="not a hook point"):
        add_sae(model, random_sae(model.cfg.d_model, "topk", hook="blocks.0.hook_nothing"))
    with pytest.raises(FbtError, match="no SAE is attached"):
        reset_saes(model, HOOK)
    narrow = random_sae(model.cfg.d_model // 2, "topk")
    with pytest.raises(FbtError, match="last dimension"):
        run_with_saes(model, tok, saes=[narrow])
    assert acts_to_saes(model) == {} and HOOK in model.hook_dict  # a failed run leaves the model as it was


# cfg.json as SAELens 6.54.12's `SAE.save_model` writes it (TopKSAE / JumpReLUSAE, field for field)
SAELENS_CFG = {
    "d_in": 4,
    "d_sae": 6,
    "dtype": "float32",
    "device": "cpu",
    "apply_b_dec_to_input": True,
    "normalize_activations": "none",
    "reshape_activations": "none",
    "metadata": {
        "sae_lens_version": "6.54.12",
        "sae_lens_training_version": "6.54.12",
        "model_name": "m",
        "hook_name": "blocks.0.hook_resid_post",
        "context_size": 7,
        "prepend_bos": False,
        "dataset_path": "d",
    },
}


def saelens_reference(arch: str, w: dict, x: np.ndarray, k: int = 2, rescale: bool = False):
    """SAELens's TopKSAE / JumpReLUSAE encode and decode, float64 numpy."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    norms = np.linalg.norm(w["W_dec"], axis=1)
    if arch == "topk":
        pre = pre * norms if rescale else pre
        f = np.zeros_like(pre)
        idx = np.argsort(-pre, axis=-1)[:, :k]
        np.put_along_axis(f, idx, np.maximum(np.take_along_axis(pre, idx, -1), 0), -1)
        return f, (f / norms if rescale else f) @ w["W_dec"] + w["b_dec"]
    f = np.maximum(pre, 0) * (pre > w["threshold"])
    return f, f @ w["W_dec"] + w["b_dec"]


@pytest.mark.parametrize("arch, rescale", [("topk", False), ("topk", True), ("jumprelu", False)])
def test_loads_a_folder_in_saelens_layout(tmp_path, arch, rescale):
    from safetensors.torch import save_file

    cfg = dict(SAELENS_CFG, architecture=arch, dtype="float64")
    if arch == "topk":
        cfg |= {"k": 2, "rescale_acts_by_decoder_norm": rescale}
    g = torch.Generator().manual_seed(3)
    w = {
        "W_enc": torch.randn(4, 6, generator=g, dtype=torch.float64),
        "b_enc": 0.1 * torch.randn(6, generator=g, dtype=torch.float64),
        "W_dec": 2 * torch.randn(6, 4, generator=g, dtype=torch.float64),  # rows not of unit norm
        "b_dec": 0.1 * torch.randn(4, generator=g, dtype=torch.float64),
    }
    if arch == "jumprelu":
        w["threshold"] = 0.2 + 0.2 * torch.rand(6, generator=g, dtype=torch.float64)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    save_file(w, str(tmp_path / "s" / "sae_weights.safetensors"))
    sae = SparseAutoencoder.load(tmp_path / "s")
    x = torch.randn(50, 4, generator=g, dtype=torch.float64)
    f_ref, rec_ref = saelens_reference(arch, {k: v.numpy() for k, v in w.items()}, x.numpy(), rescale=rescale)
    with torch.no_grad():
        f, rec = sae.encode(x).numpy(), sae(x).numpy()
    assert np.abs(f - f_ref).max() <= 1e-12 and np.abs(rec - rec_ref).max() <= 1e-12
    assert (f > 0).sum(1).mean() > 0.5  # latents fire: the comparison is not of zeros
    assert sae.hook_name == "blocks.0.hook_resid_post" and sae.cfg.metadata["context_size"] == 7


@pytest.mark.parametrize(
    "change, message",
    [
        ({"reshape_activations": "hook_z"}, "reshape_activations 'hook_z'"),
        ({"dtype": "int8"}, "'dtype' 'int8'"),
        ({"architecture": "topk"}, "field 'k' missing"),
        ({"architecture": "standard"}, "architecture 'standard'"),
    ],
)
def test_saelens_layouts_we_cannot_read_are_refused(tmp_path, change, message):
    cfg = dict(SAELENS_CFG, architecture="jumprelu") | change
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "s" / "sae_weights.safetensors").write_bytes(b"")
    with pytest.raises(FbtError, match=message):
        SparseAutoencoder.load(tmp_path / "s")


def test_saelens_metadata_of_the_folders_we_write(setup, tmp_path):
    """context_size, prepend_bos and dataset_path from the activations `collect` read; the mode where
    SAELens reads the model's setup (`model_from_pretrained_kwargs`)."""
    model = setup[0]
    df = pd.DataFrame({"token_ids": [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12]]})
    x, index = collect(model, df, "fusion.hook_feedback", "jacobi:2", "fed")
    meta = {"hook_name": "fusion.hook_feedback", "mode": "jacobi:2"} | saelens_metadata(index, "runs/data")
    assert meta["context_size"] == 5 and meta["prepend_bos"] is False and meta["dataset_path"] == "runs/data"
    assert len(x) == 2 + 4 + 3  # every position t >= 1 of each sample: the longest reaches position 4
    sae = SparseAutoencoder(SAEConfig(model.cfg.d_model, 8, "topk", 2, "float64", meta))
    sae.save(tmp_path / "s")
    written = json.loads((tmp_path / "s" / "cfg.json").read_text())["metadata"]
    assert {k: written[k] for k in ("context_size", "prepend_bos", "dataset_path", "hook_name")} == {
        "context_size": 5,
        "prepend_bos": False,
        "dataset_path": "runs/data",
        "hook_name": "fusion.hook_feedback",
    }
    assert written["model_from_pretrained_kwargs"] == {"default_mode": "jacobi:2"} and written["mode"] == "jacobi:2"
    again = SparseAutoencoder.load(tmp_path / "s")
    again.save(tmp_path / "t")
    assert (tmp_path / "t" / "cfg.json").read_text() == (tmp_path / "s" / "cfg.json").read_text()
