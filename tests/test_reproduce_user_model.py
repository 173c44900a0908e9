"""A user checkpoint's study follows the checkpoint's own training record: its held-out split feeds
the probe datasets and the answer-accuracy samples, its schedule labels the contraction curve, and a
checkpoint without a record (an import) is said to have seen none of the task contexts."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fbt_probe.reproduce.config import (
    HeldOutOfAll,
    ReproConfig,
    schedule_label,
    study_contexts,
    study_training,
    train_config,
    trained_as,
    training_note,
)
from fbt_probe.tasks import generate, load_spec
from fbt_probe.tasks.streams import HeldOut
from fbt_probe.training.config import TrainConfig
from fbt_probe.training.data import heldout


def _folder(path, train: TrainConfig | None):
    path.mkdir(parents=True)
    record = {"model": {}} if train is None else {"model": {}, "train": train.to_dict()}
    (path / "config.json").write_text(json.dumps(record))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    base = train_config(ReproConfig(), False)
    seed5 = TrainConfig.from_dict({**base.to_dict(), "seed": 5, "schedule": "1:.5,4:.5"})
    seed7 = TrainConfig.from_dict({**base.to_dict(), "seed": 7, "baseline": True})
    return {
        "seed5": _folder(tmp_path / "s5", seed5),
        "seed7": _folder(tmp_path / "s7", seed7),
        "import": _folder(tmp_path / "imp", None),
        "cfg5": seed5,
    }


def test_a_trained_checkpoint_brings_its_own_split_and_schedule(runs):
    cfg = ReproConfig(model=runs["seed5"])
    assert trained_as(cfg, "feedback") == runs["cfg5"] and study_training(cfg) == runs["cfg5"]
    ctx = study_contexts(cfg, heldout)
    assert isinstance(ctx, HeldOut) and (ctx.seed, ctx.fraction) == (5, 0.2)
    # the datasets come from contexts held out under seed 5, not under the preset's seed 0
    df = generate(load_spec("memory").replace(length_grid=[8]), groups=40, seed=1, contexts=ctx)
    own, preset = HeldOut(0.2, 5, ctx.tasks), HeldOut(0.2, 0, ctx.tasks)
    assert all(c in own for c in df["context_id"])
    assert not all(c in preset for c in df["context_id"])
    assert schedule_label(cfg, "feedback") == "1:.5,4:.5"
    assert "seed 5" in training_note(cfg) and "held-out contexts only" in training_note(cfg)


def test_a_baseline_with_another_split_restricts_to_contexts_held_out_of_both(runs):
    cfg = ReproConfig(model=runs["seed5"], baseline=runs["seed7"])
    ctx = study_contexts(cfg, heldout)
    assert isinstance(ctx, HeldOutOfAll)
    s5, s7 = HeldOut(0.2, 5, ctx.splits[0].tasks), HeldOut(0.2, 7, ctx.splits[0].tasks)
    df = generate(load_spec("memory").replace(length_grid=[8]), groups=20, seed=1, contexts=ctx)
    assert all(c in s5 and c in s7 for c in df["context_id"])
    ids = [f"memory:c{i:x}" for i in range(4000)]
    assert any(c in s5 and c not in s7 for c in ids)  # the intersection is a real restriction
    assert schedule_label(cfg, "baseline") == "constant:1"
    # a task the model's training left out is not restricted by it
    assert "compose:k2:01" in HeldOutOfAll([HeldOut(0.2, 5, frozenset({"memory"}))])


def test_an_import_without_a_record_is_said_to_be_untrained_on_the_tasks(runs):
    cfg = ReproConfig(model=runs["import"])
    assert trained_as(cfg, "feedback") is None
    assert study_training(cfg) == train_config(cfg, False)  # the preset's split: a fixed subset of unseen contexts
    assert schedule_label(cfg, "feedback") == "not recorded"
    from fbt_probe.reproduce.parts.contraction import trained_passes

    table = pd.DataFrame({"run": ["feedback", "baseline"], "schedule": ["not recorded", "constant:1"]})
    assert trained_passes(table) == {"baseline": 1}  # no trained depth to mark for an import
    assert "not trained on these tasks" in training_note(cfg)


def test_the_presets_study_is_unchanged():
    cfg = ReproConfig()
    assert study_training(cfg) == train_config(cfg, False) and training_note(cfg) == ""
    ctx = study_contexts(cfg, heldout)
    assert ctx is heldout(train_config(cfg, False))
    assert schedule_label(cfg, "baseline") == "constant:1"
    assert schedule_label(cfg, "feedback") == train_config(cfg, False).schedule


def test_checkpoints_the_feedback_study_does_not_apply_to_are_refused_before_anything_is_written(tmp_path):
    import fbt_probe as fp
    from fbt_probe.errors import FbtError
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.formats.qwen3 import export_qwen3
    from fbt_probe.reference import folder
    from fbt_probe.reproduce.pipeline import check_study_models, reproduce
    from fbt_probe.tasks import build_tokenizer, save_tokenizer

    hidden = str(folder("tiny-hidden"))
    qwen = tmp_path / "qwen3"
    export_qwen3(fp.load_model("tiny", depth_scaling="none"), qwen)
    ours = tmp_path / "ours"
    save_checkpoint(fp.load_model("tiny"), ours)
    save_tokenizer(build_tokenizer(), ours / "tokenizer.json")
    out = tmp_path / "study"
    for cfg, said in (
        (ReproConfig(model=hidden), "fbt-probe figures hidden"),
        (ReproConfig(model=str(ours), baseline=hidden), "--baseline"),
        (ReproConfig(model=str(qwen)), "pass it as --baseline"),
    ):
        with pytest.raises(FbtError, match="does not apply|no trained fusion") as err:
            reproduce(cfg, out, echo=lambda *_: None)
        assert said in str(err.value) and "\n" not in str(err.value)
        assert not out.exists()  # nothing written
    check_study_models(ReproConfig(model=str(ours), baseline=str(qwen)))  # a Qwen3 baseline: the untrained fusion
    check_study_models(ReproConfig(model=str(ours)))


def test_the_study_device_is_refused_where_unavailable_and_keys_only_a_non_cpu_study(tmp_path):
    import torch
    from typer.testing import CliRunner

    from fbt_probe.cli import app
    from fbt_probe.reproduce.pipeline import build_stages

    if not torch.cuda.is_available():
        res = CliRunner().invoke(app, ["reproduce", "--device", "cuda", "--out", str(tmp_path / "s")])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert "CUDA is not available" in res.output and not (tmp_path / "s").exists()
    res = CliRunner().invoke(
        app,
        ["reproduce", "--device", "cpu", "--jobs", "1", "--model", str(tmp_path / "no"), "--out", str(tmp_path / "o")],
    )
    assert res.exit_code == 2 and "checkpoint folder not found" in res.output
    cpu = {s.name: s.inputs for s in build_stages(ReproConfig(shipped=True), tmp_path)}
    gpu = {s.name: s.inputs for s in build_stages(ReproConfig(shipped=True, device="cuda:1"), tmp_path)}
    assert all("device" not in k for k in cpu.values())  # a CPU study keeps its stage keys
    assert all(k.get("device") == "cuda:1" for k in gpu.values() if "seed" in k)


def test_the_study_under_several_processes_is_refused_naming_what_scales(monkeypatch, tmp_path):
    import fbt_probe.distributed as distributed
    from fbt_probe.cli.reproduce import check_one_process
    from fbt_probe.errors import FbtError

    check_one_process()  # one process: nothing to refuse
    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=1, size=4, local_rank=1))
    with pytest.raises(FbtError, match="4 processes") as err:
        check_one_process()
    assert "extract, patch" in str(err.value) and "--device cuda" in str(err.value)
