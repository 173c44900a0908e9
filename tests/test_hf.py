"""Hugging Face Qwen3 as an external oracle, and the import/export round trip."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fbt_probe as fp  # noqa: E402
from fbt_probe.errors import FbtError  # noqa: E402
from fbt_probe.formats.qwen3 import export_qwen3, import_qwen3  # noqa: E402


def _hf_config(**kw):
    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_theta=10000.0,
    )
    base.update(kw)
    return transformers.Qwen3Config(**base)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(_hf_config()).eval()
    folder = tmp_path_factory.mktemp("qwen3")
    hf.save_pretrained(folder)
    return hf, folder


def test_imported_model_equals_hf_qwen3(hf_folder):
    hf, folder = hf_folder
    model = fp.load_model(str(folder)).eval()
    assert model.cfg.resolved_layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    toks = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))  # 40 > window 8
    with torch.no_grad():
        ours, theirs = model(toks), hf(toks).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    # the window matters: the same weights with all-global attention differ from HF
    model_global = import_qwen3(folder)
    object.__setattr__(model_global.blocks[0].attn, "window", None)
    with torch.no_grad():
        assert (model_global(toks) - theirs).abs().max() > 1e-3


def test_export_round_trip(hf_folder, tmp_path):
    hf, folder = hf_folder
    model = import_qwen3(folder, seed=5)
    export_qwen3(model, tmp_path / "out")
    again = import_qwen3(tmp_path / "out", seed=99)  # fusion restored from fusion.safetensors, not re-drawn
    sd1, sd2 = model.state_dict(), again.state_dict()
    assert sd1.keys() == sd2.keys() and all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    hf2 = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out").eval()
    toks = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf2(toks).logits, hf(toks).logits, rtol=0, atol=0)
    with pytest.raises(FbtError, match="refusing to overwrite"):
        export_qwen3(model, tmp_path / "out")


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("tie_word_embeddings", False, "tie_word_embeddings"),
        ("attention_bias", True, "attention_bias"),
        ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, "rope_parameters"),
        ("model_type", "llama", "model_type"),
    ],
)
def test_import_refuses_what_it_cannot_represent(hf_folder, tmp_path, field, value, match):
    _, folder = hf_folder
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(FbtError, match=match):
        import_qwen3(tmp_path)


def test_export_refuses_depth_scaling(tmp_path):
    with pytest.raises(FbtError, match="depth_scaling"):
        export_qwen3(fp.load_model("tiny"), tmp_path / "x")
