"""Cheap bounds before expensive work: a checkpoint's config against its tensors before the model is
allocated, pass counts and Jacobi K bounded where they multiply work, seeds and counts in range.
Each case is one line, exit code 2, and nothing written."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from tests.test_bad_input import one_line_error, workdir  # noqa: F401 (the shared fixture)

runner = CliRunner()


def edited_checkpoint(workdir, tmp_path, field, value):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(workdir / "run", run)
    meta = json.loads((run / "config.json").read_text())
    meta["model"][field] = value
    (run / "config.json").write_text(json.dumps(meta))
    return run


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "d_vocab",
            10**12,
            "{run}/model.safetensors: tensor 'embed.weight' has shape (128, 32), config expects (1000000000000, 32)",
        ),
        (
            "n_layers",
            10**9,
            "{run}/config.json: field 'n_layers' is 1000000000, but model.safetensors holds 3 layers; "
            "the config does not describe these weights",
        ),
    ],
    ids=["1e12-vocabulary", "1e9-layers"],
)
def test_a_config_is_checked_against_the_tensors_before_allocation(workdir, tmp_path, field, value, message):  # noqa: F811
    run = edited_checkpoint(workdir, tmp_path, field, value)
    out = tmp_path / "acts"
    res = runner.invoke(app, ["extract", str(run), str(workdir / "data"), "--modes", "standard", "--out", str(out)])
    one_line_error(res, "error: " + message.format(run=run))
    assert not out.exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--seed", "99999999999999999999999"],
            "error: train config: field 'seed' (--seed) must be an integer 0..2**63-1, got 99999999999999999999999",
        ),
        (
            ["--steps", "3", "--one-pass-steps", "99"],
            "error: train config: field 'one_pass_steps' (--one-pass-steps) must be an integer 0..steps (3), got 99",
        ),
        (
            ["--schedule", "99999:1"],
            "error: schedule '99999:1': K 99999 passes: expected K <= 64 (each pass is a forward of the whole "
            "sequence per training step; the paper trains K <= 3)",
        ),
        (
            ["--schedule", "constant:65"],
            "error: schedule 'constant:65': K 65 passes: expected K <= 64",
        ),
    ],
)
def test_train_bounds(tmp_path, args, line):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--out", str(out), *args])
    one_line_error(res, line)
    assert not out.exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (["--rows", "-1"], "error: --rows -1: expected an integer 1..4096 (packed validation rows)"),
        (["--passes", "0"], "error: --passes 0: expected an integer 1..1024"),
        (["--passes", "100000"], "error: --passes 100000: expected an integer 1..1024"),
    ],
)
def test_diagnose_contraction_bounds(workdir, tmp_path, args, line):  # noqa: F811
    out = tmp_path / "diag"
    res = runner.invoke(app, ["diagnose", "contraction", str(workdir / "run"), "--out", str(out), *args])
    one_line_error(res, line)
    assert not out.exists()


def test_tasks_show_refuses_a_negative_count(workdir):  # noqa: F811
    parquet = next((workdir / "data").glob("*.parquet"))
    one_line_error(
        runner.invoke(app, ["tasks", "show", str(parquet), "--n", "-1"]), "error: --n -1: expected an integer >= 1"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--d", "0"], "error: --d 0: expected an integer >= 1"),
        (["--folds", "1"], "error: --folds 1: expected an integer >= 2"),
        (["--n", "6", "--folds", "5"], "error: --n 6: expected at least 2 x --folds (10) samples"),
    ],
)
def test_bench_probes_bounds(tmp_path, args, line):
    out = tmp_path / "bench.md"
    one_line_error(runner.invoke(app, ["bench", "probes", *args, "--out", str(out)]), line)
    assert not out.exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--mode", "jacobi:99999"],
            "error: --mode jacobi:99999: the lens reads every pass of jacobi:K (K hooked passes over the whole input, "
            "each pass's residuals kept); expected K <= 64 (the exact recurrence is --mode full)",
        ),
        (["--seed", "-1"], "error: --seed -1: expected an integer 0..2**63-1"),
    ],
)
def test_lens_bounds(workdir, tmp_path, args, line):  # noqa: F811
    out = tmp_path / "lens"
    res = runner.invoke(app, ["lens", str(workdir / "run"), str(workdir / "data"), "--out", str(out), *args])
    one_line_error(res, line)
    assert not out.exists()
