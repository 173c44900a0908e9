"""The general-LM corpus: pins, every file by sha256, the BPE and its whole tokens, the stored tokens
(decoded back to the files), windows, refusals, and training on it (resume bit for bit)."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.corpus import build, open_corpus, read_files, read_pins
from fbt_probe.corpus import fetch as fetch_mod
from fbt_probe.corpus.bpe import WHOLE, check_whole, make_whole, new_tokenizer
from fbt_probe.corpus.pins import held_out
from fbt_probe.errors import FbtError
from fbt_probe.io import sha256_file
from tests.corpus_helpers import build_test_corpus, fit_tokenizer, make_corpus_sources, write_sdist

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    build_test_corpus(base / "src", base / "corpus")
    return base


def test_the_stored_tokens_decode_back_to_every_file(corpus):
    """Oracle: each listed file's text, read from its archive, is what its tokens decode to."""
    from fbt_probe.corpus.store import read_texts

    c = open_corpus(corpus / "corpus")
    tok = c.tokenizer()
    pins = read_pins(corpus / "src" / "pins.json")
    texts = {
        (r.archive, r.path): t
        for r, t in read_texts(pins, read_files(pins, corpus / "src" / "files.tsv"), corpus / "src")
    }
    assert len(c.documents) == len(texts)
    bos = tok.token_to_id("<|bos|>")
    for archive, path, split, start, n in c.documents:
        ids = c.arrays[split][start : start + n].tolist()
        assert ids[0] == bos and bos not in ids[1:]
        assert tok.decode(ids[1:]) == texts[(archive, path)]
    total = {s: sum(d[4] for d in c.documents if d[2] == s) for s in ("train", "heldout")}
    assert {s: len(c.arrays[s]) for s in total} == total == {s: c.record["counts"][s]["tokens"] for s in total}


def test_the_scan_drops_empty_duplicate_and_unchosen_files_and_splits_by_file(corpus):
    pins = read_pins(corpus / "src" / "pins.json")
    rows = read_files(pins, corpus / "src" / "files.tsv")
    paths = {r.path for r in rows}
    assert "pkg/__init__.py" not in paths and "setup.cfg" not in paths
    assert "pkg/copy_of_mod0.py" in paths and "pkg/mod0.py" not in paths  # the same bytes: the first in name order kept
    assert len(paths) == 60 + 30 + 60
    assert {r.split for r in rows} == {"train", "heldout"}
    for r in rows:
        assert (r.split == "heldout") == held_out(pins, r.archive, r.path)


def test_a_build_is_byte_identical(corpus, tmp_path):
    build_test_corpus(tmp_path / "src", tmp_path / "again")
    for name in ("tokenizer.json", "train.bin", "heldout.bin", "documents.tsv"):
        assert sha256_file(tmp_path / "again" / name) == sha256_file(corpus / "corpus" / name)


def test_a_tampered_archive_is_refused_by_name_and_nothing_is_written(corpus, tmp_path):
    src = tmp_path / "src"
    pins_path, files_path = make_corpus_sources(src)
    with open(src / "Example-1.0.tar.gz", "ab") as f:
        f.write(b"\0")
    pins = read_pins(pins_path)
    with pytest.raises(FbtError, match=r"Example-1\.0\.tar\.gz: sha256 .* is not the pinned"):
        build(
            tmp_path / "out",
            src,
            pins=pins,
            files=read_files(pins, files_path),
            tokenizer=fit_tokenizer(corpus / "src"),
        )
    assert not (tmp_path / "out").exists()


def test_a_changed_member_is_refused_by_name(corpus, tmp_path):
    """An archive whose pinned hash was updated but one of whose listed files changed."""
    src = tmp_path / "src"
    pins_path, files_path = make_corpus_sources(src)
    with tarfile.open(src / "Example-1.0.tar.gz") as tar:
        files = {m.name.removeprefix("Example-1.0/"): tar.extractfile(m).read().decode() for m in tar if m.isfile()}
    files["docs/topic3.txt"] += "An added sentence.\n"
    write_sdist(src / "Example-1.0.tar.gz", "Example-1.0/", files)
    d = json.loads(pins_path.read_text())
    d["archives"][0]["sha256"] = sha256_file(src / "Example-1.0.tar.gz")
    pins_path.write_text(json.dumps(d))
    pins = read_pins(pins_path)
    with pytest.raises(FbtError, match=r"member docs/topic3\.txt: sha256 .* is not the listed"):
        build(
            tmp_path / "out",
            src,
            pins=pins,
            files=read_files(pins, files_path),
            tokenizer=fit_tokenizer(corpus / "src"),
        )
    assert not (tmp_path / "out").exists()


def test_a_missing_archive_names_the_fetch_command(tmp_path):
    src = tmp_path / "src"
    pins_path, files_path = make_corpus_sources(src)
    (src / "pkg-2.0-py3-none-any.whl").unlink()
    pins = read_pins(pins_path)
    with pytest.raises(FbtError, match=r"pkg-2\.0-py3-none-any\.whl: archive missing .*fbt-probe corpus fetch"):
        build(tmp_path / "out", src, pins=pins, files=read_files(pins, files_path))


def test_make_whole_joins_each_string_and_keeps_the_trained_merges_first(corpus):
    tok = fit_tokenizer(corpus / "src")
    check_whole(tok)
    for s in WHOLE:
        assert len(tok.encode(s, add_special_tokens=False).ids) == 1
    # a tokenizer with no merges: every added string is built from bytes, each joined by its own merges
    bare = new_tokenizer()
    d = json.loads(bare.to_str())
    d["model"]["vocab"] = {c: i for i, c in enumerate(["<|bos|>", *sorted(set("Ġ0123456789zerodnm"))])}
    from tokenizers import Tokenizer

    whole = make_whole(Tokenizer.from_str(json.dumps(d)), [" zero", " 42"])
    assert whole.encode(" zero 42 zed", add_special_tokens=False).tokens == [
        "Ġzero",
        "Ġ42",
        "Ġze",
        "d",
    ]  # the joins apply wherever their pieces meet
    with pytest.raises(FbtError, match="' zed' is 2 tokens, expected one"):
        check_whole(whole, [" zed"])


def test_tasks_are_exact_minimal_pairs_in_the_corpus_tokenizer(corpus):
    """Every pair of every built-in appendix-F task: equal length and the same final token."""
    from fbt_probe.tasks import generate, load_spec

    tok = open_corpus(corpus / "corpus").tokenizer()
    for task in ("completion", "memory", "registers", "registers-count"):
        df = generate(load_spec(task), groups=8, seed=0, tokenizer=tok)
        for _, pair in df.groupby("pair_id"):
            ids = pair["token_ids"].tolist()
            assert len(ids) == 2 and len(ids[0]) == len(ids[1]) and ids[0][-1] == ids[1][-1]


def test_windows_are_a_function_of_the_seed_and_targets_are_the_next_tokens(corpus):
    c = open_corpus(corpus / "corpus")
    a, ya = c.windows("train", 4, 16, seed=7)
    b, yb = c.windows("train", 4, 16, seed=7)
    assert torch.equal(a, b) and torch.equal(ya, yb)
    assert not torch.equal(a, c.windows("train", 4, 16, seed=8)[0])
    assert torch.equal(a[:, 1:], ya[:, :-1])
    arr = np.asarray(c.arrays["train"])
    for row, target in zip(a.tolist(), ya.tolist()):  # each window is a stretch of the stored array
        full = row + target[-1:]
        starts = np.flatnonzero(arr[: len(arr) - 16] == full[0])
        assert any(arr[s : s + 17].tolist() == full for s in starts)


def test_a_corrupted_token_file_is_refused(corpus, tmp_path):
    import shutil

    shutil.copytree(corpus / "corpus", tmp_path / "c")
    with open(tmp_path / "c" / "train.bin", "r+b") as f:
        f.write(b"\1\1")
    with pytest.raises(FbtError, match=r"train\.bin: sha256 differs"):
        open_corpus(tmp_path / "c")


def test_fetch_checks_the_hash_and_writes_nothing_on_a_mismatch(tmp_path, monkeypatch):
    src = tmp_path / "src"
    pins_path, _ = make_corpus_sources(src)
    pins = read_pins(pins_path)

    def fake_pip(archive, dest, payload=None):
        data = (src / archive.file).read_bytes() if payload is None else payload
        (dest / archive.file).write_bytes(data)

    monkeypatch.setattr(fetch_mod, "_pip_download", fake_pip)
    got = fetch_mod.fetch(tmp_path / "dl", pins)
    assert [r["status"] for r in got] == ["fetched", "fetched"]
    assert [r["status"] for r in fetch_mod.fetch(tmp_path / "dl", pins)] == ["present", "present"]
    monkeypatch.setattr(fetch_mod, "_pip_download", lambda a, d: fake_pip(a, d, b"other bytes"))
    with pytest.raises(FbtError, match=r"Example-1\.0\.tar\.gz has sha256 .*, not the pinned"):
        fetch_mod.fetch(tmp_path / "dl2", pins)
    assert sorted(p.name for p in (tmp_path / "dl2").iterdir()) == []
    (tmp_path / "dl" / "pkg-2.0-py3-none-any.whl").write_bytes(b"a user's file")
    with pytest.raises(FbtError, match=r"pkg-2\.0-py3-none-any\.whl: sha256 .* refusing to replace it"):
        fetch_mod.fetch(tmp_path / "dl", pins)
    assert (tmp_path / "dl" / "pkg-2.0-py3-none-any.whl").read_bytes() == b"a user's file"


def test_the_built_in_pins_list_every_file_with_its_split():
    pins = read_pins()
    rows = read_files(pins)
    assert {r.archive for r in rows} == {a.file for a in pins.archives}
    assert len({(r.archive, r.path) for r in rows}) == len(rows) == len({r.sha256 for r in rows})
    assert all(0 < r.bytes <= pins.max_file_bytes for r in rows)
    assert all((r.split == "heldout") == held_out(pins, r.archive, r.path) for r in rows)
    assert sum(r.bytes for r in rows) > 60e6  # about 20 M training tokens at ~3.2 bytes a token


def test_build_refuses_a_folder_it_did_not_write(corpus, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = CliRunner().invoke(
        app, ["corpus", "build", "--src", str(corpus / "src"), "--out", str(tmp_path / "mine"), "--force"]
    )
    assert r.exit_code == 2 and (tmp_path / "mine" / "notes.txt").read_text() == "keep"


# ---------------------------------------------------------------- training on the corpus


def _cfg(corpus_dir, **kw):
    from fbt_probe.training import TrainConfig

    base = dict(corpus=str(corpus_dir), tokens_per_step=64, seq_len=16, steps=4, warmup=2, eval_every=2, save_every=2)
    return TrainConfig(**{**base, **kw})


def test_a_corpus_run_resumes_bit_for_bit_and_records_its_corpus(corpus, tmp_path):
    from fbt_probe.training import run_training

    cfg = _cfg(corpus / "corpus")
    run_training(cfg, tmp_path / "whole", progress=False)
    run_training(_cfg(corpus / "corpus", steps=2), tmp_path / "split", progress=False)
    run_training(cfg, tmp_path / "split", resume=True, progress=False)
    assert sha256_file(tmp_path / "whole" / "model.safetensors") == sha256_file(
        tmp_path / "split" / "model.safetensors"
    )
    run_training(cfg, tmp_path / "again", progress=False)  # the same seed: the same bytes (same thread count)
    for name in ("model.safetensors", "train_state.pt"):
        assert sha256_file(tmp_path / "whole" / name) == sha256_file(tmp_path / "again" / name)
    meta = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert meta["train"]["corpus_sha256"] == open_corpus(corpus / "corpus").sha256
    assert meta["train"]["tasks"] == []
    assert (tmp_path / "whole" / "tokenizer.json").read_bytes() == (corpus / "corpus" / "tokenizer.json").read_bytes()
    log = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert {"val_loss_pass1", "val_loss_pass4"} <= set(log[-1])


def test_a_corpus_run_refuses_task_fields_and_another_corpus_build(corpus, tmp_path):
    from fbt_probe.training import TrainConfig

    with pytest.raises(FbtError, match="trains on the corpus alone"):
        TrainConfig(corpus="x", tasks=("completion",))
    with pytest.raises(FbtError, match="field 'copy_steps' applies to task training"):
        TrainConfig(corpus="x", copy_steps=2)
    with pytest.raises(FbtError, match="seq_len"):
        TrainConfig(corpus="x", seq_len=1)
    from fbt_probe.training.lm import corpus_of

    with pytest.raises(FbtError, match="is not the run's recorded"):
        corpus_of(_cfg(corpus / "corpus", corpus_sha256="0" * 64))


def test_a_fork_of_the_baselines_one_pass_steps_is_the_feedback_run_bit_for_bit(corpus, tmp_path):
    """Oracle: the feedback run trained from scratch with the same one-pass steps."""
    import shutil

    from fbt_probe.training import run_training

    base = _cfg(corpus / "corpus", steps=6, baseline=True)
    fb = _cfg(corpus / "corpus", steps=6, one_pass_steps=3, schedule="constant:2")
    run_training(base, tmp_path / "base", progress=False, stop_at=3)
    assert json.loads((tmp_path / "base" / "config.json").read_text())["step"] == 3
    shutil.copytree(tmp_path / "base", tmp_path / "base-at-3")
    run_training(base, tmp_path / "base", resume=True, progress=False)
    run_training(base, tmp_path / "base-straight", progress=False)
    same = sha256_file(tmp_path / "base" / "model.safetensors")
    assert same == sha256_file(tmp_path / "base-straight" / "model.safetensors")
    run_training(fb, tmp_path / "fb-scratch", progress=False)
    run_training(fb, tmp_path / "fb-fork", progress=False, fork=tmp_path / "base-at-3")
    assert sha256_file(tmp_path / "fb-fork" / "model.safetensors") == sha256_file(
        tmp_path / "fb-scratch" / "model.safetensors"
    )
    assert sha256_file(tmp_path / "fb-fork" / "model.safetensors") != same  # the feedback steps changed it
    log = [json.loads(line)["passes"] for line in (tmp_path / "fb-fork" / "metrics.jsonl").read_text().splitlines()]
    assert log == [1, 1, 1, 2, 2, 2]
    rec = json.loads((tmp_path / "fb-fork" / "config.json").read_text())["train"]
    assert rec["fork"] == str(tmp_path / "base-at-3") and len(rec["fork_sha256"]) == 64


def test_a_fork_is_refused_unless_its_steps_are_this_runs(corpus, tmp_path):
    from fbt_probe.training import run_training

    run_training(_cfg(corpus / "corpus", steps=6, baseline=True), tmp_path / "base", progress=False, stop_at=3)
    for cfg, match in (
        (_cfg(corpus / "corpus", steps=6, one_pass_steps=2, schedule="constant:2"), "pass --one-pass-steps 3 or more"),
        (_cfg(corpus / "corpus", steps=6, one_pass_steps=3, lr=2e-3), "field 'lr' is 0.001 there and 0.002 here"),
        (_cfg(corpus / "corpus", steps=6, one_pass_steps=3, seed=1), "field 'seed'"),
    ):
        with pytest.raises(FbtError, match=match):
            run_training(cfg, tmp_path / "fb", progress=False, fork=tmp_path / "base")
        assert not (tmp_path / "fb").exists()


def test_a_corpus_run_packs_with_its_corpus_loss_and_in_context_check(corpus, tmp_path, monkeypatch):
    """model pack of a corpus run: the record names the corpus and the held-out loss per pass (oracle:
    the loss recomputed from the weights), the check slice is the tasks read in context and recomputes,
    and the retrain line is the run's from scratch. The card's accuracy table is read under standard
    prefill alone here (decoding a toy model token by token over every task length is minutes of CPU
    and tested with the task models)."""
    import fbt_probe.training.pack as pack_module
    from fbt_probe.loading import load_model
    from fbt_probe.training import run_training
    from fbt_probe.training.evaluate import contraction
    from fbt_probe.training.lm import heldout_windows
    from fbt_probe.training.pack import check_slice, pack

    monkeypatch.setattr(pack_module, "EVAL_MODES", ("standard",))
    cfg = _cfg(corpus / "corpus")
    run_training(cfg, tmp_path / "run", progress=False)
    dest = pack(tmp_path / "run", "toy-lm", out_root=tmp_path / "refs", eval_pairs=2)
    rec = json.loads((dest / "reference.json").read_text())
    assert rec["corpus"]["corpus_sha256"] == open_corpus(corpus / "corpus").sha256
    model = load_model(str(dest))
    t, y, w = heldout_windows(json_cfg := _cfg(corpus / "corpus", corpus_sha256=rec["corpus"]["corpus_sha256"]))
    table = contraction(model, t, y, w, n_passes=4)
    assert [rec["corpus"]["heldout_loss"][str(k)] for k in (1, 2, 3, 4)] == pytest.approx(
        list(table["val_loss"]), abs=1e-5
    )
    assert rec["corpus"]["heldout_files"] == t.shape[0] and json_cfg.corpus is not None
    got = check_slice(model, cfg, open_corpus(corpus / "corpus").tokenizer())
    want = {(r["task"], r["length_knob"]): r["correct"] for r in rec["check"]["rows"]}
    assert {(r.task, r.length_knob) for r in got.itertuples()} == set(want) and len(want) >= 4
    assert all(abs(r.correct - want[(r.task, r.length_knob)]) <= 1 for r in got.itertuples())
    card = (dest / "card.md").read_text()
    assert "never trained on the appendix-F tasks" in card and "choice (standard)" in card
    assert rec["command"].startswith(f"fbt-probe train --preset tiny --corpus {corpus / 'corpus'} --tokens-per-step 64")
