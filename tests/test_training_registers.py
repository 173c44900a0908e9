"""Register training stages: the register mix (several supervised queries per document,
zero scratch lines, a weighted mixture of kinds), answer-only loss, constant lr, `--init` of a
feedback or baseline run, and the defaults left exactly as they were."""

import hashlib
import json
import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, load_spec
from fbt_probe.training import TrainConfig, run_training
from fbt_probe.training.data import (
    _mix_docs,
    batches_for_step,
    cell_probabilities,
    heldout,
    one_per_row,
    validation_batch,
)
from fbt_probe.training.evaluate import eval_samples
from fbt_probe.training.loop import lr_at

runner = CliRunner()
REG = ("registers", "registers-count")


def _tensor_digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _frame_digest(df) -> str:
    h = hashlib.sha256()
    for row in df[["task", "text", "label", "group_id", "context_id", "length_knob", "pair_id"]].itertuples(
        index=False
    ):
        h.update(repr(tuple(row)).encode())
    for ids in df["token_ids"]:
        h.update(repr(list(map(int, ids))).encode())
    return h.hexdigest()


# computed with these two functions at main 2302557, before the register mix existed
MAIN_DIGESTS = {
    "batches": "8c5c5a7f03daca6619f9649d48abf361dcda33fab9142d1bc5051874da9e3635",
    "val": "545f0c53b8e1300ac458204f8b8a4fc489abe314b64354bd0f30260dc5a55b23",
    "eval": "3ff17d27669ef05222428f96546d85bb56c05126d34b1399a58b207d2d63d046",
    "completion": "266c172c3c780521d3dce1afeb180288566f4507423c9845dcfddf2363915a22",
    "memory": "16b6f29784a528d36b3ce7e381b183e87f6c6cec28345bcc7a54095593f38053",
    "registers": "a737deb3ceadb463d9eb47f7baa30d7a25d5322e6dc72536a81dff64b4094fe6",
    "registers-count": "4032e40e98e2b8a4af332854e96a909f44d04be612138fc8ffc33a5339c6b8dd",
}
MAIN_CONFIG_FIELDS = [
    "answer_share",
    "answer_weight",
    "arch",
    "baseline",
    "betas",
    "clip",
    "cross_stream_layers",
    "dtype",
    "eval_every",
    "heldout_fraction",
    "knobs",
    "lam",
    "lr",
    "min_lr_ratio",
    "noise",
    "one_pass_steps",
    "prefix_mix",
    "preset",
    "save_every",
    "schedule",
    "seed",
    "steps",
    "streams",
    "task_shares",
    "tasks",
    "tokens_per_step",
    "warmup",
    "weight_decay",
]


def test_defaults_give_the_batches_datasets_and_config_of_before():
    tok = build_tokenizer()
    cfg = TrainConfig()
    got = {
        "batches": _tensor_digest([t for step in range(3) for b in batches_for_step(cfg, tok, step) for t in b]),
        "val": _tensor_digest(list(validation_batch(cfg, tok))),
        "eval": _frame_digest(eval_samples(cfg, tok, pairs=4)),
    }
    got.update(
        {t: _frame_digest(generate(load_spec(t), groups=3, tokenizer=tok)) for t in ("completion", "memory", *REG)}
    )
    assert got == MAIN_DIGESTS
    assert (
        sorted(cfg.to_dict()) == MAIN_CONFIG_FIELDS
    )  # a run that uses none of the new fields records what it did before
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def _labelled(tok, toks, targets, weights):
    """(text before each answer, answer word) of every weighted position of one row."""
    words = [tok.id_to_token(int(i)) for i in toks]
    return [
        (" ".join(words[: p + 1]), tok.id_to_token(int(targets[p])))
        for p in torch.nonzero(weights > 0).flatten().tolist()
    ]


def _latest(text: str) -> dict:
    """An independent reading of a register document: register -> its last written value."""
    return {int(r): int(v) for r, v in re.findall(r"\br (\d+) = (\d+)", text)}


def test_register_mix_documents_supervise_every_query():
    tok = build_tokenizer()
    mix = "2:wpr:1:0 2:wpr:2:0 3:12:2 1:wpr:2:1:0.5"
    cfg = TrainConfig(tasks=REG, register_mix=mix, register_queries=3, answer_share=1.0, tokens_per_step=800)
    assert cfg.register_mix == "2:wpr:1:0:1 2:wpr:2:0:1 3:wpr:4:2:1 1:wpr:2:1:0.5"
    shapes = {
        (2, 1, 0): 10 + 27,
        (2, 2, 0): 20 + 27,
        (3, 4, 2): 60 + 8 + 27,
        (1, 2, 1): 10 + 4 + 27,
    }  # 5 tokens a write, 4 a scratch line, 9 a query
    seen = set()
    for step in range(3):
        for toks, targets, weights in batches_for_step(cfg, tok, step):
            for r in range(toks.shape[0]):
                text = " ".join(tok.id_to_token(int(i)) for i in toks[r])
                writes = re.findall(r"\br (\d+) = (\d+)", text.split("query")[0])
                m, n_scratch = len({w[0] for w in writes}), text.count("scratch")
                kind = (m, len(writes) // m, n_scratch)
                assert toks.shape[1] == shapes[kind] and sorted(int(w[0]) for w in writes) == sorted(
                    list(range(m)) * kind[1]
                )
                seen.add(kind)
                answers = _labelled(tok, toks[r], targets[r], weights[r])
                assert len(answers) == 3 and torch.allclose(weights[r][weights[r] > 0], torch.full((3,), 1 / 3))
                asked = []
                for prefix, word in answers:
                    assert prefix.endswith("Value :")
                    q = int(re.findall(r"query = r (\d+)", prefix)[-1])
                    asked.append(q)
                    assert word == ("zero", "one")[_latest(prefix.split("query")[0])[q]]
                assert len(set(asked)) == min(3, m)  # distinct registers while there are enough
    assert seen == set(shapes)
    # each kind's share of the documents is its weight; the kinds together take the register tasks' token share
    both = TrainConfig(
        tasks=("completion", "registers"), task_shares={"completion": 0.6, "registers": 0.4}, register_mix=mix
    )
    cells, lengths, p = cell_probabilities(both, tok)
    mixed = np.array([c[0] == "register-mix" for c in cells])
    assert np.allclose(p[mixed] / p[mixed].sum(), np.array([1, 1, 1, 0.5]) / 3.5, rtol=0, atol=1e-12)
    assert (p * lengths)[mixed].sum() / (p * lengths).sum() == pytest.approx(0.4, abs=1e-12)
    assert [c for c in cells if c[0] != "register-mix"] == [("completion", 0), ("completion", 8), ("completion", 32)]


def _gid(task, m, writes, s):
    """The probe group id of a schedule (tasks/groups.py's naming, written out here): values complemented
    so the first is 0, each write one hex digit 2 * register + value."""
    flip = writes[0][1]
    return f"{task}:m{m}w{len(writes) // m}S{s}:" + "".join(format(2 * r + (v ^ flip), "x") for r, v in writes)


def test_register_mix_never_draws_a_held_out_schedule():
    """Schedules are named as probe groups are; one held out under either register task's name is
    never drawn for training (validation draws only those). Small kinds, so the held-out names are
    hit often: every other schedule of the kind is drawn."""
    tok = build_tokenizer()
    cfg = TrainConfig(tasks=REG, register_mix="1:wpr:1:1 2:wpr:1:1")
    held = heldout(cfg)
    spaces = {
        0: {_gid("x", 1, [(0, 0)], s).split(":", 1)[1] for s in range(10)},
        1: {_gid("x", 2, [(a, 0), (1 - a, v)], s).split(":", 1)[1] for a in (0, 1) for v in (0, 1) for s in range(10)},
    }
    held_as = {t: {x for sp in spaces.values() for x in sp if f"{t}:{x}" in held} for t in REG}
    assert held_as["registers"] - held_as["registers-count"] and held_as["registers-count"] - held_as["registers"]

    def suffix(doc):
        text = doc["text"].split("query")[0]
        writes = [(int(r), int(v)) for r, v in re.findall(r"r(\d+) = (\d+)", text)]
        s = int(re.search(r"scratch = (\d+)", text).group(1))
        return _gid("x", len({r for r, _ in writes}), writes, s).split(":", 1)[1]

    for i, space in spaces.items():
        train = {suffix(d) for d in _mix_docs(cfg, i, tok, 400, seed=i, split="train")}
        val = {suffix(d) for d in _mix_docs(cfg, i, tok, 40, seed=i, split="val")}
        free = {x for x in space if not any(f"{t}:{x}" in held for t in REG)}
        assert train == free and val and val <= space - free


def test_several_answers_share_the_answer_weight():
    docs = [
        {"token_ids": list(range(1, 13)), "answer_pos": 10, "answer_positions": [4, 10]},
        {"token_ids": [5, 6, 3, 9, 2], "answer_pos": 3},
    ]
    _, targets, w = one_per_row(docs, 20.0, answer_share=1.0)  # answers only: every answer the same weight
    assert w[0].tolist() == [0, 0, 0, 0.5, 0, 0, 0, 0, 0, 0.5, 0, 0] and w[1].tolist()[:5] == [0, 0, 1, 0, 0]
    assert targets[0, 3] == 5 and targets[0, 9] == 11
    _, _, w = one_per_row(
        docs[:1], 20.0, answer_share=0.5
    )  # the answers' half split equally, the text's half over 9 tokens
    assert torch.allclose(w[0, [3, 9]], torch.tensor([0.25, 0.25])) and torch.allclose(
        w[0, [0, 1, 2, 4, 5, 6, 7, 8, 10]], torch.full((9,), 0.5 / 9)
    )
    _, _, w = one_per_row(docs[:1], 20.0)  # answer_share None: each answer weighs answer_weight text tokens
    assert torch.allclose(w[0, 3] / w[0, 0], torch.tensor(20.0)) and torch.allclose(w[0].sum(), torch.tensor(1.0))


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"register_mix": "2:x:0"},
            "field 'register_mix' (--register-mix) '2:x:0': kind '2:x:0': expected m:wpr:K:S[:weight]",
        ),
        ({"register_mix": "3:16:8"}, "N assignments must be a positive multiple of m = 3"),
        ({"register_mix": "2:wpr:0:0"}, "writes per register must be 1..64"),
        ({"register_mix": "2:wpr:1:0:0"}, "weight must be a finite number > 0"),
        ({"register_mix": "  "}, "expected one or more kinds"),
        ({"register_mix": "2:wpr:1:0", "tasks": ("completion",)}, "tasks ['completion'] have none"),
        ({"register_queries": 2}, "set field 'register_mix' (--register-mix) too"),
        (
            {"register_queries": 0, "register_mix": "2:wpr:1:0"},
            "field 'register_queries' (--register-queries) must be an integer 1..64",
        ),
        ({"answer_share": 1.5}, "field 'answer_share' (--answer-share) must be in (0, 1]"),
        ({"answer_share": 0.0}, "field 'answer_share'"),
        ({"min_lr_ratio": 1.5}, "field 'min_lr_ratio' (--min-lr-ratio) must be in [0, 1]"),
        ({"lr": float("nan")}, "fields 'lr' and 'warmup' (--lr, --warmup) must be finite and >= 0"),
    ],
)
def test_bad_register_options_are_one_line_errors(fields, message):
    with pytest.raises(FbtError) as err:
        TrainConfig(**{"tasks": REG, **fields})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_constant_lr_after_warmup():
    cfg = TrainConfig(lr=1e-3, warmup=4, min_lr_ratio=1.0, steps=50)
    assert [lr_at(cfg, s) for s in range(3)] == [2.5e-4, 5e-4, 7.5e-4] and {lr_at(cfg, s) for s in range(3, 50)} == {
        1e-3
    }


def test_decay_steps_is_a_cosine_tail_after_a_constant_lr():
    """`decay_steps` N: the lr of the constant-lr config until step steps - N, then a cosine that
    reaches lr · min_lr_ratio at `steps`; N = steps - warmup is the plain cosine, N = 0 too."""
    lr, warmup, steps, n, floor = 1e-3, 4, 50, 10, 0.1
    tail = TrainConfig(lr=lr, warmup=warmup, min_lr_ratio=floor, steps=steps, decay_steps=n)
    const = TrainConfig(lr=lr, warmup=warmup, min_lr_ratio=1.0, steps=steps)
    assert [lr_at(tail, s) for s in range(steps - n + 1)] == [lr_at(const, s) for s in range(steps - n + 1)]
    for s in range(steps - n, steps + 1):  # an independent float64 formula
        want = lr * (floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * (s - (steps - n)) / n)))
        assert lr_at(tail, s) == pytest.approx(want, rel=1e-12, abs=0)
    assert lr_at(tail, steps) == pytest.approx(lr * floor, rel=1e-12)
    assert all(lr_at(tail, s + 1) < lr_at(tail, s) for s in range(steps - n, steps))
    cosine = TrainConfig(lr=lr, warmup=warmup, min_lr_ratio=floor, steps=steps)
    whole = TrainConfig(lr=lr, warmup=warmup, min_lr_ratio=floor, steps=steps, decay_steps=steps - warmup)
    assert [lr_at(whole, s) for s in range(steps)] == [lr_at(cosine, s) for s in range(steps)]
    assert "decay_steps" not in cosine.to_dict() and tail.to_dict()["decay_steps"] == n
    assert TrainConfig.from_dict(tail.to_dict()) == tail and TrainConfig.from_dict(cosine.to_dict()) == cosine


@pytest.mark.parametrize("bad", [-1, 51, True, 2.5])
def test_bad_decay_steps_is_a_one_line_error(bad):
    with pytest.raises(FbtError) as err:
        TrainConfig(steps=50, decay_steps=bad)
    assert "'decay_steps' (--decay-steps) must be an integer 0..steps (50)" in str(err.value) and "\n" not in str(
        err.value
    )


def test_decay_steps_from_the_cli_is_recorded_and_a_bad_value_writes_nothing(tmp_path):
    base = ["train", "--baseline", "--tasks", "registers", "--tokens-per-step", "100", "--warmup", "1"]
    res = runner.invoke(app, [*base, "--steps", "3", "--decay-steps", "2", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["train"]["decay_steps"] == 2
    lrs = [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"lr"' in line]
    cfg = TrainConfig(steps=3, decay_steps=2, warmup=1, tasks=("registers",))
    assert lrs == [lr_at(cfg, s) for s in range(3)] and lrs[0] == lrs[1] > lrs[2]  # constant, then the decay
    res = runner.invoke(app, [*base, "--steps", "3", "--decay-steps", "4", "--out", str(tmp_path / "bad")])
    assert res.exit_code != 0 and "'decay_steps' (--decay-steps) must be an integer 0..steps (3)" in res.output
    assert not (tmp_path / "bad").exists()


def test_a_decay_tail_added_to_a_finished_constant_lr_run_is_the_decay_run_from_scratch(tmp_path):
    """How the shipped recipe's lr decay was measured (docs/research/reference-recipe.md, "The shipped
    recipe: phase-1300 with a 300-step lr decay at the end (phase-1300+decay)"): a run with a
    constant lr, resumed after its config was given `decay_steps` and more `steps`, ends with the
    bytes of the decay run trained from scratch."""
    fields = dict(
        tokens_per_step=200,
        warmup=1,
        eval_every=10_000,
        save_every=10_000,
        tasks=REG,
        register_mix="2:wpr:1:0 2:wpr:2:0",
        register_queries=2,
        answer_share=1.0,
    )
    run_training(TrainConfig(steps=4, min_lr_ratio=1.0, **fields), tmp_path / "tail", progress=False, eval_pairs=2)
    meta = json.loads((tmp_path / "tail" / "config.json").read_text())
    meta["train"].update(steps=6, decay_steps=2, min_lr_ratio=0.1)
    (tmp_path / "tail" / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    run_training(TrainConfig(steps=6, **fields), tmp_path / "tail", resume=True, progress=False, eval_pairs=2)
    run_training(
        TrainConfig(steps=6, decay_steps=2, min_lr_ratio=0.1, **fields),
        tmp_path / "scratch",
        progress=False,
        eval_pairs=2,
    )
    digest = lambda run: hashlib.sha256((tmp_path / run / "model.safetensors").read_bytes()).hexdigest()
    assert digest("tail") == digest("scratch")
    lrs = lambda run: [
        json.loads(l)["lr"] for l in (tmp_path / run / "metrics.jsonl").read_text().splitlines() if '"lr"' in l
    ]
    assert lrs("tail") == lrs("scratch") and lrs("scratch")[3] > lrs("scratch")[5]
    cold = TrainConfig(steps=6, min_lr_ratio=1.0, **fields)  # and the decay changed the run: not the constant-lr one
    run_training(cold, tmp_path / "constant", progress=False, eval_pairs=2)
    assert digest("constant") != digest("scratch")


SMALL = dict(
    tokens_per_step=300,
    warmup=2,
    eval_every=10_000,
    save_every=10_000,
    tasks=REG,
    register_mix="2:wpr:1:0 2:wpr:2:0",
    register_queries=2,
    answer_share=1.0,
    min_lr_ratio=1.0,
)


def test_init_starts_from_the_runs_weights_and_records_it(tmp_path):
    """A baseline stage from scratch, then a feedback stage from it at lr 0: its weights are the
    first run's exactly, and its config names the run and the checkpoint's sha256."""
    run_training(TrainConfig(steps=2, baseline=True, **SMALL), tmp_path / "s1", progress=False, eval_pairs=2)
    run_training(
        TrainConfig(steps=1, lr=0.0, **SMALL), tmp_path / "s2", init=tmp_path / "s1", progress=False, eval_pairs=2
    )
    a, b = fp.load_model(str(tmp_path / "s1")), fp.load_model(str(tmp_path / "s2"))
    fresh = fp.load_model("tiny", seed=0, d_vocab=a.cfg.d_vocab)
    assert any(
        not torch.equal(x, y) for x, y in zip(a.state_dict().values(), fresh.state_dict().values())
    )  # stage 1 trained
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name
    train = json.loads((tmp_path / "s2" / "config.json").read_text())["train"]
    assert train["init"] == str(tmp_path / "s1")
    assert train["init_sha256"] == hashlib.sha256((tmp_path / "s1" / "model.safetensors").read_bytes()).hexdigest()
    assert train["register_mix"] == "2:wpr:1:0:1 2:wpr:2:0:1" and train["register_queries"] == 2
    assert "init" not in json.loads((tmp_path / "s1" / "config.json").read_text())["train"]


def test_init_from_a_shipped_model_on_the_cli(tmp_path):
    res = runner.invoke(
        app,
        [
            "train",
            "--out",
            str(tmp_path / "r"),
            "--init",
            "ref:tiny-baseline",
            "--baseline",
            "--steps",
            "1",
            "--lr",
            "0",
            "--tasks",
            "registers",
            "--tokens-per-step",
            "300",
            "--register-mix",
            "2:wpr:1:0",
            "--register-queries",
            "2",
            "--answer-share",
            "1",
            "--min-lr-ratio",
            "1",
            "--warmup",
            "5",
        ],
    )
    assert res.exit_code == 0, res.output
    ref, got = fp.load_model("ref:tiny-baseline"), fp.load_model(str(tmp_path / "r"))
    assert all(torch.equal(x, y) for x, y in zip(ref.state_dict().values(), got.state_dict().values()))
    train = json.loads((tmp_path / "r" / "config.json").read_text())["train"]
    assert (
        train["init"],
        train["tasks"],
        train["tokens_per_step"],
        train["warmup"],
        train["answer_share"],
        train["min_lr_ratio"],
    ) == ("ref:tiny-baseline", ["registers"], 300, 5, 1.0, 1.0)


def test_init_with_other_shapes_is_a_one_line_error(tmp_path):
    from fbt_probe.formats.checkpoint import save_checkpoint

    save_checkpoint(
        fp.load_model("tiny", n_layers=2, d_vocab=build_tokenizer().get_vocab_size()), tmp_path / "two-layers"
    )
    cases = [
        (["--init", str(tmp_path / "two-layers")], "not a 'tiny' model (blocks.2."),
        (["--init", "ref:tiny-baseline", "--preset", "paper-1b"], "not a 'paper-1b' model (embed.weight: (122, 128)"),
        (["--register-mix", "2:x", "--tasks", "registers"], "expected m:wpr:K:S[:weight]"),
        (["--tasks", "registers,nope"], "--tasks 'registers,nope': nope: unknown task"),
        (["--register-queries", "3"], "set field 'register_mix' (--register-mix) too"),
    ]
    for args, message in cases:
        res = runner.invoke(app, ["train", "--out", str(tmp_path / "r"), *args])
        assert res.exit_code == 2 and message in res.output and res.output.strip().count("\n") == 0, (args, res.output)
    assert not (tmp_path / "r").exists()


def test_pack_asks_for_the_command_of_a_staged_run():
    from fbt_probe.training.pack import retrain_command

    assert (
        retrain_command(TrainConfig(baseline=True), "b")
        == "fbt-probe train --preset tiny --steps 800 --seed 0 --baseline --out runs/b"
    )
    for cfg in (TrainConfig(init="runs/r12"), TrainConfig(tasks=REG, register_mix="2:wpr:1:0")):
        with pytest.raises(FbtError, match="pass --command"):
            retrain_command(cfg, "r")


def test_a_register_stage_resumes_bit_for_bit(tmp_path):
    cfg = TrainConfig(steps=3, **{**SMALL, "save_every": 2})
    run_training(cfg, tmp_path / "straight", progress=False, eval_pairs=2)
    run_training(TrainConfig(steps=2, **SMALL), tmp_path / "split", progress=False, eval_pairs=2)
    run_training(cfg, tmp_path / "split", resume=True, progress=False, eval_pairs=2)
    assert (tmp_path / "straight" / "model.safetensors").read_bytes() == (
        tmp_path / "split" / "model.safetensors"
    ).read_bytes()
    assert (
        json.loads((tmp_path / "split" / "config.json").read_text())["train"]["register_mix"]
        == "2:wpr:1:0:1 2:wpr:2:0:1"
    )
