"""Lenses: the logit lens at the top depth is the model's logits exactly (every mode and every Jacobi
pass), tuned-lens translators at identity are the logit lens, training lowers the KL, and the sweep's
tables, split and command line."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.interventions import label_token_ids
from fbt_probe.lens import LensConfig, TunedLens, fit_tuned_lens, kl_to, logit_lens, pass_activations, run_lens
from fbt_probe.modes import parse_mode
from fbt_probe.tasks import build_tokenizer, generate, load_spec, save_tokenizer, write_dataset
from tests.helpers import make_model, tokens

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full", "jacobi:3"])
def test_logit_lens_at_the_top_depth_is_the_models_logits(model, mode):
    toks = tokens(3, 11)
    L = model.cfg.n_layers
    passes = pass_activations(model, toks, parse_mode(mode))
    assert sorted(passes) == (list(range(1, 4)) if mode == "jacobi:3" else [1])
    with torch.no_grad():
        for k, acts in passes.items():
            # the same operations on tensors of the same shape: bit for bit
            assert torch.equal(logit_lens(model, acts["resid"][L]), acts["logits"])
            own = model(
                toks, mode=f"jacobi:{k}" if mode.startswith("jacobi") else mode
            )  # pass k = jacobi:k's last pass
            torch.testing.assert_close(acts["logits"], own, rtol=0, atol=1e-12)
        assert not torch.allclose(logit_lens(model, passes[max(passes)]["resid"][0]), passes[max(passes)]["logits"])


def test_tuned_lens_translators_at_identity_reproduce_the_logit_lens(model):
    L, D = model.cfg.n_layers, model.cfg.d_model
    lens = TunedLens(D, L, dtype=torch.float64)
    acts = pass_activations(model, tokens(2, 9), parse_mode("recurrent:1"))[1]["resid"]
    with torch.no_grad():
        for d, r in acts.items():
            assert torch.equal(lens(model, r, d), logit_lens(model, r))  # x + (0·x + 0) is x exactly


def test_tuned_lens_training_lowers_the_kl_and_keeps_the_top_depth(model):
    L = model.cfg.n_layers
    acts = pass_activations(model, tokens(8, 12, seed=3), parse_mode("standard"))[1]
    X = {d: r.reshape(-1, r.shape[-1]) for d, r in acts["resid"].items()}
    Y = acts["logits"].reshape(-1, acts["logits"].shape[-1])
    lens, history = fit_tuned_lens(model, X, Y, steps=60, lr=1e-2, batch=64, seed=0)
    assert len(history) == 60
    with torch.no_grad():
        for d in range(L):  # full-batch KL to the final logits, before (= logit lens) and after
            before, after = kl_to(Y, logit_lens(model, X[d])).mean(), kl_to(Y, lens(model, X[d], d)).mean()
            assert after < 0.7 * before, (d, float(before), float(after))
        assert torch.equal(lens(model, X[L], L), Y)
        assert lens.translators[0].weight.abs().max() > 0
    assert all(p.requires_grad for p in model.parameters())


@pytest.fixture(scope="module")
def pair_df():
    tok = build_tokenizer()
    frames = [
        generate(dataclasses.replace(load_spec(t), length_grid=(8,)), groups=6, seed=0, tokenizer=tok)
        for t in ("completion", "memory")
    ]
    df = pd.concat(frames, ignore_index=True)
    return df, label_token_ids(df, tok)


def test_lens_sweep_tables_and_held_out_split(model, pair_df):
    df, ids = pair_df
    res = run_lens(model, df, LensConfig(modes=("standard", "jacobi:2"), steps=20, n_boot=50), ids)
    rows, s = res.rows, res.summary
    L = model.cfg.n_layers
    assert set(rows["lens"]) == {"logit", "tuned"} and set(rows["depth"]) == set(range(L + 1))
    assert set(zip(rows["mode"], rows["pass_index"])) == {("standard", 1), ("jacobi:2", 1), ("jacobi:2", 2)}
    for task, sub in rows.groupby("task"):  # held-out pairs: no group on both sides, both sides present
        held, train = sub[sub["eval"]], sub[~sub["eval"]]
        assert len(held) and len(train) and not set(held["group_id"]) & set(train["group_id"])
    assert (rows.groupby(["task", "pair_id"])["eval"].nunique() == 1).all()  # a pair is on one side
    top = rows[(rows.depth == L) & (rows.metric == "kl_to_final")]
    np.testing.assert_allclose(top["value"], 0.0, atol=1e-12)
    p = s[(s.metric == "p_correct") & (s.length_knob == -1)]
    assert (p["ci_low"] <= p["mean"] + 1e-12).all() and (p["mean"] <= p["ci_high"] + 1e-12).all()
    std, jac1 = (
        p[(p["mode"] == m) & (p.pass_index == 1)].set_index(["task", "lens", "depth"])["mean"]
        for m in ("standard", "jacobi:2")
    )
    np.testing.assert_allclose(std.sort_index(), jac1.sort_index(), atol=1e-12)  # Jacobi pass 1 is standard
    assert res.training["kl"].iloc[-1] < res.training["kl"].iloc[0]


def test_lens_cli_writes_tables_and_figure_and_refuses_to_overwrite(tmp_path):
    tok = build_tokenizer()
    df = generate(dataclasses.replace(load_spec("memory"), length_grid=(8,)), groups=4, seed=0, tokenizer=tok)
    write_dataset(df, tmp_path / "data", tok)
    save_tokenizer(tok, tmp_path / "tokenizer.json")
    save_checkpoint(make_model(dtype=torch.float32), tmp_path / "run", tokenizer_path=tmp_path / "tokenizer.json")
    args = [
        "lens",
        str(tmp_path / "run"),
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "lens"),
        "--mode",
        "standard,jacobi:2",
        "--steps",
        "5",
        "--n-boot",
        "20",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "P(correct)" in res.output
    out = tmp_path / "lens"
    for f in ("rows.parquet", "lens_summary.csv", "training.parquet", "translators.safetensors", "figures/lens.png"):
        assert (out / f).is_file(), f
    man = json.loads((out / "manifest.json").read_text())
    assert man["provenance"]["checkpoint_hash"] and man["provenance"]["dataset_hash"]
    from fbt_probe.figures import draw

    assert draw("lens", out, metric="kl_to_final") is not None
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    bad = CliRunner().invoke(app, args[:-4] + ["--eval-fraction", "1.5", "--force"])
    assert bad.exit_code == 2 and bad.output.strip().count("\n") == 0
