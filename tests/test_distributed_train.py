"""Training on 2 gloo processes equals one process on the same global batch: DDP and FSDP2 over a
3-step run (float64, every draw from (seed, step)). The ranks' micro-batches have other
shapes than the single process's (each holds part of the rows), so BLAS may round differently:
compared in float64 to 1e-9, far below what a wrong share of the loss or a missed reduction moves
(a share taken from the float32 weight sums alone already moved the weights by 1e-8)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fbt_probe as fp
from fbt_probe import distributed
from fbt_probe.loading import load_model
from fbt_probe.tasks import build_tokenizer, save_tokenizer
from fbt_probe.training import TrainConfig
from fbt_probe.training.loop import train
from fbt_probe.training.data import batches_for_step
from tests.distributed_helpers import run_ranks

# 3 steps, one- and two-pass (fusion unused on a one-pass step), micro-batches of 1..n rows: a cell
# with fewer documents than ranks gives one rank the scale-0 stand-in row
CFG = dict(steps=3, tokens_per_step=300, warmup=1, eval_every=10_000, save_every=10_000, noise=0.0,
           schedule="1:.5,2:.5", tasks=("completion", "memory"), knobs={"completion": [0], "memory": [8]})


def _model(cfg: TrainConfig, tok):
    return load_model("tiny", seed=cfg.seed, d_vocab=tok.get_vocab_size(), feedback_noise=0.0).double()


def _train(out: str, fsdp: bool = False) -> None:
    cfg, tok = TrainConfig(**CFG), build_tokenizer()
    out = Path(out)
    if distributed.world().main:
        out.mkdir(parents=True)
        save_tokenizer(tok, out / "tokenizer.json")
    distributed.barrier()
    train(_model(cfg, tok), tok, cfg, out, progress=False, fsdp=fsdp)


def _train_both(root: str) -> None:
    """DDP, then FSDP2, in one process group (one start-up of the processes for both)."""
    _train(f"{root}/two")
    _train(f"{root}/fsdp", True)  # sharded; checkpoint consolidated by rank 0


def _state(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow  # one run alone, two on 2 spawned processes (~35 s on 2 busy cores)
def test_ddp_and_fsdp2_on_two_ranks_train_the_single_process_model(tmp_path):
    cfg, tok = TrainConfig(**CFG), build_tokenizer()
    passes = {TrainConfig(**CFG).schedule_obj.draw(0.25), TrainConfig(**CFG).schedule_obj.draw(0.75)}
    assert passes == {1, 2}
    assert {len(batches_for_step(cfg, tok, s)) for s in range(cfg.steps)} and \
        min(b[0].shape[0] for s in range(cfg.steps) for b in batches_for_step(cfg, tok, s)) == 1  # a 1-row micro-batch
    _train(str(tmp_path / "one"))
    run_ranks(_train_both, 2, str(tmp_path))
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
        assert [r["passes"] for r in log[0]] == [r["passes"] for r in log[1]] and {r["passes"] for r in log[0]} == {1, 2}
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
                torch.testing.assert_close(opt["state"][i][key], st[key], rtol=1e-7, atol=1e-13, msg=f"{run}: {i} {key}")
    assert json.loads((tmp_path / "one" / "config.json").read_text())["provenance"]["world_size"] == 1
