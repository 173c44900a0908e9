"""The reference recipe (`--recipe reference`) and its register phase (`register_steps`)
(docs/research/reference-recipe.md; its time: BENCHMARKS.md, "The reference recipe, alone")."""

import json

import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.reproduce.config import ReproConfig, train_config
from fbt_probe.tasks import build_tokenizer
from fbt_probe.training import TrainConfig
from fbt_probe.training.data import MIX, batches_for_step, cell_probabilities
from fbt_probe.training.pack import retrain_command
from fbt_probe.training.recipes import RECIPES, recipe, recipe_of

runner = CliRunner()
TOK = build_tokenizer()
MIXED = "2:wpr:1:0 4:wpr:2:3"


def _shapes(batches):
    return sorted(tuple(m[0].shape) for m in batches)


def _lengths(cfg, kinds):
    """Document lengths of the cells of `kinds` ('mix' or a task name), from the drawing table itself."""
    cells, lengths, _ = cell_probabilities(cfg, TOK)
    return {
        int(n) for (t, _), n in zip(cells, lengths) if (t == MIX) == (kinds == "mix") and (kinds == "mix" or t == kinds)
    }


def test_register_steps_draw_only_register_documents_then_exactly_the_plain_runs_batches():
    kw = dict(steps=12, tokens_per_step=900, register_mix=MIXED, copy_steps=2)
    plain = TrainConfig(**kw)
    phased = TrainConfig(**kw, register_steps=5)
    mix_len = _lengths(plain, "mix")
    other = _lengths(plain, "completion") | _lengths(plain, "memory")
    assert mix_len and other and not mix_len & other  # the lengths tell the documents apart
    for step in range(2, 7):  # the register phase: only register-mix rows, the step still filled
        batches = batches_for_step(phased, TOK, step)
        lens = {m[0].shape[1] for m in batches}
        assert lens <= mix_len, (step, lens)
        assert sum(m[0].shape[0] * m[0].shape[1] for m in batches) >= 900
    seen_other = False
    for step in (0, 1, 7, 8, 11):  # the warm-up and every step after the phase: exactly the plain run's
        a, b = batches_for_step(phased, TOK, step), batches_for_step(plain, TOK, step)
        assert len(a) == len(b) and all(torch.equal(x, y) for ma, mb in zip(a, b) for x, y in zip(ma, mb))
        seen_other |= step >= 7 and bool({m[0].shape[1] for m in a} & other)
    assert seen_other  # after the phase the other tasks are drawn again
    # validation is never restricted
    assert _shapes(batches_for_step(phased, TOK, 3, split="val")) == _shapes(
        batches_for_step(plain, TOK, 3, split="val")
    )


@pytest.mark.parametrize("value", [-1, 9, 2.5, True])
def test_register_steps_must_fit_after_the_warm_up(value):
    with pytest.raises(FbtError, match="register_steps"):
        TrainConfig(steps=10, copy_steps=2, register_steps=value)


def test_register_steps_need_a_register_task_and_are_recorded_only_when_used(tmp_path):
    with pytest.raises(FbtError, match="register_steps.*have none"):
        TrainConfig(tasks=("completion",), steps=10, register_steps=2)
    assert "register_steps" not in TrainConfig().to_dict()
    assert TrainConfig(steps=10, register_steps=3).to_dict()["register_steps"] == 3
    res = runner.invoke(
        app,
        [
            "train",
            "--baseline",
            "--tasks",
            "completion,registers",
            "--steps",
            "2",
            "--register-steps",
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
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["register_steps"] == 1
    res = runner.invoke(app, ["train", "--steps", "2", "--register-steps", "3", "--out", str(tmp_path / "bad")])
    assert res.exit_code != 0 and "register_steps" in res.output and not (tmp_path / "bad").exists()


def test_the_recipe_is_a_set_of_fields_options_override_and_a_run_knows_its_recipe(tmp_path):
    fields = recipe("reference")
    cfg = TrainConfig(**fields, seed=3, baseline=True)
    for k, v in fields.items():
        assert getattr(cfg, k) == (TrainConfig(register_mix=v).register_mix if k == "register_mix" else v)
    assert recipe_of(cfg) == "reference" and recipe_of(TrainConfig()) is None
    assert recipe_of(TrainConfig(**{**fields, "lam": 0.5})) is None  # any other field changed: not the recipe
    assert (
        retrain_command(cfg, "b") == "fbt-probe train --recipe reference --preset tiny --seed 3 --baseline --out runs/b"
    )
    fields["steps"] = 999  # recipe() hands out a copy
    assert RECIPES["reference"]["steps"] == 2800
    assert cfg.register_ramp == "2:300 4:400" and cfg.ramp_bound(500) == 2 and cfg.ramp_bound(800) == 4
    assert cfg.ramp_bound(1199) == 4 and cfg.ramp_bound(1200) is None and cfg.ramp_bound(499) is None
    with pytest.raises(FbtError, match="--recipe 'nope': no such training recipe"):
        recipe("nope")
    res = runner.invoke(app, ["train", "--recipe", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "no such training recipe" in res.output and not (tmp_path / "x").exists()
    # an option given on the command line wins over the recipe; the rest is the recipe's
    short = [
        "train",
        "--recipe",
        "reference",
        "--steps",
        "2",
        "--copy-steps",
        "1",
        "--register-steps",
        "1",
        "--tokens-per-step",
        "300",
        "--warmup",
        "1",
        "--baseline",
        "--decay-steps",
        "1",
    ]
    # the recipe's register ramp (700 steps) does not fit a 1-step register phase: one line, nothing written
    res = runner.invoke(app, [*short, "--out", str(tmp_path / "no")])
    assert res.exit_code != 0 and "register_ramp" in res.output and "'none'" in res.output
    assert not (tmp_path / "no").exists()
    res = runner.invoke(app, [*short, "--register-ramp", "none", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "r" / "config.json").read_text())["train"]
    assert (got["steps"], got["copy_steps"], got["register_steps"], got["tokens_per_step"]) == (2, 1, 1, 300)
    assert "register_ramp" not in got  # turned off: recorded as a run without one
    assert (got["answer_share"], got["min_lr_ratio"], got["decay_steps"], got["register_queries"]) == (1.0, 0.1, 1, 4)
    # the recipe's 300-step decay does not fit 2 steps: one line naming the option, nothing written
    res = runner.invoke(app, [*short[:-2], "--register-ramp", "none", "--out", str(tmp_path / "d")])
    assert res.exit_code != 0 and "'decay_steps' (--decay-steps) must be an integer 0..steps (2), got 300" in res.output
    assert not (tmp_path / "d").exists()
    assert got["register_mix"] == cfg.register_mix and got["task_shares"] == cfg.task_shares


def test_reproduce_trains_the_recipe_and_quick_trains_the_defaults():
    full = train_config(ReproConfig(seed=2), baseline=False)
    assert recipe_of(full) == "reference" and full.seed == 2 and full.steps == RECIPES["reference"]["steps"]
    quick = train_config(ReproConfig.quick_config(), baseline=True)
    assert recipe_of(quick) is None and quick.copy_steps == 0 and quick.steps == 60
    with pytest.raises(FbtError, match="--steps 400: the reference recipe's induction warm-up alone takes 500 steps"):
        train_config(ReproConfig(steps=400), baseline=False)
    # past the warm-up but inside the register phase: the message names both phases
    with pytest.raises(
        FbtError,
        match="--steps 1000: the reference recipe trains 500 warm-up and 1300 register-only "
        "steps before the other tasks; pass more than 1800",
    ):
        train_config(ReproConfig(steps=1000), baseline=False)
    assert train_config(ReproConfig(steps=1801), baseline=False).steps == 1801


RAMPED = "1:16:8 2:wpr:1:0 4:wpr:2:3 8:wpr:1:0"


def test_the_register_ramp_draws_only_kinds_with_few_registers_in_its_windows_then_exactly_the_plain_phase():
    kw = dict(steps=14, tokens_per_step=900, register_mix=RAMPED, copy_steps=2, register_steps=8)
    plain = TrainConfig(**kw)
    ramped = TrainConfig(**kw, register_ramp="2:3, 4:2")
    assert ramped.register_ramp == "2:3 4:2" and ramped.to_dict()["register_ramp"] == "2:3 4:2"
    cells, lengths, _ = cell_probabilities(plain, TOK)
    regs = {int(n): plain.register_kinds[k].registers for (t, k), n in zip(cells, lengths) if t == MIX}
    assert len(regs) == 4  # each kind has its own document length: a row's length names its kind
    seen = {}
    for step in range(2, 10):
        got = {regs[m[0].shape[1]] for m in batches_for_step(ramped, TOK, step)}
        seen[step] = got
        bound = 2 if step < 5 else 4 if step < 7 else 8
        assert got and max(got) <= bound and ramped.ramp_bound(step) == (bound if step < 7 else None), (step, got)
    assert any(8 in seen[s] for s in (7, 8, 9)) and any(4 in seen[s] for s in (5, 6))  # the bound lifts
    for step in (0, 1, 7, 8, 9, 10, 13):  # the warm-up, the phase after the ramp and the rest: the plain run's batches
        a, b = batches_for_step(ramped, TOK, step), batches_for_step(plain, TOK, step)
        assert len(a) == len(b) and all(torch.equal(x, y) for ma, mb in zip(a, b) for x, y in zip(ma, mb))
    assert "register_ramp" not in plain.to_dict()


TOO_LONG = r"more than the register phase \(register_steps = 8\); pass a shorter ramp, or 'none'"


@pytest.mark.parametrize(
    "ramp, match",
    [
        ("2:9", TOO_LONG),
        ("2:x", "expected M:N"),
        ("0:3", "M and N must be >= 1"),
        ("", "one or more windows"),
        ("1:2", "no kind of the register mix has at most 1"),
    ],
)
def test_a_bad_register_ramp_is_one_line_naming_the_field(ramp, match):
    with pytest.raises(FbtError, match=match):
        TrainConfig(steps=14, register_mix="2:wpr:1:0 4:wpr:2:3", copy_steps=2, register_steps=8, register_ramp=ramp)
    with pytest.raises(FbtError, match="set field 'register_mix'"):
        TrainConfig(steps=14, copy_steps=2, register_steps=8, register_ramp="2:3")


def test_register_ramp_from_the_command_line(tmp_path):
    res = runner.invoke(
        app,
        [
            "train",
            "--baseline",
            "--steps",
            "3",
            "--register-steps",
            "2",
            "--register-mix",
            "2:wpr:1:0 4:wpr:1:0",
            "--register-ramp",
            "2:1",
            "--tokens-per-step",
            "200",
            "--warmup",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["register_ramp"] == "2:1"
    res = runner.invoke(
        app,
        [
            "train",
            "--steps",
            "3",
            "--register-steps",
            "2",
            "--register-mix",
            "2:wpr:1:0",
            "--register-ramp",
            "2:5",
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert res.exit_code != 0 and "register_ramp" in res.output and not (tmp_path / "bad").exists()
