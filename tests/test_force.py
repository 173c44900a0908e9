"""`--force` never loses data: every input is read first, the new output is built in a temporary
sibling and swapped in on success, and only a folder of the command's own output kind is replaced.
Each case asserts that the old folder's bytes survive a refused or failed command."""

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_dir
from fbt_probe.training import TrainConfig, run_training

runner = CliRunner()
SMALL = dict(
    tokens_per_step=300,
    warmup=1,
    eval_every=10_000,
    save_every=1,
    tasks=("completion", "memory", "registers"),
    knobs={"completion": [0], "memory": [8], "registers": [2]},
)


def snapshot(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def no_temp_left(parent) -> bool:
    return not [p for p in parent.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "R"
    run_training(TrainConfig(steps=1, **SMALL), out, progress=False, eval_pairs=2)
    return out


def test_train_force_with_a_bad_init_keeps_the_old_run(trained):
    """Before: R was deleted before --init was read, and an empty folder was left."""
    before = snapshot(trained)
    res = runner.invoke(app, ["train", "--out", str(trained), "--force", "--init", str(trained.parent / "nope")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "nope: neither a preset" in res.output, res.output
    assert snapshot(trained) == before and no_temp_left(trained.parent)


def test_train_force_refuses_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["train", "--out", str(tmp_path / "data"), "--force", "--steps", "1"])
    assert res.exit_code == 2 and "is not a training run folder" in res.output and "pass --force" not in res.output
    assert (tmp_path / "data" / "notes.txt").read_text() == "mine"


def test_an_interrupted_forced_run_leaves_the_old_run(trained, monkeypatch):
    import fbt_probe.training as training

    before = snapshot(trained)

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", stop)
    with pytest.raises(KeyboardInterrupt):
        run_training(TrainConfig(steps=2, **SMALL), trained, force=True, progress=False, eval_pairs=2)
    assert snapshot(trained) == before and no_temp_left(trained.parent)


def test_a_forced_run_replaces_the_old_one_when_it_finishes(tmp_path):
    out = tmp_path / "R"
    run_training(TrainConfig(steps=1, **SMALL), out, progress=False, eval_pairs=2)
    res = run_training(TrainConfig(steps=2, **SMALL), out, force=True, progress=False, eval_pairs=2)
    assert res["replaced"] == str(out) and '"step": 2' in (out / "config.json").read_text()
    assert no_temp_left(tmp_path)


def test_atomic_dir_replaces_only_its_own_kind(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "precious.txt").write_text("keep")
    with pytest.raises(FbtError, match="is not a results folder; refusing to replace it, even with --force"):
        with atomic_dir(target, force=True, own=lambda p: (p / "manifest.json").is_file(), kind="a results folder"):
            pass
    with pytest.raises(RuntimeError), atomic_dir(target, force=True, own=lambda p: True) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("failed half-way")
    assert snapshot(target) == {"precious.txt": b"keep"} and no_temp_left(tmp_path)


def test_a_swapped_in_folder_gets_the_usual_permissions(tmp_path):
    """Before: mkdtemp's 0700 stayed on every output folder built beside its target (datasets,
    activations, shipped reference models), unreadable to the other users of a shared machine."""
    import os

    mask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
    finally:
        os.umask(mask)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
