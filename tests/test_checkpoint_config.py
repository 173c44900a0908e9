"""A checkpoint's config is complete: a missing or ill-typed field is a one-line error naming it;
format fbt-probe/1 folders (written before two initialisation-only fields existed) still load."""

import json

import pytest
import torch
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.cli import app
from fbt_probe.config import LEGACY_MODEL_DEFAULTS, ModelConfig
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import FORMAT, LEGACY_FORMAT, save_checkpoint
from tests.helpers import make_model, tokens

runner = CliRunner()


@pytest.fixture()
def ckpt(tmp_path):
    model = make_model(dtype=torch.float32, rope_theta=1e6, depth_scaling="none")
    save_checkpoint(model, tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


def edit_config(folder, fn):
    path = folder / "config.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def test_every_field_is_recorded(ckpt):
    _, folder = ckpt
    meta = json.loads((folder / "config.json").read_text())
    assert meta["fbt_probe_format"] == FORMAT
    assert set(meta["model"]) == {f for f in ModelConfig.__dataclass_fields__}


def test_missing_fields_are_named_not_defaulted(ckpt):
    """Before: rope_theta 1e4 and depth scaling on were silently taken (logits moved by 0.31)."""
    _, folder = ckpt
    edit_config(folder, lambda m: [m["model"].pop(k) for k in ("rope_theta", "depth_scaling")])
    with pytest.raises(FbtError, match="model config field 'rope_theta' missing"):
        fp.load_model(str(folder))
    res = runner.invoke(app, ["model", "info", str(folder)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "'rope_theta' missing" in res.output


def test_a_legacy_folder_loads_with_its_documented_defaults_only(ckpt):
    model, folder = ckpt
    edit_config(
        folder, lambda m: m.update(fbt_probe_format=LEGACY_FORMAT) or [m["model"].pop(k) for k in LEGACY_MODEL_DEFAULTS]
    )
    again = fp.load_model(str(folder))
    toks = tokens(2, 7)
    with torch.no_grad():
        assert torch.equal(
            again(toks, mode="recurrent:1"), model(toks, mode="recurrent:1")
        )  # weights override the init fields
    edit_config(folder, lambda m: m["model"].pop("rope_theta"))
    with pytest.raises(FbtError, match="'rope_theta' missing"):
        fp.load_model(str(folder))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("n_layers", "four", "field 'n_layers' must be an integer >= 1"),
        ("n_layers", 0, "field 'n_layers' must be an integer >= 1"),
        ("dtype", "float8", "field 'dtype' must be one of"),
        ("rope_theta", "big", "field 'rope_theta' must be a number > 0"),
        ("window", 2.5, "field 'window' must be a positive integer or null"),
        ("fast_fusion", "yes", "field 'fast_fusion' must be true or false"),
    ],
)
def test_ill_typed_fields_are_one_line_errors(ckpt, field, value, match):
    _, folder = ckpt
    edit_config(folder, lambda m: m["model"].update({field: value}))
    res = runner.invoke(app, ["model", "info", str(folder)])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert match in res.output


def test_a_run_records_every_train_config_field(tmp_path):
    """Every field but those added after format fbt-probe/2, which are recorded only when used (so a
    default run's config.json has the fields it had before them), and those too when set."""
    from fbt_probe.training import TrainConfig
    from fbt_probe.training.checkpoint import save_run
    from fbt_probe.training.config import ADDED_FIELDS

    model = fp.load_model("tiny")
    opt = torch.optim.AdamW(model.parameters())
    used = TrainConfig(
        steps=2,
        tasks=("registers",),
        register_mix="2:wpr:1:0",
        register_queries=2,
        init="x",
        init_sha256="0" * 64,
        copy_steps=1,
        register_steps=1,
        register_ramp="2:1",
        decay_steps=1,
        fork="x",
        fork_sha256="0" * 64,
        k_curriculum="2,4,8@0.9",
    )
    corpus_only = {"corpus", "corpus_sha256", "seq_len"}  # a corpus run's fields, refused beside --tasks
    (tmp_path / "used").mkdir()
    save_run(model, opt, used, tmp_path / "used", 0)
    assert (
        set(json.loads((tmp_path / "used" / "config.json").read_text())["train"])
        == set(TrainConfig.__dataclass_fields__) - corpus_only
    )
    lm = TrainConfig(steps=2, corpus="c", corpus_sha256="0" * 64, seq_len=8, tokens_per_step=64)
    (tmp_path / "lm").mkdir()
    save_run(model, opt, lm, tmp_path / "lm", 0)
    recorded = set(json.loads((tmp_path / "lm" / "config.json").read_text())["train"])
    assert corpus_only <= recorded and not {"fork", "fork_sha256"} & recorded
    cfg = TrainConfig(steps=1)
    (tmp_path / "run").mkdir()
    save_run(model, opt, cfg, tmp_path / "run", 0)
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(meta["train"]) == set(TrainConfig.__dataclass_fields__) - set(ADDED_FIELDS)
    del meta["train"]["lr"]
    (tmp_path / "run" / "config.json").write_text(json.dumps(meta))
    res = runner.invoke(app, ["eval", str(tmp_path / "run")])
    assert res.exit_code == 2 and "train config field 'lr' missing" in res.output
