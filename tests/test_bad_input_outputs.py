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
        "data", "data/mine.txt", "eval", "eval/mine.txt", "figures", "figures/mine.txt"]
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
