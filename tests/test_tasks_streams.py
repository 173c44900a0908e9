"""Training streams (answer after the colon) and the held-out split by context."""

from __future__ import annotations

import pytest

from fbt_probe.errors import FbtError
from fbt_probe.tasks import HeldOut, build_tokenizer, generate, heldout_groups, interpret, load_spec, training_documents

TASKS = ["completion", "memory", "registers", "registers-count"]
KNOBS = {"completion": [0, 8], "memory": [8, 12], "registers": [1, 2], "registers-count": [1, 8]}


def test_documents_put_the_answer_after_the_colon():
    tok = build_tokenizer()
    docs = list(training_documents(TASKS, tok, n=150, seed=1, knobs=KNOBS))
    assert len(docs) == 150 and {d["task"] for d in docs} == set(TASKS)
    specs = {t: load_spec(t) for t in TASKS}
    for d in docs:
        ids, pos = d["token_ids"], d["answer_pos"]
        assert ids[pos - 1] == tok.token_to_id(":") and ids[pos] == tok.token_to_id(d["label_word"])
        assert ids[pos + 1 :] == [tok.token_to_id("\n")] and len(ids) == pos + 2
        assert ids[:pos] == tok.encode(d["text"], add_special_tokens=False).ids
        assert interpret(specs[d["task"]], d["text"]) == d["label"]
        assert d["label_word"] == specs[d["task"]].label_words[d["label"]]
        assert d["length_knob"] in KNOBS[d["task"]]
    assert 0.35 < sum(d["label"] for d in docs) / 150 < 0.65
    again = list(training_documents(TASKS, tok, n=150, seed=1, knobs=KNOBS))
    assert again == docs
    assert list(training_documents(TASKS, tok, n=150, seed=2, knobs=KNOBS)) != docs


def test_mixture_and_knobs():
    docs = list(
        training_documents(
            TASKS,
            n=400,
            seed=0,
            knobs=[0, 8],
            mixture={"completion": 3, "memory": 1, "registers": 0, "registers-count": 0},
        )
    )
    n_comp = sum(d["task"] == "completion" for d in docs)
    assert {d["task"] for d in docs} == {"completion", "memory"} and 0.68 < n_comp / 400 < 0.82
    assert {d["length_knob"] for d in docs} == {0, 8}


def test_heldout_contexts_never_reach_training():
    held = heldout_groups(TASKS, fraction=0.3, seed=7)
    docs = list(training_documents(TASKS, n=300, seed=3, knobs=KNOBS, exclude_groups=held))
    assert not any(d["context_id"] in held for d in docs)
    # the same split selects the probe-time rows of a dataset, without splitting pairs
    df = generate(load_spec("completion").replace(length_grid=[8]), seed=0)
    train, probe = held.split(df)
    assert len(train) + len(probe) == len(df) and 0.15 < len(probe) / len(df) < 0.45
    assert set(train.context_id).isdisjoint(probe.context_id)
    assert probe.groupby("pair_id").size().eq(2).all() and set(probe.label) == {0, 1}
    # a probe set drawn from held-out contexts keeps the paper's 80 count-pair groups, each balanced
    only = generate(load_spec("completion").replace(length_grid=[8]), seed=0, contexts=held)
    assert only.group_id.nunique() == 80 and all(c in held for c in only.context_id)
    assert only.groupby("group_id").label.mean().eq(0.5).all()
    # an explicit set of ids (context or group) works as well
    groups = {"completion:p3-5"}
    docs = list(training_documents("completion", n=200, seed=0, knobs=[0], exclude_groups=groups))
    assert all(d["group_id"] != "completion:p3-5" for d in docs)


def test_generate_restricted_to_heldout_contexts():
    held = heldout_groups("memory", fraction=0.25, seed=1)
    df = generate(load_spec("memory").replace(length_grid=[8, 32]), groups=20, seed=0, contexts=held)
    assert len(df) == 80 and all(c in held for c in df.context_id)
    assert "registers:w1:0" not in held and isinstance(held, HeldOut)


def test_heldout_fraction_is_close_and_seeded():
    ids = [f"memory:n12:{i:03x}" for i in range(4096)]
    for frac in (0.1, 0.5):
        share = sum(i in HeldOut(frac, 3) for i in ids) / len(ids)
        assert abs(share - frac) < 0.03
    assert {i for i in ids if i in HeldOut(0.2, 1)} != {i for i in ids if i in HeldOut(0.2, 2)}
    assert all(i in HeldOut(1.0, 0) for i in ids[:50]) and not any(i in HeldOut(0.0, 0) for i in ids[:50])


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"mixture": {"stack": 1}}, "mixture: unknown task"),
        ({"mixture": {"memory": -1}}, "mixture: expected non-negative"),
        ({"knobs": {"memory": [-1]}}, "knobs[memory]: -1 is not a distractor count"),
        ({"knobs": {"registers": [0]}}, "knobs[registers]: 0 is not a writes per register"),
        ({"exclude_groups": HeldOut(1.0, 0)}, "exclude_groups: no"),
        ({"n": -1}, "n: expected an integer"),
    ],
)
def test_stream_errors(kwargs, fragment):
    with pytest.raises(FbtError) as err:
        list(training_documents(TASKS, **{"n": 5, "seed": 0, **kwargs}))
    assert fragment in err.value.message
    with pytest.raises(FbtError, match="heldout fraction"):
        heldout_groups("memory", 1.5)
