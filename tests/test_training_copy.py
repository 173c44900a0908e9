"""The induction warm-up (`copy_steps`) and many-valued register-mix kinds (`:vN`)
(docs/research/register-binding.md, "The induction warm-up: P1–P10")."""

import json
import re

import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer
from fbt_probe.training import TrainConfig
from fbt_probe.training.copy import COPY_GAP, COPY_LEN, ROW_LEN, copy_batch
from fbt_probe.training.data import _mix_docs, batches_for_step, step_seed
from fbt_probe.training.mix import parse_register_mix

runner = CliRunner()
TOK = build_tokenizer()
REG = ("registers", "registers-count")


def test_a_copy_row_repeats_its_numbers_after_a_random_gap_and_weights_only_the_predictable_copy():
    tokens, targets, weights = copy_batch(TOK, rows=64, seed=5)
    assert tokens.shape == targets.shape == weights.shape == (64, ROW_LEN)
    numbers = {TOK.token_to_id(str(d)) for d in range(100)}
    assert set(tokens.unique().tolist()) <= numbers
    assert torch.allclose(weights.sum(1), torch.ones(64))
    starts = []
    for r in range(64):
        # the second copy found independently: the first offset >= COPY_LEN that repeats the first COPY_LEN tokens
        start = next(
            s
            for s in range(COPY_LEN, COPY_LEN + COPY_GAP + 1)
            if torch.equal(tokens[r, s : s + COPY_LEN], tokens[r, :COPY_LEN])
        )
        starts.append(start)
        weighted = torch.nonzero(weights[r]).flatten().tolist()
        assert weighted == list(range(start, start + COPY_LEN - 1))
        for t in weighted:  # each weighted target is the token that followed the earlier occurrence of tokens[t]
            assert targets[r, t] == tokens[r, t + 1] == tokens[r, t - start + 1]
    assert len(set(starts)) > 3  # the gap varies between rows: no fixed offset copies
    again = copy_batch(TOK, rows=64, seed=5)
    assert all(torch.equal(x, y) for x, y in zip((tokens, targets, weights), again))
    assert not torch.equal(copy_batch(TOK, rows=64, seed=6)[0], tokens)


def test_copy_steps_replace_only_the_first_steps_batches():
    plain = TrainConfig(tasks=REG, steps=10, tokens_per_step=600)
    warm = TrainConfig(tasks=REG, steps=10, tokens_per_step=600, copy_steps=3)
    for step in range(3):
        (micro,) = batches_for_step(warm, TOK, step)
        assert micro[0].shape == (600 // ROW_LEN, ROW_LEN)
        assert torch.equal(micro[0], copy_batch(TOK, 600 // ROW_LEN, seed=step_seed(warm.seed, step, "copy"))[0])
    for step in (3, 4, 9):  # afterwards exactly the run without a warm-up
        a, b = batches_for_step(warm, TOK, step), batches_for_step(plain, TOK, step)
        assert len(a) == len(b) and all(torch.equal(x, y) for ma, mb in zip(a, b) for x, y in zip(ma, mb))
    # validation never draws copy documents
    assert batches_for_step(warm, TOK, 0, split="val")[0][0].shape != (600 // ROW_LEN, ROW_LEN)


@pytest.mark.parametrize("value", [-1, 11, 2.5, True])
def test_copy_steps_must_be_an_integer_up_to_steps(value):
    with pytest.raises(FbtError, match="copy_steps"):
        TrainConfig(tasks=REG, steps=10, copy_steps=value)


def test_copy_steps_is_recorded_only_when_used(tmp_path):
    assert "copy_steps" not in TrainConfig(tasks=REG).to_dict()
    assert TrainConfig(tasks=REG, steps=10, copy_steps=4).to_dict()["copy_steps"] == 4
    res = runner.invoke(
        app,
        [
            "train",
            "--baseline",
            "--tasks",
            "registers",
            "--steps",
            "1",
            "--copy-steps",
            "1",
            "--tokens-per-step",
            "100",
            "--warmup",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["train"]["copy_steps"] == 1
    res = runner.invoke(
        app, ["train", "--tasks", "registers", "--steps", "2", "--copy-steps", "3", "--out", str(tmp_path / "bad")]
    )
    assert res.exit_code != 0 and "copy_steps" in res.output and not (tmp_path / "bad").exists()


def test_many_valued_kinds_parse_and_print_back():
    (k,) = parse_register_mix("8:wpr:2:8:0.5:v16")
    assert (k.registers, k.writes, k.scratch, k.weight, k.values) == (8, 2, 8, 0.5, 16)
    assert str(k) == "8:wpr:2:8:0.5:v16" and parse_register_mix(str(k)) == (k,)
    (b,) = parse_register_mix("8:16:8:v2")
    assert b.values == 2 and str(b) == "8:wpr:2:8:1"  # v2 is the binary default: the normal form omits it
    for bad in ("2:wpr:1:0:v1", "2:wpr:1:0:v101", "2:wpr:1:0:vx"):
        with pytest.raises(FbtError, match="register_mix"):
            parse_register_mix(bad)


def test_a_many_valued_document_answers_each_query_with_the_latest_value_written():
    cfg = TrainConfig(tasks=REG, register_mix="4:wpr:2:3:1:v16 4:wpr:2:3", register_queries=4)
    for i, values in ((0, 16), (1, 2)):
        docs = _mix_docs(cfg, i, TOK, 40, seed=3, split="train")
        seen = set()
        for doc in docs:
            lines = doc["text"].strip().split("\n")
            latest, answers = {}, []
            for line in lines:
                w = re.fullmatch(r"r(\d) = (\d+)", line)
                if w:
                    latest[w.group(1)] = int(w.group(2))
                q = re.fullmatch(r"query = r(\d)", line)
                if q:
                    answers.append(latest[q.group(1)])
            seen |= set(latest.values())
            words = [TOK.id_to_token(doc["token_ids"][p]) for p in doc["answer_positions"]]
            expect = [str(v) if values > 2 else ("zero", "one")[v] for v in answers]
            assert words == expect and doc["labels"] == answers
            if values > 2:
                assert max(latest.values()) <= 15 and any(
                    v > 1 for _, v in re.findall(r"r(\d) = (\d+)", doc["text"]) for v in [int(v)]
                )
        assert (max(seen) > 1) == (values > 2)
