"""Output markers: a command recognises its own output folder by the `.fbt-output.json` it wrote
(command, format, the sha256 of each file), never by file names. `--force` replaces only such a
folder, carries the files the marker does not list into the new output, and refuses a listed file
whose bytes changed; a folder that merely holds our file names is refused in one line, untouched."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.marker import MARKER, output_dir, read_marker
from tests.test_bad_input import one_line_error, workdir  # noqa: F401 (the shared fixture)

runner = CliRunner()


def tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(folder, name, text):
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_output_dir_marks_replaces_its_own_files_and_keeps_the_rest(tmp_path):
    out = tmp_path / "o"
    with output_dir(out, "lens") as tmp:
        write(tmp, "a.csv", "1")
        write(tmp, "figures/f.png", "png")
    record = read_marker(out)
    assert record["command"] == "lens" and sorted(record["files"]) == ["a.csv", "figures/f.png"]
    write(out, "notes.txt", "mine")
    write(out, "figures/mine.png", "mine too")
    (out / "empty").mkdir()
    (out / "link").symlink_to("notes.txt")
    with output_dir(out, "lens", force=True) as tmp:
        write(tmp, "b.csv", "2")
    assert (out / "empty").is_dir() and (out / "link").is_symlink() and (out / "link").read_text() == "mine"
    assert tree(out) == {
        MARKER: (out / MARKER).read_bytes(),
        "b.csv": b"2",
        "notes.txt": b"mine",
        "figures/mine.png": b"mine too",
        "link": b"mine",
    }
    assert sorted(read_marker(out)["files"]) == ["b.csv"]  # the kept files stay the user's
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_output_dir_refuses_without_force_another_command_a_changed_file_and_a_clash(tmp_path):
    out = tmp_path / "o"
    with output_dir(out, "lens") as tmp:
        write(tmp, "a.csv", "1")
    before = tree(out)
    with pytest.raises(FbtError, match=rf"^{out}: already exists; refusing to overwrite \(pass --force"):
        with output_dir(out, "lens"):
            pass
    with pytest.raises(
        FbtError,
        match=rf"^{out}: exists and is not an output of fbt-probe patch \(its {MARKER} marker names fbt-probe lens\)",
    ):
        with output_dir(out, "patch", force=True):
            pass
    write(out, "a.csv", "edited")
    with pytest.raises(FbtError, match=rf"^{out / 'a.csv'}: changed since fbt-probe lens wrote it"):
        with output_dir(out, "lens", force=True):
            pass
    write(out, "a.csv", "1")
    write(out, "b.csv", "mine")
    with pytest.raises(FbtError, match=rf"^{out / 'b.csv'}: not written by fbt-probe lens"):
        with output_dir(out, "lens", force=True) as tmp:
            write(tmp, "b.csv", "ours")
    assert tree(out) == {**before, "b.csv": b"mine"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_damaged_marker_is_no_marker(tmp_path):
    out = tmp_path / "o"
    with output_dir(out, "lens") as tmp:
        write(tmp, "a.csv", "1")
    (out / MARKER).write_text(json.dumps({"command": "lens", "format": 1, "files": ["a.csv"]}))
    with pytest.raises(FbtError, match=f"it has no {MARKER} marker"):
        with output_dir(out, "lens", force=True):
            pass
    assert (out / "a.csv").read_text() == "1"


def lookalike(folder, manifest_format):
    """A user's folder holding our file names: a manifest of our format and a table."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": manifest_format}))
    (folder / "rows.csv").write_text("mine")
    return folder


def test_lens_force_refuses_a_folder_with_our_file_names(workdir, tmp_path):  # noqa: F811
    out = lookalike(tmp_path / "lens", "fbt-probe.lens/1")
    before = tree(out)
    res = runner.invoke(app, ["lens", str(workdir / "run"), str(workdir / "data"), "--out", str(out), "--force"])
    one_line_error(
        res, f"error: {out}: exists and is not a lens results folder written by fbt-probe lens (it has no {MARKER}"
    )
    assert tree(out) == before


def test_patch_force_refuses_a_folder_with_our_file_names(workdir, tmp_path):  # noqa: F811
    out = tmp_path / "results"
    out.mkdir()
    lookalike(out / "feedback-swap", "fbt-probe.interventions/1")
    before = tree(out)
    args = ["patch", str(workdir / "run"), str(workdir / "data"), "--experiment", "feedback-swap"]
    res = runner.invoke(app, [*args, "--out", str(out), "--force"])
    one_line_error(
        res,
        f"error: {out / 'feedback-swap'}: exists and is not an interventions results folder written by "
        f"fbt-probe patch (it has no {MARKER} marker)",
    )
    assert tree(out) == before


def test_sae_analyze_force_refuses_a_folder_with_our_file_names(workdir, tmp_path):  # noqa: F811
    out = tmp_path / "analysis"
    out.mkdir()
    (out / "analysis.json").write_text("{}")
    res = runner.invoke(
        app,
        ["sae", "analyze", str(workdir / "run"), str(tmp_path), str(workdir / "data"), "--out", str(out), "--force"],
    )
    one_line_error(res, f"error: {out}: exists and is not an SAE analysis folder written by fbt-probe sae analyze")
    assert tree(out) == {"analysis.json": b"{}"}


def test_extract_force_keeps_the_files_it_did_not_write_and_refuses_a_lookalike(workdir, tmp_path):  # noqa: F811
    out = tmp_path / "acts"
    args = ["extract", str(workdir / "run"), str(workdir / "data"), "--modes", "standard", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    assert sorted(read_marker(out)["files"]) == ["manifest.json", "plan.json", "samples.parquet"]
    write(out, "notes.txt", "mine")
    write(out, "shards/standard/mine.csv", "mine too")
    res = runner.invoke(app, [*args, "--force"])
    assert res.exit_code == 0, res.output
    assert (out / "notes.txt").read_text() == "mine" and (out / "shards/standard/mine.csv").read_text() == "mine too"
    # a user's folder with our file names: a plan and manifest of our format, no marker
    fake = tmp_path / "fake"
    shutil.copytree(out, fake)
    (fake / MARKER).unlink()
    before = tree(fake)
    res = runner.invoke(app, [*args[:-1], str(fake), "--force"])
    one_line_error(
        res,
        f"error: {fake}: exists and is not an activation folder; refusing to write into or replace it, even with "
        f"--force (it has no {MARKER} marker of fbt-probe extract",
    )
    assert tree(fake) == before


def test_train_force_keeps_the_files_it_did_not_write_and_refuses_a_lookalike(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), "--steps", "1", "--tasks", "completion", "--tokens-per-step", "200"]
    args += ["--warmup", "1"]
    assert runner.invoke(app, args).exit_code == 0
    assert read_marker(out)["command"] == "train"
    write(out, "mynotes.txt", "mine")
    write(out, "mysub/a.csv", "1,2")
    res = runner.invoke(app, [*args, "--force", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert (out / "mynotes.txt").read_text() == "mine" and (out / "mysub" / "a.csv").read_text() == "1,2"
    assert '"seed": 1' in (out / "config.json").read_text()
    fake = tmp_path / "fake"
    shutil.copytree(out, fake)
    (fake / MARKER).unlink()
    before = tree(fake)
    res = runner.invoke(app, [*args[:2], str(fake), *args[3:], "--force"])
    one_line_error(res, f"error: {fake}: exists and is not a training run folder written by fbt-probe train")
    assert tree(fake) == before


@pytest.fixture(scope="module")
def run1(tmp_path_factory):
    out = tmp_path_factory.mktemp("run1") / "run"
    args = ["train", "--out", str(out), "--steps", "1", "--tasks", "completion", "--tokens-per-step", "200"]
    assert runner.invoke(app, [*args, "--warmup", "1"]).exit_code == 0
    return out


def test_eval_tables_are_named_outputs_replaced_only_as_written(run1, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", str(run1), "--pairs", "2", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    record = read_marker(out)
    assert record["command"] == "named outputs"
    assert sorted(record["files"]) == ["accuracy.csv", "accuracy.json", "accuracy.parquet"]
    write(out, "notes.txt", "mine")
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0  # its own files, unchanged: replaced
    assert (out / "notes.txt").read_text() == "mine"
    write(out, "accuracy.csv", "edited by hand")
    before = tree(out)
    one_line_error(
        runner.invoke(app, [*args, "--force"]), f"error: {out / 'accuracy.csv'}: changed since fbt-probe wrote it"
    )
    assert tree(out) == before
    user = tmp_path / "user"
    write(user, "accuracy.parquet", "mine")
    res = runner.invoke(app, ["eval", str(run1), "--pairs", "2", "--out", str(user), "--force"])
    one_line_error(res, f"error: {user / 'accuracy.parquet'}: exists and was not written by fbt-probe (absent from")
    assert tree(user) == {"accuracy.parquet": b"mine"}


def test_figures_force_refuses_a_users_file_of_the_figures_name(tmp_path):
    out = tmp_path / "figs"
    write(out, "fig7a.png", "my picture")
    res = runner.invoke(app, ["figures", "fig7a", str(tmp_path / "no-results"), "--out", str(out), "--force"])
    one_line_error(res, f"error: {out / 'fig7a.png'}: exists and was not written by fbt-probe")
    assert tree(out) == {"fig7a.png": b"my picture"}
