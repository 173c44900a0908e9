"""Bad input gets one line (`error: ...`), exit code 2 and nothing written: the cases of the README
table "What bad input gets" that the other test files do not cover."""

import dataclasses
import json
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.tasks import build_tokenizer, generate, load_spec, save_tokenizer, write_dataset
from tests.helpers import make_model

runner = CliRunner()


def one_line_error(res, match: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
    assert match in res.output, res.output


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    tok = build_tokenizer()
    df = generate(dataclasses.replace(load_spec("completion"), length_grid=(0,)), groups=3, seed=0, tokenizer=tok)
    write_dataset(df, root / "data", tok)
    save_tokenizer(tok, root / "tokenizer.json")
    save_checkpoint(make_model(dtype=torch.float32), root / "run", tokenizer_path=root / "tokenizer.json")
    return root


@pytest.mark.parametrize(
    "args, match",
    [
        (["--max-pairs", "0"], "--max-pairs 0: expected an integer >= 1"),
        (["--experiment", "residual", "--last-k", "-3"], "--last-k -3: expected an integer >= 1"),
        (["--experiment", "probe-direction", "--folds", "1"], "--folds 1: expected an integer >= 2"),
        (["--experiment", "residual", "--depths", "99"], "--depths 99: this model has probe depths 0..3"),
        (["--experiment", "residual", "--depths", "-1"], "--depths -1: expected probe depths >= 0"),
        (["--min-gap", "nan"], "--min-gap nan: expected a finite number >= 0"),
        (["--mode", "recurrent:1,recurrent:1"], "'recurrent:1' is listed twice"),
        (["--device", "cuda:0" if not torch.cuda.is_available() else "warp"], "device"),
        (["--experiment", "attribution", "--check", "-1"], "--check -1: expected an integer >= 0"),
        (
            ["--experiment", "attribution", "--hooks", "blocks.9.hook_resid_pre"],
            "hooks: unknown hook 'blocks.9.hook_resid_pre'",
        ),
        (
            ["--experiment", "attribution", "--hooks", "fusion.hook_gate,fusion.hook_gate"],
            "expected distinct hook names",
        ),
        (["--experiment", "das", "--steps", "0"], "--steps 0: expected an integer >= 1"),
        (["--experiment", "das", "--lr", "nan"], "--lr nan: expected a finite number > 0"),
        (["--experiment", "das", "--ks", "0"], "--ks 0: expected distinct subspace dimensions >= 1"),
        (["--experiment", "das", "--ks", "2,2"], "--ks 2,2: expected distinct subspace dimensions >= 1"),
        (["--experiment", "das", "--ks", "one"], "ks 'one': expected comma-separated integers"),
    ],
)
def test_patch_options(workdir, args, match):
    base = [
        "patch",
        str(workdir / "run"),
        str(workdir / "data"),
        "--experiment",
        "feedback-swap",
        "--out",
        str(workdir / "res"),
    ]
    experiment = args[args.index("--experiment") + 1] if "--experiment" in args else None
    if experiment:
        i = base.index("--experiment")
        base[i + 1] = experiment
        args = [a for j, a in enumerate(args) if not (a == "--experiment" or (j > 0 and args[j - 1] == "--experiment"))]
    one_line_error(runner.invoke(app, base + args), match)
    assert not (workdir / "res").exists()


@pytest.mark.parametrize(
    "args, match",
    [
        (["--eval-fraction", "1.5"], "--eval-fraction 1.5: expected a number in (0, 1)"),
        (["--steps", "-1"], "--steps -1: expected an integer >= 0"),
        (["--lr", "0"], "--lr 0.0: expected a finite number > 0"),
        (["--positions", "0"], "--positions 0: expected an integer >= 1"),
        (["--max-pairs", "0"], "--max-pairs 0: expected an integer >= 1"),
        (["--mode", "standard,standard"], "'standard' is listed twice"),
    ],
)
def test_lens_options(workdir, args, match):
    base = ["lens", str(workdir / "run"), str(workdir / "data"), "--out", str(workdir / "lens-res"), "--steps", "2"]
    one_line_error(runner.invoke(app, base + args), match)
    assert not (workdir / "lens-res").exists()


def test_lens_force_replaces_only_lens_results(workdir):
    target = workdir / "not-lens"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["lens", str(workdir / "run"), str(workdir / "data"), "--out", str(target), "--force"])
    one_line_error(res, "is not a lens results folder")
    assert (target / "notes.txt").read_text() == "mine" and len(list(target.iterdir())) == 1


def test_patch_force_replaces_only_results(workdir):
    target = workdir / "elsewhere" / "feedback-swap"
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    res = runner.invoke(
        app,
        [
            "patch",
            str(workdir / "run"),
            str(workdir / "data"),
            "--experiment",
            "feedback-swap",
            "--out",
            str(workdir / "elsewhere"),
            "--force",
        ],
    )
    one_line_error(res, "is not an interventions results folder")
    assert (target / "notes.txt").read_text() == "mine" and len(list(target.iterdir())) == 1


def test_an_empty_dataset_into_patch(workdir, tmp_path):
    from fbt_probe.tasks.dataset import arrow_schema

    src = workdir / "data"
    (tmp_path / "data").mkdir()
    empty = tmp_path / "data" / "completion.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=arrow_schema()), empty)
    manifest = json.loads((src / "completion.manifest.json").read_text())
    from fbt_probe.io import sha256_file

    manifest.update(rows=0, pairs=0, sha256=sha256_file(empty))
    (tmp_path / "data" / "completion.manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "data" / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    res = runner.invoke(
        app,
        [
            "patch",
            str(workdir / "run"),
            str(tmp_path / "data"),
            "--experiment",
            "feedback-swap",
            "--out",
            str(tmp_path / "res"),
        ],
    )
    one_line_error(res, "no rows")
    res = runner.invoke(app, ["extract", str(workdir / "run"), str(tmp_path / "data"), "--out", str(tmp_path / "acts")])
    one_line_error(res, "no rows")


def test_an_older_dataset_with_an_unknown_label_word_is_refused_by_patch(workdir, tmp_path):
    """Datasets written before generation refused such words: their manifest maps the word to <unk>."""
    import shutil

    shutil.copytree(workdir / "data", tmp_path / "data")
    path = tmp_path / "data" / "completion.manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tokenizer"]["label_token_ids"]["done"] = 1  # <unk> in the built-in tokenizer
    path.write_text(json.dumps(manifest))
    res = runner.invoke(
        app,
        [
            "patch",
            str(workdir / "run"),
            str(tmp_path / "data"),
            "--experiment",
            "feedback-swap",
            "--out",
            str(tmp_path / "res"),
        ],
    )
    one_line_error(res, "label word 'done' is the unknown token of")


def flipped_copy(workdir, tmp_path, *, word_too: bool):
    """The dataset with row 0's label flipped (and its label word, `word_too`), the manifest's sha256 updated."""
    import shutil

    from fbt_probe.io import sha256_file

    shutil.copytree(workdir / "data", tmp_path / "data")
    parquet = tmp_path / "data" / "completion.parquet"
    table = pq.read_table(parquet)
    df = table.to_pandas()
    words = json.loads((tmp_path / "data" / "completion.manifest.json").read_text())["spec"]["label_words"]
    df.loc[0, "label"] = 1 - df.loc[0, "label"]
    if word_too:
        df.loc[0, "label_word"] = words[str(df.loc[0, "label"])]
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), parquet)
    mpath = tmp_path / "data" / "completion.manifest.json"
    mpath.write_text(json.dumps({**json.loads(mpath.read_text()), "sha256": sha256_file(parquet)}))
    return tmp_path / "data", int(df.loc[0, "pair_id"])


@pytest.mark.parametrize("word_too", [True, False], ids=["label-and-word", "label-only"])
def test_labels_flipped_against_the_text_are_refused_on_load(workdir, tmp_path, word_too):
    """The manifest's sha256 matches the tampered file; the labels are re-derived from the text."""
    data, pair = flipped_copy(workdir, tmp_path, word_too=word_too)
    for cmd in (
        ["extract", str(workdir / "run"), str(data), "--out", str(tmp_path / "acts")],
        ["patch", str(workdir / "run"), str(data), "--experiment", "feedback-swap", "--out", str(tmp_path / "res")],
    ):
        res = runner.invoke(app, cmd)
        one_line_error(res, f"completion.parquet: row 0 (pair {pair}): field 'label' is ")
        assert "but its text says" in res.output
    assert not (tmp_path / "acts").exists() and not (tmp_path / "res").exists()


# ----------------------------------------------------------------------------- task specs
def spec_file(tmp_path, **changes):
    raw = {**load_spec("completion").to_dict(), "task": "variant", "length_grid": [0], **changes}
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_huge_value_range_is_refused_at_once(tmp_path):
    """Before: [0, 10^9] hung (the relation was checked on every (R, C) pair in Python). Counts are words of
    the task tokenizer up to 99."""
    t0 = time.perf_counter()
    res = runner.invoke(
        app, ["tasks", "generate", str(spec_file(tmp_path, value_range=[0, 10**9])), "--out", str(tmp_path / "d")]
    )
    one_line_error(res, "field 'value_range': expected [low, high] with 0 <= low <= high <= 99")
    assert time.perf_counter() - t0 < 30  # a hang guard, not a benchmark
    ok = runner.invoke(
        app,
        [
            "tasks",
            "generate",
            str(spec_file(tmp_path, value_range=[0, 99])),
            "--out",
            str(tmp_path / "d"),
            "--groups",
            "2",
        ],
    )
    assert ok.exit_code == 0, ok.output


def test_a_label_word_outside_the_tokenizer_is_refused_at_generation(tmp_path):
    """Before: it became <unk> in the dataset and `patch` scored logit differences against <unk>."""
    runner.invoke(app, ["tasks", "tokenizer", "--out", str(tmp_path / "tok.json")])
    spec = spec_file(tmp_path, label_words={"0": "more", "1": "FINISHED"})
    res = runner.invoke(
        app, ["tasks", "generate", str(spec), "--out", str(tmp_path / "d"), "--tokenizer", str(tmp_path / "tok.json")]
    )
    one_line_error(res, f"label word 'FINISHED' is not in the vocabulary of tokenizer {tmp_path / 'tok.json'}")
    assert not (tmp_path / "d").exists()


def test_a_label_word_of_several_tokens_is_refused_at_generation(tmp_path):
    """Before: `tasks generate` accepted it and only `patch` refused it."""
    from tokenizers import pre_tokenizers

    spec = spec_file(tmp_path, label_words={"0": "MORE", "1": "ALL_DONE"})
    tok = build_tokenizer([load_spec(spec)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([tok.pre_tokenizer, pre_tokenizers.Split("_", "isolated")])
    save_tokenizer(tok, tmp_path / "split.json")
    res = runner.invoke(
        app, ["tasks", "generate", str(spec), "--out", str(tmp_path / "d"), "--tokenizer", str(tmp_path / "split.json")]
    )
    one_line_error(res, "label word 'ALL_DONE' is 3 tokens after the query under tokenizer")
    with pytest.raises(FbtError, match="'ALL_DONE' is 3 tokens"):
        generate(load_spec(spec), groups=2, tokenizer=tok)


# ----------------------------------------------------------------------------- Qwen3 import
@pytest.fixture()
def qwen(tmp_path):
    import fbt_probe as fp
    from fbt_probe.formats.qwen3 import export_qwen3

    export_qwen3(fp.load_model("tiny", depth_scaling="none"), tmp_path / "hf")
    return tmp_path / "hf"


def edit(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda c: c.pop("num_hidden_layers"), "field 'num_hidden_layers' missing"),
        (lambda c: c.update(hidden_size="64"), "field 'hidden_size': expected an integer >= 1, got '64'"),
        (lambda c: c.update(intermediate_size=512), "has shape (384, 128), config expects (512, 128)"),
        (lambda c: c.update(rms_norm_eps="small"), "field 'rms_norm_eps': expected a number"),
    ],
)
def test_import_hf_config_errors(qwen, tmp_path, change, match):
    edit(qwen, change)
    res = runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt")])
    one_line_error(res, match)
    assert not (tmp_path / "ckpt").exists()


def test_import_hf_refuses_shards_outside_the_folder(qwen, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((qwen / "model.safetensors").read_bytes())
    (qwen / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "../elsewhere.safetensors"}})
    )
    res = runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt")])
    one_line_error(res, "'../elsewhere.safetensors' is outside")
    (qwen / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": str(outside)}}))
    one_line_error(runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt")]), "is outside")


def test_import_and_export_force_replace_only_their_own_kind(qwen, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    for args in (
        ["model", "import-hf", str(qwen), str(tmp_path / "mine"), "--force"],
        ["model", "export-hf", "tiny", str(tmp_path / "mine"), "--force"],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "refusing to replace it" in res.output, res.output
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt")]).exit_code == 0
    again = runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt"), "--force"])
    assert again.exit_code == 0 and "replaced" in again.output


def test_token_ids_of_a_dataframe_outside_the_model_are_refused():
    from fbt_probe.activations import extract

    df = pd.DataFrame(
        {
            "task": ["t"],
            "token_ids": [[1, -2, 3]],
            "label": [0],
            "label_word": ["A"],
            "pair_id": [0],
            "group_id": ["g"],
            "length_knob": [0],
            "n_tokens": [3],
            "text": [""],
            "seed": [0],
        }
    )
    with pytest.raises(FbtError, match="id -2 is outside"):
        extract(make_model(), df, "standard", "/nonexistent/never-written")


def test_import_hf_refuses_a_tokenizer_larger_than_the_embedding(qwen, tmp_path):
    from tokenizers import Tokenizer, models

    from fbt_probe.tasks import build_tokenizer, load_tokenizer, save_tokenizer, tokenizer_sha256

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(200)}, unk_token="w0"))  # more ids than rows
    big = save_tokenizer(tok, tmp_path / "big" / "tokenizer.json")
    cfg = json.loads((qwen / "config.json").read_text())
    assert tok.get_vocab_size() > cfg["vocab_size"]
    res = runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt"), "--tokenizer", str(big)])
    one_line_error(
        res, f"the tokenizer's largest id is 199 ('w199'), but the checkpoint's embedding has {cfg['vocab_size']} rows"
    )
    assert not (tmp_path / "ckpt").exists()
    small = save_tokenizer(build_tokenizer(), tmp_path / "small" / "tokenizer.json")
    res = runner.invoke(app, ["model", "import-hf", str(qwen), str(tmp_path / "ckpt"), "--tokenizer", str(small)])
    assert res.exit_code == 0, res.output
    record = json.loads((tmp_path / "ckpt" / "config.json").read_text())["tokenizer"]
    assert record["sha256"] == tokenizer_sha256(load_tokenizer(tmp_path / "ckpt"))
