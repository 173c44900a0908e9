"""`fbt-probe patch --experiment attribution|das` end to end on a saved small checkpoint: tables,
manifest, figures, the parity lines, and refusals."""

import dataclasses
import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.tasks import build_tokenizer, generate, load_spec, save_tokenizer, write_dataset
from tests.helpers import make_model

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("methods")
    tok = build_tokenizer()
    for task in ("completion", "memory"):
        df = generate(dataclasses.replace(load_spec(task), length_grid=(8,)), groups=4, seed=0, tokenizer=tok)
        write_dataset(df, root / "data", tok)
    save_tokenizer(tok, root / "tokenizer.json")
    save_checkpoint(make_model(dtype=torch.float32), root / "run", tokenizer_path=root / "tokenizer.json")
    return root


def _patch(workdir, *extra):
    return runner.invoke(
        app,
        [
            "patch",
            str(workdir / "run"),
            str(workdir / "data"),
            "--out",
            str(workdir / "res"),
            "--n-boot",
            "30",
            "--min-gap",
            "0",
            *extra,
        ],
    )


def test_attribution_cli_with_check(workdir):
    res = _patch(workdir, "--experiment", "attribution", "--mode", "standard,jacobi:2", "--check", "3", "--last-k", "5")
    assert res.exit_code == 0, res.output
    assert "AtP vs exact on 6 cells" in res.output and "Spearman" in res.output
    folder = workdir / "res" / "attribution"
    for f in (
        "rows.parquet",
        "summary.csv",
        "parity.parquet",
        "parity.csv",
        "atp_rows.parquet",
        "figures/atp-heatmap.png",
        "figures/atp-parity.png",
    ):
        assert (folder / f).is_file(), f
    assert not (folder / "atp_rows.csv").exists()
    rows, every = pd.read_parquet(folder / "rows.parquet"), pd.read_parquet(folder / "atp_rows.parquet")
    assert set(rows["method"]) == {"atp", "exact"} and set(every["method"]) == {"atp"}
    cells = ["task", "mode", "direction", "hook", "pass_index", "position"]
    assert len(rows[cells].drop_duplicates()) == 2 * 2 * 2 * 6  # tasks × modes × directions × (3 top + 3 random)
    assert len(every[cells].drop_duplicates()) > 4 * len(rows[cells].drop_duplicates())
    man = json.loads((folder / "manifest.json").read_text())
    assert "parity.csv" in man["files"] and "atp_rows.parquet" in man["files"] and "atp_rows.csv" not in man["files"]
    assert man["provenance"]["config"]["options"]["check"] == 3
    par = pd.read_parquet(folder / "parity.parquet")
    assert set(par["mode"]) == {"standard", "jacobi:2"} and set(par["hook_rule"]) == {"one-pass", "serial"}
    s = pd.read_parquet(folder / "summary.parquet")
    assert set(s.loc[s["mode"] == "jacobi:2", "pass_index"]) == {1, 2} and set(s["method"]) == {"atp", "exact"}


def test_das_cli(workdir):
    res = _patch(
        workdir,
        "--experiment",
        "das",
        "--mode",
        "recurrent:1",
        "--ks",
        "1,2",
        "--steps",
        "3",
        "--folds",
        "2",
        "--hooks",
        "fusion.hook_feedback",
    )
    assert res.exit_code == 0, res.output
    assert "fusion.hook_feedback: IIA full" in res.output and "cos(probe)" in res.output
    folder = workdir / "res" / "das"
    for f in ("das_folds.parquet", "das_folds.csv", "summary.parquet", "figures/das-iia.png"):
        assert (folder / f).is_file(), f
    s = pd.read_parquet(folder / "summary.parquet")
    assert set(s["subspace_dim"]) == {1, 2, 32} and {"iia", "iia_choice"} <= set(s["metric"])
    iia = s[s["metric"].isin(["iia", "iia_choice"])]  # proportions: Wilson at n = groups, never zero width
    assert (iia["interval"] == "wilson").all() and (iia["n_groups"] >= 1).all()
    assert (iia["ci_low"] < iia["ci_high"]).all()
    assert ((iia["ci_low"] <= iia["mean"]) & (iia["mean"] <= iia["ci_high"])).all()


def test_methods_cli_refusals(workdir):
    res = _patch(workdir, "--experiment", "das", "--ks", "0", "--out", str(workdir / "x"))
    assert res.exit_code == 2 and "--ks 0: expected distinct subspace dimensions >= 1" in res.output
    res = _patch(
        workdir, "--experiment", "attribution", "--hooks", "blocks.9.hook_resid_pre", "--out", str(workdir / "y")
    )
    assert res.exit_code == 2 and "unknown hook" in res.output and res.output.strip().count("\n") == 0
    assert not (workdir / "y").exists()
