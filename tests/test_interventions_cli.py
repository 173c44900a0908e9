"""`fbt-probe patch`: end to end on a saved small checkpoint and a written dataset; outputs, refusals,
figures drawn from the written tables."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.interventions import PatchConfig, load_pairs, run
from fbt_probe.interventions.registry import ProbeDirectionOptions, ResidualOptions
from tests.helpers import make_model, patch_workdir

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return patch_workdir(tmp_path_factory.mktemp("patch"))


def test_patch_cli_writes_tables_manifest_and_figures(workdir):
    out = workdir / "results"
    args = [
        "patch",
        str(workdir / "run"),
        str(workdir / "data"),
        "--experiment",
        "feedback-swap",
        "--mode",
        "recurrent:1",
        "--out",
        str(out),
        "--n-boot",
        "50",
        "--min-gap",
        "0",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "normalized" in res.output and "tiny-gap" in res.output
    folder = out / "feedback-swap"
    for name in (
        "rows.parquet",
        "rows.csv",
        "summary.parquet",
        "summary.csv",
        "manifest.json",
        "figures/ablation-bars.png",
    ):
        assert (folder / name).is_file(), name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["hook_rule"].startswith("one-pass")
    assert manifest["provenance"]["checkpoint_hash"] and manifest["provenance"]["dataset_hash"]
    assert (
        manifest["tiny_gap"]["by_mode"]["recurrent:1"]["pairs"] == 18
    )  # completion 3 groups x 2 pairs x 2 lengths, memory 3 x 2
    rows = pd.read_parquet(folder / "rows.parquet")
    assert {"pair_id", "condition", "metric", "value", "hook_rule", "tiny_gap"} <= set(rows.columns)
    from fbt_probe.figures import draw

    assert draw("ablation-bars", folder, metric="accuracy") is not None  # the registry finds summary.parquet
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "refusing to overwrite" in again.output
    assert runner.invoke(app, args + ["--force"]).exit_code == 0


def test_patch_cli_errors_are_one_line(workdir):
    res = runner.invoke(
        app, ["patch", str(workdir / "run"), str(workdir / "data"), "--experiment", "nope", "--out", str(workdir / "x")]
    )
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0 and "expected one of" in res.output
    res = runner.invoke(
        app,
        [
            "patch",
            str(workdir / "nope"),
            str(workdir / "data"),
            "--experiment",
            "residual",
            "--out",
            str(workdir / "x"),
        ],
    )
    assert res.exit_code == 2 and "neither a preset" in res.output


def test_residual_and_probe_direction_figures_from_written_tables(workdir):
    from fbt_probe.figures import get_figure

    model = make_model()
    df = load_pairs(workdir / "data", ["completion"])
    res = run(
        model,
        df,
        PatchConfig(
            "residual", modes=("standard", "recurrent:1"), options=ResidualOptions(depths=(0, 3)), n_boot=50, min_gap=0
        ),
        out=workdir / "lib",
    )
    summary = pd.read_parquet(res.out_dir / "summary.parquet")
    assert set(summary["hook_rule"]) == {"one-pass", "serial"}
    assert (res.out_dir / "figures" / "patching-heatmap.png").is_file()
    pd_res = run(
        model,
        df,
        PatchConfig(
            "probe-direction",
            options=ProbeDirectionOptions(depths=(0, 1), scales=(1.0,), n_folds=2, erase="orth"),
            n_boot=50,
            min_gap=0,
        ),
    )
    for name in ("decodable-vs-used", "steering-sweep"):
        get_figure(name)(pd_res.summary)
    with pytest.raises(Exception, match="no rows of experiment"):
        get_figure("ablation-bars")(pd_res.summary)


def test_patch_cli_runs_several_experiments_into_their_folders(workdir):
    out = workdir / "several"
    args = [
        "patch",
        str(workdir / "run"),
        str(workdir / "data"),
        "--experiment",
        "feedback-swap,probe-direction,residual",
        "--out",
        str(out),
        "--n-boot",
        "20",
        "--depths",
        "0,2",
        "--scales",
        "1",
        "--folds",
        "2",
        "--no-figures",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for name in ("feedback-swap", "probe-direction", "residual"):
        assert (out / name / "summary.parquet").is_file() and (out / name / "manifest.json").is_file()
        assert f"wrote {out / name}" in res.output
    # an existing folder of any of them: refused before anything runs, nothing else written
    again = runner.invoke(app, args[:4] + ["gate-ablation,feedback-swap"] + args[5:])
    assert again.exit_code == 2 and "feedback-swap: already exists" in again.output
    assert not (out / "gate-ablation").exists()


def test_patch_cli_refuses_a_repeated_experiment_in_one_line(workdir):
    res = runner.invoke(
        app,
        [
            "patch",
            str(workdir / "run"),
            str(workdir / "data"),
            "--experiment",
            "feedback-swap,feedback-swap",
            "--out",
            str(workdir / "dup"),
        ],
    )
    assert res.exit_code == 2 and "each experiment at most once" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (workdir / "dup").exists()


def test_probe_direction_edits_the_carried_state_with_feedback_and_refuses_it_under_standard(workdir):
    """--feedback adds the carried state fed to the final position (depth -1) to the probed depths,
    with the steering figure drawn for it; under standard prefill no state is fed, so it is refused in
    one line and nothing is written."""
    base = ["patch", str(workdir / "run"), str(workdir / "data"), "--experiment", "probe-direction"]
    few = ["--depths", "0", "--scales", "1", "--folds", "2", "--erase", "orth", "--n-boot", "20", "--min-gap", "0"]
    out = workdir / "carried"
    res = runner.invoke(app, [*base, *few, "--feedback", "--mode", "recurrent:1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = pd.read_parquet(out / "probe-direction" / "rows.parquet")
    assert sorted(set(rows["depth"])) == [-1, 0]
    assert {"probe", "erase-orth", "steer", "steer-random"} <= set(rows.loc[rows["depth"] == -1, "condition"])
    summary = out / "probe-direction" / "summary.parquet"
    res = runner.invoke(
        app, ["figures", "steering-sweep", str(summary), "--option", "depth=-1", "--out", str(workdir / "carried-fig")]
    )
    assert res.exit_code == 0, res.output
    assert (workdir / "carried-fig" / "steering-sweep.png").is_file()
    refused = workdir / "carried-standard"
    res = runner.invoke(app, [*base, *few, "--feedback", "--mode", "standard", "--out", str(refused)])
    assert res.exit_code != 0 and "feeds no state into the final position" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not refused.exists()
