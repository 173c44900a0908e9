"""Hidden Decoding through the shared stages: training loop (warm start, resume, CLI), stream
extraction read by the probe sweep, and the (stream, depth) figure."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.activations import extract_streams
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.hidden import HiddenDecodingTransformer, load_hidden, split_stream_depth, stream_depth, stream_position
from fbt_probe.hooks import depth_name
from fbt_probe.training import TrainConfig, run_training
from tests.helpers import make_model

runner = CliRunner()
SMALL = dict(
    tokens_per_step=400,
    warmup=2,
    eval_every=10_000,
    save_every=2,
    tasks=("completion", "memory", "registers"),
    knobs={"completion": [0, 8], "memory": [8], "registers": [2]},
)


def frame(n_pairs: int = 6, lengths=(6, 9), tasks=("alpha", "beta")) -> pd.DataFrame:
    """Minimal pairs of random ids (vocab 37) that differ at position 1 and end in the same token."""
    rng, rows = np.random.default_rng(0), []
    for task in tasks:
        for knob, T in enumerate(lengths):
            for p in range(n_pairs):
                ids = rng.integers(0, 37, size=T)
                for label in (0, 1):
                    ids = ids.copy()
                    ids[1], ids[-1] = 10 + label, 7
                    rows.append(
                        {
                            "task": task,
                            "text": "",
                            "token_ids": ids,
                            "label": label,
                            "label_word": "AB"[label],
                            "pair_id": p,
                            "group_id": f"{task}:{knob}:{p}",
                            "length_knob": knob,
                            "n_tokens": T,
                        }
                    )
    return pd.DataFrame(rows)


def test_training_warm_starts_from_a_standard_checkpoint_and_resumes(tmp_path):
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.tasks import build_tokenizer

    base = fp.load_model("tiny", seed=3, d_vocab=build_tokenizer().get_vocab_size())
    save_checkpoint(base, tmp_path / "base")
    cfg = TrainConfig(steps=2, arch="hidden-decoding", streams=2, cross_stream_layers=(3,), **SMALL)
    assert cfg.schedule == "constant:1"
    run_training(cfg, tmp_path / "hd", init=tmp_path / "base", progress=False, eval_pairs=2)
    meta = json.loads((tmp_path / "hd" / "config.json").read_text())
    assert meta["model"]["arch"] == "hidden-decoding" and meta["model"]["n_streams"] == 2
    assert meta["train"]["arch"] == "hidden-decoding" and meta["model"]["cross_stream_layers"] == [3]
    run_training(
        TrainConfig(steps=3, arch="hidden-decoding", streams=2, **SMALL),
        tmp_path / "hd",
        resume=True,
        progress=False,
        eval_pairs=2,
    )
    log = [json.loads(l) for l in (tmp_path / "hd" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and {r["passes"] for r in log} == {1}
    assert "val_loss" in log[-1] and all(np.isfinite(r["loss"]) for r in log)
    hd = load_hidden(tmp_path / "hd")
    assert hd.cfg.resolved_cross_stream_layers == (3,)
    # trained 3 small steps from the base: the streams' tables are still close to the base embedding
    for E in hd.embeds:
        assert (E.weight - base.embed.weight).abs().max() < 0.05


def test_train_cli_passes_the_hidden_options(monkeypatch, tmp_path):
    got = {}
    monkeypatch.setattr(
        "fbt_probe.cli.train.run_training",  # the name the command calls
        lambda cfg, out, **kw: got.update(cfg=cfg, **kw) or {"step": 1, "seconds": 1.0, "tokens": 1},
    )
    res = runner.invoke(
        app,
        [
            "train",
            "--out",
            str(tmp_path / "r"),
            "--arch",
            "hidden-decoding",
            "--streams",
            "3",
            "--cross-layers",
            "1,3",
            "--init",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = got["cfg"]
    assert (cfg.arch, cfg.streams, cfg.cross_stream_layers, got["init"]) == ("hidden-decoding", 3, (1, 3), tmp_path)
    for args, message in [
        (["--streams", "2"], "need --arch hidden-decoding"),
        (["--arch", "hd"], "expected 'feedback' or 'hidden-decoding'"),
        (["--arch", "hidden-decoding", "--cross-layers", "a"], "comma-separated"),
    ]:
        res = runner.invoke(app, ["train", "--out", str(tmp_path / "r"), *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)


@pytest.fixture(scope="module")
def hidden():
    return HiddenDecodingTransformer.from_base(make_model(dtype=torch.float64), n_streams=2).eval()


def test_extraction_holds_every_stream_at_every_depth(hidden, tmp_path):
    df = frame(n_pairs=3)
    store = extract_streams(hidden, df, tmp_path / "acts", batch_size=4, dtype="float64")
    assert store.modes == ["standard"]
    L, n = hidden.cfg.n_layers, hidden.cfg.n_streams
    X, rows, targets = store.load("standard", "beta", 1)
    assert X.shape == (n * (L + 1), len(rows), hidden.cfg.d_model)
    assert [t.depth for t in targets] == list(range(n * (L + 1)))
    toks = torch.tensor(np.stack(df.loc[rows.row, "token_ids"].to_list()), dtype=torch.long)
    _, cache = hidden.run_with_cache(toks)
    for k in range(1, n + 1):
        for d in range(L + 1):
            p = stream_depth(k, d, L)
            assert split_stream_depth(p, L) == (k, d) and targets[p].hook == depth_name(d)
            # extraction ran batches of 4 and 2, the cache one batch of 6: float64 to 1e-12, not bitwise
            np.testing.assert_allclose(
                X[p], cache[depth_name(d)][:, stream_position(-1, k, n)].numpy(), rtol=0, atol=1e-12
            )
    with pytest.raises(FbtError, match="refusing to overwrite"):
        extract_streams(hidden, df, tmp_path / "acts")


def test_probe_sweep_and_figure_over_streams(hidden, tmp_path):
    from fbt_probe.activations import extract
    from fbt_probe.figures import draw
    from fbt_probe.figures.hidden import stream_curves
    from fbt_probe.probes import ProbeConfig, probe_sweep

    df = frame(n_pairs=6, lengths=(6,), tasks=("alpha",))
    pcfg = ProbeConfig(n_splits=3, backend="sklearn", n_jobs=1, control=False)
    table = probe_sweep(extract_streams(hidden, df, tmp_path / "hd"), pcfg).table
    L = hidden.cfg.n_layers
    assert sorted(table["depth"].unique()) == list(range(2 * (L + 1)))
    curves = stream_curves(table)
    assert set(curves["stream"]) == {1, 2} and set(curves["layer_depth"]) == set(range(L + 1))
    base = make_model(dtype=torch.float64)
    feedback = probe_sweep(extract(base, df, ["standard", "recurrent:1"], tmp_path / "fb", reference=False), pcfg).table
    fig = draw("hidden", table, feedback=feedback)
    assert len(fig.axes) >= 2
    fig.savefig(tmp_path / "hidden.png")
