"""Bad input to `fbt-probe train`: a resume continues the recorded run (options that differ are
refused by name), every float option is finite and in range, and a damaged train state is one line."""

import json

import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from tests.test_bad_input import one_line_error

runner = CliRunner()
SMALL = ["--tasks", "completion", "--tokens-per-step", "200", "--warmup", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-step run (its bytes are compared, never changed, by the tests that read it)."""
    out = tmp_path_factory.mktemp("train") / "run"
    res = runner.invoke(app, ["train", "--out", str(out), "--steps", "3", *SMALL])
    assert res.exit_code == 0, res.output
    return out


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_resume_without_steps_trains_to_the_recorded_total(finished):
    before = snapshot(finished)
    res = runner.invoke(app, ["train", "--resume", "--out", str(finished)])
    assert res.exit_code == 0, res.output
    assert "the run is finished (3 of 3 steps)" in res.output and "trained" not in res.output
    assert snapshot(finished) == before


@pytest.mark.parametrize(
    "args, named",
    [
        (["--lr", "5"], "--lr 5.0 (recorded: 0.001)"),
        (["--schedule", "constant:3"], "--schedule constant:3 (recorded: 1:0.75,2:0.22,3:0.03)"),
        (["--seed", "7"], "--seed 7 (recorded: 0)"),
        (["--baseline"], "--baseline True (recorded: False)"),
        (["--lam", "0.5"], "--lam 0.5 (recorded: 1.0)"),
        (["--tasks", "memory"], "--tasks memory (recorded: completion)"),
        (["--recipe", "reference"], "--copy-steps 500 (recorded: 0)"),
        (["--init", "ref:tiny-baseline"], "--init ref:tiny-baseline (recorded: None)"),
    ],
)
def test_resume_refuses_an_option_that_differs_from_the_record(finished, args, named):
    before = snapshot(finished)
    res = runner.invoke(app, ["train", "--resume", "--out", str(finished), "--steps", "4", *args])
    one_line_error(res, named)
    assert "a resume continues the recorded run" in res.output
    assert snapshot(finished) == before


def test_resume_accepts_the_recorded_options_and_refuses_fewer_steps(finished, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    res = runner.invoke(app, ["train", "--resume", "--out", str(run), "--steps", "2"])
    one_line_error(res, "--steps 2: the run records 3 steps")
    res = runner.invoke(app, ["train", "--resume", "--out", str(run), "--steps", "4", "--schedule", "paper", *SMALL])
    assert res.exit_code == 0, res.output
    meta = json.loads((run / "config.json").read_text())
    assert meta["step"] == 4 and meta["train"]["steps"] == 4


@pytest.mark.parametrize(
    "args, named",
    [
        (["--schedule", "1:nan"], "schedule '1:nan': each K must be a distinct integer >= 1 with a finite p >= 0"),
        (["--schedule", "1:inf,2:-inf"], "with a finite p >= 0"),
        (["--lam", "nan"], "field 'lam' (--lam) must be a finite number >= 0, got nan"),
        (["--lam", "inf"], "field 'lam' (--lam) must be a finite number >= 0, got inf"),
        (["--noise", "nan"], "field 'noise' (--noise) must be a finite number >= 0, got nan"),
        (["--noise", "-1"], "field 'noise' (--noise) must be a finite number >= 0, got -1.0"),
        (["--lr", "inf"], "'lr' and 'warmup' (--lr, --warmup) must be finite"),
        (["--min-lr-ratio", "nan"], "field 'min_lr_ratio' (--min-lr-ratio)"),
        (["--answer-share", "nan"], "field 'answer_share' (--answer-share)"),
        (["--task-shares", "completion:nan"], "field 'task_shares' needs a positive share"),
    ],
)
def test_train_float_options_must_be_finite_and_in_range(tmp_path, args, named):
    out = tmp_path / "r"
    res = runner.invoke(app, ["train", "--out", str(out), "--steps", "2", *SMALL, *args])
    one_line_error(res, named)
    assert not out.exists()


@pytest.mark.parametrize(
    "state, named",
    [
        ([1, 2, 3], "expected an object with 'step' and 'optimizer', got a list"),
        ({"optimizer": {"state": {}, "param_groups": []}}, "field 'step' missing"),
        ({"step": 3}, "field 'optimizer' missing"),
        ({"step": 3, "optimizer": {}}, "field 'optimizer.state' missing"),
        ({"step": 3, "optimizer": {"state": {}}}, "field 'optimizer.param_groups' missing"),
        ({"step": 3, "optimizer": {"state": {}, "param_groups": []}}, "must list groups"),
        ({"step": "3", "optimizer": {"state": {}, "param_groups": []}}, "field 'step' must be an integer >= 0"),
        (
            {"step": 3, "optimizer": {"state": {}, "param_groups": [{"params": [0]}]}},
            "optimizer state does not fit the model",
        ),
    ],
)
def test_a_damaged_train_state_is_refused_by_name(finished, tmp_path, state, named):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    torch.save(state, run / "train_state.pt")
    before = snapshot(run)
    res = runner.invoke(app, ["train", "--resume", "--out", str(run), "--steps", "4"])
    one_line_error(res, "train_state.pt")
    assert named in res.output
    assert snapshot(run) == before


def stopped_before_first_checkpoint(folder):
    """What a run killed before its first checkpoint leaves: the tokenizer and the output marker, a
    log line, a temp file."""
    from fbt_probe.marker import write_marker
    from fbt_probe.tasks import build_tokenizer, save_tokenizer

    folder.mkdir(parents=True)
    save_tokenizer(build_tokenizer(), folder / "tokenizer.json")
    write_marker(folder, "train")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / ".model.safetensors.abc123.tmp").write_bytes(b"\0" * 10)
    return folder


def test_a_run_stopped_before_its_first_checkpoint_is_no_dead_end(tmp_path):
    run = stopped_before_first_checkpoint(tmp_path / "run")
    res = runner.invoke(app, ["train", "--resume", "--out", str(run)])
    one_line_error(
        res,
        f"{run}: no run to resume (config.json missing); it stopped before its first checkpoint: "
        "start it again with --force",
    )
    res = runner.invoke(app, ["train", "--out", str(run), "--steps", "2", *SMALL, "--force"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "config.json").read_text())["step"] == 2
    assert not list(run.glob(".*.tmp"))


def test_force_still_refuses_a_folder_with_other_files(tmp_path):
    run = stopped_before_first_checkpoint(tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["train", "--out", str(run), "--steps", "2", *SMALL, "--force"])
    one_line_error(res, f"{run}: exists and is not a training run folder")
    assert (run / "notes.txt").read_text() == "mine"


def test_a_killed_force_run_is_named_where_its_checkpoint_lies(tmp_path):
    """A `--force` run trains in a hidden sibling and swaps it in when finished; killed before that
    (SIGKILL: no clean-up), the sibling holds its checkpoints. `--resume` of the old folder names the
    sibling and its step in one line, and the sibling moved over the folder resumes."""
    import shutil

    run = stopped_before_first_checkpoint(tmp_path / "run")
    done = tmp_path / "done"
    assert runner.invoke(app, ["train", "--out", str(done), "--steps", "2", *SMALL]).exit_code == 0
    left = tmp_path / ".run.k1ll3d.tmp"  # what the killed forced run left: its folder at its step-2 checkpoint
    shutil.copytree(done, left)
    res = runner.invoke(app, ["train", "--resume", "--out", str(run)])
    one_line_error(
        res,
        f"{run}: no run to resume (config.json missing); a --force run of it was interrupted at its step-2 "
        f"checkpoint in {left}: move that folder over {run} to resume it",
    )
    shutil.rmtree(run)
    left.rename(run)
    res = runner.invoke(app, ["train", "--resume", "--out", str(run), "--steps", "3"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "config.json").read_text())["step"] == 3
