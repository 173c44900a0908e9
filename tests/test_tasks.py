"""Generators, label checker and spec validation of the synthetic probe tasks (DESIGN §4)."""
from __future__ import annotations

import json
import re
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, interpret, load_spec, spec_from_dict
from fbt_probe.tasks.generators import draw_cell, group_ids, render

SMALL = {"completion": [0, 8], "memory": [8, 12], "registers": [1, 2]}


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
    reg = re.search(r"^# (r\d):$", text, re.M).group(1)
    return int(re.findall(rf"^{reg} = ([01])$", text, re.M)[-1])


def test_explainer_examples():
    spec = load_spec("completion")
    tail = "\n".join(["scratch += 0"] * 8 + ["Status:"])
    assert interpret(spec, f"required = 4\ncompleted = 9\nscratch = 7\n{tail}") == 0  # MORE
    assert interpret(spec, f"required = 4\ncompleted = 4\nscratch = 7\n{tail}") == 1  # DONE
    mem = load_spec("memory")
    body = "scratch = 0\nscratch ^= 0\nscratch ^= 1\n# final state:"
    assert [interpret(mem, f"state = {b}\n{body}") for b in (0, 1)] == [0, 1]
    reg = load_spec("registers")
    hist = "r3 = 1\nr1 = 0\nr3 = 0\nr1 = 1"
    assert interpret(reg, hist + "\n# r3:") == 0 and interpret(reg, hist + "\n# r1:") == 1


@pytest.mark.parametrize("text, fragment", [
    ("required = 4\ncompleted 4\nStatus:", "not a statement"),
    ("required = 4\nscratch += 1\ncompleted = 4\nStatus:", "updated before it is assigned"),
    ("required = 4\ncompleted = 4\nStatus", "query ending in ':'"),
    ("required = 4\nStatus:", "never assigned"),
    ("required = 4\ncompleted = 4\n# final state:", "is not 'Status:'"),
])
def test_checker_rejects_malformed_programs(text, fragment):
    with pytest.raises(FbtError, match=re.escape(fragment)):
        interpret(load_spec("completion"), text)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.sampled_from(["completion", "memory", "registers"]), seed=st.integers(0, 2**31), knob=st.integers(0, 48))
def test_checker_agrees_with_generator_and_oracle(task, seed, knob):
    spec = load_spec(task)
    knob = 1 + knob % 8 if task == "registers" else knob
    draws = draw_cell(spec, knob, 25, seed)
    for d in draws:
        samples = render(spec, knob, d)
        assert [g for *_, g in samples] == group_ids(spec, d)
        assert sorted(label for _, label, _ in samples) == [0, 1]
        for text, label, _ in samples:
            assert interpret(spec, text) == label == oracle(task, text)


def test_relation_is_a_task_parameter():
    spec = small("completion", task="completion_ge", relation="completed >= required")
    df = generate(spec, pairs=40, seed=3)
    for text, label in zip(df.text, df.label):
        r = int(re.search(r"required = (\d+)", text).group(1))
        c = int(re.search(r"completed = (\d+)", text).group(1))
        assert label == int(c >= r)
    assert set(df.group_id.str.split(":").str[0]) == {"completion_ge"}


@pytest.mark.parametrize("task", ["completion", "memory", "registers"])
def test_pairs_differ_only_in_the_label_field(task):
    df = generate(small(task), pairs=30, seed=5)
    tok = build_tokenizer()
    colon = tok.token_to_id(":")
    assert (df.pair_id.values[0::2] == df.pair_id.values[1::2]).all()  # adjacent rows
    assert df.pair_id.nunique() == len(df) // 2
    for a, b in zip(df.iloc[0::2].itertuples(), df.iloc[1::2].itertuples()):
        ia, ib = list(a.token_ids), list(b.token_ids)
        assert len(ia) == len(ib) == a.n_tokens == b.n_tokens
        diff = [i for i, (x, y) in enumerate(zip(ia, ib)) if x != y]
        if task == "completion":
            expected = [ia.index(tok.token_to_id("completed")) + 2]  # the C digit
        else:
            expected = [2] if task == "memory" else [len(ia) - 2]  # the state bit / queried register
        assert diff == expected
        assert ia[-1] == ib[-1] == colon
        assert {a.label, b.label} == {0, 1} and a.context_id == b.context_id and a.length_knob == b.length_knob
        assert (a.group_id == b.group_id) == (task != "completion")


def _context_text(task: str, text: str) -> str:
    """What a pair shares, read from one sample: drop the label-dependent line."""
    lines = text.split("\n")
    if task == "completion":
        return "\n".join(l for l in lines if not l.startswith("completed"))
    return "\n".join(lines[1:] if task == "memory" else lines[:-1])


@pytest.mark.parametrize("task, knob", [("memory", 4), ("memory", 9), ("registers", 1), ("completion", 2)])
def test_ids_are_one_to_one_with_contexts(task, knob):
    spec = load_spec(task)
    seen_group, seen_ctx = {}, {}
    for seed in range(3):
        for d in draw_cell(spec, knob, 200, seed):
            for text, _, group in render(spec, knob, d):
                ctx = _context_text(task, text)
                assert seen_ctx.setdefault(d.context_id, ctx) == ctx
                key = re.findall(r"^(?:required|completed) = \d+$", text, re.M) if task == "completion" else ctx
                assert seen_group.setdefault(group, key) == key
    assert len(set(seen_ctx.values())) == len(seen_ctx)  # different contexts never share an id
    if task != "completion":
        assert len(set(map(str, seen_group.values()))) == len(seen_group)
    else:
        assert len(seen_group) == 100 and len(seen_ctx) == 100  # (R, C) and (R, S) over 0..9


def test_cells_hold_distinct_pairs_and_prefix_property():
    spec = load_spec("memory").replace(length_grid=[3, 8])
    with pytest.warns(UserWarning, match="distractors=3 has only 8 distinct"):
        df = generate(spec, pairs=20, seed=0)
    assert df.attrs["counts"]["3"]["pairs"] == 8 and df.attrs["counts"]["8"]["pairs"] == 20
    assert df[df.length_knob == 8].group_id.nunique() == 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = generate(spec, pairs=30, seed=0)
    for knob in (3, 8):
        a, b = df[df.length_knob == knob].text.tolist(), big[big.length_knob == knob].text.tolist()
        assert b[: len(a)] == a
    with pytest.warns(UserWarning, match="distractors=0 has only 1"):
        assert len(generate(load_spec("memory").replace(length_grid=[0]), pairs=5)) == 2


def test_default_specs_shape():
    for name, grid in (("completion", (0, 8, 32, 128, 256)), ("memory", (0, 8, 32, 128, 256)), ("registers", (2, 4, 8))):
        spec = load_spec(name)
        assert spec.length_grid == grid and 100 <= spec.pairs_per_cell <= 200
    assert load_spec("registers").registers == 8
    assert load_spec("completion").label_words == ("MORE", "DONE")
    assert load_spec("memory").label_words == ("ZERO", "ONE")


BAD_SPECS = [
    ({"kind": "stack"}, "field 'kind': expected one of completion, memory, registers"),
    ({"pairs_per_cel": 3}, "field 'pairs_per_cel'"),
    ({"length_grid": [0, -3]}, "field 'length_grid[1]'"),
    ({"length_grid": [0, 2.5]}, "'length_grid[1]'"),
    ({"length_grid": [99999]}, "'length_grid[0]': 99999 is not a distractor count that can be produced"),
    ({"pairs_per_cell": 0}, "field 'pairs_per_cell': expected an integer >= 1"),
    ({"seed": "one"}, "field 'seed'"),
    ({"label_words": {"0": "DONE", "1": "DONE"}}, "field 'label_words'"),
    ({"template": {"header": ["required = {R}", "completed = {C}", "scratch = {S}"], "distractor": "scratch += 0", "query": "Status"}}, "field 'template.query'"),
    ({"template": {"header": ["required = {R}", "completed = {C}", "scratch = {S}"], "distractor": "completed += 1", "query": "Status:"}}, "field 'template.distractor'"),
    ({"template": {"header": ["required = {R}", "completed = {R}", "scratch = {S}"], "distractor": "scratch += 0", "query": "Status:"}}, "placeholder {C} exactly once"),
    ({"relation": "scratch == required"}, "field 'relation'"),
    ({"relation": "completed > required", "value_range": [3, 3]}, "field 'relation'"),
    ({"value_range": [5, 2]}, "field 'value_range'"),
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
    with pytest.raises(FbtError, match="field 'registers'"):
        spec_from_dict({**raw, "registers": 1}, source="r.json")
    raw = load_spec("memory").to_dict()
    with pytest.raises(FbtError, match="field 'answer'"):
        spec_from_dict({**raw, "answer": "scratch"}, source="m.json")
    with pytest.raises(FbtError, match="field 'seed'"):
        spec_from_dict({k: v for k, v in raw.items() if k != "seed"}, source="m.json")


def test_spec_roundtrip_and_variant_copy(tmp_path):
    for name in ("completion", "memory", "registers"):
        spec = load_spec(name)
        copy = tmp_path / f"{name}_copy.json"
        copy.write_text(json.dumps({**spec.to_dict(), "task": f"{name}_copy"}))
        assert load_spec(copy).replace(task=name) == spec


def test_generation_refuses_a_label_the_checker_disputes(monkeypatch):
    import fbt_probe.tasks.generators as gen

    real = gen.render

    def mislabel(spec, knob, draw):
        (t0, l0, g0), second = real(spec, knob, draw)
        return [(t0, 1 - l0, g0), second]

    monkeypatch.setattr(gen, "render", mislabel)
    with pytest.raises(FbtError, match=r"memory: sample 0 \(pair 0, .*\): label checker says \d"):
        generate(small("memory"), pairs=2, seed=0)


@pytest.mark.slow
def test_default_datasets_cells_and_lengths():
    colon = build_tokenizer().token_to_id(":")
    expected = {"completion": {0: 14, 8: 46, 32: 142, 128: 526, 256: 1038},
                "memory": {0: 12, 8: 44, 32: 140, 128: 524, 256: 1036}, "registers": {2: 67, 4: 131, 8: 259}}
    for name, lengths in expected.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = generate(name)
        assert {k: set(g) for k, g in df.groupby("length_knob").n_tokens} == {k: {v} for k, v in lengths.items()}
        assert all(ids[-1] == colon for ids in df.token_ids)
        pairs = {int(k): c["pairs"] for k, c in df.attrs["counts"].items()}
        full = load_spec(name).pairs_per_cell
        assert pairs == {k: (1 if (name, k) == ("memory", 0) else full) for k in lengths}  # memory n=0: one context
        assert [str(w.message) for w in caught] == (["memory: distractors=0 has only 1 distinct pair(s) (asked for 128)"]
                                                    if name == "memory" else [])
