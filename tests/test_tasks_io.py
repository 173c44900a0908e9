"""Tokenizer, dataset files, determinism and the error paths of dataset I/O."""

from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from fbt_probe.errors import FbtError
from fbt_probe.io import sha256_file
from fbt_probe.tasks import (
    COLUMNS,
    build_tokenizer,
    generate,
    load_dataset,
    load_spec,
    load_tokenizer,
    save_tokenizer,
    tokenizer_sha256,
    write_dataset,
)
from fbt_probe.tasks.tokenizer import spec_words

SMALL = {"completion": [0, 8], "memory": [8, 12], "registers": [1, 2], "registers-count": [1, 4]}


def small(name: str, **changes):
    return load_spec(name).replace(length_grid=SMALL[name], **changes)


def test_tokenizer_vocab():
    tok = build_tokenizer()
    vocab = tok.get_vocab()
    assert tok.get_vocab_size() < 128
    assert vocab["<pad>"] == 0 and "<unk>" in vocab and vocab["\n"] == 2 and vocab[":"] == 3
    for name in ("completion", "memory", "registers", "registers-count"):
        assert spec_words(load_spec(name)) <= set(vocab)
    enc = tok.encode("r3 = 1\nscratch = 57\nquery = r3\nValue:", add_special_tokens=False)
    assert enc.tokens == [
        "r",
        "3",
        "=",
        "1",
        "\n",
        "scratch",
        "=",
        "57",
        "\n",
        "query",
        "=",
        "r",
        "3",
        "\n",
        "Value",
        ":",
    ]
    assert tokenizer_sha256(tok) == tokenizer_sha256(
        build_tokenizer(["completion", "memory", "registers", "registers-count"])
    )


def test_tokenizer_grows_for_variant_words():
    spec = load_spec("completion").replace(
        task="c2",
        label_words={"0": "NO", "1": "YES"},
        template={
            "header": ["need = {R}", "got = {C}", "scratch = {S}"],
            "distractor": "scratch += 0",
            "query": "Status:",
        },
        relation="got == need",
    )
    tok = build_tokenizer([spec])
    base = build_tokenizer().get_vocab()
    vocab = tok.get_vocab()
    assert all(vocab[w] == i for w, i in base.items())  # existing ids never move
    assert [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1])][len(base) :] == sorted(
        ["NO", "YES", "got", "need"]
    )


def test_tokenizer_save_load(tmp_path):
    tok = build_tokenizer()
    path = save_tokenizer(tok, tmp_path / "tok" / "tokenizer.json")
    assert sha256_file(path) == tokenizer_sha256(tok)
    again = load_tokenizer(path.parent)  # a folder holding tokenizer.json works too
    assert again.encode("state = 1\n# final state:").ids == tok.encode("state = 1\n# final state:").ids
    with pytest.raises(FbtError, match="missing.json: tokenizer file not found"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(FbtError, match="bad.json: not a valid Hugging Face tokenizer.json"):
        load_tokenizer(bad)


def test_dataset_roundtrip_schema_and_manifest(tmp_path):
    spec = small("registers")
    df = generate(spec, groups=2, seed=4)
    tok = build_tokenizer()
    path = write_dataset(df, tmp_path, tok)
    back = load_dataset(path)
    assert list(back.columns) == list(COLUMNS)
    assert back.text.tolist() == df.text.tolist() and back.label.tolist() == df.label.tolist()
    assert [list(x) for x in back.token_ids] == df.token_ids.tolist()
    m = json.loads((tmp_path / "registers.manifest.json").read_text())
    assert (
        m["sha256"] == sha256_file(path) and m["rows"] == 64 and m["spec"] == spec.to_dict()
    )  # 2 groups x 16 x 2 cells
    assert m["counts"]["1"]["pairs"] == 16 and m["counts"]["1"]["groups"] == 2 and m["n_groups"] == 4
    assert m["knob"] == "writes_per_register" and m["suffix_tokens"] == {"1": 1, "2": 2, "4": 4}
    assert m["tokenizer"]["sha256"] == sha256_file(tmp_path / "tokenizer.json")
    assert m["tokenizer"]["final_token"] == ":" and m["package_version"] and "git_commit" in m["provenance"]
    ids = m["tokenizer"]["label_token_ids"]
    assert ids == {"zero": tok.token_to_id("zero"), "one": tok.token_to_id("one")}
    assert load_dataset(tmp_path / "registers.manifest.json").equals(back)


def _content_hash(df) -> str:
    h = hashlib.sha256()
    for row in df.itertuples():
        h.update(
            f"{row.text}|{row.label}|{row.group_id}|{row.context_id}|{row.pair_id}|{list(row.token_ids)}\n".encode()
        )
    return h.hexdigest()


def test_determinism_and_pinned_content(tmp_path):
    files = []
    for i in range(2):
        for name in NAMES:
            write_dataset(generate(small(name), groups=3, seed=11), tmp_path / str(i), build_tokenizer())
        files.append({p.name: sha256_file(p) for p in (tmp_path / str(i)).glob("*.parquet")})
    assert files[0] == files[1] and len(files[0]) == 4
    # Pinned so that a change to the generators (which silently changes every dataset) fails here.
    got = {n: _content_hash(generate(small(n), groups=3, seed=11))[:16] for n in NAMES}
    assert got == PINNED


NAMES = ("completion", "memory", "registers", "registers-count")
PINNED = {
    "completion": "04e547165619557a",
    "memory": "419882f332675154",
    "registers": "62ad7d1aae80bb56",
    "registers-count": "f49d2855b38fd62b",
}


def test_load_dataset_errors(tmp_path):
    path = write_dataset(generate(small("memory"), groups=4, seed=0), tmp_path, build_tokenizer())
    manifest = tmp_path / "memory.manifest.json"
    with pytest.raises(FbtError, match="nope.parquet: dataset file not found"):
        load_dataset(tmp_path / "nope.parquet")
    # checksum
    data = path.read_bytes()
    path.write_bytes(data + b"\0")
    with pytest.raises(FbtError, match=r"memory.parquet: sha256 does not match field 'sha256' of memory.manifest.json"):
        load_dataset(path)
    path.write_bytes(data)
    # schema: a file whose checksum matches its manifest but lacks a column
    table = pq.read_table(path).drop_columns(["context_id"])
    pq.write_table(table, path)
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "sha256": sha256_file(path)}))
    with pytest.raises(FbtError, match="memory.parquet: schema does not match.*context_id"):
        load_dataset(path)
    # row count
    path.write_bytes(data)
    manifest.write_text(json.dumps({**m, "rows": 3}))
    with pytest.raises(FbtError, match="rows but field 'rows'"):
        load_dataset(path)
    manifest.unlink()
    with pytest.raises(FbtError, match="memory.manifest.json: dataset manifest .* not found"):
        load_dataset(path)


def test_write_refuses_existing_and_is_atomic(tmp_path, monkeypatch):
    tok = build_tokenizer()
    df = generate(small("completion"), groups=3, seed=0)
    path = write_dataset(df, tmp_path, tok)
    with pytest.raises(FbtError, match="completion.parquet: already exists"):
        write_dataset(df, tmp_path, tok)
    write_dataset(generate(small("completion"), groups=4, seed=0), tmp_path, tok, force=True)
    assert len(load_dataset(path)) == 32  # 4 groups x 4 assignments x 2 lengths
    other = build_tokenizer([load_spec("memory").replace(label_words={"0": "off", "1": "on"})])
    df_mem = generate(small("memory"), groups=3, seed=0, tokenizer=other)
    with pytest.raises(FbtError, match="tokenizer.json: already exists"):
        write_dataset(df_mem, tmp_path, other)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError):
        write_dataset(df_mem, tmp_path / "new", tok)
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["tokenizer.json"]  # no parquet, no temp file


def _whitespace_tokenizer(words) -> Tokenizer:
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_foreign_tokenizer_must_give_a_shared_final_token(tmp_path):
    from fbt_probe.tasks.tokenizer import check_encoded

    tok = build_tokenizer()
    colon, one = tok.token_to_id(":"), tok.token_to_id("1")
    with pytest.raises(
        FbtError, match=r"registers: sample 1 \(pair 0\) ends with token '1' .* every sample of a task must end"
    ):
        check_encoded(tok, "registers", [[one, colon], [colon, one]], lambda i: f"pair {i // 2}")
    tok = _whitespace_tokenizer(
        ["=", "0", "1", "state", "scratch", "^=", "+=", "#", "final", "zero", "one"]
    )  # no "state:"
    with pytest.raises(FbtError, match=r"memory: sample 0 .* outside the tokenizer's vocabulary"):
        generate(small("memory"), groups=3, seed=0, tokenizer=tok)
    path = save_tokenizer(build_tokenizer(), tmp_path / "t.json")
    df = generate(small("memory"), groups=3, seed=0, tokenizer=load_tokenizer(path))
    assert df.token_ids.tolist() == generate(small("memory"), groups=3, seed=0).token_ids.tolist()
