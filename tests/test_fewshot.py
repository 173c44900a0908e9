"""Few-shot prompts (`fbt_probe.tasks.fewshot`, `fbt-probe eval --shots`): the demonstrations are
solved examples of other groups, and every minimal pair stays exact."""

import dataclasses
import json

import pandas as pd
import pytest
from tokenizers.processors import TemplateProcessing
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, interpret, load_spec
from fbt_probe.tasks.fewshot import MAX_SHOTS, demonstrations, with_shots
from fbt_probe.tasks.tokenizer import encode
from tests.test_bad_input import one_line_error

runner = CliRunner()
TASKS = ("completion", "memory", "registers", "compose-s3")


def samples(tok) -> pd.DataFrame:
    frames = []
    for t in TASKS:
        spec = load_spec(t)
        frames.append(
            generate(dataclasses.replace(spec, length_grid=spec.length_grid[:2]), groups=4, seed=3, tokenizer=tok)
        )
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_zero_shots_change_nothing_but_the_column(tok):
    s = samples(tok)
    z = with_shots(s, tok, 0)
    assert (z["shots"] == 0).all()
    pd.testing.assert_frame_equal(z.drop(columns="shots"), s)


def test_the_prefix_is_solved_examples_of_other_groups_and_every_pair_stays_exact(tok):
    s = samples(tok)
    f = with_shots(s, tok, 4)
    assert (f["shots"] == 4).all() and f.index.equals(s.index)
    for task, rows in f.groupby("task"):
        spec = load_spec(task)
        demos = demonstrations(task, 4, tok, set(s["group_id"]))
        assert [d[1] for d in demos] == [spec.label_words[0], spec.label_words[1]] * 2  # alternating, balanced
        assert not {d[2] for d in demos} & set(s["group_id"]) and len({d[2] for d in demos}) == 4
        for text, word, _ in demos:  # each demonstration is solved right, by the independent checker
            assert spec.label_words[interpret(spec, text)] == word
        prefix = encode(tok, ["".join(f"{t} {w}\n\n" for t, w, _ in demos)])[0]
        orig = s.loc[rows.index]
        for ids, own, text, own_text in zip(rows["token_ids"], orig["token_ids"], rows["text"], orig["text"]):
            assert list(ids) == prefix + list(own)  # the sample's own tokens, unchanged, after the prefix
            assert text.endswith(own_text) and text.count(" \n\n") == 0
    # the minimal pairs: equal lengths and the same final token, as before
    assert (f.groupby(["task", "pair_id"])["n_tokens"].nunique() == 1).all()
    assert f["token_ids"].map(lambda t: t[-1]).nunique() == 1
    assert (f["n_tokens"] == f["token_ids"].map(len)).all() and (f["n_tokens"] > s["n_tokens"]).all()


def test_a_tokenizer_that_starts_every_text_with_a_bos_keeps_one(tok):
    bos_tok = build_tokenizer()
    bos_tok.add_special_tokens(["<bos>"])
    bos = bos_tok.token_to_id("<bos>")
    bos_tok.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    s = samples(bos_tok)
    assert all(t[0] == bos for t in s["token_ids"])
    f = with_shots(s, bos_tok, 2)
    assert all(t[0] == bos and list(t).count(bos) == 1 for t in f["token_ids"])
    assert all(list(a)[-(len(b) - 1) :] == list(b)[1:] for a, b in zip(f["token_ids"], s["token_ids"]))


@pytest.mark.parametrize("bad", [-1, MAX_SHOTS + 1, 2.0, True])
def test_a_bad_shot_count_is_refused(tok, bad):
    with pytest.raises(FbtError, match=r"--shots .*: expected an integer 0\.\.16"):
        with_shots(samples(tok), tok, bad)


def test_eval_with_shots_records_them_and_refuses_a_bad_count_writing_nothing(tmp_path, monkeypatch):
    import fbt_probe.cli.evaluate as cli_eval

    short = {"completion": [0], "memory": [0], "registers": [2], "registers-count": [1]}
    real = cli_eval.eval_samples
    monkeypatch.setattr(cli_eval, "eval_samples", lambda *a, **kw: real(*a, **kw, knobs=short))  # the shortest cells
    res = runner.invoke(
        app, ["eval", "ref:tiny-feedback", "--pairs", "2", "--shots", "99", "--out", str(tmp_path / "e")]
    )
    one_line_error(res, "--shots 99: expected an integer 0..16")
    assert not (tmp_path / "e").exists()
    res = runner.invoke(
        app, ["eval", "ref:tiny-feedback", "--pairs", "1", "--shots", "2", "--out", str(tmp_path / "e")]
    )
    assert res.exit_code == 0, res.output
    assert "2-shot: 2 solved examples of each task before every sample" in res.output
    acc = pd.read_parquet(tmp_path / "e" / "accuracy.parquet")
    assert (acc["shots"] == 2).all() and len(acc) > 0
    assert json.loads((tmp_path / "e" / "accuracy.json").read_text())["shots"] == 2
