"""Bad input against output folders: a folder that is not the command's own output is refused
before anything is written, and a redone stage keeps its old outputs until it has finished."""

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.reproduce.stages import Runner, Stage
from tests.test_bad_input import one_line_error

runner = CliRunner()


def user_folder(root):
    out = root / "o" / "r1"
    for sub in ("data", "eval", "figures"):
        (out / sub).mkdir(parents=True)
        (out / sub / "mine.txt").write_text(sub)
    return out


def test_reproduce_refuses_a_folder_that_is_not_a_study(tmp_path):
    out = user_folder(tmp_path)
    res = runner.invoke(app, ["reproduce", "--out", str(out), "--demo"])
    one_line_error(res, f"--out {out}: exists and is not a study folder (stages.json missing)")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "data",
        "data/mine.txt",
        "eval",
        "eval/mine.txt",
        "figures",
        "figures/mine.txt",
    ]
    assert (out / "data" / "mine.txt").read_text() == "data"


def test_reproduce_seeds_refuses_a_folder_that_is_not_a_seeds_study(tmp_path):
    out = user_folder(tmp_path)
    res = runner.invoke(app, ["reproduce", "--out", str(out), "--train", "--quick", "--seeds", "2"])
    one_line_error(res, f"--out {out}: exists and is not a study over seeds")
    assert (out / "eval" / "mine.txt").read_text() == "eval"


def test_reproduce_refuses_a_file_as_out(tmp_path):
    out = tmp_path / "file"
    out.write_text("mine")
    res = runner.invoke(app, ["reproduce", "--out", str(out), "--demo"])
    one_line_error(res, f"--out {out}: is a file")
    assert out.read_text() == "mine"


def test_reproduce_unknown_force_stage_makes_nothing(tmp_path):
    out = tmp_path / "absent"
    res = runner.invoke(app, ["reproduce", "--out", str(out), "--demo", "--force", "bogus"])
    one_line_error(res, "--force bogus: unknown stage")
    assert not out.exists()


def test_runner_refuses_a_user_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FbtError, match="stages.json missing"):
        Runner(tmp_path, echo=lambda _: None)


def test_a_failed_redo_puts_the_old_outputs_back(tmp_path):
    out = tmp_path / "study"
    target = out / "results" / "a"

    def write(tag, fail=False):
        def fn():
            target.mkdir(parents=True, exist_ok=True)
            (target / "t.txt").write_text(tag)
            if fail:
                raise RuntimeError("stage failed")

        return fn

    Runner(out, echo=lambda _: None).run(Stage("a", {"v": 1}, [target], write("old")))
    with pytest.raises(RuntimeError):
        Runner(out, echo=lambda _: None).run(Stage("a", {"v": 2}, [target], write("new", fail=True)))
    assert (target / "t.txt").read_text() == "old"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # nothing left aside
    Runner(out, echo=lambda _: None).run(Stage("a", {"v": 2}, [target], write("new")))
    assert (target / "t.txt").read_text() == "new"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def raise_full(*args, **kwargs):
    import errno
    import os

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def raise_safetensors_full(*args, **kwargs):
    raise RuntimeError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    )


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    from fbt_probe.io import atomic_dir, atomic_path

    target = tmp_path / "out" / "file.bin"
    with pytest.raises(
        FbtError,
        match=rf"^{tmp_path / 'out'}: no space left on the device \(free .* MB; the output being written had reached 0.0 MB",
    ):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"")
            raise_full()
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(FbtError, match="no space left on the device"):
        with atomic_dir(tmp_path / "folder") as tmp:
            (tmp / "a").write_bytes(b"x" * 10)
            raise_safetensors_full()
    assert not (tmp_path / "folder").exists() and not list(tmp_path.glob(".folder*"))
    with pytest.raises(ValueError):  # any other error passes through unchanged
        with atomic_path(target):
            raise ValueError("other")


def test_train_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    import fbt_probe.formats.checkpoint as ck

    monkeypatch.setattr(ck, "save_file", raise_safetensors_full)
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "--out",
            str(out),
            "--steps",
            "1",
            "--tasks",
            "completion",
            "--tokens-per-step",
            "200",
            "--warmup",
            "1",
        ],
    )
    assert res.exit_code == 2, res.output  # the progress bar's line may come first; the error is one line
    assert res.output.splitlines()[-1].startswith(f"error: {out}: no space left on the device")
    assert (
        "Traceback" not in res.output
        and not (out / "model.safetensors").exists()
        and not (out / "config.json").exists()
    )


def test_extract_and_generate_on_a_full_disk_are_one_line(tmp_path, monkeypatch):
    import fbt_probe.activations as acts

    res = runner.invoke(app, ["tasks", "generate", "completion", "--groups", "2", "--out", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    monkeypatch.setattr(acts, "save_file", raise_full)
    res = runner.invoke(
        app, ["extract", "tiny", str(tmp_path / "data"), "--modes", "standard", "--out", str(tmp_path / "acts")]
    )
    one_line_error(res, "no space left on the device")
    assert str(tmp_path) in res.output
    monkeypatch.setattr("pyarrow.parquet.write_table", raise_full)
    res = runner.invoke(app, ["tasks", "generate", "memory", "--groups", "2", "--out", str(tmp_path / "data2")])
    one_line_error(res, f"{tmp_path / 'data2'}: no space left on the device")
    assert not list((tmp_path / "data2").glob("*.parquet")) if (tmp_path / "data2").exists() else True
