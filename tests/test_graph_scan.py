"""The serial scan over static buffers at a device-side position (`fbt_probe.engine.graph_scan`,
what a CUDA graph captures) computes the lean step's scan.

Oracle: the serial scan (walked) through the lean step (`DecodePlan` over a `KVCache`), itself tested equal to
the module path (test_decode_step.py). On CPU the same body runs eagerly; float64: the two differ in
summation order only (the masked attention sums over the whole capacity, masked weights exactly 0),
~1e-15, while a wrong window edge, rotation row or cache slot moves logits at order 1e-2.
The `gpu` tests check the captured graph against the same body run eagerly on CUDA.
"""

import pytest
import torch

from fbt_probe.engine import dispatch, graph_scan, walk
from fbt_probe.engine.graph_scan import GraphedScan
from tests.helpers import STEP_CONFIGS, make_model, serial_scan, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL = 1e-12
CONFIGS = STEP_CONFIGS


@pytest.fixture
def on_cpu(monkeypatch):
    """The serial scan takes the static-buffer path on CPU too (run eagerly); records each use."""
    used = []

    def scan(has_plan, cuda_graphs, cache, tokens, start, n):
        if not (has_plan and cuda_graphs):
            return "eager"
        ok = n >= dispatch.MIN_STEPS and dispatch.buffers_ready(cache, start, n)
        used.append(ok)
        return "graphed" if ok else "eager"

    monkeypatch.setattr(dispatch, "scan", scan)
    return used


@pytest.mark.parametrize("name", CONFIGS)
@torch.no_grad()
def test_static_buffer_scan_equals_the_lean_scan(name, on_cpu, monkeypatch):
    model = make_model(**CONFIGS[name])
    x = tokens(3, 19)
    # full, full up to T-1 (carried_states), recurrent:10, recurrent:9 stopped early (8 steps)
    for n_serial, stop in ((18, None), (18, 18), (10, None), (9, 18)):
        model.cuda_graphs = False
        ref = serial_scan(model, x, n_serial, stop=stop)
        model.cuda_graphs = True
        on_cpu.clear()
        got = serial_scan(model, x, n_serial, stop=stop)
        assert on_cpu == [True]  # the static-buffer path ran
        for a, b in zip(got[1:], ref[1:]):
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
        end = stop or 19
        for layer in range(model.cfg.n_layers):  # the cache it leaves behind (prefix reuse forks it)
            assert got[0].lengths[layer] == end
            torch.testing.assert_close(
                got[0].keys[layer][:, :, :end], ref[0].keys[layer][:, :, :end], rtol=0, atol=ATOL
            )
            torch.testing.assert_close(
                got[0].values[layer][:, :, :end], ref[0].values[layer][:, :, :end], rtol=0, atol=ATOL
            )


@torch.no_grad()
def test_width_buckets_cover_every_position_once_and_equal_the_lean_scan(on_cpu, monkeypatch):
    monkeypatch.setattr(graph_scan, "MIN_WIDTH", 4)  # buckets 4, 8, 16, 32, 37 over T = 37
    model = make_model()
    x = tokens(2, 37)
    model.cuda_graphs = False
    ref = serial_scan(model, x, 30)
    model.cuda_graphs = True
    got = serial_scan(model, x, 30)  # positions 7..36
    assert on_cpu == [True]
    for a, b in zip(got[1:], ref[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
    cache = model.prefill_cache(x[:, :7], capacity=37)[0]
    scan = GraphedScan(walk.decode_plan(model), cache, x, None, None, torch.zeros(2, 32), 7)
    assert scan.widths(30) == [(8, 1), (16, 8), (32, 16), (37, 5)]
    assert scan.widths(9) == [(8, 1), (16, 8)]


@torch.no_grad()
def test_full_mode_through_the_static_buffers_equals_jacobi_T(on_cpu):
    model = make_model()
    x = tokens(2, 12)
    full = model(x, mode="full")
    assert on_cpu == [True]
    torch.testing.assert_close(full, model(x, mode="jacobi:12"), rtol=0, atol=ATOL)  # no serial step at all


@torch.no_grad()
def test_short_scans_and_cpu_tensors_keep_the_lean_loop():
    model = make_model()
    cache = model.prefill_cache(tokens(1, 4), capacity=12)[0]
    x = tokens(1, 12)
    assert dispatch.scan(True, True, cache, x, 4, 8) == "eager"  # CPU tensors
    assert not dispatch.buffers_ready(cache, 4, 9)  # no room
    assert not dispatch.buffers_ready(cache, 3, 4)  # the cache holds more than the start
    assert dispatch.buffers_ready(cache, 4, 8)


def _cuda_model(**kw):
    return make_model(dtype=torch.float32, **kw).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("name", CONFIGS)
@torch.no_grad()
def test_cuda_graph_replays_equal_the_eager_scan_on_the_gpu(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = _cuda_model(**CONFIGS[name])
    x = tokens(3, 40).cuda()
    model.cuda_graphs = False
    ref = serial_scan(model, x, 39)  # the lean loop over the KVCache on the GPU
    model.cuda_graphs = True
    got = serial_scan(model, x, 39)  # captured graph (with the Triton epilogue where it runs)
    for a, b in zip(got[1:], ref[1:]):  # float32, 39 serial steps: rounding only
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    cpu = make_model(**CONFIGS[name])  # the float64 CPU model with the same weights (same seed)
    want = serial_scan(cpu, x.cpu(), 39)
    torch.testing.assert_close(got[2].double().cpu(), want[2], rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@torch.no_grad()
def test_graph_and_eager_body_are_the_same_kernels(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    monkeypatch.setattr(graph_scan, "MIN_WIDTH", 8)  # several graphs: widths 8, 16, 30
    model = _cuda_model()
    x = tokens(2, 30).cuda()
    outs = []
    for graph in (False, True):
        cache, state, logits = model.prefill_cache(x[:, :4], capacity=30)
        carried = state.new_zeros(2, 30, model.cfg.d_model)
        out = logits.new_zeros(2, 30, logits.shape[-1])
        scan = GraphedScan(walk.decode_plan(model), cache, x, carried, out, state[:, -1], 4)
        last = scan.run(26, graph=graph)
        outs.append((carried, out, last))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
