"""The one-token-a-step serial-depth tasks (`chain-s3`, `chain-a5`: kind compose with `inline_steps`).

Every label is recomputed here a third way (the generator composes tuples, the checker reads the
text word by word): the text is parsed by a regular expression and the point moved through the
generators by plain dictionary look-ups. Pairs, token lengths, the one-token steps, the held-out
words per k and the CLI are checked on generated data, never against stored values.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, heldout_groups, load_dataset, load_spec, training_documents
from fbt_probe.tasks.checker import check_sample, interpret
from fbt_probe.tasks.spec import spec_from_dict
from fbt_probe.tasks.tokenizer import encode, tokenizer_sha256

TASKS = ("chain-s3", "chain-a5")
# the generators written out by cycle, independent of the spec files: point -> image
CYCLES = {
    "chain-s3": ([(0, 1)], [(0, 1, 2)]),
    "chain-a5": ([(0, 1, 2, 3, 4)], [(0, 1, 2)]),
}
POINTS = {"chain-s3": 3, "chain-a5": 5}
ACCEPT = {"chain-s3": {0}, "chain-a5": {0, 1}}
TEXT = re.compile(r"state = (\d)\n((?:\d )*\d)\n# final state:")
runner = CliRunner()
# k = 2 and 4 have only 4 and 16 words: generation says so for every request above that
pytestmark = pytest.mark.filterwarnings("ignore:.*distinct group:UserWarning")


def from_cycles(cycles, n: int) -> dict:
    image = {x: x for x in range(n)}
    for cycle in cycles:
        for i, x in enumerate(cycle):
            image[x] = cycle[(i + 1) % len(cycle)]
    return image


def generators(task: str) -> list[dict]:
    return [from_cycles(c, POINTS[task]) for c in CYCLES[task]]


def parse(text: str) -> tuple[int, list[int]]:
    m = TEXT.fullmatch(text)
    assert m is not None, text
    return int(m.group(1)), [int(w) for w in m.group(2).split(" ")]


def recompute(task: str, text: str) -> int:
    point, word = parse(text)
    gens = generators(task)
    for g in word:
        point = gens[g][point]
    return int(point in ACCEPT[task])


def closure(gens: list[dict], n: int) -> set:
    """Every permutation the generators give (products of generators), as tuples of images."""
    ident = tuple(range(n))
    seen, frontier = {ident}, [ident]
    while frontier:
        q = frontier.pop()
        for g in gens:
            r = tuple(g[x] for x in q)
            if r not in seen:
                seen.add(r)
                frontier.append(r)
    return seen


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def data(tok):
    return {t: generate(load_spec(t), groups=24, seed=3, tokenizer=tok) for t in TASKS}


@pytest.mark.parametrize("task, order", [("chain-s3", 6), ("chain-a5", 60)])
def test_the_specs_hold_the_named_generators_and_they_generate_s3_and_a5(task, order):
    spec = load_spec(task)
    gens = generators(task)
    assert [list(p) for p in spec.permutations] == [[g[x] for x in range(POINTS[task])] for g in gens]
    assert set(spec.accept) == ACCEPT[task] and spec.inline_steps is True and spec.kind == "compose"
    assert len(closure(gens, POINTS[task])) == order
    # the base vocabulary holds every word: the tokenizer that training builds is unchanged
    assert tokenizer_sha256(build_tokenizer([spec])) == tokenizer_sha256(build_tokenizer())


@pytest.mark.parametrize("task", TASKS)
def test_every_label_equals_a_recomputation_from_the_text(task, data):
    df = data[task]
    assert len(df) > 0
    assert df["label"].tolist() == [recompute(task, t) for t in df["text"]]
    assert (df["label_word"] == df["label"].map({0: "zero", 1: "one"})).all()
    for text, k in zip(df["text"], df["length_knob"]):
        assert len(parse(text)[1]) == k


@pytest.mark.parametrize("task", TASKS)
def test_pairs_differ_by_one_token_in_the_start_with_equal_length_and_final_token(task, data, tok):
    df = data[task]
    for _, pair in df.groupby("pair_id"):
        (a, b), (ta, tb) = pair["token_ids"].tolist(), pair["text"].tolist()
        assert len(a) == len(b) and a[-1] == b[-1]
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert diff == [2]  # `state`, `=`, then the start point: the one edit
        assert parse(ta)[1] == parse(tb)[1] and sorted(pair["label"]) == [0, 1]
    assert df["token_ids"].map(lambda ids: ids[-1]).nunique() == 1
    assert tok.id_to_token(df["token_ids"].iloc[0][-1]) == ":"


@pytest.mark.parametrize("task", TASKS)
def test_every_step_is_one_token_and_the_longest_sample_fits_in_40(task, data, tok):
    spec, df = load_spec(task), data[task]
    for g in range(len(spec.permutations)):
        word = spec.template["step"].format(g=g)
        (ids,) = encode(tok, [word])
        assert len(ids) == 1 and tok.decode(ids) == word
    newline = tok.token_to_id("\n")
    for ids, text, k in zip(df["token_ids"], df["text"], df["length_knob"]):
        first, second = [i for i, t in enumerate(ids) if t == newline]
        steps = ids[first + 1 : second]
        assert len(steps) == k and tok.decode(steps) == text.split("\n")[1]
        assert encode(tok, [text])[0] == ids
    assert (df["n_tokens"] == 9 + df["length_knob"]).all()
    top = max(spec.length_grid)
    assert df[df["length_knob"] == top]["n_tokens"].max() <= 40 and set(df["length_knob"]) == set(spec.length_grid)


@pytest.mark.parametrize("task", TASKS)
def test_each_k_has_held_out_words_and_training_never_sees_them(task, tok):
    spec = load_spec(task)
    held = heldout_groups(task, fraction=0.2, seed=0)  # the split of `fbt-probe train --seed 0`
    probe = generate(spec, groups=16, seed=0, tokenizer=tok, contexts=held)
    assert set(probe["length_knob"]) == set(spec.length_grid)  # every k has at least one held-out word
    assert probe["context_id"].map(lambda c: c in held).all()
    docs = list(training_documents([task], tok, n=600, seed=1, exclude_groups=held))
    for k in spec.length_grid:
        train = {tuple(parse(d["text"])[1]) for d in docs if d["length_knob"] == k}
        heldout = {tuple(parse(t)[1]) for t in probe[probe["length_knob"] == k]["text"]}
        assert train and heldout and not train & heldout, k
    for d in docs[:50]:
        assert d["label"] == recompute(task, d["text"])
        assert tok.id_to_token(d["token_ids"][d["answer_pos"]]) == d["label_word"]


def test_the_checker_reads_one_step_line_and_refuses_others(data):
    spec, df = load_spec("chain-a5"), data["chain-a5"]
    text, label = df["text"].iloc[0], int(df["label"].iloc[0])
    check_sample(spec, text, label, spec.label_words[label], "ok")
    with pytest.raises(FbtError, match="label checker says"):
        check_sample(spec, text, 1 - label, spec.label_words[1 - label], "flipped")
    start, word = parse(text)
    for bad in (
        f"state = {start}\n" + "\n".join(map(str, word)) + "\n# final state:",  # a line a step
        f"state = {start}\n" + " ".join(map(str, word)) + " 2\n# final state:",  # no generator 2
        f"state = {start}\n" + "  ".join(map(str, word)) + "\n# final state:",  # an empty word
        "state = 5\n" + " ".join(map(str, word)) + "\n# final state:",  # not a point of 0..4
    ):
        with pytest.raises(FbtError):
            interpret(spec, bad)
    word[0] = 1 - word[0]  # one step changed: the checker follows the text
    edited = f"state = {start}\n" + " ".join(map(str, word)) + "\n# final state:"
    assert interpret(spec, edited) == recompute("chain-a5", edited)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("inline_steps", "yes", "field 'inline_steps'"),
        ("template", {"start": "state = {A}", "step": "r {g}", "query": "# final state:"}, "one word"),
        ("length_grid", [0, 4], "number of dependent steps"),
    ],
)
def test_spec_errors_name_the_field(field, value, message):
    raw = json.loads(json.dumps(load_spec("chain-s3").to_dict())) | {field: value}
    with pytest.raises(FbtError, match=re.escape(message)):
        spec_from_dict(raw, source="variant.json")


def test_the_line_designs_keep_their_spec_records():
    for name in ("compose", "compose-s3", "compose-s3-lines"):
        spec = load_spec(name)
        assert spec.inline_steps is None and "inline_steps" not in spec.to_dict()


def cli(*args):
    return runner.invoke(app, ["tasks", *map(str, args)])


def test_cli_lists_and_generates_byte_identical_files_and_refuses_bad_input_in_one_line(tmp_path):
    res = cli("list")
    assert res.exit_code == 0 and "chain-s3" in res.output and "chain-a5" in res.output
    assert "steps=2/4/8/16/24" in res.output
    for out in ("a", "b"):
        res = cli("generate", "chain-s3", "chain-a5", "--out", tmp_path / out, "--groups", 8, "--seed", 4)
        assert res.exit_code == 0, res.output
    for task in TASKS:
        one, two = (tmp_path / out / f"{task}.parquet" for out in ("a", "b"))
        assert one.read_bytes() == two.read_bytes()
        df = load_dataset(one)
        assert df["label"].tolist() == [recompute(task, t) for t in df["text"]]
    other = tmp_path / "c"
    assert cli("generate", "chain-s3", "--out", other, "--groups", 8, "--seed", 5).exit_code == 0
    assert (other / "chain-s3.parquet").read_bytes() != (tmp_path / "a" / "chain-s3.parquet").read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(load_spec("chain-s3").to_dict() | {"task": "bad", "inline_steps": 1}))
    for args in (
        ["generate", bad, "--out", tmp_path / "d"],
        ["generate", "chain-s3", "--out", tmp_path / "d", "--groups", 0],
    ):
        res = cli(*args)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
        assert res.output.startswith("error: ")


def test_training_reads_the_spec_grid():
    from fbt_probe.training.config import TrainConfig

    cfg = TrainConfig(tasks=("chain-s3",))
    assert cfg.knobs == {"chain-s3": [2, 4, 8, 16, 24]}
