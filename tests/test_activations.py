"""Activation extraction: equals a manual forward, resumes to identical shards, refuses bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe.activations import REFERENCE_MODE, ActivationStore, extract
from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name
from tests.helpers import make_model

FINAL = 7  # every sample ends with this token (the task's shared colon)


def frame(n_pairs: int = 6, lengths=(6, 9), tasks=("alpha", "beta"), seed: int = 0) -> pd.DataFrame:
    """Minimal pairs of random token ids (vocab 37) ending in FINAL; one group per pair."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in tasks:
        for knob, T in enumerate(lengths):
            for p in range(n_pairs):
                ids = rng.integers(0, 37, size=T).astype(np.int32)
                for label in (0, 1):
                    ids = ids.copy()
                    ids[1], ids[-1] = 10 + label, FINAL
                    rows.append(
                        {
                            "task": task,
                            "text": "",
                            "token_ids": ids,
                            "label": label,
                            "label_word": "AB"[label],
                            "pair_id": p,
                            "group_id": f"{task}:{knob}:{p}",
                            "length_knob": knob,
                            "n_tokens": T,
                            "seed": seed,
                        }
                    )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def model():
    return make_model(dtype=torch.float64)


def shard_bytes(folder) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob("shards/**/*.safetensors"))}


def test_extraction_equals_a_manual_forward(model, tmp_path):
    df = frame(n_pairs=3)
    modes = ["standard", "recurrent:1", "full", "jacobi:2"]
    store = extract(model, df, modes, tmp_path / "acts", batch_size=2, shard_rows=5, dtype="float64")
    assert store.modes == modes + [REFERENCE_MODE]
    for mode in modes:
        X, rows, targets = store.load(mode, "beta", 1)
        assert [t.hook for t in targets] == [depth_name(d) for d in range(model.cfg.n_layers + 1)]
        tokens = torch.tensor(np.stack(df.loc[rows.row, "token_ids"].to_list()), dtype=torch.long)
        _, cache = model.run_with_cache(tokens, mode=mode, names_filter=[t.hook for t in targets])
        for k, t in enumerate(targets):
            np.testing.assert_allclose(
                X[k], cache[t.hook][:, -1].numpy(), rtol=0, atol=1e-10, err_msg=f"{mode} {t.hook}"
            )
    # the reference pseudo-mode holds exactly the state recurrent:1 feeds into the last position
    X, rows, targets = store.load(REFERENCE_MODE, "beta", 1)
    tokens = torch.tensor(np.stack(df.loc[rows.row, "token_ids"].to_list()), dtype=torch.long)
    _, cache = model.run_with_cache(tokens, mode="recurrent:1", names_filter=["fusion.hook_feedback"])
    np.testing.assert_allclose(X[0], cache["fusion.hook_feedback"][:, -1].numpy(), rtol=0, atol=1e-12)
    assert targets[0].position == -2 and targets[0].depth == model.cfg.n_layers


def test_depth0_standard_vectors_are_identical_by_construction(model, tmp_path):
    store = extract(model, frame(), ["standard"], tmp_path / "acts", reference=False)
    X, _, _ = store.load("standard", "alpha", 0)
    assert np.ptp(X[0], axis=0).max() == 0.0
    assert np.ptp(X[1], axis=0).max() > 0.0


def test_manifest_records_what_was_extracted(model, tmp_path):
    df = frame()
    store = extract(model, df, "standard", tmp_path / "acts", extra_hooks=["blocks.1.hook_mlp_out@-2"])
    m = store.manifest
    assert m["model"]["hash"] and m["dataset"]["hash"] and m["dtype"] == "float32"
    assert m["modes"] == ["standard", REFERENCE_MODE] and m["n_samples"] == len(df)
    assert m["peak_rss_mb"]["largest_length"] == 9 and m["peak_rss_mb"]["after_largest_length"] > 0
    assert {t["key"] for t in m["targets"]["standard"]} >= {"depth.0", "blocks.1.hook_mlp_out@-2"}
    assert sorted(sum((s["rows"] for s in m["shards"] if s["mode"] == "standard"), [])) == list(range(len(df)))
    np.testing.assert_array_equal(store.samples["label"], df["label"])
    assert store.conditions()[0] == ("standard", "alpha", 0)


def test_resume_after_an_interrupted_extraction_yields_identical_shards(model, tmp_path):
    df = frame()
    fresh = extract(model, df, ["standard", "recurrent:1"], tmp_path / "fresh", shard_rows=4)
    done = []

    def die_after_three(shard):
        done.append(shard["file"])
        if len(done) == 3:
            raise KeyboardInterrupt  # the process is stopped between two shards

    with pytest.raises(KeyboardInterrupt):
        extract(model, df, ["standard", "recurrent:1"], tmp_path / "cut", shard_rows=4, on_shard=die_after_three)
    cut = tmp_path / "cut"
    assert not (cut / "manifest.json").exists()
    with pytest.raises(FbtError, match="unfinished: run extract again"):
        ActivationStore(cut)
    before = {f: os.stat(cut / f).st_mtime_ns for f in done}
    time.sleep(0.01)
    resumed = extract(model, df, ["standard", "recurrent:1"], cut, shard_rows=4)
    assert {f: os.stat(cut / f).st_mtime_ns for f in done} == before  # finished shards never rewritten
    assert shard_bytes(cut) == shard_bytes(tmp_path / "fresh")
    assert [s["sha256"] for s in resumed.manifest["shards"]] == [s["sha256"] for s in fresh.manifest["shards"]]
    assert not list(cut.rglob("*.tmp"))


@pytest.mark.slow
def test_resume_after_a_killed_process_yields_identical_shards(tmp_path):
    """A real SIGKILL in the middle of the extraction (a preset model, loaded by name in both runs)."""
    df = frame(n_pairs=8, lengths=(6, 9, 12))
    df.to_pickle(tmp_path / "df.pkl")
    script = (
        "import sys, time, pandas as pd, torch\n"
        "torch.set_num_threads(int(sys.argv[3]))  # the parent's: BLAS blocks by its thread count\n"
        "from fbt_probe.activations import extract\n"
        "df = pd.read_pickle(sys.argv[1])\n"
        "extract('tiny', df, ['standard'], sys.argv[2], shard_rows=4, reference=False,\n"
        "        on_shard=lambda s: (print('shard', flush=True), time.sleep(0.5)))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "df.pkl"), str(tmp_path / "cut"), str(torch.get_num_threads())],
        stdout=subprocess.PIPE,
        text=True,
    )
    for _ in range(2):
        assert proc.stdout.readline().strip() == "shard"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = shard_bytes(tmp_path / "cut")
    assert 2 <= len(written) < 12 and not (tmp_path / "cut" / "manifest.json").exists()
    resumed = extract("tiny", df, ["standard"], tmp_path / "cut", shard_rows=4, reference=False)
    fresh = extract("tiny", df, ["standard"], tmp_path / "fresh", shard_rows=4, reference=False)
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "fresh")
    assert all(shard_bytes(tmp_path / "cut")[k] == v for k, v in written.items())
    assert resumed.manifest["model"]["hash"] == fresh.manifest["model"]["hash"]


# ----------------------------------------------------------------------------- bad input
def test_existing_output_is_kept_without_force(model, tmp_path):
    df = frame()
    extract(model, df, "standard", tmp_path / "acts", reference=False)
    before = shard_bytes(tmp_path / "acts")
    with pytest.raises(FbtError, match="already holds a finished extraction"):
        extract(model, df, "standard", tmp_path / "acts", reference=False)
    assert shard_bytes(tmp_path / "acts") == before
    store = extract(model, df, "recurrent:1", tmp_path / "acts", reference=False, force=True)
    assert store.modes == ["recurrent:1"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    for force in (False, True):  # before: --force deleted any folder (and the message suggested it)
        with pytest.raises(
            FbtError, match="not an activation folder; refusing to write into or replace it, even with --force"
        ):
            extract(model, df, "standard", tmp_path / "other", force=force)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_unfinished_extraction_of_other_inputs_is_not_resumed(model, tmp_path):
    df = frame()

    def stop(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract(model, df, "standard", tmp_path / "acts", on_shard=stop)
    with pytest.raises(FbtError, match="different modes"):
        extract(model, df, "recurrent:1", tmp_path / "acts")


@pytest.mark.parametrize(
    "mode, match",
    [
        ("recurrent:0", "recurrent:k needs k >= 1"),
        ("sideways", "expected"),
        ("recurrent:6", "k must be < the sequence length"),
    ],
)
def test_a_mode_the_model_cannot_run_is_refused_before_writing(model, tmp_path, mode, match):
    with pytest.raises(FbtError, match=match):
        extract(model, frame(), ["standard", mode], tmp_path / "acts")
    assert not (tmp_path / "acts").exists()


def test_token_ids_outside_the_vocabulary_are_refused(model, tmp_path):
    df = frame()
    df.at[3, "token_ids"] = np.array([1, 2, 199, FINAL, 4, FINAL], dtype=np.int32)
    with pytest.raises(FbtError, match="token id 199 is outside the model's vocabulary of 128"):
        extract(model, df, "standard", tmp_path / "acts")


def test_checkpoint_with_another_tokenizer_is_refused(model, tmp_path):
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset

    tok = build_tokenizer()
    spec = load_spec("completion").replace(length_grid=[0])
    data = write_dataset(generate(spec, groups=6, seed=0, tokenizer=tok), tmp_path / "data", tok)
    same = save_checkpoint(model, tmp_path / "same", tokenizer_path=tmp_path / "data" / "tokenizer.json")
    store = extract(str(same), data, "standard", tmp_path / "ok", reference=False)
    assert store.manifest["model"]["hash"] and store.manifest["dataset"]["tokenizer_sha256"]
    other = json.loads((tmp_path / "data" / "tokenizer.json").read_text())
    vocab = other["model"]["vocab"]
    words = sorted(vocab, key=vocab.get)
    other["model"]["vocab"] = {w: i for i, w in enumerate(reversed(words))}  # same words, other ids
    (tmp_path / "other.json").write_text(json.dumps(other))
    ckpt = save_checkpoint(model, tmp_path / "ckpt", tokenizer_path=tmp_path / "other.json")
    with pytest.raises(FbtError, match="made with another tokenizer"):
        extract(str(ckpt), data, "standard", tmp_path / "acts")
    assert not (tmp_path / "acts").exists()


def test_non_finite_activations_are_refused(tmp_path):
    broken = make_model(dtype=torch.float64)
    with torch.no_grad():
        next(broken.blocks[1].parameters()).fill_(float("nan"))  # NaN from depth 2 on
    with pytest.raises(FbtError, match="non-finite activations"):
        extract(broken, frame(), "standard", tmp_path / "acts", reference=False)
    assert not list((tmp_path / "acts").rglob("*.safetensors"))


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_shard_is_refused(model, tmp_path, damage):
    store = extract(model, frame(), "standard", tmp_path / "acts", reference=False)
    shard = tmp_path / "acts" / store.manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[-3] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    shard.write_bytes(bytes(data))
    with pytest.raises(FbtError, match="corrupt shard"):
        ActivationStore(tmp_path / "acts").load("standard", "alpha", 0)


def test_a_direction_fitted_on_a_stored_cell(model, tmp_path):
    from fbt_probe.probes import fit_direction

    store = extract(model, frame(), "recurrent:1", tmp_path / "acts")
    direction = fit_direction(store, "recurrent:1", "alpha", 1, depth=2)
    X, rows, _ = store.load("recurrent:1", "alpha", 1)
    assert direction.hook == depth_name(2) and direction.d_model == model.cfg.d_model
    assert direction.meta["depth"] == 2 and direction.meta["model_hash"] == store.manifest["model"]["hash"]
    accuracy = np.mean(direction.predict(X[2]) == rows["label"].to_numpy())
    assert accuracy == pytest.approx(direction.meta["train_accuracy"])
    reference = fit_direction(tmp_path / "acts", REFERENCE_MODE, "alpha", 1, depth=model.cfg.n_layers)
    assert reference.hook == "ln_final.hook_normalized" and reference.meta["position"] == -2
    with pytest.raises(FbtError, match="has no depth 0"):
        fit_direction(store, REFERENCE_MODE, "alpha", 1, depth=0)
