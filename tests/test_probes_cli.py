"""`fbt-probe extract | probe | figures` end to end on a tiny checkpoint, and their bad-input exits."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from tests.helpers import make_model

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A checkpoint folder and a dataset folder (completion 0/8 distractors, memory 0 distractors in 3 groups)."""
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset

    root = tmp_path_factory.mktemp("study")
    tok = build_tokenizer()
    for task, grid, groups in (("completion", [0, 8], 10), ("memory", [0], 3)):  # memory: fewer groups than folds
        spec = load_spec(task).replace(length_grid=grid)
        write_dataset(generate(spec, groups=groups, seed=0, tokenizer=tok), root / "data", tok)
    save_checkpoint(make_model(dtype=torch.float32), root / "ckpt", tokenizer_path=root / "data" / "tokenizer.json")
    return root


def test_extract_probe_figures_end_to_end(study, tmp_path):
    from fbt_probe.formats.checkpoint import checkpoint_hash

    acts, results, figs = tmp_path / "acts", tmp_path / "results", tmp_path / "figs"
    r = run("extract", study / "ckpt", study / "data", "--modes", "standard,recurrent:1", "--out", acts)
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "peak RSS" in r.output
    r = run("probe", acts, "--out", results, "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "memory standard length 0: skipped: 3 groups" in r.output  # fewer groups than folds: flagged, not fatal
    table = pd.read_parquet(results / "probes.parquet")
    assert set(table["mode"]) == {"standard", "recurrent:1", "carried-state"}
    assert set(table["task"]) == {"completion"} and set(table["length"]) == {0, 8}
    assert len(pd.read_csv(results / "probes.csv")) == len(table)
    # each sample's held-out prediction, from the fold that tests it: the fold accuracies recompute from it
    samples = pd.read_parquet(results / "probes_samples.parquet")
    keys = ["mode", "length", "depth", "fold"]
    acc = table[table["metric"] == "accuracy"].set_index(keys)["value"]
    assert (samples.groupby(keys)["correct"].mean().reindex(acc.index) == acc).all()
    prov = json.loads((results / "probes.provenance.json").read_text())
    assert prov["model_hash"] == checkpoint_hash(study / "ckpt") and prov["dataset_hash"]
    assert prov["config"]["n_splits"] == 4 and prov["seed"] == 0 and prov["git_commit"]
    r = run("figures", "fig7a", results, "--out", figs)
    assert r.exit_code == 0, r.output
    assert (figs / "fig7a.png").is_file() and (figs / "fig7a.svg").is_file()

    # nothing is overwritten without --force
    for args in (
        ("extract", study / "ckpt", study / "data", "--out", acts),
        ("probe", acts, "--out", results),
        ("figures", "fig7a", results, "--out", figs),
    ):
        r = run(*args)
        assert r.exit_code == 2 and "--force" in r.output, r.output
    assert run("figures", "fig7a", results, "--out", figs, "--force").exit_code == 0
    r = run("probe", acts, "--out", results, "--jobs", "1", "--strict", "--force")
    assert r.exit_code == 2 and "fewer than the 4 folds" in r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (("extract", "{ckpt}", "{data}", "--modes", "standard,recurrent:x", "--out", "{tmp}/a"), "mode 'recurrent:x'"),
        (
            ("extract", "{ckpt}", "{data}", "--modes", "recurrent:40", "--out", "{tmp}/a"),
            "k must be < the sequence length",
        ),
        (("extract", "{tmp}/nowhere", "{data}", "--out", "{tmp}/a"), "neither a preset"),
        (("probe", "{tmp}", "--out", "{tmp}/r"), "no manifest.json"),
        (("figures", "fig99", "{tmp}", "--out", "{tmp}/f"), "unknown (available: "),
        (("figures", "fig7a", "{tmp}", "--out", "{tmp}/f"), "no probes.parquet"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(study, tmp_path, args, message):
    fill = {"ckpt": study / "ckpt", "data": study / "data", "tmp": tmp_path}
    r = run(*(a.format(**fill) for a in args))
    assert r.exit_code == 2, r.output
    assert message in r.output and r.output.count("\n") == 1 and r.output.startswith("error: ")
    assert not (tmp_path / "a").exists() and not (tmp_path / "r").exists()


def test_extract_takes_a_hidden_decoding_checkpoint(study, tmp_path):
    """`fbt-probe extract` on a Hidden Decoding checkpoint: streams x depths in mode `standard`, equal
    to the model's own residual stream at the final token's streams; feedback modes are refused."""
    import numpy as np

    from fbt_probe.activations import ActivationStore
    from fbt_probe.hidden import HiddenDecodingTransformer, load_hidden, save_checkpoint, stream_depth, stream_position
    from fbt_probe.hooks import depth_name

    hd = HiddenDecodingTransformer.from_base(make_model(dtype=torch.float32), n_streams=2).eval()
    save_checkpoint(hd, tmp_path / "hd", tokenizer_path=study / "data" / "tokenizer.json")
    r = run("extract", tmp_path / "hd", study / "data", "--modes", "recurrent:1", "--out", tmp_path / "no")
    assert r.exit_code == 2 and "only mode 'standard'" in r.output and not (tmp_path / "no").exists()
    r = run("extract", tmp_path / "hd", study / "data", "--out", tmp_path / "acts")
    assert r.exit_code == 0, r.output
    L = hd.cfg.n_layers
    assert f"2 streams x {L + 1} depths" in r.output
    store = ActivationStore(tmp_path / "acts")
    assert store.modes == ["standard"] and store.manifest["model"]["arch"] == "hidden-decoding"
    from fbt_probe.loading import load_data

    X, rows, _ = store.load("standard", "completion", 8)
    data = load_data(study / "data")  # the rows the store's row ids index
    toks = torch.tensor(np.stack(data.loc[rows.row, "token_ids"].to_list()), dtype=torch.long)
    _, cache = load_hidden(tmp_path / "hd").run_with_cache(toks)
    for k in (1, 2):
        np.testing.assert_allclose(
            X[stream_depth(k, L, L)], cache[depth_name(L)][:, stream_position(-1, k, 2)].numpy(), rtol=1e-6, atol=1e-6
        )
    r = run("probe", tmp_path / "acts", "--out", tmp_path / "res", "--folds", "2", "--no-control")
    assert r.exit_code == 0, r.output
