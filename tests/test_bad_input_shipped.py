"""Every command that reads a model, on every shipped model: it runs, or refuses in one line (never a
traceback); and the shipped models' records and names are checked on load."""
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe import reference
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset
from tests.test_bad_input import one_line_error

runner = CliRunner()
SHIPPED = reference.names()
EXPERIMENTS = ["feedback-swap", "state-replacement", "gate-ablation", "residual", "probe-direction", "attribution", "das"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("shipped")
    tok = build_tokenizer()
    df = generate(dataclasses.replace(load_spec("completion"), length_grid=(0,)), groups=2, seed=0, tokenizer=tok)
    write_dataset(df, root / "data", tok)
    return root / "data"


def commands(ref: str, data: Path, out: Path) -> list[list[str]]:
    few = ["--n-boot", "10", "--no-figures"]
    return [
        ["model", "info", ref],
        ["extract", ref, str(data), "--out", str(out / "acts")],
        *[["patch", ref, str(data), "--experiment", e, "--out", str(out / "patch"), "--ks", "1", "--steps", "2", *few]
          for e in EXPERIMENTS],
        ["lens", ref, str(data), "--steps", "0", "--mode", "standard", "--out", str(out / "lens"), *few],
        ["lens", ref, str(data), "--steps", "0", "--out", str(out / "lens-modes"), *few],
        ["diagnose", "contraction", ref, "--passes", "2", "--rows", "2", "--out", str(out / "diag")],
        ["model", "export-hf", ref, str(out / "hf")],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_command_runs_or_refuses_in_one_line_on_every_shipped_model(data, tmp_path, name):
    """A latent-feedback model runs every command (export-hf may refuse a config Qwen3 cannot hold);
    a Hidden Decoding model runs the others and is refused by patch, lens and the contraction diagnostic."""
    ref = f"ref:{name}"
    hidden = reference.record(name)["arch"] == "hidden-decoding"
    for args in commands(ref, data, tmp_path):
        res = runner.invoke(app, args)
        if res.exit_code == 0:
            continue
        assert isinstance(res.exception, SystemExit), (args, repr(res.exception))  # never a traceback
        if args[0] in ("patch", "lens") and hidden:
            one_line_error(res, f"{ref}: a hidden-decoding model")
        elif args[0] == "diagnose" and hidden:
            one_line_error(res, "a hidden-decoding model has no feedback passes")
        elif args[:2] == ["model", "export-hf"]:
            one_line_error(res, "only 'none' is a Qwen3 function")
        else:
            raise AssertionError((args, res.output))


def test_patch_and_lens_refuse_a_hidden_decoding_model_in_one_line(data, tmp_path):
    for args in (["patch", "ref:tiny-hidden", str(data), "--experiment", "feedback-swap", "--out", str(tmp_path / "p")],
                 ["lens", "ref:tiny-hidden", str(data), "--out", str(tmp_path / "l")],
                 ["lens", "ref:tiny-hidden", str(data), "--mode", "standard", "--out", str(tmp_path / "l")]):
        res = runner.invoke(app, args)
        one_line_error(res, f"ref:tiny-hidden: a hidden-decoding model (2 streams per token, one pass): `fbt-probe {args[0]}`")
    assert not (tmp_path / "p").exists() and not (tmp_path / "l").exists()


@pytest.fixture
def copied_refs(tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(reference.ROOT, root)
    monkeypatch.setattr(reference, "ROOT", root)
    return root


@pytest.mark.parametrize("edit, named", [
    (lambda r: r.pop("accuracy"), "field 'accuracy' missing"),
    (lambda r: r.pop("train_seconds"), "field 'train_seconds' missing"),
    (lambda r: r.update(steps="many"), "field 'steps' must be an integer, got str"),
    (lambda r: r.update(baseline=1), "field 'baseline' must be true or false, got int"),
    (lambda r: r["accuracy"]["rows"][0].pop("correct"), "field 'accuracy.rows[0].correct' missing"),
    (lambda r: r["accuracy"].pop("rows"), "field 'accuracy.rows' missing or not a list"),
    (lambda r: r["check"].update(rows={}), "field 'check.rows' missing or not a list"),
    (lambda r: r["accuracy"]["rows"][1].update(n=0), "field 'accuracy.rows[1]' must have 0 <= correct <= n"),
    (lambda r: r["check"]["rows"][0].pop("task"), "field 'check.rows[0].task' missing"),
])
def test_a_tampered_reference_record_is_one_line(copied_refs, edit, named):
    path = copied_refs / "tiny-feedback" / "reference.json"
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))
    res = runner.invoke(app, ["model", "refs"])
    one_line_error(res, f"{path}: {named}")
    assert res.output.rstrip().endswith("; reinstall fbt-probe")
    with pytest.raises(FbtError, match="reinstall fbt-probe"):
        fp.load_model("ref:tiny-feedback")


def test_a_model_may_be_named_by_a_path():
    by_path, by_str = fp.load_model(Path("ref:tiny-feedback")), fp.load_model("ref:tiny-feedback")
    assert by_path.cfg == by_str.cfg
    assert all((a == b).all() for a, b in zip(by_path.state_dict().values(), by_str.state_dict().values()))
    assert fp.load_model(Path("tiny")).cfg == fp.load_model("tiny").cfg
    with pytest.raises(FbtError, match="ref:nope: no such reference model"):
        fp.load_model(Path("ref:nope"))
