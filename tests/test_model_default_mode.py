"""The model-level default mode (TransformerLens callers inherit it), the serial cache, bad tokens."""

import dataclasses

import pytest
import torch
from transformer_lens import patching

from fbt_probe.errors import FbtError
from fbt_probe.interventions import label_token_ids, pair_batches, residual_patching
from fbt_probe.modes import parse_mode
from fbt_probe.surface.decoding import generate
from fbt_probe.tasks import build_tokenizer, load_spec
from fbt_probe.tasks import generate as generate_pairs
from tests.helpers import make_model, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = dict(rtol=0, atol=1e-12)  # float64: the same computation in chunks of other shapes


@pytest.fixture(scope="module")
def model():
    return make_model()


def test_default_mode_is_what_calls_without_a_mode_run(model):
    toks = tokens(2, 9)
    with torch.no_grad():
        rec = model(toks, mode="recurrent:1")
        assert model.default_mode == "standard"
        with model.mode("recurrent:1"):
            assert model.default_mode == "recurrent:1"
            assert torch.equal(model(toks), rec)  # the same computation, the same shapes
            _, cache = model.run_with_cache(toks, names_filter="fusion.hook_feedback")
            assert torch.count_nonzero(cache["fusion.hook_feedback"][:, -1]) > 0  # a carried state fired
            assert torch.equal(model(toks, mode="standard"), model.run_with_hooks(toks, mode="standard"))
        assert model.default_mode == "standard"
        with pytest.raises(RuntimeError), model.mode("full"):
            raise RuntimeError("the default comes back after an error too")
        assert model.default_mode == "standard"
    with pytest.raises(FbtError, match="mode 'sideways'"):
        model.default_mode = "sideways"


@pytest.fixture(scope="module")
def pair_batch():
    tok = build_tokenizer()
    df = generate_pairs(dataclasses.replace(load_spec("memory"), length_grid=(2,)), groups=3, seed=0, tokenizer=tok)
    return next(pair_batches(df, label_token_ids(df, tok), batch_size=6))


@pytest.mark.parametrize("mode", ["standard", "recurrent:1"])
def test_transformer_lens_patching_equals_our_serial_residual_patching(model, pair_batch, mode):
    """TL's get_act_patch_resid_pre, run inside `model.mode(mode)`, runs under the exact hook rule:
    it equals our residual patching with the serial rule (serial=True) at every layer and position,
    the patch reaching the carried states of later positions. blocks.l.hook_resid_pre carries the
    same values as our probe depth l."""
    b = pair_batch
    L, T = model.cfg.n_layers, b.T
    weights = torch.rand(b.n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def metric(logits):  # a weighted sum of per-row logit differences: one scalar that sees every row
        rows = torch.arange(b.n)
        return ((logits[rows, -1, b.target] - logits[rows, -1, b.other]) * weights).sum()

    with torch.no_grad(), model.mode(mode):
        _, clean_cache = model.run_with_cache(b.tokens)
        tl = patching.get_act_patch_resid_pre(model, b.tokens[b.partner], clean_cache, metric)
    ours = residual_patching(
        model, [b], mode=parse_mode(mode), depths=range(L), directions=("denoising",), serial=mode != "standard"
    )
    ours["w"] = weights.numpy()[ours.index % b.n]
    table = (ours.logit_diff * ours.w).groupby([ours.depth, ours.position]).sum()
    expected = torch.tensor(table.unstack().to_numpy())
    assert tl.shape == expected.shape == (L, T)
    # TL stores the metric in float32 (our rows are float64); a patch at a wrong layer or position
    # moves it by > 1e-3 here
    torch.testing.assert_close(tl.double(), expected, rtol=1e-6, atol=1e-6)
    assert (expected[:, 1:] - expected[:, :-1]).abs().max() > 1e-3


def test_transformer_lens_patching_under_recurrent_1_is_not_the_serial_rule(model, pair_batch):
    """Under recurrent:1 the serial rule (our default there) reaches the carried state into T-1 from a
    patch at p < T-1, which TL's one-pass patch cannot: both agree at p = T-1 and differ before it."""
    b = pair_batch
    kw = dict(mode=parse_mode("recurrent:1"), depths=[1], directions=("denoising",))
    one_pass = residual_patching(model, [b], serial=False, **kw).set_index(["position", "row"]).logit_diff
    serial = residual_patching(model, [b], serial=True, **kw).set_index(["position", "row"]).logit_diff
    last = b.T - 1
    torch.testing.assert_close(torch.tensor(serial[last].to_numpy()), torch.tensor(one_pass[last].to_numpy()), **TOL)
    before = (serial - one_pass).drop(index=last, level="position")
    assert before.abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["recurrent:3", "full"])
def test_serial_cache_stitches_every_chunk(model, mode):
    """Before: the serial cache held only the last step ([batch, 1, ...]). The stitched chunks equal
    the one-pass cache of the same mode (the final pass is exact), the pattern included."""
    toks = tokens(2, 10)
    with torch.no_grad():
        logits, serial = model.run_with_cache(toks, mode=mode, serial=True)
        ref_logits, ref = model.run_with_cache(toks, mode=mode)
    torch.testing.assert_close(logits, ref_logits, **TOL)
    assert set(serial.keys()) == set(ref.keys())
    first = 10 - (3 if mode == "recurrent:3" else 9)
    for name in ref.keys():
        assert serial[name].shape == ref[name].shape, name
        if name.startswith("fusion."):  # no fusion in the standard prefix: NaN there, exact elsewhere
            assert torch.isnan(serial[name][:, :first]).all(), name
            torch.testing.assert_close(serial[name][:, first:], ref[name][:, first:], **TOL, msg=name)
        else:
            torch.testing.assert_close(serial[name], ref[name], **TOL, msg=name)


def test_serial_cache_under_jacobi_has_one_entry_per_pass(model):
    toks = tokens(2, 8)
    with torch.no_grad():
        _, serial = model.run_with_cache(toks, mode="jacobi:3", serial=True, names_filter=lambda n: "resid_post" in n)
        _, final = model.run_with_cache(toks, mode="jacobi:3", names_filter=lambda n: "resid_post" in n)
        _, std = model.run_with_cache(toks, mode="standard", names_filter=lambda n: "resid_post" in n)
        _, two = model.run_with_cache(toks, mode="jacobi:2", names_filter=lambda n: "resid_post" in n)
    for name in final.keys():  # pass k is the final pass of jacobi:k: the same computation, bit for bit
        assert torch.equal(serial[name], final[name]) and torch.equal(serial[f"{name}.pass3"], final[name])
        assert torch.equal(serial[f"{name}.pass1"], std[name]) and torch.equal(serial[f"{name}.pass2"], two[name])
    with pytest.raises(FbtError, match="pos_slice"):
        model.run_with_cache(toks, mode="full", serial=True, pos_slice=-1)


def test_jacobi_passes_are_capped_at_the_sequence_length(model):
    """jacobi:K with K > T is jacobi:T (= full) bit for bit: pass T is already the fixed point."""
    toks = tokens(2, 6)
    calls = []
    with torch.no_grad():
        ref = model(toks, mode="jacobi:6")
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: calls.append(1))]):
            capped = model(toks, mode="jacobi:60", serial=True)
        one_pass = model(toks, mode="jacobi:60")
    # a hook attached takes the hooked attention path (other kernels than `ref`'s fused GEMM):
    # float64 closeness, and exactly T passes
    assert len(calls) == 6
    torch.testing.assert_close(capped, ref, **TOL)
    assert torch.equal(one_pass, ref)
    # with autograd on, the model takes its training path (separate q/k/v GEMMs, not the fused
    # inference GEMM of `ref`: other kernels, so float64 closeness across the two paths, and bitwise
    # equality within the autograd path)
    grad_capped = model(toks, mode="jacobi:60")
    assert torch.equal(grad_capped, model(toks, mode="jacobi:6"))
    torch.testing.assert_close(grad_capped.detach(), ref, **TOL)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([[1, 2, 3]], "expected a LongTensor"),
        (torch.tensor([1, 2, 3]), r"tokens\[None\]"),
        (torch.zeros(1, 2, 3, dtype=torch.long), r"expected shape \[batch, pos\]"),
        (torch.zeros(1, 3), "dtype torch.float32"),
        (torch.zeros(1, 3, dtype=torch.bool), "dtype torch.bool"),
        (torch.tensor([[1, 128]]), "id 128 is outside the vocabulary 0..127"),
        (torch.tensor([[-1, 2]]), "id -1 is outside"),
        (torch.zeros(1, 129, dtype=torch.long), "129 positions exceed the model's context n_ctx = 128"),
        (torch.zeros(1, 0, dtype=torch.long), "at least one"),
    ],
)
def test_bad_tokens_are_one_line_errors(model, bad, match):
    with pytest.raises(FbtError, match=match):
        model(bad)
    with pytest.raises(FbtError, match=match):
        model.run_with_cache(bad, mode="recurrent:1")


def test_generate_refuses_bad_counts(model):
    toks = tokens(1, 5)
    assert generate(model, toks, 0).shape == (1, 0)
    with pytest.raises(FbtError, match="n_new: expected an integer >= 0, got -1"):
        generate(model, toks, -1)
    with pytest.raises(FbtError, match="exceed the model's context"):
        generate(model, toks, 200)
    with pytest.raises(FbtError, match="id 130"):
        generate(model, torch.tensor([[1, 130]]), 2)
