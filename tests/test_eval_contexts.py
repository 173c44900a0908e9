"""`fbt-probe eval`'s answer loss and its `--contexts`: the loss is the cross-entropy of the answer
token over the whole vocabulary (recomputed here in float64 from the model's logits), and
`--contexts trained` reads only the contexts the run trains on, `held-out` only those its split
keeps out; a corpus run or an unknown value is refused in one line."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.tasks import load_spec, load_tokenizer
from fbt_probe.training import TrainConfig, run_training
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.curriculum import Trained
from fbt_probe.training.data import heldout
from fbt_probe.training.evaluate import answer_accuracy, eval_samples
from tests.test_bad_input import one_line_error

runner = CliRunner()
SMALL = dict(tokens_per_step=300, warmup=1, eval_every=10_000, tasks=("completion", "memory"))
KNOBS = {"completion": [0], "memory": [8]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ctx") / "run"
    run_training(TrainConfig(steps=3, knobs=KNOBS, **SMALL), out, progress=False, eval_pairs=2)
    return out


def test_answer_loss_is_the_answer_tokens_cross_entropy(run):
    model, cfg, folder = load_trained(str(run))
    tok = load_tokenizer(folder / "tokenizer.json")
    samples = eval_samples(cfg, tok, pairs=3, knobs=KNOBS)
    modes = ("standard", "recurrent:1", "full")
    table = answer_accuracy(model, samples, tok, modes=modes)
    for (task, mode), cell in table.groupby(["task", "mode"]):
        rows = samples[samples["task"] == task]
        words = load_spec(task).label_words
        answer = torch.tensor([tok.token_to_id(words[y]) for y in rows["label"]])
        with torch.no_grad():
            last = model(torch.tensor(rows["token_ids"].tolist()), mode=mode)[:, -1].double()
        want = torch.nn.functional.cross_entropy(last, answer).item()  # the mean over the cell's samples
        assert cell["answer_loss"].iloc[0] == pytest.approx(want, rel=1e-6, abs=1e-9), (task, mode)
    # untrained models differ by mode: the loss is each mode's own
    assert table.groupby("task")["answer_loss"].nunique().gt(1).all()


def test_an_answer_word_of_several_tokens_gives_no_loss_rather_than_a_partial_mean(run):
    model, cfg, folder = load_trained(str(run))
    tok = load_tokenizer(folder / "tokenizer.json")
    samples = eval_samples(cfg, tok, pairs=2, knobs=KNOBS)
    broken = samples.copy()
    broken.loc[broken.index[0], "label_word"] = "no such word"  # one row of one cell: not one token
    table = answer_accuracy(model, broken, tok, modes=("standard",)).set_index("task")
    assert np.isnan(table.loc["completion", "answer_loss"]) and np.isfinite(table.loc["memory", "answer_loss"])


def test_contexts_trained_reads_the_words_the_run_trains_on(run, tmp_path):
    model, cfg, _ = load_trained(str(run))
    held = heldout(cfg)
    for contexts, expect_held in ((None, True), (Trained(held), False)):
        drawn = eval_samples(cfg, load_tokenizer(run / "tokenizer.json"), pairs=4, knobs=KNOBS, contexts=contexts)
        assert len(drawn) > 0 and all((c in held) == expect_held for c in drawn["context_id"])
    for contexts in ("held-out", "trained"):
        out = tmp_path / contexts
        res = runner.invoke(app, ["eval", str(run), "--pairs", "2", "--contexts", contexts, "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert f"answer loss (nats; {contexts} contexts)" in res.output
        table = pd.read_parquet(out / "accuracy.parquet")
        assert set(table["contexts"]) == {contexts} and table["answer_loss"].gt(0).all()
        assert json.loads((out / "accuracy.json").read_text())["contexts"] == contexts
    losses = [pd.read_parquet(tmp_path / c / "accuracy.parquet")["answer_loss"] for c in ("held-out", "trained")]
    assert not np.allclose(*losses)  # other words drawn, other losses


def test_a_bad_contexts_value_and_a_corpus_run_are_refused_in_one_line(run, tmp_path):
    res = runner.invoke(app, ["eval", str(run), "--contexts", "train", "--out", str(tmp_path / "a")])
    one_line_error(res, "--contexts train: expected one of held-out, trained")
    res = runner.invoke(app, ["eval", "ref:small-lm-feedback", "--contexts", "trained", "--out", str(tmp_path / "b")])
    one_line_error(res, "never on a task's words")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
