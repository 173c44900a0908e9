"""Bad hook names and empty datasets are refused by name, before any model work."""

import dataclasses

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset
from tests.test_bad_input import one_line_error

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("hooks")
    tok = build_tokenizer()
    df = generate(dataclasses.replace(load_spec("completion"), length_grid=(0,)), groups=2, seed=0, tokenizer=tok)
    write_dataset(df, root / "data", tok)
    empty_dataset(root / "data", root / "empty")
    return root


def empty_dataset(src, dest):
    """A dataset file with no rows, its manifest's hashes made consistent (as a generator could write)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from fbt_probe.io import sha256_file
    from fbt_probe.tasks.dataset import arrow_schema

    dest.mkdir()
    pq.write_table(pa.Table.from_pylist([], schema=arrow_schema()), dest / "completion.parquet")
    manifest = json.loads((src / "completion.manifest.json").read_text())
    manifest.update(rows=0, pairs=0, sha256=sha256_file(dest / "completion.parquet"))
    (dest / "completion.manifest.json").write_text(json.dumps(manifest))
    (dest / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())


@pytest.mark.parametrize(
    "hooks, named",
    [
        ("bogus", "hooks: unknown hook 'bogus' (this model's hooks: hook_embed, "),
        ("blocks.9.hook_resid_pre", "hooks: unknown hook 'blocks.9.hook_resid_pre'"),
        ("blocks.0.hook_resid_pre@2", "hook 'blocks.0.hook_resid_pre@2': position 2: expected a position from the end"),
        ("blocks.0.hook_resid_pre@x", "hook 'blocks.0.hook_resid_pre@x': expected NAME or NAME@POSITION"),
    ],
)
def test_extract_names_a_bad_hook_not_the_mode(data, tmp_path, monkeypatch, hooks, named):
    import fbt_probe.activations as acts

    monkeypatch.setattr(acts, "load_data", lambda *a, **k: pytest.fail("data read before the hooks were checked"))
    res = runner.invoke(app, ["extract", "tiny", str(data / "data"), "--hooks", hooks, "--out", str(tmp_path / "a")])
    one_line_error(res, named)
    assert "unknown hook" not in res.output or "blocks.<l>.hook_resid_pre" in res.output  # the valid names' pattern
    assert "mode 'standard'" not in res.output and not (tmp_path / "a").exists()


def test_a_valid_extra_hook_still_extracts(data, tmp_path):
    res = runner.invoke(
        app,
        [
            "extract",
            "tiny",
            str(data / "data"),
            "--hooks",
            "blocks.1.hook_mlp_out@-2",
            "--modes",
            "standard",
            "--out",
            str(tmp_path / "a"),
        ],
    )
    assert res.exit_code == 0, res.output


def test_lens_on_an_empty_dataset_says_nothing_to_lens(data, tmp_path):
    res = runner.invoke(app, ["lens", "tiny", str(data / "empty"), "--out", str(tmp_path / "l")])
    one_line_error(res, "the dataset has no rows; nothing to lens")
    res = runner.invoke(
        app, ["patch", "tiny", str(data / "empty"), "--experiment", "feedback-swap", "--out", str(tmp_path / "p")]
    )
    one_line_error(res, "the dataset has no rows; nothing to patch")
    assert not (tmp_path / "l").exists() and not (tmp_path / "p").exists()
