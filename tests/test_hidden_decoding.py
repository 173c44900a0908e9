"""Hidden Decoding model: n = 1 is the base model, eq. 1 expansion, eq. 4 masks written out by hand,
attention cost linear in n, loss only at last streams, KV cache, checkpoints."""

import pytest
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hidden import (
    HiddenConfig,
    HiddenDecodingTransformer,
    attended_pairs,
    hidden_loss,
    load_hidden,
    save_checkpoint,
    split_streams,
    stream_mask,
    stream_position,
    stream_slice,
)
from fbt_probe.hooks import act_name, depth_names
from fbt_probe.training.evaluate import contraction
from tests.helpers import make_cfg, make_model, tokens


@pytest.fixture(scope="module")
def base():
    return make_model(dtype=torch.float64)  # 3 layers, window 5, layer 2 global


@pytest.mark.parametrize("cross", [None, (0,), (), (0, 1, 2)])
def test_one_stream_is_the_base_model_exactly(base, cross):
    hd = HiddenDecodingTransformer.from_base(base, n_streams=1, cross_stream_layers=cross).eval()
    x = tokens(2, 13)  # longer than the window: the sliding layers matter
    # the stream mask goes to SDPA as a mask, the base model's window as query blocks: the same
    # function through different kernels, so float64 closeness (a wrong mask differs at 1e-2)
    exact = dict(rtol=0, atol=1e-12)
    torch.testing.assert_close(hd(x), base(x, mode="standard"), **exact)
    names = depth_names(3) + [act_name("pattern", 1), act_name("z", 2), "ln_final.hook_normalized", "hook_embed"]
    _, c_base = base.run_with_cache(x, mode="standard", names_filter=names)
    _, c_hd = hd.run_with_cache(x, names_filter=names)
    for name in names:
        torch.testing.assert_close(c_base[name], c_hd[name], **exact, msg=name)


def test_expansion_is_eq1_with_contiguous_positions(base):
    """E_1 = E_2 and every layer cross-stream: the 2-stream model is the base model run on each
    token written twice (x1 x1 x2 x2 ...) at positions 0..2L-1, read at every second position."""
    cfg = make_cfg(window=None)
    torch.manual_seed(0)
    from fbt_probe.model.transformer import FeedbackTransformer

    dense = FeedbackTransformer(cfg).double().eval()
    hd = HiddenDecodingTransformer.from_base(dense, n_streams=2, cross_stream_layers=(0, 1, 2)).eval()
    x = tokens(2, 9)
    ref = dense(x.repeat_interleave(2, dim=1), mode="standard")
    torch.testing.assert_close(hd(x), ref[:, 1::2], rtol=0, atol=1e-12)
    # distinct tables: position t holds E_{s(t)}(x_{i(t)})
    with torch.no_grad():
        for k, E in enumerate(hd.embeds):
            E.weight.add_(float(k + 1))
    _, cache = hd.run_with_cache(x, names_filter=["hook_embed"])
    S = split_streams(cache["hook_embed"], 2)  # [batch, pos, n, d]
    for k in (1, 2):
        assert torch.equal(S[:, :, k - 1], hd.embeds[k - 1](x))
        assert torch.equal(cache["hook_embed"][:, stream_slice(k, 2)], hd.embeds[k - 1](x))
    assert torch.equal(cache["hook_embed"][:, stream_position(-1, 1, 2)], hd.embeds[0](x[:, -1]))
    assert torch.equal(cache["hook_embed"][:, stream_position(3, 2, 2)], hd.embeds[1](x[:, 3]))


# physical positions t = 1..6 (rows: query t, columns: key t'), written out from eq. 3-4
INTRA_N2 = [
    [1, 0, 0, 0, 0, 0],  # s = 1
    [0, 1, 0, 0, 0, 0],  # s = 2
    [1, 0, 1, 0, 0, 0],  # s = 1
    [0, 1, 0, 1, 0, 0],  # s = 2
    [1, 0, 1, 0, 1, 0],
    [0, 1, 0, 1, 0, 1],
]
INTRA_N3 = [
    [1, 0, 0, 0, 0, 0],  # s = 1, token 1
    [0, 1, 0, 0, 0, 0],  # s = 2
    [0, 0, 1, 0, 0, 0],  # s = 3
    [1, 0, 0, 1, 0, 0],  # s = 1, token 2
    [0, 1, 0, 0, 1, 0],
    [0, 0, 1, 0, 0, 1],
]
CROSS = [[1 if k <= q else 0 for k in range(6)] for q in range(6)]
CROSS_N2_WINDOW2 = [
    [1, 0, 0, 0, 0, 0],  # token 1: sees token 1 only
    [1, 1, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0],  # token 2: tokens 1-2
    [1, 1, 1, 1, 0, 0],
    [0, 0, 1, 1, 1, 0],  # token 3: tokens 2-3
    [0, 0, 1, 1, 1, 1],
]
INTRA_N2_WINDOW2 = [
    [1, 0, 0, 0, 0, 0],
    [0, 1, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 0],
    [0, 1, 0, 1, 0, 0],
    [0, 0, 1, 0, 1, 0],
    [0, 0, 0, 1, 0, 1],
]


@pytest.mark.parametrize(
    "n,cross,window,expected",
    [
        (2, False, None, INTRA_N2),
        (3, False, None, INTRA_N3),
        (2, True, None, CROSS),
        (3, True, None, CROSS),
        (2, True, 2, CROSS_N2_WINDOW2),
        (2, False, 2, INTRA_N2_WINDOW2),
    ],
)
def test_masks_match_eq4_by_hand(n, cross, window, expected):
    pos = torch.arange(6)
    assert stream_mask(pos, pos, n, cross, window).int().tolist() == expected


def test_the_model_attends_only_where_the_mask_allows():
    torch.manual_seed(0)
    cfg = HiddenConfig.from_base(make_cfg(window=None, n_layers=2), n_streams=2, cross_stream_layers=(1,))
    hd = HiddenDecodingTransformer(cfg).double().eval()
    _, cache = hd.run_with_cache(tokens(1, 3), names_filter=lambda n: n.endswith("hook_pattern"))
    for layer, expected in ((0, INTRA_N2), (1, CROSS)):
        pattern = cache[act_name("pattern", layer)][0]  # [heads, q, k]
        allowed = torch.tensor(expected, dtype=torch.bool)
        assert (pattern[:, ~allowed] == 0).all() and (pattern[:, allowed] > 0).all(), layer


def test_default_cross_layers_follow_the_base_pattern():
    assert HiddenConfig.from_base(make_cfg()).resolved_cross_stream_layers == (2,)  # the one global layer
    assert HiddenConfig.from_base(make_cfg(window=None, n_layers=4, global_every=2)).resolved_cross_stream_layers == (
        1,
        3,
    )
    with pytest.raises(FbtError, match="cross_stream_layers"):
        HiddenConfig.from_base(make_cfg(), cross_stream_layers=(3,))


@pytest.mark.parametrize("window", [None, 4])
def test_factorized_attention_cost_grows_linearly_in_n(window):
    L = 24
    cfg = make_cfg(window=window, n_layers=2, global_every=2)  # layer 0 intra-stream, layer 1 cross-stream
    counts = {
        n: attended_pairs(HiddenDecodingTransformer(HiddenConfig.from_base(cfg, n_streams=n)), L) for n in (1, 2, 4, 8)
    }
    for n, (intra, cross) in counts.items():
        assert intra == n * counts[1][0]  # O(n L^2): exactly n copies of the base layer's pairs
        assert cross > 0.8 * n * n * counts[1][1]  # a dense layer is ~n^2
    dense = attended_pairs(HiddenDecodingTransformer(HiddenConfig.from_base(cfg, 8, (0, 1))), L)
    assert counts[8][0] < 0.2 * dense[0]  # the same layer made cross-stream costs > 5x more at n = 8


def test_loss_is_taken_only_at_last_stream_positions(base):
    n = 3
    hd = HiddenDecodingTransformer.from_base(base, n_streams=n).eval()
    x, targets = tokens(2, 7), tokens(2, 7, seed=5)
    weights = torch.rand(2, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # the head on the last streams only vs on every stream, then sliced: products of different shapes
    # (bitwise equal on some CPUs only), so float64 at 1e-12; a wrong stream is off by > 1e-3
    torch.testing.assert_close(hd(x), hd.stream_logits(x)[:, n - 1 :: n], rtol=0, atol=1e-12)
    assert (hd(x) - hd.stream_logits(x)[:, n - 2 :: n]).abs().max() > 1e-3
    grads = []

    def keep(act, hook):
        act.retain_grad()
        grads.append(act)
        return act

    with hd.hooks(fwd_hooks=[("ln_final.hook_normalized", keep)]):
        loss = hidden_loss(hd, x, targets, weights)
    loss.backward()
    g = split_streams(grads[0].grad, n).abs().sum(-1)  # [batch, pos, n]
    assert (g[..., : n - 1] == 0).all() and (g[..., n - 1] > 0).all()
    logp = torch.log_softmax(hd.stream_logits(x)[:, n - 1 :: n], -1)  # eq. 2 by hand
    ref = -(logp.gather(-1, targets[..., None])[..., 0] * weights).sum() / weights.sum()
    torch.testing.assert_close(loss, ref)
    from fbt_probe.training import multipass_loss

    total, parts = multipass_loss(hd, x, targets, weights, K=1)
    assert torch.equal(total, loss) and len(parts) == 1


def test_kv_cache_keeps_every_stream_and_matches_the_full_pass(base):
    hd = HiddenDecodingTransformer.from_base(base, n_streams=3).eval()
    x = tokens(2, 12)
    cache, logits = hd.prefill_cache(x[:, :5])
    assert cache.length == 15 and cache.keys[0].shape[2] == 15  # [batch, n_kv_heads, capacity, d_head]
    steps = [hd.step(x[:, t], cache) for t in range(5, 12)]
    assert cache.length == 36
    torch.testing.assert_close(torch.cat([logits, torch.stack(steps, 1)], 1), hd(x), rtol=0, atol=1e-6)
    assert hd.generate(x[:, :4], 3).shape == (2, 7)


def test_no_feedback_modes(base):
    hd = HiddenDecodingTransformer.from_base(base, n_streams=2)
    with pytest.raises(FbtError, match="no feedback modes"):
        hd(tokens(1, 4), mode="recurrent:1")
    with pytest.raises(FbtError, match="no feedback passes"):
        hd.jacobi_passes(tokens(1, 4), 2)
    x = tokens(2, 6)
    with pytest.raises(FbtError, match="no feedback passes"):  # every walk of passes (the contraction diagnostic)
        contraction(hd, x, x, torch.ones(2, 6), n_passes=3)


def test_checkpoint_round_trip(base, tmp_path):
    from fbt_probe.formats.checkpoint import load_checkpoint

    hd = HiddenDecodingTransformer.from_base(base, n_streams=2, cross_stream_layers=(0,)).float()
    save_checkpoint(hd, tmp_path)
    again = load_hidden(tmp_path)
    assert again.cfg == hd.cfg and again.cfg.cross_stream_layers == (0,)
    assert all(torch.equal(a, b) for a, b in zip(hd.state_dict().values(), again.state_dict().values()))
    with pytest.raises(FbtError, match="unknown model config field"):
        load_checkpoint(tmp_path)  # a plain loader refuses it with a one-line error
