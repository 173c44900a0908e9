"""The idiom suite: what a TransformerLens user writes first, on every mode, each number checked
against an independent computation (docs/modes.md, "Hooks under feedback").

- gradients: a plain backward hook (and `run_with_cache(incl_bwd=True)`) gives d metric / d
  activation through the carried state, checked against autograd through the serial run and
  against finite differences of the serial run;
- activation patching: TransformerLens's `patching` functions inside `model.mode(m)` give the
  serial run's patch (residual and per-head), computed here by hand with `serial=True`;
- padding: left- and right-padded batches equal their rows run alone;
- the final norm: the direct-logit-attribution and logit-lens idioms give the logits;
- the smaller idioms (zero biases, loss_fn, start_at_layer, unembed, token helpers, stop_at_eos).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from transformer_lens import patching

from fbt_probe.errors import FbtError
from fbt_probe.loading import load_model
from tests.helpers import make_model, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
FEEDBACK = ["recurrent:1", "recurrent:3", "full", "jacobi:2"]
T = 8


@pytest.fixture(scope="module")
def model():
    return make_model()  # float64, 3 layers


@pytest.fixture(scope="module")
def ref():
    return load_model("ref:tiny-feedback").double().eval()


def metric(logits):
    return (logits[:, -1, 3] - logits[:, -1, 4]).sum()


def serial_gradient(model, toks, mode, name):
    """The oracle: a zero leaf added to `name` in each chunk of the serial run, its gradient."""
    leaf = None

    def add(x, hook):
        nonlocal leaf
        ctx = model.hook_context
        if leaf is None:
            shape = (x.shape[0], toks.shape[1], *x.shape[2:])
            leaf = x.new_zeros(shape, requires_grad=True)
        if ctx.phase == "pass":  # Jacobi: the same leaf in every pass
            return x + leaf
        return x + leaf[:, ctx.positions.start : ctx.positions.stop]

    metric(model.run_with_hooks(toks, mode=mode, serial=True, fwd_hooks=[(name, add)])).backward()
    return leaf.grad


@pytest.mark.parametrize("name", ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"])
@pytest.mark.parametrize("mode", FEEDBACK)
def test_a_backward_hook_gets_the_serial_gradient(model, mode, name):
    toks = tokens(2, T)
    grads, contexts = [], []

    def grab(g, hook):
        grads.append(g.detach().clone())
        contexts.append(model.hook_context)

    with model.hooks(bwd_hooks=[(name, grab)]):
        metric(model(toks, mode=mode)).backward()
    assert len(grads) == 1  # once per backward, as in TransformerLens
    assert contexts[0].phase == "backward" and contexts[0].positions == range(T) and model.hook_context is None
    want = serial_gradient(model, toks, mode, name)
    got = grads[0]
    assert got.shape == want.shape
    cos = F.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.999999
    assert (got - want).norm() / want.norm() < 1e-10
    # the one hooked pass alone (serial=False) misses the path through the carried state
    held = []

    def keep(x, hook):
        x.retain_grad()
        held.append(x)
        return x

    metric(model.run_with_hooks(toks, mode=mode, serial=False, fwd_hooks=[(name, keep)])).backward()
    assert (held[0].grad - want).abs().max() > 1e-3 * want.abs().max()


@pytest.mark.parametrize("mode", ["recurrent:1", "full"])
def test_the_gradient_matches_finite_differences_of_the_serial_run(model, mode):
    toks, name, p = tokens(1, T), "blocks.0.hook_resid_post", T - 2
    grads = []
    with model.hooks(bwd_hooks=[(name, lambda g, hook: grads.append(g))]):
        metric(model(toks, mode=mode)).backward()
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def shifted(eps):
        def add(x, hook):
            ctx = model.hook_context
            if p in ctx.positions:
                x = x.clone()
                x[:, p - ctx.positions.start] += eps * direction
            return x

        with torch.no_grad():
            return metric(model.run_with_hooks(toks, mode=mode, serial=True, fwd_hooks=[(name, add)]))

    eps = 1e-5
    fd = (shifted(eps) - shifted(-eps)) / (2 * eps)
    assert abs(fd) > 1e-4
    assert abs(float(grads[0][0, p] @ direction) - float(fd)) / abs(float(fd)) < 1e-6


def test_run_with_cache_incl_bwd_holds_the_serial_gradient(model):
    toks, mode, name = tokens(2, T), "recurrent:3", "blocks.1.hook_resid_mid"
    _, cache = model.run_with_cache(toks, mode=mode, return_type="loss", incl_bwd=True)
    leaf = None

    def add(x, hook):
        nonlocal leaf
        ctx = model.hook_context
        if leaf is None:
            leaf = x.new_zeros((x.shape[0], T, x.shape[-1]), requires_grad=True)
        return x + leaf[:, ctx.positions.start : ctx.positions.stop]

    model.run_with_hooks(toks, mode=mode, serial=True, return_type="loss", fwd_hooks=[(name, add)]).backward()
    torch.testing.assert_close(cache[name + "_grad"], leaf.grad, rtol=0, atol=1e-12)
    assert leaf.grad[:, : T - 3].abs().max() > 1e-8


def test_backward_hooks_under_the_one_pass_rule_are_refused(model):
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: None)]):
        with pytest.raises(FbtError, match="misses the path through the carried state"):
            model(tokens(1, T), mode="recurrent:1", serial=False)
        model(tokens(1, T), mode="standard", serial=False)  # nothing carried: exact


def test_a_backward_hook_that_edits_the_gradient_is_refused(model):
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: 2 * g)]):
        with pytest.raises(FbtError, match="returned a gradient"):
            metric(model(tokens(1, T), mode="recurrent:1")).backward()


def hand_serial_patch(model, corrupt, cache, mode, name, index):
    """The serial run of `corrupt` with the clean value written at `index` (position, [head])."""

    def patch(x, hook):
        ctx = model.hook_context
        p = index[0]
        if p in ctx.positions:
            x = x.clone()
            at = (slice(None), p - ctx.positions.start) + tuple(index[1:])
            x[at] = cache[name][(slice(None), p) + tuple(index[1:])]
        return x

    with torch.no_grad():
        return model.run_with_hooks(corrupt, mode=mode, serial=True, fwd_hooks=[(name, patch)])


@pytest.mark.parametrize("mode", ["recurrent:1", "full", "jacobi:2"])
def test_transformer_lens_head_patching_gives_the_serial_patch(model, mode):
    """Under jacobi:K the cache holds the last pass, and the patch writes it in every pass (the
    rule's definition for Jacobi: the same edit in each of its K passes)."""
    clean, corrupt = tokens(2, 6, seed=1), tokens(2, 6, seed=2)
    corrupt[:, -1] = clean[:, -1]
    with torch.no_grad(), model.mode(mode):
        _, cache = model.run_with_cache(clean)
        tl = patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, lambda lg: metric(lg) / 2)
    L, P, H = model.cfg.n_layers, 6, model.cfg.n_heads
    assert tl.shape == (L, P, H)
    for l, p, h in [(0, 4, 1), (1, 2, 3), (2, 4, 0), (0, 5, 2)]:
        want = metric(hand_serial_patch(model, corrupt, cache, mode, f"blocks.{l}.attn.hook_z", (p, h))) / 2
        torch.testing.assert_close(tl[l, p, h].double(), want, rtol=1e-6, atol=1e-6)
    one_pass = metric(model.run_with_hooks(corrupt, mode=mode, serial=False)) / 2
    assert (tl[:, : P - 1] - one_pass).abs().max() > 1e-4  # positions before the last matter through the state


def test_a_cache_of_another_mode_is_warned_once_by_name(model):
    clean, corrupt = tokens(1, 5, seed=1), tokens(1, 5, seed=2)
    _, cache = model.run_with_cache(clean, mode="recurrent:1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        patching.get_act_patch_resid_pre(model, corrupt, cache, metric)  # runs under the default, standard
    ours = [w for w in seen if "read from a cache made under 'recurrent:1'" in str(w.message)]
    assert len(ours) == 1 and "blocks.0.hook_resid_pre" in str(ours[0].message)
    with warnings.catch_warnings(record=True) as seen, model.mode("recurrent:1"):
        warnings.simplefilter("always")
        patching.get_act_patch_resid_pre(model, corrupt, cache, metric)
    assert not [w for w in seen if "read from a cache" in str(w.message)]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full", "jacobi:2"])
def test_padded_batches_equal_their_rows_alone(ref, mode, side):
    words = [ref.tokenizer.id_to_token(i) for i in range(10, 22)]
    short, long = " ".join(words[:4]), " ".join(words[:9])
    toks = ref.to_tokens([short, long], padding_side=side)
    assert toks.shape == (2, 9)
    with torch.no_grad():
        batch = ref(toks, mode=mode)
        a, b = ref(ref.to_tokens(short), mode=mode)[0], ref(ref.to_tokens(long), mode=mode)[0]
        rows = batch[0, :4] if side == "right" else batch[0, -4:]
        torch.testing.assert_close(rows, a, rtol=0, atol=1e-10)
        torch.testing.assert_close(batch[1], b, rtol=0, atol=1e-10)
        text = ref([short, long], mode=mode, padding_side=side)
        torch.testing.assert_close(text, batch, rtol=0, atol=0)
        loss = ref(toks, mode=mode, return_type="loss", loss_per_token=True)
        alone = ref(ref.to_tokens(short), mode=mode, return_type="loss", loss_per_token=True)[0]
        torch.testing.assert_close(loss[0, :3] if side == "right" else loss[0, -3:], alone, rtol=0, atol=1e-10)


def test_an_explicit_attention_mask_and_its_refusals(model):
    toks = tokens(2, T)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        got = model(toks, mode="recurrent:1", attention_mask=mask)
        torch.testing.assert_close(got[0, 3:], model(toks[:1, 3:], mode="recurrent:1")[0], rtol=0, atol=1e-10)
        assert torch.count_nonzero(got[0, :3]) == 0
        with pytest.raises(FbtError, match="padded batch with a hook on blocks.0.hook_resid_pre"):
            model.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x)])
        hole = torch.ones(2, T, dtype=torch.long)
        hole[0, 4] = 0
        with pytest.raises(FbtError, match="one run at the left or the right edge"):
            model(toks, attention_mask=hole)


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full"])
def test_direct_logit_attribution_gives_the_logit_difference(ref, mode):
    words = [ref.tokenizer.id_to_token(i) for i in range(10, 22)]
    toks = ref.to_tokens(" ".join(words[:7]))
    A, B = 5, 6
    with torch.no_grad():
        logits, cache = ref.run_with_cache(toks, mode=mode)
        direction = ref.tokens_to_residual_directions(torch.tensor([A])) - ref.tokens_to_residual_directions(
            torch.tensor([B])
        )
        diff = logits[0, -1, A] - logits[0, -1, B]
        final = cache.accumulated_resid(layer=-1, apply_ln=True, pos_slice=-1)[-1]
        torch.testing.assert_close((final @ direction[0])[0], diff, rtol=0, atol=1e-10)
        parts = cache.decompose_resid(apply_ln=True, pos_slice=-1)
        torch.testing.assert_close((parts @ direction[0]).sum(0)[0], diff, rtol=0, atol=1e-10)
        normalized = cache["ln_final.hook_normalized"]  # before the gain, as TransformerLens's
        torch.testing.assert_close(ref.unembed(normalized), logits, rtol=0, atol=1e-10)
        rms = normalized.pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-5)
        lens = ref.unembed(cache.accumulated_resid(apply_ln=True, pos_slice=-1))  # the logit lens
        torch.testing.assert_close(lens[-1], logits[:, -1], rtol=0, atol=1e-10)
        tl_lens = cache.logit_lens(positions=None)  # TransformerLens's own logit-lens tool
        torch.testing.assert_close(tl_lens.values[-1], logits, rtol=0, atol=1e-10)
        torch.testing.assert_close(tl_lens.values[:, :, -1], lens, rtol=0, atol=1e-10)


def test_zero_biases_loss_fn_start_at_layer_and_unembed(model):
    cfg = model.cfg
    assert model.b_Q.shape == model.b_K.shape == model.b_V.shape == (cfg.n_layers, cfg.n_heads, cfg.d_head)
    assert model.b_O.shape == model.b_out.shape == (cfg.n_layers, cfg.d_model)
    assert model.b_in.shape == (cfg.n_layers, cfg.d_mlp)
    assert not any(b.any() for b in (model.b_Q, model.b_O, model.b_in))
    toks = tokens(2, T)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
        want = F.cross_entropy(logits[:, :-1].flatten(0, 1), toks[:, 1:].flatten(), reduction="none").view(2, -1)
        torch.testing.assert_close(model.loss_fn(logits, toks, per_token=True), want, rtol=0, atol=1e-12)
        torch.testing.assert_close(model.loss_fn(logits, toks), want.mean(), rtol=0, atol=1e-12)
        torch.testing.assert_close(model(toks, return_type="loss", loss_per_token=True), want, rtol=0, atol=1e-12)
        started = model(cache["blocks.1.hook_resid_pre"], start_at_layer=1)
        torch.testing.assert_close(started, logits, rtol=0, atol=1e-12)
        mid = model(cache["blocks.0.hook_resid_pre"], start_at_layer=0, stop_at_layer=2)
        torch.testing.assert_close(mid, cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)
        with pytest.raises(FbtError, match="start_at_layer under 'recurrent:1'"):
            model(cache["blocks.1.hook_resid_pre"], mode="recurrent:1", start_at_layer=1)


def test_token_helpers_and_stop_at_eos(ref):
    text = " ".join(ref.tokenizer.id_to_token(i) for i in (12, 15, 12, 18))
    assert ref.to_single_str_token(15) == ref.tokenizer.id_to_token(15)
    assert ref.to_single_str_token(torch.tensor(15)) == ref.tokenizer.id_to_token(15)
    word = ref.tokenizer.id_to_token(12)
    assert ref.get_token_position(word, text) == 0
    assert ref.get_token_position(word, text, mode="last") == 2
    assert ref.get_token_position(18, ref.to_tokens(text)) == 3
    with pytest.raises(FbtError, match="not in the input"):
        ref.get_token_position(19, text)
    ids = ref.to_tokens(text)
    free = ref.generate(ids, max_new_tokens=4)
    eos = int(free[0, -3])  # treat the second new token as the EOS
    stopped = ref.generate(ids, max_new_tokens=4, stop_at_eos=True, eos_token_id=eos)
    first = int((free[0, 4:] == eos).nonzero()[0])
    assert torch.equal(stopped[0], free[0, : 4 + first + 1])
    with pytest.raises(FbtError, match="no EOS token"):
        ref.generate(ids, max_new_tokens=2, stop_at_eos=True)


@pytest.mark.parametrize("mode", ["standard", "recurrent:1"])
def test_the_transformer_lens_hook_points_mean_what_they_mean_there(model, mode):
    toks = tokens(2, T)
    l, eps = 1, model.cfg.rms_eps
    with torch.no_grad():
        logits, c = model.run_with_cache(toks, mode=mode)
        for ln, src in (("ln1", "hook_resid_pre"), ("ln2", "hook_resid_mid")):
            x = c[f"blocks.{l}.{src}"]
            want = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()  # before the gain
            torch.testing.assert_close(c[f"blocks.{l}.{ln}.hook_normalized"], want, rtol=0, atol=1e-12)
        attn = model.blocks[l].attn
        rep = model.cfg.n_heads // model.cfg.n_key_value_heads
        q, k = c[f"blocks.{l}.attn.hook_rot_q"], c[f"blocks.{l}.attn.hook_rot_k"].repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * model.cfg.d_head**-0.5
        scores = scores.masked_fill(~attn.mask(torch.arange(T), torch.arange(T)), float("-inf"))
        torch.testing.assert_close(c[f"blocks.{l}.attn.hook_attn_scores"], scores, rtol=0, atol=1e-12)
        torch.testing.assert_close(c[f"blocks.{l}.attn.hook_pattern"], scores.softmax(-1), rtol=0, atol=1e-12)
        result = c[f"blocks.{l}.attn.hook_result"]
        torch.testing.assert_close(
            result[:, :, 2], c[f"blocks.{l}.attn.hook_z"][:, :, 2] @ attn.W_O[2], rtol=0, atol=1e-12
        )
        torch.testing.assert_close(result.sum(2), c[f"blocks.{l}.hook_attn_out"], rtol=0, atol=1e-12)
        torch.testing.assert_close(c[f"blocks.{l}.hook_mlp_in"], c[f"blocks.{l}.hook_resid_mid"], rtol=0, atol=0)
        # an edit of hook_mlp_in moves the MLP branch's input only, not the residual it is added to
        bump = torch.zeros(model.cfg.d_model, dtype=torch.float64)
        bump[3] = 1.0
        _, e = model.run_with_cache(toks, mode=mode, serial=False)
        with model.hooks(fwd_hooks=[(f"blocks.{l}.hook_mlp_in", lambda x, hook: x + bump)]):
            _, edited = model.run_with_cache(toks, mode=mode, serial=False, names_filter=f"blocks.{l}.hook_resid_post")
        blk = model.blocks[l]
        want = e[f"blocks.{l}.hook_resid_mid"] + blk.mlp(
            blk.ln2(e[f"blocks.{l}.hook_resid_mid"] + bump), lambda hp, v: v
        )
        torch.testing.assert_close(edited[f"blocks.{l}.hook_resid_post"], want, rtol=0, atol=1e-12)


def test_unknown_hook_names_name_the_alternative(model):
    with pytest.raises(FbtError, match=r"blocks.0.attn.hook_q_input'.*use blocks.0.ln1.hook_normalized"):
        model.run_with_hooks(tokens(1, 4), fwd_hooks=[("blocks.0.attn.hook_q_input", lambda x, hook: x)])
    with pytest.raises(KeyError):  # still a KeyError, as TransformerLens's lookups raise
        model.hook_dict["blocks.0.hook_attn_in"]


def test_serial_cache_returns_the_loss_and_the_config_fields(model):
    toks = tokens(2, T)
    with torch.no_grad():
        loss, cache = model.run_with_cache(toks, mode="recurrent:3", serial=True, return_type="loss")
        torch.testing.assert_close(loss, model(toks, mode="recurrent:3", return_type="loss"), rtol=0, atol=1e-12)
    assert cache["blocks.0.hook_resid_pre"].shape[:2] == (2, T)
    assert model.cfg.original_architecture == "FeedbackTransformer"
    assert model.cfg.model_name == f"fbt-{model.cfg.n_layers}L-{model.cfg.d_model}d"


def test_nnsight_clean_and_corrupted_invokes_in_one_trace(model):
    """nnsight's clean -> corrupted pattern: two invokes batched in one trace equal separate runs
    (a clean value written into the corrupted run's analysed pass: the one-pass rule)."""
    from fbt_probe.surface.nnsight_model import traceable

    clean, corrupt = tokens(2, 10, seed=1), tokens(2, 10, seed=2)
    nn_model = traceable(model)
    with torch.no_grad(), nn_model.trace(mode="recurrent:1") as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(clean):
            resid = nn_model.blocks[1].hook_resid_post.output[:, 6].save()
            barrier()
            clean_out = nn_model.output.save()
        with tracer.invoke(corrupt):
            barrier()
            nn_model.blocks[1].hook_resid_post.output[:, 6] = resid
            patched = nn_model.output.save()
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, mode="recurrent:1")

        def write(x, hook):
            x = x.clone()
            x[:, 6] = cache["blocks.1.hook_resid_post"][:, 6]
            return x

        want = model.run_with_hooks(
            corrupt, mode="recurrent:1", serial=False, fwd_hooks=[("blocks.1.hook_resid_post", write)]
        )
        torch.testing.assert_close(clean_out, model(clean, mode="recurrent:1"), rtol=0, atol=1e-12)
        torch.testing.assert_close(patched, want, rtol=0, atol=1e-12)
        assert (want - model(corrupt, mode="recurrent:1")).abs().max() > 1e-6
    with pytest.raises(FbtError, match="mode='full' but an earlier invoke has 'recurrent:1'"):
        with nn_model.trace() as tracer:
            with tracer.invoke(clean, mode="recurrent:1"):
                nn_model.output.save()
            with tracer.invoke(corrupt, mode="full"):
                nn_model.output.save()
    with pytest.raises(FbtError, match="one trace batches rows of one length"):
        with nn_model.trace() as tracer:
            with tracer.invoke(clean):
                nn_model.output.save()
            with tracer.invoke(corrupt[:, :7]):
                nn_model.output.save()


@pytest.mark.parametrize("mode", ["recurrent:1", "full"])
def test_attribution_patching_the_transformer_lens_way_equals_ours(model, mode):
    """TransformerLens-style AtP (a backward hook's gradient of the summed logit difference, under the
    default rule) equals our attribution's serial gradients at every position."""
    import dataclasses

    from fbt_probe.interventions import label_token_ids, pair_batches
    from fbt_probe.interventions.attribution import trace
    from fbt_probe.interventions.metrics import logit_diff
    from fbt_probe.modes import parse_mode
    from fbt_probe.tasks import build_tokenizer, load_spec
    from fbt_probe.tasks import generate as generate_pairs

    tok = build_tokenizer()
    df = generate_pairs(dataclasses.replace(load_spec("memory"), length_grid=(2,)), groups=2, seed=0, tokenizer=tok)
    b = next(pair_batches(df, label_token_ids(df, tok), batch_size=4))
    name = "blocks.1.hook_resid_pre"
    ours = trace(model, b, parse_mode(mode), [name], serial=True).grads[(name, 1)]
    grads = []
    with model.hooks(bwd_hooks=[(name, lambda g, hook: grads.append(g))]):
        logit_diff(model(b.tokens, mode=mode)[:, -1], b.target, b.other).sum().backward()
    torch.testing.assert_close(grads[0], ours, rtol=0, atol=1e-10)
    assert ours[:, : b.T - 1].abs().max() > 1e-6


def test_the_exact_rule_is_bounded_before_any_work(monkeypatch, model):
    import fbt_probe.model.transformer as transformer

    monkeypatch.setattr(transformer, "EXACT_PASS_LIMIT", 5)
    toks = tokens(1, T)
    hook = [("blocks.0.hook_resid_pre", lambda x, hook: x)]
    with pytest.raises(
        FbtError, match=r"'full' on 8 tokens: the exact hook rule would run 8 hooked passes \(at most 5\)"
    ):
        model.run_with_hooks(toks, mode="full", fwd_hooks=hook)
    with torch.no_grad():  # the alternatives it names run
        serial = model.run_with_hooks(toks, mode="full", serial=True, fwd_hooks=hook)
        torch.testing.assert_close(serial, model(toks, mode="full"), rtol=0, atol=1e-12)
        model.run_with_hooks(toks, mode="recurrent:3", fwd_hooks=hook)  # 4 passes: within the bound
