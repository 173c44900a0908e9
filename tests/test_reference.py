"""Reference models shipped inside the package: loadable by name, verified by hash, and their held-out
accuracy on the check slice recomputed from the weights (an independent oracle for the recorded numbers)."""

import json

import pytest
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe import reference
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import sha256_file
from fbt_probe.marker import write_marker
from fbt_probe.training import TrainConfig, run_training

runner = CliRunner()
SMALL = dict(
    tokens_per_step=300,
    warmup=1,
    eval_every=10_000,
    save_every=1,
    tasks=("completion", "memory"),
    knobs={"completion": [0], "memory": [8]},
)


def test_the_package_ships_the_feedback_model_its_baseline_and_a_hidden_decoding_model():
    shipped = reference.names()
    recs = [reference.record(n) for n in shipped]
    kinds = {(r["arch"], r["baseline"]) for r in recs}
    assert {("feedback", False), ("feedback", True), ("hidden-decoding", False)} <= kinds, shipped


@pytest.mark.parametrize("name", reference.names())
def test_a_shipped_model_loads_by_name_with_its_recorded_hash_and_check_accuracy(name):
    from fbt_probe.tasks import load_tokenizer
    from fbt_probe.training.pack import check_slice

    rec = reference.record(name)
    folder = reference.folder(f"ref:{name}")
    assert checkpoint_hash(folder) == rec["checkpoint_sha256"] == rec["sha256"]["model.safetensors"]
    model = fp.load_model(f"ref:{name}")
    cfg = TrainConfig.from_dict(json.loads((folder / "config.json").read_text())["train"])
    got = check_slice(model, cfg, load_tokenizer(folder / "tokenizer.json"))
    want = {(r["task"], r["length_knob"]): (r["correct"], r["n"]) for r in rec["check"]["rows"]}
    assert set(want) == {(r.task, r.length_knob) for r in got.itertuples()}
    for r in got.itertuples():
        correct, n = want[(r.task, r.length_knob)]
        assert r.n == n
        # the same weights and inputs; a logit tie broken differently by another CPU's BLAS may move
        # one answer of a cell, a different model or a different slice moves many
        assert abs(r.correct - correct) <= 1, (name, r.task, r.length_knob, r.correct, correct)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("refs")
    run = root.parent / "run"
    run_training(TrainConfig(steps=2, **SMALL), run, progress=False, eval_pairs=2)
    res = runner.invoke(app, ["model", "pack", str(run), "--name", "toy", "--out", str(root), "--eval-pairs", "2"])
    assert res.exit_code == 0, res.output
    return root


def test_pack_records_every_file_hash_and_a_card(packed):
    rec = reference.record("toy", packed)
    assert set(rec["sha256"]) == set(reference.FILES)
    for f, h in rec["sha256"].items():
        assert sha256_file(packed / "toy" / f) == h
    card = (packed / "toy" / "card.md").read_text()
    assert rec["checkpoint_sha256"] in card and "fbt-probe train --preset tiny --steps 2 --seed 0" in card
    assert "timing" not in rec and "Training time alone" not in card  # nothing measured, nothing claimed
    assert "lr 0.001 (a cosine to 0.1x after a 1-step warm-up)" in card
    assert reference.folder("ref:toy", packed) == packed / "toy"


def test_a_missing_or_corrupted_shipped_file_is_a_one_line_error(packed, tmp_path, monkeypatch):
    import shutil

    root = tmp_path / "refs"
    shutil.copytree(packed, root)
    monkeypatch.setattr(reference, "ROOT", root)
    assert fp.load_model("ref:toy").cfg.d_model > 0
    weights = root / "toy" / "model.safetensors"
    good = weights.read_bytes()
    data = bytearray(good)
    data[-3] ^= 0xFF  # one flipped bit pattern inside a tensor: the file still parses
    weights.write_bytes(bytes(data))
    with pytest.raises(FbtError, match="ref:toy: shipped file model.safetensors is corrupted"):
        fp.load_model("ref:toy")
    res = runner.invoke(app, ["model", "info", "ref:toy"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "is corrupted" in res.output, res.output
    weights.write_bytes(good)
    (root / "toy" / "tokenizer.json").unlink()
    res = runner.invoke(app, ["extract", "ref:toy", str(tmp_path), "--out", str(tmp_path / "acts")])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "shipped file tokenizer.json is missing" in res.output and not (tmp_path / "acts").exists()
    with pytest.raises(FbtError, match=r"ref:nope: no such reference model \(shipped: ref:toy\)"):
        fp.load_model("ref:nope")


def test_pack_refuses_to_replace_a_folder_that_is_not_a_reference_model(packed, tmp_path):
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "mine.txt").write_text("keep")
    run = packed.parent / "run"
    res = runner.invoke(app, ["model", "pack", str(run), "--name", "toy", "--out", str(tmp_path), "--force"])
    assert res.exit_code == 2 and "is not a reference model folder" in res.output, res.output
    assert (tmp_path / "toy" / "mine.txt").read_text() == "keep"


def test_pack_re_evaluates_a_shipped_model_by_name_and_keeps_its_training_record(packed, tmp_path, monkeypatch):
    """After a change to evaluation the shipped cards are redone without the training run (it is not
    shipped): `model pack ref:<name>` recomputes the accuracy tables from the shipped weights and keeps
    what only training knew (command, CPU, time, steps). Oracle: the tables pack wrote from the run."""
    import shutil

    root = tmp_path / "refs"
    shutil.copytree(packed, root)
    monkeypatch.setattr(reference, "ROOT", root)
    want = reference.record("toy", root)
    rec = json.loads((root / "toy" / reference.RECORD).read_text())
    rec["accuracy"]["rows"], rec["check"]["rows"] = [], []  # stale tables must be recomputed, not kept
    rec["command"], rec["cpu"] = "fbt-probe train --the-line-that-trained-it", "the training machine"
    rec["timing"] = "1,234 s, measured alone"
    (root / "toy" / reference.RECORD).write_text(json.dumps(rec))
    write_marker(root / "toy", "model pack")  # as an earlier pack wrote it (an edit by hand is refused)
    res = runner.invoke(app, ["model", "pack", "ref:toy", "--name", "toy", "--eval-pairs", "2", "--force"])
    assert res.exit_code == 0, res.output
    got = reference.record("toy", root)
    assert got["accuracy"] == want["accuracy"] and got["check"] == want["check"]
    assert (got["command"], got["cpu"]) == (rec["command"], rec["cpu"])
    assert (got["steps"], got["train_seconds"], got["checkpoint_sha256"]) == (
        want["steps"],
        want["train_seconds"],
        want["checkpoint_sha256"],
    )
    assert got["sha256"]["model.safetensors"] == want["sha256"]["model.safetensors"]
    assert "the-line-that-trained-it" in (root / "toy" / "card.md").read_text()
    assert (
        got["timing"] == rec["timing"]
        and "Training time alone: 1,234 s, measured alone" in (root / "toy" / "card.md").read_text()
    )
    res = runner.invoke(
        app, ["model", "pack", "ref:toy", "--name", "toy", "--eval-pairs", "2", "--force", "--timing", "5 s"]
    )
    assert res.exit_code == 0 and reference.record("toy", root)["timing"] == "5 s", res.output
    assert reference.folder("ref:toy", root) == root / "toy"  # every hash verifies after the rewrite


def test_eval_and_diagnose_contraction_take_a_shipped_model_by_name(tmp_path):
    """A shipped model has no optimizer state; `diagnose contraction` and `eval` still read it by name
    (issue 15: Fig. 3 over seeds includes the shipped seed). Oracle: the contraction table recomputed
    from `fp.load_model` on the same validation rows (same kernels, same shapes: exact)."""
    import pandas as pd

    from fbt_probe.tasks import load_tokenizer
    from fbt_probe.training.data import validation_batch
    from fbt_probe.training.evaluate import contraction

    r = runner.invoke(
        app, ["diagnose", "contraction", "ref:tiny-feedback", "--passes", "3", "--out", str(tmp_path / "c")]
    )
    assert r.exit_code == 0, r.output
    got = pd.read_parquet(tmp_path / "c" / "contraction.parquet")
    folder = reference.folder("ref:tiny-feedback")
    cfg = TrainConfig.from_dict(json.loads((folder / "config.json").read_text())["train"])
    want = contraction(
        fp.load_model("ref:tiny-feedback"),
        *validation_batch(cfg, load_tokenizer(folder / "tokenizer.json")),
        n_passes=3,
    )
    assert got["run"].tolist() == ["ref:tiny-feedback"] * 3
    pd.testing.assert_frame_equal(got[want.columns], want)
    prov = json.loads((tmp_path / "c" / "contraction.json").read_text())
    assert prov["checkpoint_sha256"] == reference.record("tiny-feedback")["checkpoint_sha256"]

    r = runner.invoke(app, ["eval", "ref:tiny-feedback", "--pairs", "1", "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    assert set(pd.read_parquet(tmp_path / "e" / "accuracy.parquet")["mode"]) >= {"standard", "full"}


@pytest.mark.parametrize("argv", [["eval", "ref:tiny-feedback"], ["diagnose", "contraction", "ref:tiny-feedback"]])
def test_eval_and_diagnose_refuse_to_write_into_the_package(argv):
    r = runner.invoke(app, argv)
    assert r.exit_code != 0
    assert "needs --out" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_the_card_names_the_lr_schedule_the_run_had():
    from fbt_probe.training.loop import lr_at
    from fbt_probe.training.pack import _lr_schedule

    for cfg, words in [
        (TrainConfig(steps=50, warmup=5, min_lr_ratio=1.0), "constant after a 5-step warm-up"),
        (
            TrainConfig(steps=50, warmup=5, min_lr_ratio=0.1, decay_steps=10),
            "constant after a 5-step warm-up, then a cosine to 0.1x over the last 10 steps",
        ),
        (TrainConfig(steps=50, warmup=5, min_lr_ratio=0.1, decay_steps=45), "a cosine to 0.1x after a 5-step warm-up"),
        (TrainConfig(steps=50, warmup=5, min_lr_ratio=0.1), "a cosine to 0.1x after a 5-step warm-up"),
    ]:
        assert _lr_schedule(cfg.to_dict()) == words
        # the words against the schedule itself: still at the peak at step 30 exactly when they say "constant"
        assert (lr_at(cfg, 30) == cfg.lr) == words.startswith("constant")
