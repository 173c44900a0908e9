"""Training on 2 gloo processes equals one process on the same global batch: DDP and FSDP2 over a
3-step run (float64, every draw from (seed, step)). The ranks' micro-batches have other
shapes than the single process's (each holds part of the rows), so BLAS may round differently:
compared in float64 to 1e-9, far below what a wrong share of the loss or a missed reduction moves
(a share taken from the float32 weight sums alone already moved the weights by 1e-8).

Resume: a run stopped after step 1 and resumed (`run_training(resume=True)`) equals the
uninterrupted run, on 2 ranks with DDP and with FSDP2, and across world sizes (an FSDP2 checkpoint
resumed by one process, a one-process checkpoint resumed by FSDP2 on 2 ranks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fbt_probe as fp
from fbt_probe import distributed
from fbt_probe.loading import load_model
from fbt_probe.tasks import build_tokenizer, save_tokenizer
from fbt_probe.training import TrainConfig, run_training
from fbt_probe.training.data import batches_for_step
from fbt_probe.training.loop import train
from tests.distributed_helpers import run_ranks

# 3 steps, one- and two-pass (fusion unused on a one-pass step), micro-batches of 1..n rows: a cell
# with fewer documents than ranks gives one rank the scale-0 stand-in row
CFG = dict(
    steps=3,
    tokens_per_step=300,
    warmup=1,
    eval_every=10_000,
    save_every=10_000,
    noise=0.0,
    schedule="1:.5,2:.5",
    tasks=("completion", "memory"),
    knobs={"completion": [0], "memory": [8]},
)


def _model(cfg: TrainConfig, tok):  # float64 recorded in its config: a resumed run reloads it in float64
    return load_model("tiny", seed=cfg.seed, d_vocab=tok.get_vocab_size(), feedback_noise=0.0, dtype="float64")


def _train(out: str, fsdp: bool = False, steps: int = CFG["steps"]) -> None:
    """A fresh run; `steps` < 3 stops it early (warmup=1: step 0's learning rate is cfg.lr whatever
    the run's length, and steps >= 1 follow the cosine of the 3-step run a resume continues)."""
    cfg, tok = TrainConfig(**{**CFG, "steps": steps}), build_tokenizer()
    out = Path(out)
    if distributed.world().main:
        out.mkdir(parents=True)
        save_tokenizer(tok, out / "tokenizer.json")
    distributed.barrier()
    train(_model(cfg, tok), tok, cfg, out, progress=False, fsdp=fsdp)


def _resume(out: str, fsdp: bool = False) -> None:
    run_training(TrainConfig(**CFG), Path(out), resume=True, progress=False, eval_pairs=2, fsdp=fsdp)


def _copy(src: str, dst: str) -> None:
    if distributed.world().main:
        shutil.copytree(src, dst)
    distributed.barrier()


def _train_all(root: str) -> None:
    """Every 2-rank run, in one process group (one start-up of the processes for all)."""
    _train(f"{root}/two")
    _train(f"{root}/fsdp", True)  # sharded; checkpoint consolidated by rank 0
    for name, fsdp in (("two", False), ("fsdp", True)):  # stopped after step 1, resumed to step 3
        _train(f"{root}/{name}-split", fsdp, steps=1)
        _copy(f"{root}/{name}-split", f"{root}/{name}-at1")
        _resume(f"{root}/{name}-split", fsdp)
    _resume(f"{root}/one-to-fsdp", True)  # a one-process checkpoint continued by FSDP2 on 2 ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """one: a single process; two / fsdp: DDP / FSDP2 on 2 ranks; *-split: stopped after step 1 and
    resumed; fsdp-to-one, one-to-fsdp: resumed by the other world size. All 3 steps."""
    root = tmp_path_factory.mktemp("train")
    _train(str(root / "one"))
    _train(str(root / "one-to-fsdp"), steps=1)
    run_ranks(_train_all, 2, str(root), limit_s=300)
    shutil.copytree(root / "fsdp-at1", root / "fsdp-to-one")
    _resume(str(root / "fsdp-to-one"))
    return root


def _state(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow  # the runs: 4 steps alone, 14 on 2 spawned processes (~35 s on 2 cores)
def test_ddp_and_fsdp2_on_two_ranks_train_the_single_process_model(runs):
    tmp_path, cfg, tok = runs, TrainConfig(**CFG), build_tokenizer()
    passes = {TrainConfig(**CFG).pass_mix.draw(0.25), TrainConfig(**CFG).pass_mix.draw(0.75)}
    assert passes == {1, 2}
    assert {len(batches_for_step(cfg, tok, s)) for s in range(cfg.steps)} and min(
        b[0].shape[0] for s in range(cfg.steps) for b in batches_for_step(cfg, tok, s)
    ) == 1  # a 1-row micro-batch
    one = _state(tmp_path / "one")
    start = _model(cfg, tok).state_dict()
    moved = [k for k in one if not torch.equal(one[k], start[k].to(one[k].dtype))]
    assert len(moved) > len(one) // 2  # the runs did train
    opt_one = torch.load(tmp_path / "one" / "train_state.pt", weights_only=True)["optimizer"]
    for run in ("two", "fsdp"):
        other = _state(tmp_path / run)
        assert other.keys() == one.keys()
        for k in one:
            torch.testing.assert_close(other[k], one[k], rtol=1e-9, atol=1e-11, msg=f"{run}: {k}")
        log = [[json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("one", run)]
        assert [r["passes"] for r in log[0]] == [r["passes"] for r in log[1]] and {r["passes"] for r in log[0]} == {
            1,
            2,
        }
        for a, b in zip(*log):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-12)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-9)
        meta = json.loads((tmp_path / run / "config.json").read_text())
        assert meta["provenance"]["world_size"] == 2
        assert fp.load_model(str(tmp_path / run)).cfg.n_layers == 4  # an ordinary checkpoint
        # the optimizer state is saved whole and index-keyed, as one process saves it: any world size resumes it
        opt = torch.load(tmp_path / run / "train_state.pt", weights_only=True)["optimizer"]
        assert opt["param_groups"] == opt_one["param_groups"] and opt["state"].keys() == opt_one["state"].keys()
        for i, st in opt_one["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(
                    opt["state"][i][key], st[key], rtol=1e-7, atol=1e-13, msg=f"{run}: {i} {key}"
                )
    assert json.loads((tmp_path / "one" / "config.json").read_text())["provenance"]["world_size"] == 1


def _log(folder: Path) -> list[dict]:
    return [json.loads(l) for l in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # shares the runs of the test above
def test_a_resumed_run_on_two_ranks_equals_the_uninterrupted_run(runs):
    one = _state(runs / "one")
    # the same world size: the same kernels on the same shapes, and the checkpoint holds the float64
    # weights and the optimizer state exactly, so the resumed run is the uninterrupted one bit for bit
    for name in ("two", "fsdp"):
        assert json.loads((runs / f"{name}-at1" / "config.json").read_text())["step"] == 1
        at1, split, straight = _state(runs / f"{name}-at1"), _state(runs / f"{name}-split"), _state(runs / name)
        assert any(not torch.equal(at1[k], straight[k]) for k in straight)  # the last 2 steps did train
        assert split.keys() == straight.keys()
        for k in straight:
            assert torch.equal(split[k], straight[k]), f"{name}: {k}"
        a = torch.load(runs / name / "train_state.pt", weights_only=True)
        b = torch.load(runs / f"{name}-split" / "train_state.pt", weights_only=True)
        assert b["step"] == a["step"] == 3 and b["optimizer"]["param_groups"] == a["optimizer"]["param_groups"]
        for i, st in a["optimizer"]["state"].items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(b["optimizer"]["state"][i][key], st[key]), f"{name}: {i} {key}"
        log, ref = _log(runs / f"{name}-split"), _log(runs / name)
        assert [r["step"] for r in log] == [1, 2, 3]
        for a_, b_ in zip(ref, log):
            assert (b_["loss"], b_["grad_norm"], b_["passes"]) == (a_["loss"], a_["grad_norm"], a_["passes"])
    # another world size: other micro-batch shapes, so float64 to 1e-9 as above (a lost or
    # misplaced Adam moment, or a restarted step count, moves the weights by far more)
    for name in ("fsdp-to-one", "one-to-fsdp"):
        got = _state(runs / name)
        for k in one:
            torch.testing.assert_close(got[k], one[k], rtol=1e-9, atol=1e-11, msg=f"{name}: {k}")
        assert [r["step"] for r in _log(runs / name)] == [1, 2, 3]
    # the metrics after resuming on 2 ranks are those of the uninterrupted single-process run
    for a_, b_ in zip(_log(runs / "one"), _log(runs / "one-to-fsdp")):
        assert b_["loss"] == pytest.approx(a_["loss"], rel=1e-12) and b_["passes"] == a_["passes"]
