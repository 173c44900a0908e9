"""`fbt-probe train --device auto|cpu|cuda`: auto is cpu on a machine without CUDA (what CI has, and
what the tests force by hiding CUDA, so they mean the same on a GPU machine); a request for cuda
without it is one error line and nothing written; under torchrun cuda is the rank's own GPU."""

import json

import pytest
import torch
from typer.testing import CliRunner

from fbt_probe import distributed
from fbt_probe.cli import app
from fbt_probe.distributed import World
from fbt_probe.errors import FbtError
from fbt_probe.training.parallel import process_device

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gpus(monkeypatch):
    """A machine with 2 GPUs as far as the device choice can tell (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_is_cpu_without_cuda_and_cuda_is_the_local_ranks_gpu(no_cuda, monkeypatch):
    assert process_device("auto") == process_device("cpu") == "cpu"
    with pytest.raises(FbtError, match="device 'cuda': CUDA is not available on this machine"):
        process_device("cuda")
    with pytest.raises(FbtError, match="--device 'gpu': expected one of auto, cpu, cuda"):
        process_device("gpu")


def test_cuda_is_cuda_local_rank(gpus, monkeypatch):
    assert process_device("auto") == process_device("cuda") == "cuda:0"  # one process: the first GPU
    monkeypatch.setattr(distributed, "world", lambda: World(rank=3, size=4, local_rank=1))  # 2nd node, 2nd process
    assert process_device("cuda") == process_device("auto") == "cuda:1"
    monkeypatch.setattr(distributed, "world", lambda: World(rank=2, size=3, local_rank=2))
    with pytest.raises(FbtError, match="device 'cuda:2': this machine has 2 CUDA device"):
        process_device("cuda")  # more processes on the node than GPUs
    assert process_device("cpu") == "cpu"  # cpu stays cpu on a GPU machine


def test_train_refuses_cuda_without_it_and_writes_nothing(no_cuda, tmp_path):
    res = runner.invoke(app, ["train", "--out", str(tmp_path / "run"), "--steps", "1", "--device", "cuda"])
    assert res.exit_code == 2, res.output
    assert (
        res.output.strip().count("\n") == 0 and "CUDA is not available" in res.output and "--device cpu" in res.output
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # two 1-step CLI runs of the tiny preset (~15 s)
def test_train_on_cpu_auto_and_cpu_write_the_same_run(no_cuda, tmp_path):
    import fbt_probe as fp

    for device in ("auto", "cpu"):
        res = runner.invoke(app, ["train", "--out", str(tmp_path / device), "--steps", "1", "--device", device])
        assert res.exit_code == 0, res.output
    assert (tmp_path / "auto" / "model.safetensors").read_bytes() == (
        tmp_path / "cpu" / "model.safetensors"
    ).read_bytes()
    meta = json.loads((tmp_path / "cpu" / "config.json").read_text())
    assert meta["model"]["device"] == "cpu" and meta["provenance"]["device"] == "cpu"
    assert fp.load_model(str(tmp_path / "cpu")).cfg.device == "cpu"
