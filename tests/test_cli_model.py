"""The model CLI: summaries, import/export, one-line errors with exit code 2."""

import torch
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.cli import app

runner = CliRunner()


def test_model_info_paper_1b_reports_fusion_parameters():
    res = runner.invoke(app, ["model", "info", "paper-1b"])
    assert res.exit_code == 0, res.output
    assert "2·D² = 4,718,592" in res.output and "n_layers           24" in res.output


def test_demo_runs_three_decodings():
    res = runner.invoke(app, ["demo", "--new-tokens", "3"])
    assert res.exit_code == 0, res.output
    assert all(f"  {m}" in res.output for m in ("std", "soft", "fused"))


def test_missing_model_is_a_one_line_error(tmp_path):
    res = runner.invoke(app, ["model", "info", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "neither a preset" in res.output


def test_import_export_cli_round_trip(tmp_path):
    model = fp.load_model("tiny", depth_scaling="none")
    from fbt_probe.formats.qwen3 import export_qwen3

    export_qwen3(model, tmp_path / "hf")
    res = runner.invoke(app, ["model", "import-hf", str(tmp_path / "hf"), str(tmp_path / "ckpt")])
    assert res.exit_code == 0, res.output
    loaded = fp.load_model(str(tmp_path / "ckpt"))
    for (n, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), n
    again = runner.invoke(app, ["model", "import-hf", str(tmp_path / "hf"), str(tmp_path / "ckpt")])
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    corrupt = tmp_path / "ckpt" / "model.safetensors"
    corrupt.write_bytes(b"not a safetensors file")
    bad = runner.invoke(app, ["model", "info", str(tmp_path / "ckpt")])
    assert bad.exit_code == 2 and "corrupt safetensors" in bad.output


def test_refs_quotes_the_cards_time_alone():
    """`model refs` quotes the time measured alone that the card states, not the optimizer steps' sum
    (an upper bound when the model trained beside other jobs)."""
    import re

    from fbt_probe.reference import ROOT

    out = runner.invoke(app, ["model", "refs"]).output
    card = (ROOT / "tiny-feedback" / "card.md").read_text()
    minutes = re.search(r"Training time alone: [^(]*\(([\d.]+) min\)", card).group(1)
    line = next(ln for ln in out.splitlines() if ln.startswith("ref:tiny-feedback"))
    assert f"{minutes} min to retrain alone (card)" in line
