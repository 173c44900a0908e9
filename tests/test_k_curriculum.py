"""The k curriculum (`TrainConfig.k_curriculum`) and answer-only supervision on the one-token-a-step
chain tasks: training draws only the cells up to the current k, a stage advances exactly when the
measured accuracy reaches the threshold, a resume across an advance is bit for bit, bad curricula
are one line naming the field, and under `answer_share` 1 no token but the answer reaches the loss."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.config import preset
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer
from fbt_probe.training import TrainConfig, multipass_loss, run_training
from fbt_probe.training import curriculum as curriculum_mod
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_curriculum
from fbt_probe.training.data import batches_for_step, cell_length, heldout, validation_batch
from tests.test_bad_input import one_line_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
CHAIN = dict(tasks=("chain-s3",), answer_share=1.0, tokens_per_step=120, warmup=1, schedule="constant:2")
CURRICULUM = "2,4,8,16,24@0.9"
TIMING = ("step_s", "tokens_per_s")  # the log's wall-clock fields


def lengths_drawn(cfg, tok, step, max_k):
    """The token lengths of the documents `step` draws (a micro-batch is one cell: one length)."""
    return {int(t.shape[1]) for t, _, _ in batches_for_step(cfg, tok, step, max_k=max_k)}


def test_the_curriculum_draws_only_the_cells_up_to_the_current_k():
    tok, cfg = build_tokenizer(), TrainConfig(**{**CHAIN, "tokens_per_step": 2000})
    length = {k: cell_length("chain-s3", k, tok) for k in (2, 4, 8, 16, 24)}  # one token a step
    assert [length[k] - k for k in length] == [length[2] - 2] * 5
    every = set()
    for max_k in (2, 4, 8, 16, 24):
        seen = set().union(*(lengths_drawn(cfg, tok, step, max_k) for step in range(4)))
        assert seen and seen <= {length[k] for k in length if k <= max_k}, (max_k, seen)
        assert length[max_k] in seen  # the newest cell is drawn
        every |= seen
    assert every == set(length.values())
    assert set().union(*(lengths_drawn(cfg, tok, step, None) for step in range(4))) == every  # no curriculum


class Scripted:
    """The measured accuracy, scripted by k (the samples the measure reads name their k)."""

    def __init__(self, by_k=None, in_turn=None):
        self.by_k, self.in_turn, self.calls = by_k, list(in_turn or []), []

    def __call__(self, model, samples, tokenizer, mode):
        (k,) = set(samples["length_knob"])
        self.calls.append((int(k), mode))
        return self.in_turn.pop(0) if self.in_turn else self.by_k.get(int(k), 0.0)


def log_of(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_stage_advances_exactly_when_the_accuracy_reaches_the_threshold(tmp_path, monkeypatch):
    acc = Scripted(in_turn=[0.5, 0.8999999, 0.9, 0.3, 0.95])
    monkeypatch.setattr(curriculum_mod, "measure_accuracy", acc)
    cfg = TrainConfig(steps=10, eval_every=2, save_every=100, k_curriculum=CURRICULUM, **CHAIN)
    run_training(cfg, tmp_path / "r", progress=False, eval_pairs=2)
    log = log_of(tmp_path / "r")
    assert [r["k"] for r in log] == [2] * 6 + [4] * 4  # advanced after step 6 (0.9) and step 10 (0.95)
    measured = [r["curriculum"] for r in log if "curriculum" in r]
    assert [r["step"] for r in log if "curriculum" in r] == [2, 4, 6, 8, 10]
    assert [m["accuracy"] for m in measured] == [0.5, 0.8999999, 0.9, 0.3, 0.95]
    assert [m["advanced_to"] for m in measured] == [None, None, 4, None, 8]
    assert [c[0] for c in acc.calls] == [2, 2, 2, 4, 4]  # each measure reads the current k's words
    assert {c[1] for c in acc.calls} == {"jacobi:2"}  # the deepest iteration the schedule trains
    assert load_curriculum(tmp_path / "r") == [6, 10]
    assert json.loads((tmp_path / "r" / "config.json").read_text())["train"]["k_curriculum"] == CURRICULUM


def test_a_resume_across_an_advance_is_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setattr(curriculum_mod, "measure_accuracy", Scripted(by_k={2: 1.0, 4: 0.95, 8: 0.2}))
    cfg = TrainConfig(steps=8, eval_every=2, save_every=100, k_curriculum=CURRICULUM, **CHAIN)
    run_training(cfg, tmp_path / "straight", progress=False, eval_pairs=2)
    for stop in (3, 4):  # inside a stage, and at the step of an advance (saved with it)
        split = tmp_path / f"split{stop}"
        run_training(cfg, split, progress=False, eval_pairs=2, stop_at=stop)
        run_training(cfg, split, resume=True, progress=False, eval_pairs=2)
        assert (tmp_path / "straight" / "model.safetensors").read_bytes() == (split / "model.safetensors").read_bytes()
        assert load_curriculum(split) == [2, 4]
        drop = [{k: v for k, v in r.items() if k not in TIMING} for r in log_of(split)]
        assert drop == [{k: v for k, v in r.items() if k not in TIMING} for r in log_of(tmp_path / "straight")]
    assert [r["k"] for r in log_of(tmp_path / "straight")] == [2, 2, 4, 4, 8, 8, 8, 8]
    assert load_curriculum(tmp_path / "straight") == [2, 4]


def test_the_full_schedule_measures_in_full_logs_both_terms_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    """`--schedule full` (pass 1 and the exact recurrence by its serial scan): the curriculum measures
    under `full`, every step logs its two loss terms, and a resume (the scan's state noise drawn
    from the step's seed) is the uninterrupted run, bit for bit."""
    acc = Scripted(by_k={2: 1.0, 4: 0.2})
    monkeypatch.setattr(curriculum_mod, "measure_accuracy", acc)
    cfg = TrainConfig(steps=3, eval_every=2, save_every=100, k_curriculum=CURRICULUM, **{**CHAIN, "schedule": "full"})
    assert str(cfg.pass_mix) == "full" and cfg.pass_mix.deepest_mode == "full"
    run_training(cfg, tmp_path / "straight", progress=False, eval_pairs=2)
    run_training(cfg, tmp_path / "split", progress=False, eval_pairs=2, stop_at=2)  # at the advance
    run_training(cfg, tmp_path / "split", resume=True, progress=False, eval_pairs=2)
    assert (tmp_path / "straight" / "model.safetensors").read_bytes() == (
        tmp_path / "split" / "model.safetensors"
    ).read_bytes()
    steps = [r for r in log_of(tmp_path / "straight") if "pass_losses" in r]
    assert [r["passes"] for r in steps] == ["full"] * 3
    assert all(len(r["pass_losses"]) == 2 and abs(r["loss"] - sum(r["pass_losses"])) < 1e-4 for r in steps)  # lam 1
    assert {c[1] for c in acc.calls} == {"full"} and [r["k"] for r in steps] == [2, 2, 4]


def test_the_fixed_form_replays_a_runs_advances_on_the_same_tokens(tmp_path, monkeypatch):
    """'k:step,...' draws the k an adaptive run drew at every step, measuring nothing: the controls
    (the baseline, a deeper baseline) train on the feedback run's tokens."""
    monkeypatch.setattr(curriculum_mod, "measure_accuracy", Scripted(by_k={2: 1.0, 4: 0.95}))
    adaptive = TrainConfig(steps=8, eval_every=2, save_every=100, k_curriculum=CURRICULUM, **CHAIN)
    run_training(adaptive, tmp_path / "a", progress=False, eval_pairs=2)
    drawn = [r["k"] for r in log_of(tmp_path / "a")]
    assert drawn == [2, 2, 4, 4, 8, 8, 8, 8]
    fixed = dict(steps=8, eval_every=2, save_every=100, k_curriculum="2:0,4:2,8:4,16:7,24:7", **CHAIN)
    with pytest.raises(FbtError, match="the steps must start at 0 and increase"):
        TrainConfig(**fixed)
    fixed["k_curriculum"] = "2:0,4:2,8:4,16:6,24:7"
    replay = curriculum_mod.Progress(TrainConfig(**fixed), None)
    assert [replay.k(s) for s in range(8)] == drawn[:6] + [16, 24]
    tok = build_tokenizer()
    for control in (TrainConfig(**fixed), TrainConfig(**fixed, baseline=True)):
        for step in range(6):
            ours = batches_for_step(adaptive, tok, step, max_k=drawn[step])
            theirs = batches_for_step(control, tok, step, max_k=replay.k(step))
            assert all(torch.equal(x, y) for a, b in zip(ours, theirs) for x, y in zip(a, b)), step
            assert len(ours) == len(theirs)
    run_training(TrainConfig(**fixed, baseline=True), tmp_path / "b", progress=False, eval_pairs=2)
    log = log_of(tmp_path / "b")
    assert [r["k"] for r in log] == drawn[:6] + [16, 24] and not any("curriculum" in r for r in log)
    assert load_curriculum(tmp_path / "b") == []


def test_bad_curricula_are_refused_in_one_line_naming_the_field(tmp_path):
    base = ["train", "--out", str(tmp_path / "r"), "--tasks", "chain-s3", "--steps", "10"]
    for spec, says in [
        ("2,4@0.9", "the last k must be the longest training length (24)"),
        ("4,2,8,16,24@0.9", "the k must increase"),
        ("2,3,8,16,24@0.9", "k 3 is not a training length of chain-s3"),
        ("2,4,8,16,24@1.5", "must be a number in (0, 1]"),
        ("2,4,8,16,24@nan", "must be a number in (0, 1]"),
        ("2:0,4:5,8:6,16:7,24:10", "step 10 is past the run's last step (9)"),
        ("2:3,4:5,8:6,16:7,24:8", "the steps must start at 0 and increase"),
        ("two,4@0.9", "each k must be an integer >= 1"),
        ("2-24", "expected 'k,k,...@accuracy'"),
    ]:
        res = runner.invoke(app, [*base, "--k-curriculum", spec])
        one_line_error(res, "field 'k_curriculum' (--k-curriculum)")
        assert says in res.output, res.output
    assert not (tmp_path / "r").exists()
    with pytest.raises(FbtError, match="field 'k_curriculum' applies to task training"):
        TrainConfig(corpus="some-corpus", tasks=(), k_curriculum=CURRICULUM)


def test_the_measure_reads_held_out_words_and_the_trained_ones_where_too_few_are_held_out():
    tok, cfg = build_tokenizer(), TrainConfig(k_curriculum=CURRICULUM, **CHAIN)
    progress = curriculum_mod.Progress(cfg, tok)
    small, words, held = progress.samples(2)  # 4 words in all, one held out at seed 0: the other three read
    assert (words, held) == (3, False) and set(small["length_knob"]) == {2}
    assert not any(c in heldout(cfg) for c in small["context_id"])
    mid, words, held = progress.samples(8)  # 46-54 of 256 held out: the trained ones read
    assert not held and not any(c in heldout(cfg) for c in mid["context_id"]) and words > 150
    big, words, held = progress.samples(16)  # thousands held out: the first CURRICULUM_WORDS of them
    assert (words, held) == (curriculum_mod.CURRICULUM_WORDS, True)
    assert all(c in heldout(cfg) for c in big["context_id"]) and set(big["length_knob"]) == {16}
    assert big.groupby("group_id").size().eq(2).all()  # one pair a word


def test_a_spec_file_trains_under_a_curriculum_as_its_task_name(tmp_path):
    """`--tasks SPEC.json` (a built-in task or a spec file, as the option says): the knobs are keyed by
    the file's path, the documents carry the spec's task name, and a run trains and validates."""
    spec = json.loads((ROOT / "fbt_probe" / "tasks" / "specs" / "chain-s3.json").read_text())
    path = tmp_path / "my-chain.json"
    path.write_text(json.dumps({**spec, "task": "my-chain"}))
    cfg = TrainConfig(
        **{**CHAIN, "tasks": (str(path),)}, steps=2, eval_every=100, save_every=100, k_curriculum="2:0,4:1"
    )
    assert list(cfg.knobs) == [str(path)]
    tok = build_tokenizer([str(path)])
    widths = [
        {int(t.shape[1]) for t, _, _ in batches_for_step(cfg, tok, step, max_k=k)} for step, k in ((0, 2), (1, 4))
    ]
    assert widths == [
        {cell_length(str(path), 2, tok)},
        {cell_length(str(path), 2, tok), cell_length(str(path), 4, tok)},
    ]
    run_training(cfg, tmp_path / "run", progress=False, eval_pairs=2)
    assert [r["k"] for r in log_of(tmp_path / "run")] == [2, 4]


def test_validation_leaves_out_a_cell_with_no_held_out_word_and_says_so():
    tok = build_tokenizer()
    answer_at = {}  # seed -> the answer positions of the validation rows (one per cell length)
    short = {"chain-s3": [2, 4]}  # two cells: k = 2 (4 words) and k = 4 (16)
    for seed in (0, 1):  # seed 0 holds out one of k = 2's 4 words, seed 1 none
        cfg = TrainConfig(seed=seed, knobs=short, **CHAIN)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tokens, _, weights = validation_batch(cfg, tok)
        said = [str(w.message) for w in caught if "validation:" in str(w.message)]
        assert said == ([] if seed == 0 else ["validation: no held-out context at chain-s3 k=2 under seed 1; left out"])
        assert tokens.shape[0] == (16 if seed == 0 else 8)  # 8 rows for each of the cells that have one
        answer_at[seed] = set(weights.gt(0).float().argmax(1).tolist())
    assert len(answer_at[0]) == 2 and answer_at[1] == answer_at[0] - {min(answer_at[0])}
    none_held = TrainConfig(seed=0, heldout_fraction=0.0, knobs=short, **CHAIN)
    with pytest.raises(FbtError, match="validation: no held-out context in any training cell"):
        validation_batch(none_held, tok)


def test_answer_only_supervision_ignores_every_other_target():
    """`answer_share` 1 (answer supervision only at the query): the loss and its gradient are the same
    whatever the other target tokens are, so nothing trains the model to write its state into the text."""
    tok, cfg = build_tokenizer(), TrainConfig(**{**CHAIN, "tokens_per_step": 400})
    model = ARCHS["feedback"].initial_model(cfg, tok.get_vocab_size(), None).train()
    rng = np.random.default_rng(0)
    for tokens, targets, weights in batches_for_step(cfg, tok, 0):
        assert ((weights > 0).sum(-1) == 1).all()  # one supervised position a document: the query's answer
        answer = weights > 0
        assert len(set(tokens[answer].tolist())) == 1  # read at the shared final ':' of the query
        other = targets.clone()
        other[~answer] = torch.as_tensor(rng.integers(0, tok.get_vocab_size(), int((~answer).sum())))
        assert not torch.equal(other, targets)
        grads = []
        for t in (targets, other):
            model.zero_grad()
            torch.manual_seed(0)  # the same feedback noise
            loss, _ = multipass_loss(model, tokens, t, weights, 3)
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        assert torch.equal(grads[0][0], grads[1][0])
        assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_the_deeper_control_is_tiny_with_twice_the_layers():
    tiny, deep = preset("tiny"), preset("tiny-deep")
    assert deep.n_layers == 2 * tiny.n_layers and deep.replace(n_layers=tiny.n_layers) == tiny
