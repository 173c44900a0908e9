"""nanochat's tokenizer.pkl: read without running pickled code, converted to a tokenizer.json that encodes
exactly as tiktoken does (tiktoken is the oracle), imported beside the checkpoint, used for the tasks,
and checked against every dataset fed to the model."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat import tokenizer as nt
from fbt_probe.tasks import build_tokenizer, load_dataset, load_tokenizer, save_tokenizer, tokenizer_sha256
from tests.nanochat_helpers import random_state, write_nanochat
from tests.tokenizer_helpers import SPECIAL_TOKENS, nanochat_encoding, write_tokenizer_dir

tiktoken = pytest.importorskip("tiktoken", reason="tiktoken (the dev extra) is the oracle of these tests")
pytest.importorskip("rustbpe", reason="rustbpe (the dev extra) trains the tokenizer as nanochat does")

runner = CliRunner()
VOCAB = 2010  # 2001 ranks + 9 special tokens: the embedding is padded to 2048 rows


@pytest.fixture(scope="module")
def enc():
    return nanochat_encoding(VOCAB)


@pytest.fixture(scope="module")
def converted(enc, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    (folder / "tokenizer.pkl").write_bytes(pickle.dumps(enc))
    nt.convert(folder / "tokenizer.pkl", folder / "tokenizer.json")
    return load_tokenizer(folder / "tokenizer.json")


def corpus(n: int = 10_000, seed: int = 0) -> list[str]:
    """Varied strings: random runs over letters of several scripts, digits, whitespace runs, punctuation,
    emoji (with modifiers and joiners), contractions, code, task lines and special-token text."""
    rng = random.Random(seed)
    alphabet = list("abcxyzABCXYZ0123456789 \t\n\r.,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`")
    alphabet += list("éüßñçøåÆ中文字日本語한국어Привет مرحبا שלום ΑΒΓ αβγ ١٢٣ ½²")
    alphabet += ["😀", "🎉", "👍🏽", "👨\u200d👩\u200d👧", "\u200b", "\u00a0", "\u3000", "ʼ", "\ufeff", "🇫🇷"]
    words = ["the", "The", " state", "Status:", "done", "more", "r3", "+=", "don't", "I'll", "they're", "WE'VE", "x"]
    words += ["12", "123", "1234567", "3.14159", "0x1F", "  ", "\n\n", "\t", "    return x", "<|bos|>", "<|user_end|>"]
    code = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {}", "a_b = {'k': [1, 2]}  # c"]
    out: dict[str, None] = {}  # distinct strings, in the order drawn
    while len(out) < n:
        k = rng.randint(0, 48)
        kind = len(out) % 3
        if kind == 0:
            text = "".join(rng.choice(alphabet) for _ in range(k))
        elif kind == 1:
            text = rng.choice(["", " ", "  "]).join(rng.choice(words) for _ in range(k))
        else:
            text = rng.choice(code)[: k + 5] + rng.choice(alphabet) * rng.randint(0, 5) + rng.choice(words)
        out[text] = None
    return list(out)


def test_converted_tokenizer_encodes_as_tiktoken(enc, converted):
    texts = corpus()
    assert len(set(texts)) == len(texts) >= 10_000
    ours = [e.ids for e in converted.encode_batch(texts, add_special_tokens=False)]
    theirs = [enc.encode(t, allowed_special="all") for t in texts]
    bad = [t for t, a, b in zip(texts, ours, theirs) if a != b]
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {bad[0]!r}"
    assert sum(len(ids) for ids in theirs) > 100_000  # the corpus exercises many merges
    for t, ids in zip(texts[:2000], ours):
        assert converted.decode(ids, skip_special_tokens=False) == enc.decode(ids)
    # the template prepends <|bos|>, as nanochat's training documents begin
    assert converted.encode("state = 1", add_special_tokens=True).ids == [enc.encode_single_token("<|bos|>")] + (
        enc.encode_ordinary("state = 1")
    )
    assert {s: converted.token_to_id(s) for s in SPECIAL_TOKENS} == enc._special_tokens


def test_the_corpus_tells_a_wrong_conversion(enc, monkeypatch):
    """Merges ranked by the token's length instead of its rank, or no whole-token shortcut, change encodings."""
    texts = corpus(2000, seed=1)
    theirs = [enc.encode(t, allowed_special="all") for t in texts]
    data = nt.EncodingData(enc.name, enc._pat_str, enc._mergeable_ranks, enc._special_tokens)
    right = nt.merges_of(enc._mergeable_ranks)
    monkeypatch.setattr(nt, "merges_of", lambda ranks: sorted(right, key=lambda m: (len(m[0] + m[1]), m)))
    wrong = nt.to_tokenizer(data)
    assert sum(e.ids != t for e, t in zip(wrong.encode_batch(texts, add_special_tokens=False), theirs)) > 0


def _pickle_of(state) -> bytes:
    """The bytes pickle writes for a tiktoken Encoding with this state."""
    body = pickle.dumps(state, protocol=4)[2:-1]  # without PROTO and STOP
    return b"\x80\x04\x8c\x0dtiktoken.core\x8c\x08Encoding\x93)\x81" + body + b"b."


class _Evil:
    def __reduce__(self):
        return (Path.touch, (Path(_Evil.target),))


def test_reader_runs_no_pickled_code(tmp_path, enc):
    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps(enc))
    data = nt.read_pickle(good)
    assert (data.name, data.pat_str, data.ranks, data.special) == (
        "rustbpe",
        enc._pat_str,
        enc._mergeable_ranks,
        enc._special_tokens,
    )
    assert nt.read_pickle(_write(tmp_path / "again.pkl", _pickle_of(pickle.loads(good.read_bytes()).__getstate__())))
    _Evil.target = str(tmp_path / "ran")
    cases = {
        "evil": (pickle.dumps(_Evil()), "names pathlib.Path"),
        "nested": (
            _pickle_of({"name": "x", "pat_str": "a", "mergeable_ranks": {b"a": _Evil()}, "special_tokens": {}}),
            "only tiktoken.core.Encoding",
        ),
        "registered": (_pickle_of("cl100k_base"), "registered encoding 'cl100k_base'"),
        "fields": (_pickle_of({"name": "x", "pat_str": "a"}), "expected the fields"),
        "ranks": (
            _pickle_of({"name": "x", "pat_str": "a", "mergeable_ranks": {"a": 0}, "special_tokens": {}}),
            "field 'mergeable_ranks'",
        ),
        "bytes": (
            _pickle_of({"name": "x", "pat_str": "a", "mergeable_ranks": {b"a": 0}, "special_tokens": {}}),
            "ranks are not|has no token",
        ),
        "dict": (pickle.dumps({"a": 1}), "top object is a dict"),
        "garbage": (b"not a pickle", "not a pickled tiktoken Encoding"),
    }
    for name, (blob, match) in cases.items():
        path = _write(tmp_path / f"{name}.pkl", blob)
        with pytest.raises(FbtError, match=match) as exc:
            nt.read_pickle(path)
        assert str(path) in exc.value.message and "\n" not in exc.value.message
    assert not (tmp_path / "ran").exists()


def _write(path: Path, blob: bytes) -> Path:
    path.write_bytes(blob)
    return path


def test_encoding_checks(enc):
    ranks = dict(enc._mergeable_ranks)
    special = dict(enc._special_tokens)
    with pytest.raises(FbtError, match="special_tokens"):
        nt.check_encoding(nt.EncodingData("x", "a", ranks, {**special, "<|extra|>": len(ranks) + 50}), "t")
    del ranks[b"\x07"]
    with pytest.raises(FbtError, match="ranks are not"):
        nt.check_encoding(nt.EncodingData("x", "a", ranks, special), "t")


# ----------------------------------------------------------------------------- import, tasks, datasets
@pytest.fixture(scope="module")
def imported(tmp_path_factory, enc):
    """nanochat's cache layout: <base>/base_checkpoints/d4/ beside <base>/tokenizer/tokenizer.pkl, imported."""
    base = tmp_path_factory.mktemp("nanochat")
    write_tokenizer_dir(base / "tokenizer", VOCAB)
    mc, state = random_state(0, vocab_size=VOCAB, sequence_len=2048)
    ckpt = write_nanochat(base / "base_checkpoints" / "d4", mc, state)
    out = base / "runs" / "d4"
    res = runner.invoke(app, ["model", "import-nanochat", str(ckpt), str(out)])
    assert res.exit_code == 0, res.output
    return base, ckpt, out


def test_import_finds_the_tokenizer_and_records_it(imported, enc):
    base, _, out = imported
    meta = json.loads((out / "config.json").read_text())
    rec = meta["nanochat"]["tokenizer"]
    tok = load_tokenizer(out)
    assert rec["source"] == str((base / "tokenizer" / "tokenizer.pkl").resolve())
    assert rec["sha256"] == tokenizer_sha256(tok) and rec["n_ids"] == VOCAB == meta["model"]["d_vocab"]
    assert rec["bos_id"] == enc.encode_single_token("<|bos|>") == len(enc._mergeable_ranks)
    assert tok.encode("r3 = 12", add_special_tokens=False).ids == enc.encode_ordinary("r3 = 12")


def test_import_refuses_a_tokenizer_that_does_not_fit(imported, tmp_path):
    _, ckpt, _ = imported
    task_tok = save_tokenizer(build_tokenizer(), tmp_path / "task" / "tokenizer.json")
    small = write_tokenizer_dir(tmp_path / "small", 1500)[0]
    mc, state = random_state(0, vocab_size=1990, sequence_len=512)
    short = write_nanochat(tmp_path / "short", mc, state)  # vocab 1990 (padded to 2048): a 2010-id tokenizer overflows
    for folder, given, match in (
        (ckpt, task_tok, "has 122 ids, fewer than the checkpoint's vocab_size 2,010"),
        (ckpt, small, "has 1,500 ids, fewer than"),
        (short, imported[0] / "tokenizer", "has 2,010 ids but the checkpoint's vocab_size is 1,990 .*padding rows"),
        (ckpt, tmp_path, "expected tokenizer.pkl or tokenizer.json"),
    ):
        out = tmp_path / "o"
        res = runner.invoke(app, ["model", "import-nanochat", str(folder), str(out), "--tokenizer", str(given)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert pytest.importorskip("re").search(match, res.output), res.output
        assert not out.exists()
    res = runner.invoke(app, ["model", "import-nanochat", str(short), str(tmp_path / "o")])
    assert res.exit_code == 2 and "--no-tokenizer" in res.output and not (tmp_path / "o").exists()
    res = runner.invoke(app, ["model", "import-nanochat", str(short), str(tmp_path / "o"), "--no-tokenizer"])
    assert res.exit_code == 0 and "no tokenizer" in res.output and not (tmp_path / "o" / "tokenizer.json").exists()


def test_tasks_in_the_model_tokenizer(imported, enc, tmp_path):
    _, _, out = imported
    data = tmp_path / "data"
    res = runner.invoke(
        app,
        ["tasks", "generate", "completion", "registers", "--groups", "3", "--tokenizer", str(out), "--out", str(data)],
    )
    assert res.exit_code == 0, res.output
    bos = enc.encode_single_token("<|bos|>")
    for task in ("completion", "registers"):
        df = load_dataset(data / f"{task}.parquet")
        man = df.attrs["manifest"]
        assert man["tokenizer"]["sha256"] == tokenizer_sha256(load_tokenizer(out))
        for text, ids in zip(df["text"], df["token_ids"]):
            assert list(ids) == [bos] + enc.encode_ordinary(text)  # BOS, then exactly tiktoken's encoding
            assert enc.decode(list(ids)[1:]) == text
        final = {ids[-1] for ids in df["token_ids"]}
        assert final == {man["tokenizer"]["final_token_id"]}
        words = man["spec"]["label_words"]
        for word in words.values():  # the answer is the word with its leading space, one token
            assert man["tokenizer"]["label_token_ids"][word] == enc.encode_single_token(f" {word}".encode())
        for _, pair in df.groupby("pair_id"):  # the two samples of a pair: same length, same final token
            a, b = (list(x) for x in pair["token_ids"])
            assert len(a) == len(b) and a[-1] == b[-1] and a != b


def test_a_label_word_that_splits_is_refused_by_name(tmp_path):
    """A tokenizer too small to hold ' completed' as one token: the spec's label word is named."""
    folder = write_tokenizer_dir(tmp_path / "tiny", 300)[0]
    nt.convert(folder / "tokenizer.pkl", folder / "tokenizer.json")
    spec = json.loads((Path(nt.__file__).parents[2] / "tasks" / "specs" / "completion.json").read_text())
    spec["label_words"] = {"0": "more", "1": "completed"}
    (tmp_path / "c.json").write_text(json.dumps(spec))
    res = runner.invoke(
        app,
        ["tasks", "generate", str(tmp_path / "c.json"), "--tokenizer", str(folder), "--out", str(tmp_path / "d")],
    )
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "label word 'more' is 3 tokens, label word 'completed' is" in res.output and "single tokens" in res.output
    assert not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("*.parquet"))


def test_a_dataset_of_another_tokenizer_is_refused(imported, tmp_path):
    base, ckpt, out = imported
    data = tmp_path / "builtin"
    res = runner.invoke(app, ["tasks", "generate", "completion", "--groups", "2", "--out", str(data)])
    assert res.exit_code == 0, res.output
    for cmd in (
        ["extract", str(out), str(data), "--modes", "standard", "--out", str(tmp_path / "acts")],
        ["patch", str(out), str(data), "--experiment", "feedback-swap", "--out", str(tmp_path / "p")],
        ["extract", str(ckpt), str(data), "--modes", "standard", "--out", str(tmp_path / "acts2")],
    ):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert "tokenizer" in res.output
    res = runner.invoke(app, ["reproduce", "--quick", "--model", str(ckpt), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "no tokenizer.json" in res.output and not (tmp_path / "r").exists()


def test_the_imported_model_prepends_its_bos(imported, enc):
    import torch

    import fbt_probe as fp

    model = fp.load_model(str(imported[2]))
    bos, text = enc.encode_single_token("<|bos|>"), "r3 = 12\nStatus:"
    assert model.to_tokens(text).tolist() == [[bos, *enc.encode_ordinary(text)]]
    assert model.to_tokens(text, prepend_bos=True).tolist() == model.to_tokens(text).tolist()
    assert model.to_tokens(text, prepend_bos=False).tolist() == [enc.encode_ordinary(text)]
    assert model.to_str_tokens(text)[0] == "<|bos|>"
    with torch.no_grad():
        assert torch.equal(model(text), model(model.to_tokens(text)))


def test_reproduce_refuses_a_baseline_it_cannot_pair(imported, tmp_path):
    _, _, out = imported
    other = tmp_path / "other"
    save_tokenizer(build_tokenizer(), other / "tokenizer.json")
    for args, match in (
        (["--baseline", str(out)], "--baseline: needs --model"),
        (["--model", str(out), "--baseline", str(other)], "differs from that of --model"),
        (["--model", str(out), "--baseline", str(tmp_path / "missing")], "checkpoint folder not found"),
    ):
        res = runner.invoke(app, ["reproduce", "--quick", *args, "--out", str(tmp_path / "r")])
        assert res.exit_code == 2 and match in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_reproduce_on_a_nanochat_import(imported, tmp_path):
    """The quick study (two tasks, one length) on the imported checkpoint, in its tokenizer, with no baseline."""
    from fbt_probe.reproduce.config import ReproConfig
    from fbt_probe.reproduce.pipeline import reproduce

    _, _, out = imported
    study = tmp_path / "study"
    modes = ["standard", "recurrent:1"]
    cfg = ReproConfig.quick_config(
        model=str(out),
        methods=False,
        knobs={"completion": [8], "memory": [8]},
        patch_knobs={"completion": [8]},
        modes={"completion": modes, "memory": modes},
    )
    reproduce(cfg, study, echo=lambda *_: None)
    report = (study / "report.md").read_text()
    sha = tokenizer_sha256(load_tokenizer(out))
    assert f"sha256 {sha[:12]}..." in report and "no baseline was given (`--baseline PATH`)" in report
    assert "feedback: not trained on these tasks by this toolkit" in report  # an import has no training record
    assert f'"sha256": "{sha}"' in report  # the provenance record's tokenizer
    assert "checkpoint sha256 (feedback)" in report and "checkpoint sha256 (baseline)" not in report
    for man in (study / "data").glob("*.manifest.json"):
        assert json.loads(man.read_text())["tokenizer"]["sha256"] == sha


def test_a_replaced_tokenizer_json_is_refused(imported, tmp_path):
    """The task tokenizer copied over an import's tokenizer.json, and a dataset made with it: the hash the
    import recorded refuses the pair."""
    import shutil

    _, _, out = imported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    save_tokenizer(build_tokenizer(), copy / "tokenizer.json")
    data = tmp_path / "data"
    res = runner.invoke(
        app, ["tasks", "generate", "memory", "--groups", "2", "--tokenizer", str(copy), "--out", str(data)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["extract", str(copy), str(data), "--modes", "standard", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "not the tokenizer its checkpoint was imported with" in res.output


def test_tasks_read_the_pickle_as_the_import_converts_it(imported, enc, tmp_path):
    """`--tokenizer` on nanochat's tokenizer folder: the same tokenizer (sha256) the import wrote, and the
    conversion is byte-for-byte deterministic."""
    base, _, out = imported
    assert tokenizer_sha256(load_tokenizer(base / "tokenizer")) == tokenizer_sha256(load_tokenizer(out))
    nt.convert(base / "tokenizer" / "tokenizer.pkl", tmp_path / "a.json")
    nt.convert(base / "tokenizer" / "tokenizer.pkl", tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    for d in ("d1", "d2"):
        res = runner.invoke(
            app,
            [
                "tasks",
                "generate",
                "memory",
                "--groups",
                "2",
                "--tokenizer",
                str(base / "tokenizer"),
                "--out",
                str(tmp_path / d),
            ],
        )
        assert res.exit_code == 0, res.output
    assert (tmp_path / "d1" / "memory.parquet").read_bytes() == (tmp_path / "d2" / "memory.parquet").read_bytes()
