"""The one loading path: checkpoint kinds by table, run folders, provenance, and the dataset /
tokenizer checks every command shares."""

from __future__ import annotations

import pytest
import torch

from fbt_probe import loading
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.tasks import save_tokenizer, tokenizer_sha256
from tests.helpers import make_model, task_pairs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """RUN/checkpoint/ holding a small model and the built-in tokenizer."""
    df, tok = task_pairs(groups=2, tasks=("completion",))
    run = tmp_path_factory.mktemp("run")
    save_tokenizer(tok, run / "tok.json")
    save_checkpoint(make_model(dtype=torch.float32, d_vocab=tok.get_vocab_size()), run / "checkpoint", run / "tok.json")
    return run, df, tok


def test_open_model_reads_a_run_folder_with_its_tokenizer_and_provenance(run_dir):
    run, _, _ = run_dir
    lm = loading.open_model(run)
    assert lm.folder == run / "checkpoint" and lm.tokenizer == run / "checkpoint" / "tokenizer.json"
    info = lm.provenance()
    assert info["model_source"] == str(run / "checkpoint") and info["checkpoint_hash"] == lm.hash
    assert len(lm.hash) == 64
    preset = loading.open_model("tiny", seed=3)
    assert preset.provenance()["model_seed"] == 3 and preset.hash.startswith("preset:tiny:")
    with pytest.raises(FbtError, match="neither a preset"):
        loading.open_model(run / "nowhere")


def test_overrides_apply_to_presets_only(run_dir):
    assert loading.load_model("tiny", n_layers=2).cfg.n_layers == 2
    with pytest.raises(FbtError, match="apply to presets only"):
        loading.load_model(run_dir[0] / "checkpoint", n_layers=2)


def test_a_foreign_folder_goes_to_the_loader_that_recognises_it(tmp_path, monkeypatch):
    got = []
    monkeypatch.setattr(
        loading,
        "FOREIGN_LOADERS",
        [(lambda f: (f / "meta.json").is_file(), lambda f, device, seed: got.append((f, device, seed)) or "model")],
    )
    (tmp_path / "meta.json").write_text("{}")
    assert loading.load_model(tmp_path, seed=5) == "model" and got == [(tmp_path, "cpu", 5)]


def test_tokenizer_check_exact_or_by_re_encoding(run_dir, tmp_path):
    run, df, tok = run_dir
    model = make_model(dtype=torch.float32, d_vocab=tok.get_vocab_size())
    ours = run / "tok.json"
    df = df.copy()
    df.attrs = {"tokenizer_sha256": "0" * 64}  # the dataset says another tokenizer made it
    loading.check_compatible(model, df, ours)  # ... but ours encodes its samples the same way: accepted
    with pytest.raises(FbtError, match="differs from the tokenizer the dataset was made with"):
        loading.check_compatible(model, df, ours, exact_tokenizer=True)
    df.attrs = {"tokenizer_sha256": tokenizer_sha256(tok)}
    loading.check_compatible(model, df, ours, exact_tokenizer=True)
    shifted = df.copy()
    shifted.attrs = {"tokenizer_sha256": None}
    shifted["token_ids"] = [[(i + 1) % tok.get_vocab_size() for i in ids] for ids in df["token_ids"]]
    with pytest.raises(FbtError, match="made with another tokenizer"):
        loading.check_compatible(model, shifted, ours, where="data")
    with pytest.raises(FbtError, match="exceeds the model's context"):
        loading.check_compatible(make_model(dtype=torch.float32, n_ctx=8), df, ours)
