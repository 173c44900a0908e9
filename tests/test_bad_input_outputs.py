"""Bad input against output folders: a folder that is not the command's own output is refused
before anything is written, and a redone stage keeps its old outputs until it has finished."""

import json

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
    one_line_error(
        res, f"--out {out}: exists and is not a study folder (it has no .fbt-output.json marker of fbt-probe reproduce)"
    )
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
    with pytest.raises(FbtError, match="it has no .fbt-output.json marker of fbt-probe reproduce"):
        Runner(tmp_path, echo=lambda _: None)


def test_a_failed_redo_puts_the_old_outputs_back(tmp_path):
    out = tmp_path / "study"
    target = out / "results" / "a"

    def write(tag, fail=False):
        return write_stage(target, tag, fail)

    Runner(out, echo=lambda _: None).run(Stage("a", {"v": 1}, [target], write("old")))
    with pytest.raises(RuntimeError):
        Runner(out, echo=lambda _: None).run(Stage("a", {"v": 2}, [target], write("new", fail=True)))
    assert (target / "t.txt").read_text() == "old"
    assert [p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp"))] == []  # nothing left aside
    Runner(out, echo=lambda _: None).run(Stage("a", {"v": 2}, [target], write("new")))
    assert (target / "t.txt").read_text() == "new"
    assert [p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp"))] == []


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


def test_reproduce_refuses_a_user_folder_with_a_stub_stage_record(tmp_path):
    out = tmp_path / "thesis"
    (out / "data").mkdir(parents=True)
    (out / "thesis.txt").write_text("chapter 1")
    (out / "data" / "x.csv").write_text("1,2\n")
    (out / "stages.json").write_text("{}")
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    res = runner.invoke(app, ["reproduce", "--demo", "--out", str(out)])
    one_line_error(res, f"--out {out}: exists and is not a study folder (it has no .fbt-output.json marker")
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def write_stage(target, tag, fail=False):
    def fn():
        target.mkdir(parents=True, exist_ok=True)
        (target / "t.txt").write_text(tag)
        if fail:
            raise RuntimeError("stage failed")

    return fn


def test_a_redone_stage_keeps_the_files_the_study_did_not_write(tmp_path):
    out = tmp_path / "study"
    target = out / "data"
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 1}, [target], write_stage(target, "old")))
    (target / "x.csv").write_text("mine")
    (target / "sub").mkdir()
    (target / "sub" / "y.txt").write_text("also mine")
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 2}, [target], write_stage(target, "new")))
    assert (target / "t.txt").read_text() == "new"
    assert (target / "x.csv").read_text() == "mine" and (target / "sub" / "y.txt").read_text() == "also mine"
    marker = json.loads((out / ".fbt-output.json").read_text())
    assert marker["command"] == "reproduce" and sorted(marker["files"]) == ["data/t.txt"]
    # a file the study wrote, changed since: refused before the stage runs, nothing moved
    (target / "t.txt").write_text("edited")
    with pytest.raises(FbtError, match=rf"^{target / 't.txt'}: changed since fbt-probe reproduce wrote it"):
        Runner(out, echo=lambda _: None).run(Stage("data", {"v": 3}, [target], write_stage(target, "newer")))
    assert (target / "t.txt").read_text() == "edited" and (target / "x.csv").read_text() == "mine"
    # a user's file where the new output writes one of the same name: the old outputs go back
    (target / "t.txt").write_text("new")  # back to the bytes the marker lists
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 3}, [target], write_stage(target, "newer")))
    (target / "clash.txt").write_text("mine")

    def clash():
        write_stage(target, "newest")()
        (target / "clash.txt").write_text("ours")

    with pytest.raises(FbtError, match=rf"^{target / 'clash.txt'}: not written by fbt-probe reproduce"):
        Runner(out, echo=lambda _: None).run(Stage("data", {"v": 4}, [target], clash))
    assert (target / "clash.txt").read_text() == "mine" and (target / "t.txt").read_text() == "newer"


def test_a_second_study_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "study"
    first = Runner(out, echo=lambda _: None)
    code = textwrap.dedent(
        f"""
        from fbt_probe.errors import FbtError
        from fbt_probe.reproduce.stages import Runner
        try:
            Runner({str(out)!r}, echo=lambda _: None)
        except FbtError as e:
            print(e)
        """
    )
    other = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert (
        other() == f"--out {out}: another fbt-probe reproduce is running in this study; wait for it to finish "
        "(a rerun then continues where it stopped), or choose another --out\n"
    )
    assert sorted(p.name for p in out.iterdir()) == [".fbt-output.json", ".fbt-study.lock"]  # nothing mixed in
    first.close()
    assert other() == ""  # the lock went with the first study


def test_a_redone_stage_keeps_a_users_empty_folder_and_link(tmp_path):
    out = tmp_path / "study"
    target = out / "data"
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 1}, [target], write_stage(target, "old")))
    (target / "empty").mkdir()
    (target / "link").symlink_to("t.txt")
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 2}, [target], write_stage(target, "new")))
    assert (target / "empty").is_dir() and (target / "link").is_symlink() and (target / "link").read_text() == "new"
