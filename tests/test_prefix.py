"""Prefix reuse (fbt_probe.engine.prefix): a run of positions >= start from a cached silent prefix
equals the full run, under every mode and both hook rules, with and without edits (float64)."""

import pytest
import torch

from fbt_probe.engine import walk
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.interventions.edits import capture, set_at
from fbt_probe.modes import parse_mode
from tests.helpers import make_model, tokens

T = 12
MODES = [
    "standard",
    "recurrent:1",
    "recurrent:3",
    "full",
    "jacobi:1",
    "jacobi:2",
    "jacobi:3",
    "jacobi:40",
]  # 40 > T: capped at T passes
# float64 with a window (5) shorter than T: prefix and full run differ only by rounding (~1e-16); a
# wrong cache slot, carried state or pass index moves the logits at order 1e-2
TOL = dict(rtol=0, atol=1e-12)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def toks():
    return tokens(3, T)


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("mode", MODES)
@torch.no_grad()
def test_every_start_equals_the_full_run(model, toks, mode, serial):
    full = model(toks, mode=mode, serial=serial)
    for upto in (0, 5, T - 1):
        pre = build_prefix(model, toks, parse_mode(mode), upto, serial)
        for start in (upto, 0, upto // 2, upto):  # down and up again: the prefix is restored in between
            torch.testing.assert_close(pre.run(start), full[:, start:], **TOL)


@pytest.mark.parametrize(
    "mode,serial",
    [
        ("recurrent:3", True),
        ("recurrent:3", False),
        ("full", True),
        ("jacobi:3", True),
        ("jacobi:3", False),
        ("standard", False),
    ],
)
@torch.no_grad()
def test_an_edit_at_or_after_start_equals_the_edited_full_run(model, toks, mode, serial):
    """Serial edits ripple forward through the carried state; one-pass edits do not: either way the
    prefix run reproduces the full run with the same hook."""
    name, pos = "blocks.1.hook_resid_post", 8
    bump = set_at(torch.full((3, model.cfg.d_model), 0.5, dtype=torch.float64), pos, model)
    full = model.run_with_hooks(toks, mode=mode, serial=serial, fwd_hooks=[(name, bump)])
    assert not torch.allclose(full[:, -1], model(toks, mode=mode, serial=serial)[:, -1])  # the edit matters
    pre = build_prefix(model, toks, parse_mode(mode), serial=serial)
    for start in (pos, 3):
        torch.testing.assert_close(pre.run(start, fwd_hooks=[(name, bump)]), full[:, start:], **TOL)
    assert not model.hook_dict[name].fwd_hooks and model.hook_context is None


@torch.no_grad()
def test_hooks_fire_in_the_full_runs_chunks_cut_at_start(model, toks):
    seen = []

    def record(x, hook):
        ctx = model.hook_context
        seen.append((ctx.phase, ctx.positions.start, ctx.positions.stop, ctx.pass_index, x.shape[1]))

    hook = [("blocks.0.hook_resid_post", record)]
    build_prefix(model, toks, parse_mode("recurrent:3"), serial=True).run(6, hook)
    assert seen == [("prefix", 6, 9, 1, 3), ("step", 9, 10, 1, 1), ("step", 10, 11, 1, 1), ("step", 11, 12, 1, 1)]
    seen.clear()
    build_prefix(model, toks, parse_mode("jacobi:2"), serial=True).run(10, hook)
    assert seen == [("pass", 10, 12, 1, 2), ("pass", 10, 12, 2, 2)]
    seen.clear()
    build_prefix(model, toks, parse_mode("jacobi:3")).run(None, hook)
    assert seen == [("final", 11, 12, 3, 1)]


@torch.no_grad()
def test_captured_final_activations_equal_the_full_runs(model, toks):
    names = ["fusion.hook_feedback", "fusion.hook_out", "blocks.2.hook_resid_post"]
    a, b = {}, {}
    model.run_with_hooks(toks, mode="full", fwd_hooks=[(n, capture(a, n, model, T - 1)) for n in names])
    build_prefix(model, toks, parse_mode("full")).run(fwd_hooks=[(n, capture(b, n, model, T - 1)) for n in names])
    for n in names:
        torch.testing.assert_close(b[n], a[n], **TOL)


@torch.no_grad()
def test_select_repeat_and_views(model, toks):
    pre = build_prefix(model, toks, parse_mode("recurrent:1"))
    rows = torch.tensor([2, 0, 1])
    torch.testing.assert_close(pre.select(rows).run(), model(toks[rows], mode="recurrent:1")[:, -1:], **TOL)
    torch.testing.assert_close(pre.repeat(2).run(), model(toks.repeat(2, 1), mode="recurrent:1")[:, -1:], **TOL)
    torch.testing.assert_close(pre.serial_view().run(), model(toks, mode="recurrent:1", serial=True)[:, -1:], **TOL)
    torch.testing.assert_close(pre.standard_view().run(), model(toks)[:, -1:], **TOL)
    with pytest.raises(ValueError, match="not standard"):
        build_prefix(model, toks, parse_mode("full")).standard_view()
    with pytest.raises(ValueError, match="serves starts"):
        pre.run(T)


@torch.no_grad()
def test_silent_passes_through_the_cache_run_in_chunks_with_the_same_result(model, toks, monkeypatch):
    """Long silent prefills are cut into chunks (memory); a chunk attends to the cache before it,
    across the sliding window (5) and the global layer."""
    ref = {m: model(toks, mode=m) for m in ("standard", "recurrent:1", "recurrent:3", "full")}
    pre = build_prefix(model, toks, parse_mode("recurrent:1"))
    monkeypatch.setattr(walk, "SILENT_CHUNK_TOKENS", 3 * 4)  # 4 positions per chunk at batch 3
    cache, _, logits = model.prefill_cache(toks)
    torch.testing.assert_close(logits, ref["standard"], **TOL)
    for mode, want in ref.items():
        torch.testing.assert_close(model(toks, mode=mode), want, **TOL)
    chunked = build_prefix(model, toks, parse_mode("recurrent:1"))
    for a, b in zip(chunked.caches[0].keys, pre.caches[0].keys):
        torch.testing.assert_close(a[:, :, : T - 1], b[:, :, : T - 1], **TOL)
    torch.testing.assert_close(chunked.run(), ref["recurrent:1"][:, -1:], **TOL)
