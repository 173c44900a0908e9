"""Extraction never certifies or probes a damaged shard, never deletes what it did not write, and
answers bad input with one line."""

import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.activations import ActivationStore, extract
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.probes import ProbeConfig, probe_sweep
from fbt_probe.shards import sidecar
from tests.helpers import make_model
from tests.test_activations import frame, shard_bytes
from tests.test_force import snapshot

runner = CliRunner()


@pytest.fixture(scope="module")
def model():
    return make_model(dtype=torch.float64)


def small_dataset(folder):
    from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset

    tok = build_tokenizer()
    write_dataset(
        generate(load_spec("memory").replace(length_grid=[8, 32]), groups=2, seed=0, tokenizer=tok), folder, tok
    )
    return folder


def interrupted(model, df, out, after: int = 3):
    done = []

    def stop(shard):
        done.append(shard["file"])
        if len(done) == after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(model, df, ["standard", "recurrent:1"], out, shard_rows=4, on_shard=stop)
    return done


def flip_a_value(path):
    """Damage a float in the middle of the data: the file stays a readable safetensors file."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x7F
    path.write_bytes(bytes(data))


def test_resume_refuses_a_shard_whose_bytes_changed(model, tmp_path):
    """Before: a finished shard was only checked for being readable, then written into the manifest."""
    df = frame()
    done = interrupted(model, df, tmp_path / "cut")
    assert all(sidecar(tmp_path / "cut" / f).is_file() for f in done)
    flip_a_value(tmp_path / "cut" / done[1])
    from safetensors.torch import load_file

    load_file(str(tmp_path / "cut" / done[1]))  # still readable: only the checksum can tell
    with pytest.raises(FbtError, match="corrupt shard"):
        extract(model, df, ["standard", "recurrent:1"], tmp_path / "cut", shard_rows=4)
    assert not (tmp_path / "cut" / "manifest.json").exists()
    sidecar(tmp_path / "cut" / done[0]).unlink()  # a shard without its record is not trusted either
    with pytest.raises(FbtError, match="no recorded sha256"):
        extract(model, df, ["standard", "recurrent:1"], tmp_path / "cut", shard_rows=4)


def test_probe_verifies_every_shard_before_fitting(model, tmp_path):
    store = extract(model, frame(), "standard", tmp_path / "acts", reference=False)
    flip_a_value(tmp_path / "acts" / store.manifest["shards"][-1]["file"])
    fitted = []
    with pytest.raises(FbtError, match="corrupt shard"):
        probe_sweep(
            tmp_path / "acts",
            ProbeConfig(n_splits=2, backend="sklearn", n_jobs=1),
            progress=lambda *a: fitted.append(a),
        )
    assert fitted == []  # before: the first cells were fitted, the damaged one failed (or was probed) later


def test_force_replaces_only_an_activation_folder(model, tmp_path):
    df = frame()
    data = small_dataset(tmp_path / "data")
    before = snapshot(data)
    res = runner.invoke(app, ["extract", "tiny", str(data), "--out", str(data), "--force"])
    assert res.exit_code == 2 and "is not an activation folder" in res.output and "pass --force" not in res.output
    assert snapshot(data) == before
    old = extract(model, df, "standard", tmp_path / "acts", reference=False)
    kept = shard_bytes(tmp_path / "acts")
    interrupted_again = []

    def stop(shard):
        interrupted_again.append(shard)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a forced run is built beside the old folder
        extract(model, df, "recurrent:1", tmp_path / "acts", reference=False, force=True, on_shard=stop)
    assert shard_bytes(tmp_path / "acts") == kept and ActivationStore(tmp_path / "acts").modes == old.modes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert extract(model, df, "recurrent:1", tmp_path / "acts", reference=False, force=True).modes == ["recurrent:1"]


def test_interrupted_extract_says_how_to_resume(tmp_path, monkeypatch):
    import fbt_probe.activations as acts

    small_dataset(tmp_path / "data")
    real, calls = acts._write_shard, []

    def write_then_stop(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # what SIGINT raises in the main thread
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(acts, "_write_shard", write_then_stop)
    res = runner.invoke(
        app, ["extract", "tiny", str(tmp_path / "data"), "--out", str(tmp_path / "acts"), "--modes", "standard"]
    )
    assert res.exit_code == 130 and "interrupted: rerun the same command to resume" in res.output
    monkeypatch.setattr(acts, "_write_shard", real)
    res = runner.invoke(
        app, ["extract", "tiny", str(tmp_path / "data"), "--out", str(tmp_path / "acts"), "--modes", "standard"]
    )
    assert res.exit_code == 0, res.output
    before = snapshot(tmp_path / "acts")
    calls.clear()
    monkeypatch.setattr(acts, "_write_shard", write_then_stop)
    res = runner.invoke(
        app,
        [
            "extract",
            "tiny",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "acts"),
            "--modes",
            "recurrent:1",
            "--force",
        ],
    )
    assert res.exit_code == 130 and f"interrupted: {tmp_path / 'acts'} is unchanged" in res.output
    assert snapshot(tmp_path / "acts") == before


@pytest.mark.parametrize(
    "args, match",
    [
        (["--modes", "standard,standard"], "'standard' is listed twice"),
        (["--modes", "recurrent:1,recurrent:01"], "'recurrent:1' is listed twice"),
        (["--modes", "jacobi:2,carried-state"], None),
        (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "warp"], "device"),
        (["--dtype", "float8"], "dtype 'float8'"),
    ],
)
def test_bad_extract_options_are_one_line_errors(tmp_path, args, match):
    small_dataset(tmp_path / "data")
    res = runner.invoke(app, ["extract", "tiny", str(tmp_path / "data"), "--out", str(tmp_path / "acts"), *args])
    if match is None:
        assert res.exit_code == 0, res.output
        return
    assert res.exit_code == 2 and res.output.count("\n") == 1 and match in res.output, res.output
    assert not (tmp_path / "acts").exists()


def test_an_empty_dataset_is_refused(model, tmp_path):
    with pytest.raises(FbtError, match="no rows"):
        extract(model, frame().iloc[:0], "standard", tmp_path / "acts")
    too_long = frame(lengths=(200,))
    with pytest.raises(FbtError, match="exceeds the model's context n_ctx = 128"):
        extract(model, too_long, "standard", tmp_path / "acts")
    assert not (tmp_path / "acts").exists()
