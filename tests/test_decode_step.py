"""The lean silent serial step (`fbt_probe.engine.step`) computes the module path's step.

Oracle: the same step through the modules (`hk=hooked` with nothing attached runs the module path
without changing its arithmetic), itself tested against Hugging Face Qwen3 (test_hf.py) and the
explicit reference (test_attention.py). float64: the two differ only in summation order (~1e-15);
a wrong rotation row, KV head, window edge, gain or residual moves logits at order 1e-2.
"""

import pytest
import torch

from fbt_probe.engine import dispatch, walk
from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.dispatch import use_path
from fbt_probe.engine.hooks import hooked
from tests.helpers import STEP_CONFIGS, make_model, make_nanochat, serial_scan, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-12
CONFIGS = STEP_CONFIGS


def _scan(model, x, n_serial, lean: bool):
    """The serial scan's outputs with the lean step (hooks off) or through the modules (hooks on, none attached)."""
    cache, carried, logits, last = serial_scan(model, x, n_serial, hooks=not lean)
    return cache, carried, logits, last


@pytest.mark.parametrize("name", CONFIGS)
@torch.no_grad()
def test_serial_scan_lean_equals_module_path(name):
    model = make_model(**CONFIGS[name])
    assert walk.decode_plan(model) is not None
    x = tokens(3, 17)
    for n_serial in (1, 5, 16):  # recurrent:1, recurrent:5, full
        lean, ref = _scan(model, x, n_serial, True), _scan(model, x, n_serial, False)
        for a, b in zip(lean[1:], ref[1:]):
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
        for layer in range(model.cfg.n_layers):  # the cache it leaves behind (prefix reuse forks it)
            assert lean[0].lengths[layer] == ref[0].lengths[layer] == 17
            torch.testing.assert_close(lean[0].keys[layer][:, :, :17], ref[0].keys[layer][:, :, :17], rtol=0, atol=ATOL)
            torch.testing.assert_close(
                lean[0].values[layer][:, :, :17], ref[0].values[layer][:, :, :17], rtol=0, atol=ATOL
            )


@torch.no_grad()
def test_full_mode_logits_equal_the_serial_hooked_run_and_the_T_pass_jacobi():
    model = make_model()
    x = tokens(2, 12)
    full = model(x, mode="full")  # carried states from the lean scan
    torch.testing.assert_close(full, model(x, mode="full", serial=True), rtol=0, atol=ATOL)  # module path throughout
    torch.testing.assert_close(full, model(x, mode="jacobi:12"), rtol=0, atol=ATOL)  # no serial step at all


@torch.no_grad()
def test_step_plain_and_fed_and_through_a_growing_cache():
    model = make_model(window=None)
    x = tokens(2, 9)
    for fed in (False, True):
        caches = [model.prefill_cache(x[:, :4], capacity=5)[0] for _ in range(2)]  # capacity 5: the 2nd step grows it
        state = torch.randn(2, model.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        states = [state if fed else None] * 2
        for t in range(4, 9):
            lean = model.step(x[:, t], caches[0], states[0])
            ref = model.step(x[:, t], caches[1], states[1], hk=hooked)
            torch.testing.assert_close(lean[0], ref[0], rtol=0, atol=ATOL)
            torch.testing.assert_close(lean[1], ref[1], rtol=0, atol=ATOL)
            states = [lean[1], ref[1]] if fed else states
        assert caches[0].length == caches[1].length == 9


@torch.no_grad()
def test_the_plan_reads_the_weights_of_its_build_time_and_a_new_plan_sees_edits():
    model = make_model()
    x = tokens(1, 6)
    before = model(x, mode="full")
    model.blocks[0].attn.v_proj.weight.mul_(
        1.5
    )  # in place (q, k would be normed away): the fused-weight cache must notice
    after = model(x, mode="full")
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, model(x, mode="full", serial=True), rtol=0, atol=ATOL)


def test_module_path_wherever_the_plan_does_not_apply():
    model = make_model()
    with torch.enable_grad():
        assert walk.decode_plan(model) is None  # autograd through the steps (attribution patching)
    with torch.no_grad():
        with use_path(model, "explicit"):
            assert walk.decode_plan(model) is None  # the reference arithmetic was asked for
        assert dispatch.step(make_nanochat(smear=True)) == "module"  # a family with backbone extras
        assert dispatch.step(make_nanochat()) == "module"  # even at identity values: the plan is the paper's model
        assert dispatch.step(make_model().to(torch.bfloat16)) == "module"  # half types keep the module's casts
        noisy = make_model(feedback_noise=0.1).train()
        assert dispatch.step(noisy) == "module"  # fresh noise on every carried state
        assert dispatch.step(noisy.eval()) == "plan"


@torch.no_grad()
def test_a_cache_from_tensors_is_never_written_by_the_lean_step():
    model = make_model(window=None)
    x = tokens(2, 7)
    cache, state, _ = model.prefill_cache(x[:, :6])
    keys = [k[:, :, :6].clone() for k in cache.keys]
    values = [v[:, :, :6].clone() for v in cache.values]
    given = KVCache.from_tensors(keys, values)
    kept = [k.clone() for k in keys]
    lean = model.step(x[:, 6], given, state[:, -1])
    ref = model.step(x[:, 6], cache, state[:, -1], hk=hooked)
    torch.testing.assert_close(lean[0], ref[0], rtol=0, atol=ATOL)
    assert all(torch.equal(a, b) for a, b in zip(keys, kept))
