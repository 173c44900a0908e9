"""Checkpoints of the nanochat latent-feedback reproduction: Hugging Face Qwen3 as the oracle with
every extra at its identity, each extra against a float64 formula of its own, the key mapping both
ways, the three fusion variants, and the refusals. All float64, tiny (D 32, 4 layers)."""

import json

import pytest
import torch
import torch.nn.functional as F

import fbt_probe as fp
from fbt_probe.config import FLOAT32_EPS
from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.checkpoint import import_nanochat, read_state, to_theirs, window_sizes
from fbt_probe.formats.nanochat.model import NanochatTransformer
from fbt_probe.model.transformer import FeedbackTransformer
from fbt_probe.modes import parse_mode
from fbt_probe.surface.decoding import generate
from tests.nanochat_helpers import META, random_state, write_nanochat

T_LONG = 140  # > their short window of 128 keys before the query (ours: 129 in all)


def _load(tmp_path, name="ck", seed=0, identity=False, **meta):
    mc, state = random_state(seed, identity, **meta)
    folder = write_nanochat(tmp_path / name, mc, state)
    model, record, notes = import_nanochat(folder)
    return model.double().eval(), mc, state


def _toks(T, seed=1, B=2, V=70):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def _norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + FLOAT32_EPS)


# ----------------------------------------------------------------------------- HF oracle
def _flip(w, n_heads, dh):
    """Negate the second half of every head's rows: P R(θ) P = R(-θ) for P = diag(1, -1) per pair,
    and the weightless QK-norm and the 1.2 scale commute with P and with R."""
    w = w.clone().view(n_heads, dh, -1)
    w[:, dh // 2 :] *= -1
    return w.view(n_heads * dh, -1)


def _hf_from_theirs(mc, state, window, flip=True):
    transformers = pytest.importorskip("transformers")
    V, D, L, H, KV = mc["vocab_size"], mc["n_embd"], mc["n_layer"], mc["n_head"], mc["n_kv_head"]
    dh = D // H
    types = ["full_attention" if w >= mc["sequence_len"] else "sliding_attention" for w in window_sizes(mc)]
    cfg = transformers.Qwen3Config(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=4 * D,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=dh,
        max_position_embeddings=mc["sequence_len"],
        rms_norm_eps=FLOAT32_EPS,
        rope_theta=100_000.0,
        hidden_act="relu",
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=True,
        sliding_window=window,
        layer_types=types,
    )
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    scale = 800.0 if mc["weight_tying"] else 1.0
    sd = {
        "model.embed_tokens.weight": _norm(
            state["transformer.wte.weight"][:V].double() * scale
        ),  # the embedding norm is per row
        "model.norm.weight": torch.ones(D),
        "lm_head.weight": (state["transformer.wte.weight"] if mc["weight_tying"] else state["lm_head.weight"])[:V],
    }
    for l in range(L):
        p, a = f"model.layers.{l}.", f"transformer.h.{l}."
        cq, ck = state[a + "attn.c_q.weight"], state[a + "attn.c_k.weight"]
        sd.update(
            {
                p + "self_attn.q_proj.weight": _flip(cq, H, dh) if flip else cq,
                p + "self_attn.k_proj.weight": _flip(ck, KV, dh) if flip else ck,
                p + "self_attn.v_proj.weight": state[a + "attn.c_v.weight"],
                p + "self_attn.o_proj.weight": state[a + "attn.c_proj.weight"],
                p + "self_attn.q_norm.weight": torch.full((dh,), 1.2),
                p + "self_attn.k_norm.weight": torch.full((dh,), 1.2),
                p + "input_layernorm.weight": torch.ones(D),
                p + "post_attention_layernorm.weight": torch.ones(D),
                # ReLU² = relu(g) · g: gate and up are both c_fc
                p + "mlp.gate_proj.weight": state[a + "mlp.c_fc.weight"],
                p + "mlp.up_proj.weight": state[a + "mlp.c_fc.weight"],
                p + "mlp.down_proj.weight": state[a + "mlp.c_proj.weight"],
            }
        )
    hf.load_state_dict({k: v.float() for k, v in sd.items()})
    return hf


@pytest.mark.parametrize("tied", [False, True])
def test_identity_extras_equal_hf_qwen3(tmp_path, tied):
    """float32 on both sides: HF computes its RoPE angles in float32 whatever the model dtype."""
    model, mc, state = _load(tmp_path, identity=True, weight_tying=tied)
    model = model.float()
    assert model.cfg.window == 129 and model.cfg.resolved_layer_types[-1] == "full_attention"
    toks = _toks(T_LONG)
    with torch.no_grad():
        ours = model(toks)
        scale = ours.abs().max()
        hf = _hf_from_theirs(mc, state, window=129)(toks).logits
        diff = lambda other: ((ours - 15 * torch.tanh(other / 15)).abs().max() / scale).item()  # noqa: E731
        assert diff(hf) < 2e-5  # float32 rounding, different summation orders
        # their window w is w keys before the query: HF's (and our) window w + 1; w alone is off by one
        off = _hf_from_theirs(mc, state, window=128)(toks).logits
        assert diff(off) > 1e-3
        # without the rotation-sign flip the relative rotation runs the other way
        assert diff(_hf_from_theirs(mc, state, window=129, flip=False)(toks).logits) > 1e-2


# ----------------------------------------------------------------------------- each extra, float64 formulas
def test_each_extra_matches_its_formula(tmp_path):
    model, mc, state = _load(tmp_path, weight_tying=True)
    cfg, V = model.cfg, mc["vocab_size"]
    toks = _toks(24)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
    sd = {k: v.double() for k, v in state.items()}
    # embedding: looked up, times 0.8 / 0.001 (tied), RMS-normed without weight
    e = sd["transformer.wte.weight"][toks] * 800.0
    torch.testing.assert_close(cache["hook_embed"], e, rtol=1e-12, atol=0)
    x = _norm(e)
    torch.testing.assert_close(cache["hook_embed_normed"], x, rtol=0, atol=1e-12)
    # smear: x_t + λ σ(W x_t[:24]) x_{t-1} for t >= 1
    gate = sd["smear_lambda"] * torch.sigmoid(x[:, 1:, :24] @ sd["smear_gate.weight"].T)
    smeared = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
    torch.testing.assert_close(cache["hook_smear"], smeared, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], smeared, rtol=0, atol=1e-12)
    for l in range(cfg.n_layers):
        # x0 mixing: λ_r[l] · (stream into block l) + λ_0[l] · x0, x0 the model's input
        mixed = sd["resid_lambdas"][l] * cache[f"blocks.{l}.hook_resid_pre"] + sd["x0_lambdas"][l] * smeared
        torch.testing.assert_close(cache[f"blocks.{l}.hook_resid_mix"], mixed, rtol=0, atol=1e-12)
        if l > 0:
            torch.testing.assert_close(
                cache[f"blocks.{l}.hook_resid_pre"], cache[f"blocks.{l - 1}.hook_resid_post"], rtol=0, atol=0
            )
        # ReLU² MLP without gate
        pre = _norm(cache[f"blocks.{l}.hook_resid_mid"]) @ sd[f"transformer.h.{l}.mlp.c_fc.weight"].T
        torch.testing.assert_close(cache[f"blocks.{l}.mlp.hook_post"], F.relu(pre) ** 2, rtol=0, atol=1e-11)
        # value embeddings on layers l % 2 == (L - 1) % 2: 3σ(W x[:12]) · E_v(token) per KV head
        name = f"blocks.{l}.attn.hook_value_embed"
        assert (name in cache) == (l % 2 == (cfg.n_layers - 1) % 2)
        if name in cache:
            a = _norm(mixed)
            g3 = 3 * torch.sigmoid(a[..., :12] @ sd[f"transformer.h.{l}.attn.ve_gate.weight"].T)
            ve = sd[f"value_embeds.{l}.weight"][toks].view(2, 24, cfg.n_key_value_heads, cfg.d_head)
            torch.testing.assert_close(cache[name], g3[..., None] * ve, rtol=0, atol=1e-12)
    # backout: the top stream minus λ_b · (output of block L // 2)
    b = cfg.n_layers // 2
    back = (
        cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"]
        - sd["backout_lambda"] * cache[f"blocks.{b}.hook_resid_post"]
    )
    torch.testing.assert_close(cache["hook_backout"], back, rtol=0, atol=1e-12)
    # tied unembedding (unscaled), soft-cap 15, padding rows cropped
    top = _norm(back)
    torch.testing.assert_close(
        logits, 15 * torch.tanh(top @ sd["transformer.wte.weight"][:V].T / 15), rtol=0, atol=1e-12
    )


def test_attention_rotates_by_minus_theta_then_norms(tmp_path):
    """Scores of layer 0 from their formula: RoPE (base 1e5, half split, -θ), then QK-norm, times 1.2."""
    model, mc, state = _load(tmp_path)
    toks = _toks(12)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n.startswith("blocks.0."))
    H, KV, dh = 4, 2, 8
    a = _norm(cache["blocks.0.hook_resid_mix"])
    q = (a @ state["transformer.h.0.attn.c_q.weight"].double().T).view(2, 12, H, dh)
    k = (a @ state["transformer.h.0.attn.c_k.weight"].double().T).view(2, 12, KV, dh)
    theta = torch.arange(12, dtype=torch.float64)[:, None] * 1e5 ** (-torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    cos, sin = theta.cos()[None, :, None], theta.sin()[None, :, None]

    def rope(x):
        x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
        return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], -1)

    q, k = 1.2 * _norm(rope(q)), 1.2 * _norm(rope(k))
    k = k.repeat_interleave(H // KV, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dh**0.5
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: x)]):
        _, c2 = model.run_with_cache(toks, names_filter="blocks.0.attn.hook_pattern")
    torch.testing.assert_close(c2["blocks.0.attn.hook_pattern"], scores.softmax(-1), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- fusion variants
FORMULAS = {
    "gate_product": lambda f, h, e: _norm((h @ f["state_proj"].T) * torch.sigmoid(_norm(e) @ f["token_gate"].T)),
    "concat_projection": lambda f, h, e: _norm(torch.cat([_norm(h), _norm(e)], -1) @ f["concat_proj"].T),
    "linear_addition": lambda f, h, e: _norm(h @ f["state_proj"].T + _norm(e) @ f["token_proj"].T),
}


@pytest.mark.parametrize("mode", list(FORMULAS))
def test_fusion_variants(tmp_path, mode):
    model, mc, state = _load(tmp_path, latent_feedback_mode=mode, weight_tying=mode == "concat_projection")
    toks = _toks(16)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, mode="jacobi:2")
        first = model(toks, mode="standard")
        _, c1 = model.run_with_cache(toks, mode="standard", names_filter="ln_final.hook_normalized")
    f = {k.split(".")[1]: v.double() for k, v in state.items() if k.startswith("latent_feedback.")}
    h = model.shift_states(
        c1["ln_final.hook_normalized"]
    )  # the fed-back state: pass 1's final post-norm state (after backout)
    torch.testing.assert_close(cache["fusion.hook_feedback"][:, 1:], h[:, 1:], rtol=0, atol=1e-12)
    fused = FORMULAS[mode](f, h, cache["hook_embed"])
    out = cache["fusion.hook_out"]
    torch.testing.assert_close(out[:, 1:], fused[:, 1:], rtol=0, atol=1e-11)
    torch.testing.assert_close(out[:, 0], cache["hook_smear"][:, 0], rtol=0, atol=0)  # position 0: the plain input
    assert first.shape == out.shape[:2] + (70,)


# ----------------------------------------------------------------------------- modes, cache, decoding
def test_modes_cache_and_prefix_on_an_import(tmp_path):
    from fbt_probe.engine.prefix import build_prefix

    model, *_ = _load(tmp_path, latent_feedback_mode="linear_addition")
    toks = _toks(10)
    with torch.no_grad():
        full = model(toks, mode="full")  # serial steps through the KV cache (smear reads the cached token)
        torch.testing.assert_close(model(toks, mode="jacobi:10"), full, rtol=0, atol=1e-10)  # jacobi:T = full
        torch.testing.assert_close(
            model(toks, mode="recurrent:3", serial=True), model(toks, mode="recurrent:3"), rtol=0, atol=1e-10
        )
        cache, _, logits = model.prefill_cache(toks[:, :6])
        for t in range(6, 10):  # plain steps through the cache = the standard prefill
            step, _ = model.step(toks[:, t], cache, None)
            torch.testing.assert_close(step, model(toks[:, : t + 1])[:, -1], rtol=0, atol=1e-10)
        for mode in ("standard", "recurrent:2", "jacobi:3"):
            ref = model(toks, mode=mode)
            torch.testing.assert_close(
                build_prefix(model, toks, parse_mode(mode), upto=5).run(3), ref[:, 3:], rtol=0, atol=1e-10
            )
    for dec in ("std", "soft", "fused"):
        assert generate(model, toks[:, :5], 4, dec).shape == (2, 4)


# ----------------------------------------------------------------------------- mapping and folder
def test_key_mapping_round_trip(tmp_path):
    mc, state = random_state(3, latent_feedback_mode="concat_projection")
    folder = write_nanochat(tmp_path / "a", mc, state, prefix="_orig_mod.")
    model, record, notes = import_nanochat(folder)
    back = to_theirs(model)
    V = mc["vocab_size"]
    assert set(back) == set(state) and back["transformer.wte.weight"].shape[0] == 128  # padded to a multiple of 64
    for k, t in state.items():
        if k.startswith("latent_feedback.") and "concat_proj" not in k:
            assert not back[k].any()  # dormant matrices are not carried over
        elif k in ("transformer.wte.weight", "lm_head.weight") or k.startswith("value_embeds."):
            assert torch.equal(back[k][:V], t[:V]) and not back[k][V:].any()
        else:
            assert torch.equal(back[k], t), k
    again, *_ = import_nanochat(write_nanochat(tmp_path / "b", mc, back))
    sd1, sd2 = model.state_dict(), again.state_dict()
    assert sd1.keys() == sd2.keys() and all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    assert (
        record["dormant_fusion_tensors"]
        == [
            "latent_feedback.state_proj.weight",
            "latent_feedback.token_gate.weight",
            "latent_feedback.token_proj.weight",
        ]
        and record["step"] == 1200
        and not notes
    )


def test_folder_loads_directly_and_notes(tmp_path):
    mc, state = random_state(0)
    folder = write_nanochat(tmp_path / "base", mc, state, extra_meta={"user_config": {"num_forward_passes": 1}})
    with pytest.warns(UserWarning, match="dormant, never trained"):
        model = fp.load_model(str(folder))
    toks = _toks(8)
    direct, *_ = import_nanochat(folder)
    with torch.no_grad():
        assert torch.equal(model(toks), direct(toks))
    mc2 = {**mc, "latent_feedback": False}
    state2 = {k: v for k, v in state.items() if not k.startswith("latent_feedback.")}
    with pytest.warns(UserWarning, match="no fusion weights"):
        fp.load_model(str(write_nanochat(tmp_path / "nolf", mc2, state2)))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda mc, st: mc.update(rope_base=5), "model_config.rope_base"),
        (lambda mc, st: mc.update(latent_feedback_mode="gated"), "latent_feedback_mode"),
        (lambda mc, st: mc.update(window_pattern="SXL"), "window_pattern"),
        (lambda mc, st: mc.update(n_embd=16, n_head=2), "n_embd"),
        (lambda mc, st: st.pop("transformer.h.1.attn.c_k.weight"), "transformer.h.1.attn.c_k.weight"),
        (lambda mc, st: st.update({"transformer.h.0.attn.bias": torch.zeros(3)}), "transformer.h.0.attn.bias"),
        (lambda mc, st: st.update({"lm_head.weight": st["transformer.wte.weight"] + 1}), "lm_head.weight"),
    ],
)
def test_refusals_name_the_field(tmp_path, edit, match):
    mc, state = random_state(0, weight_tying=True)
    edit(mc, state)
    folder = write_nanochat(tmp_path / "x", mc, state)
    with pytest.raises(FbtError, match=match):
        import_nanochat(folder)


def test_weights_only_load(tmp_path):
    """A pickle that would run code is refused (torch.load weights_only=True), in one line."""

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    folder = tmp_path / "evil"
    folder.mkdir()
    torch.save({"x": Evil()}, folder / "model_000001.pt")
    (folder / "meta_000001.json").write_text(json.dumps({"model_config": META}))
    with pytest.raises(FbtError, match="not a loadable state dict"):
        read_state(folder / "model_000001.pt")


def test_cli_import(tmp_path):
    from typer.testing import CliRunner

    from fbt_probe.cli import app

    mc, state = random_state(0)
    folder = write_nanochat(tmp_path / "ck", mc, state, step=5)
    write_nanochat(folder, mc, state, step=9, extra_meta={"num_forward_passes": 1})
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["model", "import-nanochat", str(folder), str(out), "--step", "5", "--no-tokenizer"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "config.json").read_text())
    assert meta["nanochat"]["step"] == 5 and meta["model"]["fusion"] == "gate_product"
    res = CliRunner().invoke(app, ["model", "import-nanochat", str(folder), str(tmp_path / "o2"), "--no-tokenizer"])
    assert res.exit_code == 0 and "dormant" in res.output and "step 9" in res.output
    res = CliRunner().invoke(
        app, ["model", "import-nanochat", str(folder), str(out), "--step", "7", "--force", "--no-tokenizer"]
    )
    assert res.exit_code != 0 and "--step 7" in res.output and (out / "config.json").is_file()
    loaded = fp.load_model(str(out))
    direct, *_ = import_nanochat(folder, step=5)
    toks = _toks(8)
    assert meta["model"]["arch"] == "nanochat" and type(loaded) is type(direct) is NanochatTransformer
    with torch.no_grad():
        assert torch.equal(loaded(toks, mode="jacobi:2"), direct(toks, mode="jacobi:2"))
    # a folder written while every config carried the extras (format 3, no `arch`) loads the same model
    meta["model"].pop("arch")
    (out / "config.json").write_text(json.dumps(meta))
    again = fp.load_model(str(out))
    with torch.no_grad():
        assert type(again) is NanochatTransformer and torch.equal(
            again(toks, mode="jacobi:2"), direct(toks, mode="jacobi:2")
        )


def test_interventions_on_a_fusion_without_gate(tmp_path):
    """feedback-swap runs its state and value swaps (no gate hook to swap); gate-ablation refuses in one line."""
    from fbt_probe.interventions.experiments import feedback_swap, gate_ablation
    from fbt_probe.interventions.pairs import label_token_ids, pair_batches
    from tests.helpers import task_pairs

    mc, state = random_state(0, vocab_size=128, latent_feedback_mode="linear_addition")
    model, *_ = import_nanochat(write_nanochat(tmp_path / "la", mc, state))
    df, tok = task_pairs(2, tasks=("memory",))
    batches = list(pair_batches(df, label_token_ids(df, tok), batch_size=8))
    rows = feedback_swap(model, batches, min_gap=0.0)
    assert set(rows["condition"]) == {"state", "value"}
    with pytest.raises(FbtError, match="field 'fusion' is 'linear_addition'"):
        gate_ablation(model, batches)


def test_hidden_decoding_refuses_an_import(tmp_path):
    from fbt_probe.hidden.model import HiddenDecodingTransformer

    model, *_ = _load(tmp_path)
    with pytest.raises(FbtError, match="field 'arch' is 'nanochat'.*paper's backbone"):
        HiddenDecodingTransformer.from_base(model)


def test_older_formats_load_with_extras_at_identity(tmp_path):
    """Format fbt-probe/2 (no extras) and the format-3 records that carried every extra at its identity
    value load as the core model and compute what they did; a record with an extra away from its
    identity is not a core model's, and the core config says so by name."""
    from fbt_probe.config import FORMAT_3_EXTRAS, ModelConfig
    from fbt_probe.formats.checkpoint import save_checkpoint
    from tests.helpers import make_model

    model = make_model()
    folder = save_checkpoint(model, tmp_path / "old")
    meta = json.loads((folder / "config.json").read_text())
    assert not set(FORMAT_3_EXTRAS) & set(meta["model"])  # the core writes its own fields only
    toks = _toks(12, V=37)
    for fmt, record in (
        ("fbt-probe/2", meta["model"]),
        ("fbt-probe/3", {**meta["model"], **FORMAT_3_EXTRAS, "value_embed_layers": []}),
    ):
        (folder / "config.json").write_text(json.dumps({**meta, "fbt_probe_format": fmt, "model": record}))
        again = fp.load_model(str(folder)).double()
        with torch.no_grad():
            assert type(again) is FeedbackTransformer and torch.equal(
                again(toks, mode="full"), model(toks, mode="full")
            )
    with pytest.raises(FbtError, match="old.json: field 'smear' is True: an extra of a nanochat model"):
        ModelConfig.from_dict({**meta["model"], **FORMAT_3_EXTRAS, "smear": True}, "old.json", legacy=3)
    with pytest.raises(FbtError, match="field 'rope_theta' missing"):
        ModelConfig.from_dict({k: v for k, v in meta["model"].items() if k != "rope_theta"}, "old.json", legacy=3)


def test_nanochat_config_defaults_are_the_identities_format_3_recorded():
    from fbt_probe.config import FORMAT_3_EXTRAS, ModelConfig
    from fbt_probe.formats.nanochat.config import NanochatConfig

    cfg = NanochatConfig()
    assert {name: getattr(cfg, name) for name in FORMAT_3_EXTRAS} == FORMAT_3_EXTRAS and not cfg.extras
    extra = set(NanochatConfig.__dataclass_fields__) - set(ModelConfig.__dataclass_fields__)
    assert extra == set(FORMAT_3_EXTRAS) | {"arch"} and len(ModelConfig.__dataclass_fields__) <= 25


def test_export_hf_refuses_an_import(tmp_path):
    from fbt_probe.formats.qwen3 import export_qwen3

    model, *_ = _load(tmp_path)
    with pytest.raises(FbtError, match="field 'arch' is 'nanochat'"):
        export_qwen3(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
