"""The serial-depth task (`compose`): spec validation, generation and its independent label checker.

The labels are re-derived here a third way, by multiplying permutation matrices in numpy (the
generator composes tuples, the checker reads the text point by point), and the shortcuts the
design rules out are checked on the data: the start alone, the word alone and the start with the
last step alone never decide the label.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, heldout_groups, load_spec, training_documents
from fbt_probe.tasks.checker import check_sample, interpret
from fbt_probe.tasks.spec import spec_from_dict
from fbt_probe.tasks.tokenizer import tokenizer_sha256

A5 = [[1, 2, 3, 4, 0], [1, 2, 0, 3, 4], [1, 0, 3, 2, 4], [0, 3, 2, 4, 1], [2, 4, 0, 3, 1]]


@pytest.fixture(scope="module")
def spec():
    return load_spec("compose")


@pytest.fixture(scope="module")
def data(spec):
    return generate(spec.replace(length_grid=[2, 4, 16]), groups=48, seed=3, tokenizer=build_tokenizer())


def matrix(p) -> np.ndarray:
    """Column-stochastic permutation matrix: M @ onehot(x) = onehot(p[x])."""
    M = np.zeros((len(p), len(p)))
    M[p, np.arange(len(p))] = 1.0
    return M


def parse(text: str) -> tuple[int, list[int]]:
    lines = text.split("\n")
    start = int(re.fullmatch(r"state = (\d+)", lines[0]).group(1))
    return start, [int(re.fullmatch(r"state = r(\d+) state", line).group(1)) for line in lines[1:-1]]


def label_by_matrices(text: str, perms=A5, accept=(0, 1)) -> int:
    start, word = parse(text)
    v = np.eye(len(perms[0]))[start]
    for g in word:
        v = matrix(perms[g]) @ v
    return int(np.argmax(v) in accept)


def test_the_builtin_spec_is_a5_on_five_points_and_uses_only_the_base_vocabulary(spec):
    assert [list(p) for p in spec.permutations] == A5 and spec.accept == (0, 1) and spec.knob_name == "steps"
    assert tokenizer_sha256(build_tokenizer([spec])) == tokenizer_sha256(build_tokenizer())  # no new word
    # the generators are even permutations (det +1) and two of them generate a group of 60 elements (A5)
    assert all(round(np.linalg.det(matrix(p))) == 1 for p in A5)
    seen, frontier = {tuple(range(5))}, [tuple(range(5))]
    while frontier:
        q = frontier.pop()
        for p in A5[:2]:
            r = tuple(p[x] for x in q)
            if r not in seen:
                seen.add(r)
                frontier.append(r)
    assert len(seen) == 60


def test_every_label_agrees_with_permutation_matrices_and_pairs_differ_only_in_the_start(data):
    assert (data["label"].to_numpy() == [label_by_matrices(t) for t in data["text"]]).all()
    for _, pair in data.groupby("pair_id"):
        a, b = pair["text"].tolist()
        (sa, wa), (sb, wb) = parse(a), parse(b)
        assert wa == wb and sa != sb and sorted(pair["label"]) == [0, 1]
        assert a.split("\n")[1:] == b.split("\n")[1:]
        assert len(wa) == int(pair["length_knob"].iloc[0])
    assert data["token_ids"].map(lambda ids: ids[-1]).nunique() == 1  # one final ':' token
    assert (data["n_tokens"] == 8 + 6 * data["length_knob"]).all()


def test_groups_are_words_per_cell_and_generation_is_deterministic(spec, data):
    for knob, cell in data.groupby("length_knob"):
        words = cell["text"].map(lambda t: tuple(parse(t)[1]))
        assert cell.groupby("group_id").apply(lambda g: words[g.index].nunique(), include_groups=False).eq(1).all()
        assert words.groupby(cell["group_id"]).first().is_unique  # a word is one group
        assert cell["group_id"].str.startswith(f"compose:k{knob}:").all()
    again = generate(spec.replace(length_grid=[2, 4, 16]), groups=48, seed=3, tokenizer=build_tokenizer())
    pd.testing.assert_frame_equal(data, again)
    other = generate(spec.replace(length_grid=[16]), groups=48, seed=4, tokenizer=build_tokenizer())
    assert set(other["text"]) != set(data[data["length_knob"] == 16]["text"])


def test_no_truncated_view_decides_the_label(data):
    """The start alone, the word alone, or the start with the last step cannot give the answer: each
    such view maps to both labels (at k >= 4, where every view has enough samples)."""
    long = data[data["length_knob"] >= 4]
    parsed = long["text"].map(parse)
    views = {
        "start": parsed.map(lambda p: p[0]),
        "word": parsed.map(lambda p: tuple(p[1])),
        "start+last": parsed.map(lambda p: (p[0], p[1][-1])),
        "start+first": parsed.map(lambda p: (p[0], p[1][0])),
    }
    for name, view in views.items():
        mixed = long.groupby(view.to_numpy())["label"].nunique()
        assert (mixed[long.groupby(view.to_numpy()).size() >= 8] == 2).all(), name


def test_the_solvable_control_spec_is_s3_and_its_labels_agree_with_matrices():
    s3 = load_spec("compose-s3")
    perms, accept = [list(p) for p in s3.permutations], s3.accept
    assert perms == [[1, 0, 2], [1, 2, 0]] and accept == (0,)
    df = generate(s3.replace(length_grid=[8, 16]), groups=16, seed=0, tokenizer=build_tokenizer())
    assert (df["label"].to_numpy() == [label_by_matrices(t, perms, accept) for t in df["text"]]).all()


def test_the_fixed_length_spec_has_k_moving_lines_among_32_and_labels_agree_with_matrices():
    fixed = load_spec("compose-s3-lines")
    perms = [list(p) for p in fixed.permutations]
    assert fixed.step_lines == 32 and perms[2] == [0, 1, 2]
    df = generate(fixed, groups=16, seed=0, tokenizer=build_tokenizer())
    assert df["n_tokens"].nunique() == 1  # the length does not change with k
    for text, k in zip(df["text"], df["length_knob"]):
        _, word = parse(text)
        assert len(word) == 32 and sum(g != 2 for g in word) == k
    assert (df["label"].to_numpy() == [label_by_matrices(t, perms, fixed.accept) for t in df["text"]]).all()
    assert (df.groupby("length_knob")["group_id"].nunique() == 16).all()  # held-out groups at every k
    with pytest.raises(FbtError, match="33"):
        fixed.replace(length_grid=[33])
    raw = fixed.to_dict()
    raw["permutations"] = perms[:2]  # no identity to fill the other lines with
    with pytest.raises(FbtError, match="step_lines"):
        spec_from_dict(raw, source="variant.json")


def test_the_checker_refuses_a_wrong_label_and_text_outside_the_language(spec, data):
    text, label = data["text"].iloc[0], int(data["label"].iloc[0])
    check_sample(spec, text, label, spec.label_words[label], "ok")
    with pytest.raises(FbtError, match="label checker says"):
        check_sample(spec, text, 1 - label, spec.label_words[1 - label], "flipped")
    for bad in (
        text.replace("state = r", "state = q", 1),
        text.replace("# final state:", "# final:"),
        "state = 7\nstate = r0 state\n# final state:",  # not a point of 0..4
        "state = 1\nstate = r9 state\n# final state:",  # no generator 9
    ):
        with pytest.raises(FbtError):
            interpret(spec, bad)
    # one step changed: the checker follows the text, not the generator
    start, word = parse(text)
    word[0] = (word[0] + 1) % 5
    edited = "\n".join([f"state = {start}"] + [f"state = r{g} state" for g in word] + ["# final state:"])
    assert interpret(spec, edited) == label_by_matrices(edited)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("permutations", [[0, 1, 2], [1, 2, 0]], "do not commute"),  # a cyclic group: commuting steps
        ("permutations", [[0, 1, 1], [1, 0, 2]], "permutations of one set"),
        ("permutations", [[1, 0, 2, 3], [1, 2, 0]], "permutations of one set"),
        ("accept", [0, 1, 2, 3, 4], "not all"),
        ("accept", [5], "points of 0..4"),
        ("template", {"start": "state = 1", "step": "state = r{g} state", "query": "# final state:"}, "{A}"),
        ("length_grid", [0], "number of dependent steps"),
    ],
)
def test_spec_errors_name_the_field(spec, field, value, message):
    raw = json.loads(json.dumps(spec.to_dict()))
    raw[field] = value
    with pytest.raises(FbtError, match=re.escape(message)):
        spec_from_dict(raw, source="variant.json")


def test_training_documents_answer_after_the_colon_and_skip_held_out_words(spec):
    held = heldout_groups("compose", fraction=0.5, seed=0)
    docs = list(training_documents(["compose"], build_tokenizer(), n=40, seed=1, knobs=[4, 8], exclude_groups=held))
    tok = build_tokenizer()
    for d in docs:
        assert d["context_id"] not in held and d["length_knob"] in (4, 8)
        assert tok.id_to_token(d["token_ids"][d["answer_pos"] - 1]) == ":"
        assert tok.id_to_token(d["token_ids"][d["answer_pos"]]) == d["label_word"]
        assert d["label"] == label_by_matrices(d["text"])
    probe = generate(spec.replace(length_grid=[4, 8]), groups=16, seed=0, tokenizer=tok, contexts=held)
    assert probe["context_id"].map(lambda c: c in held).all()


def test_a_task_without_training_lengths_trains_on_its_spec_grid():
    from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig

    cfg = TrainConfig(tasks=("compose",))
    assert cfg.knobs == {"compose": [2, 4, 8, 16, 32]} and cfg.task_shares == {"compose": 1.0}
    mixed = TrainConfig(tasks=("completion", "compose"), task_shares={"completion": 0.5, "compose": 0.5})
    assert mixed.knobs == {"completion": TRAIN_KNOBS["completion"], "compose": [2, 4, 8, 16, 32]}
    assert TrainConfig().knobs is None  # the paper's tasks keep TRAIN_KNOBS
    with pytest.raises(FbtError, match="positive share"):  # a default share for one task only: name them all
        TrainConfig(tasks=("completion", "compose"))
