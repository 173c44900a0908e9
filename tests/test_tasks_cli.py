"""`fbt-probe tasks list|generate|show|tokenizer`: outputs, --help examples, errors (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.tasks import load_dataset, load_spec

runner = CliRunner()


def run(*args):
    return runner.invoke(app, ["tasks", *map(str, args)])


@pytest.fixture()
def small_spec(tmp_path):
    path = tmp_path / "mem_small.json"
    path.write_text(json.dumps({**load_spec("memory").to_dict(), "task": "mem_small", "length_grid": [8, 16]}))
    return path


def test_list_shows_the_builtin_specs():
    res = run("list")
    assert res.exit_code == 0
    for name in ("completion", "memory", "registers", "registers-count"):
        assert name in res.output
    assert "0/8/32/128/256" in res.output and "2/4/8" in res.output and "1/2/4/8" in res.output


def test_generate_show_and_force(tmp_path, small_spec):
    out = tmp_path / "data"
    res = run("generate", small_spec, "--out", out, "--groups", 4, "--seed", 2)
    assert res.exit_code == 0, res.output
    assert "mem_small: 16 samples (8 pairs, 4 groups)" in res.output
    df = load_dataset(out / "mem_small.parquet")
    assert len(df) == 16 and set(df.seed) == {2}
    res = run("show", out / "mem_small.parquet", "--n", 2, "--knob", 16)
    assert res.exit_code == 0, res.output
    assert res.output.count("-> zero (0), 116 tokens") == 2 and "state = 0" in res.output and "*|" in res.output
    res = run("generate", small_spec, "--out", out, "--groups", 4)
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        f"error: {out / 'mem_small.parquet'}: already exists; refusing to overwrite (pass --force to replace it)"
    ]
    res = run("generate", small_spec, "--out", out, "--groups", 5, "--force")
    assert res.exit_code == 0 and len(load_dataset(out / "mem_small.parquet")) == 20


def test_generate_heldout_and_tokenizer(tmp_path, small_spec):
    res = run("tokenizer", "--out", tmp_path / "tok.json")
    assert res.exit_code == 0 and "sha256" in res.output
    res = run(
        "generate",
        small_spec,
        "--out",
        tmp_path / "d",
        "--groups",
        3,
        "--tokenizer",
        tmp_path / "tok.json",
        "--heldout",
        0.5,
        "--heldout-seed",
        1,
    )
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "d" / "mem_small.manifest.json").read_text())
    assert m["tokenizer"]["source"].endswith("tok.json") and m["counts"]["8"]["pairs"] == 3


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "stack", "--out", "{tmp}/o"], "stack: unknown task"),
        (
            ["generate", "{spec}", "--out", "{tmp}/o", "--tokenizer", "{tmp}/none.json"],
            "none.json: tokenizer file not found",
        ),
        (
            ["generate", "{spec}", "--out", "{tmp}/o", "--groups", "0"],
            "--groups: expected an integer 1..100000 (structural groups), got 0",
        ),
        (["generate", "{bad}", "--out", "{tmp}/o"], "bad.json: field 'length_grid[0]': -4 is not a distractor count"),
        (["show", "{tmp}/missing.parquet"], "missing.parquet: dataset file not found"),
        (["tokenizer", "--out", "{spec}"], "already exists"),
    ],
)
def test_errors_are_one_line_exit_2(tmp_path, small_spec, args, fragment):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**load_spec("memory").to_dict(), "length_grid": [-4]}))
    res = run(*[a.format(tmp=tmp_path, spec=small_spec, bad=bad) for a in args])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd", ["list", "generate", "show", "tokenizer"])
def test_help_has_an_example(cmd):
    res = run(cmd, "--help")
    assert res.exit_code == 0 and "Example: fbt-probe tasks " in res.output
