"""Generators, label checker and spec validation of the synthetic probe tasks (the paper's appendix F)."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, interpret, load_spec, spec_from_dict
from fbt_probe.tasks.groups import draw_group, render_group
from fbt_probe.tasks.rng import StableRng

SMALL = {"completion": [0, 8], "memory": [0, 3], "registers": [1, 2], "registers-count": [1, 4]}


def small(name: str, **changes):
    return load_spec(name).replace(length_grid=SMALL[name], **changes)


# Oracles written against the text with plain regexes, independent of fbt_probe.tasks.checker.
def oracle(task: str, text: str) -> int:
    if task == "completion":
        r = int(re.search(r"^required = (\d+)$", text, re.M).group(1))
        c = int(re.search(r"^completed = (\d+)$", text, re.M).group(1))
        return int(c == r)
    if task == "memory":
        return int(re.search(r"^state = ([01])$", text, re.M).group(1))
    reg = re.search(r"^query = (r\d+)\nValue:$", text, re.M).group(1)
    return int(re.findall(rf"^{reg} = ([01])$", text, re.M)[-1])


def test_paper_examples():
    """The appendix-F examples, verbatim apart from the elided lines."""
    spec = load_spec("completion")
    tail = "\n".join(["scratch += 0"] * 8 + ["Status:"])
    assert interpret(spec, f"required = 4\ncompleted = 9\nscratch = 7\n{tail}") == 0  # more
    assert interpret(spec, f"required = 4\ncompleted = 4\nscratch = 7\n{tail}") == 1  # done
    mem = load_spec("memory")
    body = "scratch = 0\nscratch ^= 0\nscratch ^= 1\nscratch ^= 1\nscratch ^= 0\nscratch ^= 1\n" + tail.replace(
        "Status:", "# final state:"
    )
    assert [interpret(mem, f"state = {b}\n{body}") for b in (0, 1)] == [0, 1]
    reg = load_spec("registers")
    hist = "r4 = 0\nr4 = 1\nr0 = 1\nr7 = 0\nr7 = 1\nr1 = 0\nscratch = 7\n" + "\n".join(["scratch += 0"] * 7)
    assert interpret(reg, hist + "\nquery = r0\nValue:") == 1 and interpret(reg, hist + "\nquery = r1\nValue:") == 0
    assert interpret(reg, "# # #\n\n" + hist + "\nquery = r7\nValue:") == 1  # padding lines are comments


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("required = 4\ncompleted 4\nStatus:", "not a statement"),
        ("required = 4\nscratch += 1\ncompleted = 4\nStatus:", "updated before it is assigned"),
        ("required = 4\ncompleted = 4\nStatus", "query ending in ':'"),
        ("required = 4\nStatus:", "never assigned"),
        ("required = 4\ncompleted = 4\n# final state:", "is not 'Status:'"),
    ],
)
def test_checker_rejects_malformed_programs(text, fragment):
    with pytest.raises(FbtError, match=re.escape(fragment)):
        interpret(load_spec("completion"), text)


def test_register_checker_rejects_malformed_queries():
    reg = load_spec("registers")
    with pytest.raises(FbtError, match="does not match template"):
        interpret(reg, "r0 = 1\nquery = x0\nValue:")
    with pytest.raises(FbtError, match="never assigned"):
        interpret(reg, "r0 = 1\nquery = r3\nValue:")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    task=st.sampled_from(["completion", "memory", "registers", "registers-count"]),
    seed=st.integers(0, 2**31),
    knob=st.integers(0, 40),
)
def test_checker_agrees_with_generator_and_oracle(task, seed, knob):
    spec = load_spec(task)
    knob = {"registers": 1 + knob % 8, "registers-count": (1, 2, 4, 8, 16)[knob % 5]}.get(task, knob)
    rng = StableRng("test", seed)
    for _ in range(5):
        samples = render_group(spec, knob, draw_group(spec, knob, rng), rng)
        for s in samples:
            assert interpret(spec, s.text) == s.label == oracle(task.split("-")[0], s.text)


def _tokens(df, i):
    return list(df.token_ids.iloc[i])


@pytest.mark.parametrize("task", ["completion", "memory", "registers", "registers-count"])
def test_minimal_pairs_differ_where_the_paper_says(task):
    df = generate(small(task), groups=6, seed=5)
    tok = build_tokenizer()
    vocab = tok.get_vocab()
    assert (df.pair_id.values[0::2] == df.pair_id.values[1::2]).all()  # adjacent rows
    assert df.pair_id.nunique() == len(df) // 2
    for i in range(0, len(df), 2):
        a, b = df.iloc[i], df.iloc[i + 1]
        ia, ib = _tokens(df, i), _tokens(df, i + 1)
        assert len(ia) == len(ib) == a.n_tokens == b.n_tokens
        assert ia[-1] == ib[-1] == vocab[":"]
        assert {a.label, b.label} == {0, 1} and a.group_id == b.group_id and a.length_knob == b.length_knob
        diff = [j for j, (x, y) in enumerate(zip(ia, ib)) if x != y]
        if task == "completion":  # only the completed count
            assert diff == [ia.index(vocab["completed"]) + 2] and a.context_id == b.context_id
        elif task == "memory":  # only the state bit
            assert diff == [2]
        else:  # the schedule and its complement: every written value and nothing else, same query
            values = [
                j + 3 for j in range(0, 5 * (a.text.count("\n") - 9), 5) if ia[j] == vocab["r"]
            ]  # r, i, =, v, newline
            assert diff == values and len(diff) == (16 if task == "registers-count" else 8 * a.length_knob)
            assert a.text.split("\n")[-2] == b.text.split("\n")[-2]


def test_completion_groups_hold_all_four_assignments_and_both_labels():
    df = generate(small("completion"), groups=10, seed=1)
    for (gid, knob), g in df.groupby(["group_id", "length_knob"]):
        a, b = map(int, re.fullmatch(r"completion:p(\d+)-(\d+)", gid).groups())
        got = sorted(
            (int(re.search(r"required = (\d+)", t).group(1)), int(re.search(r"completed = (\d+)", t).group(1)))
            for t in g.text
        )
        assert a < b and got == sorted([(a, a), (a, b), (b, a), (b, b)])
        assert sorted(g.label) == [0, 0, 1, 1]  # every group holds both labels, balanced
    assert df.groupby("group_id").length_knob.nunique().eq(2).all()  # each group at every length


def test_register_groups_are_schedule_complement_and_every_query():
    spec = small("registers-count")
    df = generate(spec, groups=5, seed=2)
    for (gid, knob), g in df.groupby(["group_id", "length_knob"]):
        m = int(knob)
        histories = {t.rsplit("\nquery", 1)[0] for t in g.text}
        assert len(histories) == 2  # a schedule and its complement
        h0, h1 = (re.findall(r"^r\d+ = ([01])$", h, re.M) for h in histories)
        assert len(h0) == 16 and all(x != y for x, y in zip(h0, h1))
        queries = sorted(int(re.search(r"query = r(\d+)", t).group(1)) for t in g.text)
        assert queries == sorted(list(range(m)) * 2) and len(g) == 2 * m
        assert g.pair_id.nunique() == m
    assert {int(k): c["groups"] for k, c in df.attrs["counts"].items()} == {1: 5, 4: 5}


def test_fold_leakage_is_impossible_and_majority_is_half():
    from fbt_probe.probes.splits import grouped_splits, majority_baseline

    df = generate(load_spec("completion").replace(length_grid=[8]), seed=0)
    assert df.group_id.nunique() == 80 and len(df) == 320
    splits = grouped_splits(df.label.to_numpy(), df.group_id.to_numpy(), n_splits=4)
    for train, test in splits:
        assert not set(df.group_id.iloc[train]) & set(df.group_id.iloc[test])
    assert abs(float(np.mean(majority_baseline(df.label.to_numpy(), splits))) - 0.5) <= 0.01
    reg = generate(small("registers"), groups=8, seed=0)

    def schedule(text: str) -> str:  # the history up to complement: values XOR the first value
        writes = re.findall(r"^r(\d+) = ([01])$", text, re.M)
        return tuple((r, int(v) ^ int(writes[0][1])) for r, v in writes)

    for tr, te in grouped_splits(reg.label.to_numpy(), reg.group_id.to_numpy(), n_splits=4):
        train, test = reg.iloc[tr], reg.iloc[te]
        # a schedule, its complement and all their queries stay on one side
        assert not set(map(schedule, train.text)) & set(map(schedule, test.text))


def test_exact_padding_and_its_refusal():
    spec = small("registers-count", pad_to=130)
    df = generate(spec, groups=3, seed=0)
    assert set(df.n_tokens) == {130} and df.attrs["padded_to"] == 130
    assert all(t.startswith("# ") for t in df.text)
    assert all(interpret(spec, t) == y for t, y in zip(df.text, df.label))
    with pytest.raises(FbtError, match=r"field 'pad_to': sample 0 already has 119 tokens, more than 100"):
        generate(small("registers-count", pad_to=100), groups=2, seed=0)


def _digit_tokenizer():
    """The built-in vocabulary with every digit a token of its own (as some BPE tokenizers split)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    base = build_tokenizer()
    tok = Tokenizer(models.WordLevel(base.get_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[ \t\r]+"), "removed"),
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.Split(":", "isolated"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    return tok


def test_exact_padding_when_lengths_differ():
    """Under a tokenizer that splits r10 into r, 1, 0 the m = 12 schedules are longer than the m = 4
    ones; "max" pads the shorter ones so every input has the same length, and the labels still hold."""
    spec = load_spec("registers-count").replace(assignments=24, length_grid=[4, 12], pad_to="max", suffix_spans=None)
    tok = _digit_tokenizer()
    natural = generate(spec.replace(pad_to=None), groups=2, seed=0, tokenizer=tok)
    assert natural.n_tokens.nunique() > 1
    df = generate(spec, groups=2, seed=0, tokenizer=tok)
    assert df.n_tokens.nunique() == 1 and df.attrs["padded_to"] == natural.n_tokens.max()
    assert all(interpret(spec, t) == y for t, y in zip(df.text, df.label))
    with pytest.raises(FbtError, match=r"suffix_spans' k=4: '\{i\}\\nValue:' covers \[4, 5\] tokens"):
        generate(spec.replace(suffix_spans={"4": "{i}\nValue:"}), groups=2, seed=0, tokenizer=tok)


def test_suffix_spans_cover_the_papers_tokens():
    df = generate(small("registers"), groups=2, seed=0)
    assert df.attrs["suffix_tokens"] == {"1": 1, "2": 2, "4": 4}
    tok = build_tokenizer()
    last4 = [tok.id_to_token(i) for i in list(df.token_ids.iloc[0])[-4:]]
    assert last4[1:] == ["\n", "Value", ":"] and last4[0].isdigit()  # the register digit, newline, Value, colon


def test_suffix_spans_refuse_a_span_that_is_not_the_end():
    with pytest.raises(FbtError, match="suffix_spans' k=2"):
        generate(small("registers", suffix_spans={"2": "Status:"}), groups=1, seed=0)


def test_default_specs_are_the_papers():
    expected = {
        "completion": ((0, 8, 32, 128, 256), 80, ("more", "done")),
        "memory": ((0, 8, 32, 128, 256), 128, ("zero", "one")),
        "registers": ((2, 4, 8), 128, ("zero", "one")),
        "registers-count": ((1, 2, 4, 8), 128, ("zero", "one")),
    }
    for name, (grid, groups, words) in expected.items():
        spec = load_spec(name)
        assert (spec.length_grid, spec.groups, spec.label_words) == (grid, groups, words)
    assert load_spec("registers").registers == 8 and load_spec("registers-count").assignments == 16
    assert load_spec("registers").empty_updates == 8 and load_spec("registers-count").pad_to == "max"


BAD_SPECS = [
    ({"kind": "stack"}, "field 'kind': expected one of completion, memory, registers"),
    ({"pairs_per_cell": 3}, "field 'pairs_per_cell'"),
    ({"length_grid": [0, -3]}, "field 'length_grid[1]'"),
    ({"length_grid": [0, 2.5]}, "'length_grid[1]'"),
    ({"length_grid": [99999]}, "'length_grid[0]': 99999 is not a distractor count that can be produced"),
    ({"groups": 0}, "field 'groups': expected an integer 1..100000"),
    ({"seed": "one"}, "field 'seed'"),
    ({"label_words": {"0": "done", "1": "done"}}, "field 'label_words'"),
    (
        {
            "template": {
                "header": ["required = {R}", "completed = {C}", "scratch = {S}"],
                "distractor": "scratch += 0",
                "query": "Status",
            }
        },
        "field 'template.query'",
    ),
    (
        {
            "template": {
                "header": ["required = {R}", "completed = {C}", "scratch = {S}"],
                "distractor": "completed += 1",
                "query": "Status:",
            }
        },
        "field 'template.distractor'",
    ),
    (
        {
            "template": {
                "header": ["required = {R}", "completed = {R}", "scratch = {S}"],
                "distractor": "scratch += 0",
                "query": "Status:",
            }
        },
        "placeholder {C} exactly once",
    ),
    ({"relation": "scratch == required"}, "field 'relation'"),
    ({"relation": "completed > required"}, "field 'relation'"),
    ({"value_range": [5, 2]}, "field 'value_range'"),
    ({"value_range": [3, 3]}, "field 'value_range'"),
    ({"value_range": [0, 10**9]}, "field 'value_range'"),  # bounded: never a quadratic check or a hang
]


@pytest.mark.parametrize("change, fragment", BAD_SPECS)
def test_bad_spec_fields_name_file_and_field(tmp_path, change, fragment):
    raw = {**load_spec("completion").to_dict(), **change}
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(FbtError) as err:
        load_spec(path)
    assert str(path) in err.value.message and fragment in err.value.message


def test_bad_spec_files_and_names(tmp_path):
    with pytest.raises(FbtError, match="unknown task and no such spec file"):
        load_spec("completon")
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(FbtError, match=r"x.json: not a valid JSON task spec"):
        load_spec(bad)
    raw = load_spec("registers").to_dict()
    with pytest.raises(FbtError, match=r"field 'length_grid\[0\]'.*writes per register"):
        spec_from_dict({**raw, "length_grid": [0]}, source="r.json")
    with pytest.raises(FbtError, match="exactly one of 'registers'"):
        spec_from_dict({**raw, "assignments": 16}, source="r.json")
    with pytest.raises(FbtError, match=r"'length_grid\[0\]'.*register count dividing 16"):
        spec_from_dict(
            {k: v for k, v in {**raw, "assignments": 16, "length_grid": [3]}.items() if k != "registers"},
            source="r.json",
        )
    with pytest.raises(FbtError, match="field 'pad_to'"):
        spec_from_dict({**raw, "pad_to": "min"}, source="r.json")
    raw = load_spec("memory").to_dict()
    with pytest.raises(FbtError, match="field 'answer'"):
        spec_from_dict({**raw, "answer": "scratch"}, source="m.json")
    with pytest.raises(FbtError, match="field 'seed'"):
        spec_from_dict({k: v for k, v in raw.items() if k != "seed"}, source="m.json")


def test_spec_roundtrip_and_variant_copy(tmp_path):
    for name in ("completion", "memory", "registers", "registers-count"):
        spec = load_spec(name)
        copy = tmp_path / f"{name}_copy.json"
        copy.write_text(json.dumps({**spec.to_dict(), "task": f"{name}_copy"}))
        assert load_spec(copy).replace(task=name) == spec


def test_generation_refuses_a_label_the_checker_disputes(monkeypatch):
    import dataclasses

    import fbt_probe.tasks.generators as gen

    real = gen.render_group

    def mislabel(spec, knob, group, rng, contexts=None):
        out = real(spec, knob, group, rng, contexts)
        return None if out is None else [dataclasses.replace(out[0], label=1 - out[0].label)] + out[1:]

    monkeypatch.setattr(gen, "render_group", mislabel)
    with pytest.raises(FbtError, match=r"memory: sample 0 \(pair 0, .*\): label checker says \d"):
        generate(small("memory"), groups=2, seed=0)


def test_generation_refuses_label_words_outside_the_tokenizer():
    spec = small("memory", label_words={"0": "nought", "1": "one"})
    with pytest.raises(FbtError, match=r"label word 'nought' is (not in the vocabulary|not one token)"):
        generate(spec, groups=2, seed=0, tokenizer=build_tokenizer())


@pytest.mark.slow
def test_paper_sized_datasets():
    """The appendix-F sizes and lengths with the built-in tokenizer (paper: 1,600 / 80, 1,280 / 128,
    3,840 per condition over m, 2,048 / 128 per writes value)."""
    colon = build_tokenizer().token_to_id(":")
    expected = {
        "completion": (1600, 80, {0: 14, 8: 46, 32: 142, 128: 526, 256: 1038}),
        "memory": (1280, 128, {0: 52, 8: 84, 32: 180, 128: 564, 256: 1076}),
        "registers": (6144, 384, {2: 119, 4: 199, 8: 359}),
        "registers-count": (3840, 512, {1: 119, 2: 119, 4: 119, 8: 119}),
    }
    for name, (rows, groups, lengths) in expected.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = generate(name)
        assert not caught
        assert (len(df), df.group_id.nunique()) == (rows, groups)
        assert {k: set(g) for k, g in df.groupby("length_knob").n_tokens} == {k: {v} for k, v in lengths.items()}
        assert all(ids[-1] == colon for ids in df.token_ids)
        assert df.text.nunique() == len(df) or name == "completion"  # (a,a) may recur across completion groups
