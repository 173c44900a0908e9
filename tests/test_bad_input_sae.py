"""Bad input to `fbt-probe sae train|analyze`: every numeric option finite and in range, a damaged
SAE folder (weights, config) one line, an SAE analysed only with the model it was trained on, and
`--force` replacing only a folder the command marked as its own (keeping every file it did not write)."""

import json

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.marker import MARKER
from tests.helpers import make_model
from tests.test_bad_input import one_line_error, workdir  # noqa: F401 (the shared fixture)

runner = CliRunner()
SMALL = ["--steps", "5", "--batch-size", "32", "--expansion", "2"]


def tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(workdir):  # noqa: F811
    out = workdir / "sae"
    res = runner.invoke(app, ["sae", "train", str(workdir / "run"), str(workdir / "data"), "--out", str(out), *SMALL])
    assert res.exit_code == 0, res.output
    return out


def test_sae_train_records_the_checkpoint_dataset_and_provenance(trained, workdir):  # noqa: F811
    from fbt_probe.loading import checkpoint_hash, load_data

    meta = json.loads((trained / "cfg.json").read_text())["metadata"]
    assert meta["checkpoint_sha256"] == checkpoint_hash(workdir / "run")
    assert meta["dataset_hash"] == load_data(workdir / "data", pairs=False).attrs["dataset_hash"]
    assert meta["provenance"]["checkpoint_hash"] == meta["checkpoint_sha256"]
    assert meta["provenance"]["dataset_hash"] == meta["dataset_hash"]
    marker = json.loads((trained / MARKER).read_text())
    assert marker["command"] == "sae train" and sorted(marker["files"]) == ["cfg.json", "sae_weights.safetensors"]


@pytest.mark.parametrize(
    "args, line",
    [
        (["--architecture", "jumprelu", "--l0-coeff", "nan"], "error: --l0-coeff nan: expected a finite number >= 0"),
        (["--l0-coeff", "-1"], "error: --l0-coeff -1.0: expected a finite number >= 0"),
        (["--lr", "nan"], "error: --lr nan: expected a finite number > 0"),
        (["--lr", "0"], "error: --lr 0.0: expected a finite number > 0"),
        (["--steps", "0"], "error: --steps 0: expected an integer >= 1"),
        (["--expansion", "100000"], "error: --expansion 100000: expected an integer 1..1024"),
        (
            ["--seed", "99999999999999999999999"],
            "error: --seed 99999999999999999999999: expected an integer 0..2**63-1",
        ),
        (["--architecture", "gated"], "error: --architecture gated: expected one of topk, jumprelu"),
    ],
)
def test_sae_train_refuses_bad_options(workdir, tmp_path, args, line):  # noqa: F811
    out = tmp_path / "o"
    res = runner.invoke(app, ["sae", "train", str(workdir / "run"), str(workdir / "data"), "--out", str(out), *args])
    one_line_error(res, line)
    assert res.output == line + "\n" and not out.exists()


def test_sae_train_force_refuses_a_user_folder_with_our_file_names(workdir, tmp_path):  # noqa: F811
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cfg.json").write_text('{"mine":1}')
    (fake / "sae_weights.safetensors").write_text("user bytes")
    before = tree(fake)
    res = runner.invoke(
        app, ["sae", "train", str(workdir / "run"), str(workdir / "data"), "--force", "--out", str(fake), *SMALL]
    )
    one_line_error(
        res,
        f"error: {fake}: exists and is not an SAE folder written by fbt-probe sae train "
        f"(it has no {MARKER} marker); refusing to replace it, even with --force",
    )
    assert tree(fake) == before


def test_sae_train_force_keeps_the_files_it_did_not_write(trained, workdir, tmp_path):  # noqa: F811
    import shutil

    out = tmp_path / "sae"
    shutil.copytree(trained, out)
    (out / "mynotes.txt").write_text("notes")
    (out / "mysub").mkdir()
    (out / "mysub" / "a.csv").write_text("1,2")
    res = runner.invoke(
        app,
        [
            "sae",
            "train",
            str(workdir / "run"),
            str(workdir / "data"),
            "--force",
            "--out",
            str(out),
            *SMALL,
            "--seed",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == (
        f"wrote {out} (replaced the earlier output; kept 2 file(s) it had not written: mynotes.txt, mysub/a.csv)"
    )
    assert (out / "mynotes.txt").read_text() == "notes" and (out / "mysub" / "a.csv").read_text() == "1,2"
    assert (out / "sae_weights.safetensors").read_bytes() != (trained / "sae_weights.safetensors").read_bytes()
    # a file the marker lists whose bytes changed since is the user's now: refused, nothing replaced
    (out / "cfg.json").write_text((out / "cfg.json").read_text() + " ")
    before = tree(out)
    res = runner.invoke(
        app, ["sae", "train", str(workdir / "run"), str(workdir / "data"), "--force", "--out", str(out), *SMALL]
    )
    one_line_error(res, f"error: {out / 'cfg.json'}: changed since fbt-probe sae train wrote it")
    assert tree(out) == before


def damaged(trained, tmp_path, name, edit):
    import shutil

    folder = tmp_path / name
    shutil.copytree(trained, folder)
    edit(folder)
    return folder


def nan_decoder(folder):
    from safetensors.torch import load_file

    state = load_file(str(folder / "sae_weights.safetensors"))
    state["W_dec"][0, 0] = float("nan")
    save_file(state, str(folder / "sae_weights.safetensors"))


def pickled(folder):
    torch.save({"W_dec": torch.zeros(2)}, folder / "sae_weights.safetensors")


def truncated(folder):
    data = (folder / "sae_weights.safetensors").read_bytes()
    (folder / "sae_weights.safetensors").write_bytes(data[: len(data) // 2])


def float8(folder):
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["dtype"] = "float8"
    (folder / "cfg.json").write_text(json.dumps(cfg))


def huge(folder):
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["d_sae"] = 10**12
    (folder / "cfg.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "edit, line",
    [
        (nan_decoder, "sae_weights.safetensors: tensor 'W_dec' holds non-finite values"),
        (pickled, "sae_weights.safetensors: not a readable safetensors file (SafetensorError"),
        (truncated, "sae_weights.safetensors: not a readable safetensors file (SafetensorError"),
        (float8, "cfg.json: SAE field 'dtype' 'float8': expected one of float32, float64, float16, bfloat16"),
        (huge, "sae_weights.safetensors: tensors {"),
    ],
    ids=["nan-W_dec", "pickle", "truncated", "float8", "d_sae-1e12"],
)
def test_sae_analyze_refuses_a_damaged_sae(trained, workdir, tmp_path, edit, line):  # noqa: F811
    folder = damaged(trained, tmp_path, "bad", edit)
    out = tmp_path / "analysis"
    res = runner.invoke(
        app, ["sae", "analyze", str(workdir / "run"), str(folder), str(workdir / "data"), "--out", str(out)]
    )
    one_line_error(res, f"error: {folder}/{line}")
    assert not out.exists()


def test_sae_analyze_refuses_another_model(trained, workdir, tmp_path):  # noqa: F811
    other = tmp_path / "other"
    save_checkpoint(make_model(seed=1, dtype=torch.float32), other, tokenizer_path=workdir / "tokenizer.json")
    out = tmp_path / "analysis"
    res = runner.invoke(app, ["sae", "analyze", str(other), str(trained), str(workdir / "data"), "--out", str(out)])
    one_line_error(
        res, f"error: {trained}/cfg.json: field 'metadata.checkpoint_sha256': the SAE was trained on {workdir / 'run'}"
    )
    assert not out.exists()


def test_sae_analyze_with_no_pair_above_the_gap_is_one_line(trained, workdir, tmp_path, monkeypatch):  # noqa: F811
    import fbt_probe.sae.analyze as analyze

    real = analyze.feature_tests  # every pair below the minimum gap, as on inputs too short for the model
    monkeypatch.setattr(analyze, "feature_tests", lambda *a, **k: real(*a, **k, min_gap=1e9))
    out = tmp_path / "analysis"
    args = ["sae", "analyze", str(workdir / "run"), str(trained), str(workdir / "data"), "--out", str(out)]
    res = runner.invoke(app, [*args, "--n-boot", "10"])
    one_line_error(res, "error: no pair above the minimum gap: all 6 pairs' clean and corrupted logit differences")
    assert not out.exists()
    one_line_error(runner.invoke(app, [*args, "--n-boot", "10"]), "error: no pair above the minimum gap")


@pytest.mark.parametrize(
    "args, line",
    [
        (["--seed", "-1"], "error: --seed -1: expected an integer 0..2**63-1"),
        (["--max-pairs", "0"], "error: --max-pairs 0: expected an integer >= 1"),
        (["--n-boot", "0"], "error: --n-boot 0: expected an integer >= 1"),
    ],
)
def test_sae_analyze_refuses_bad_options(trained, workdir, tmp_path, args, line):  # noqa: F811
    out = tmp_path / "analysis"
    res = runner.invoke(
        app, ["sae", "analyze", str(workdir / "run"), str(trained), str(workdir / "data"), "--out", str(out), *args]
    )
    one_line_error(res, line)
    assert not out.exists()


def test_a_diverged_sae_is_not_saved(tmp_path):
    from fbt_probe.sae import SAEConfig, SparseAutoencoder

    sae = SparseAutoencoder(SAEConfig(d_in=4, d_sae=8, k=2))
    with torch.no_grad():
        sae.b_dec[1] = float("inf")
    with pytest.raises(FbtError, match=rf"^{tmp_path / 's'}: the SAE's tensor 'b_dec' holds non-finite values"):
        sae.save(tmp_path / "s")
    assert not (tmp_path / "s").exists()
