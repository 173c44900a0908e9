"""Data-parallel extraction on 2 gloo processes: the same shards byte for byte as one process (each
shard is computed from the same batches, of the same shapes, by the same kernels), the same manifest
apart from the recorded world size and memory, and a killed rank is resumed to the same folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from fbt_probe import distributed
from fbt_probe.activations import ActivationStore, extract
from tests.distributed_helpers import run_ranks
from tests.helpers import make_model
from tests.test_activations import frame, shard_bytes

MODES = ["standard", "recurrent:1", "jacobi:2"]
ARGS = dict(batch_size=2, shard_rows=3, dtype="float64")


def _extract(out: str, log: str | None = None, die_after: int | None = None) -> None:
    """One rank's extraction; records the shards it wrote in `log`.<rank>; rank 1 dies (os._exit,
    no cleanup, as a killed process) after `die_after` shards."""
    rank, done = distributed.world().rank, []

    def on_shard(shard):
        done.append(shard["file"])
        if log:
            Path(f"{log}.{rank}").write_text(json.dumps(done))
        if die_after is not None and rank == 1 and len(done) >= die_after:
            os._exit(3)

    extract(make_model(dtype=torch.float64), frame(n_pairs=3), MODES, out, on_shard=on_shard, **ARGS)


def _manifest_core(folder: Path) -> dict:
    """The manifest without what differs between any two runs (memory, provenance) or by design
    (world_size)."""
    m = json.loads((folder / "manifest.json").read_text())
    for key in ("peak_rss_mb", "provenance", "world_size"):
        m.pop(key)
    m["shards"] = [{k: v for k, v in s.items() if k != "rss_mb"} for s in m["shards"]]
    return m


@pytest.fixture(scope="module")
def single(tmp_path_factory, one_thread):
    """One process, one thread like each rank (a matmul's bits may depend on the thread count)."""
    out = tmp_path_factory.mktemp("single") / "acts"
    extract(make_model(dtype=torch.float64), frame(n_pairs=3), MODES, out, **ARGS)
    return out


def test_two_ranks_write_the_single_process_folder(single, tmp_path):
    """Each rank runs one thread (tests/distributed_helpers.py), as torchrun's default OMP_NUM_THREADS=1."""
    out, log = tmp_path / "acts", tmp_path / "log"
    run_ranks(_extract, 2, str(out), str(log))
    written = [set(json.loads(Path(f"{log}.{r}").read_text())) for r in (0, 1)]
    assert written[0] and written[1] and not written[0] & written[1]  # both worked, no shard twice
    assert written[0] | written[1] == set(shard_bytes(single))
    assert shard_bytes(out) == shard_bytes(single)
    for name in ("plan.json", "samples.parquet"):
        assert (out / name).read_bytes() == (single / name).read_bytes()
    assert json.loads((out / "manifest.json").read_text())["world_size"] == 2
    assert json.loads((single / "manifest.json").read_text())["world_size"] == 1
    assert _manifest_core(out) == _manifest_core(single)
    ActivationStore(out).verify()


@pytest.mark.slow  # three rounds of 2 spawned processes (~35 s on 2 busy cores)
def test_a_killed_rank_is_resumed_to_the_same_folder(single, tmp_path):
    out = tmp_path / "acts"
    with pytest.raises((mp.ProcessExitedException, mp.ProcessRaisedException)):
        run_ranks(_extract, 2, str(out), None, 1)
    assert (out / "plan.json").is_file() and not (out / "manifest.json").exists()
    finished = shard_bytes(out)
    assert 0 < len(finished) < len(shard_bytes(single))
    # a finished shard damaged since: the rank that owns it refuses, and every rank stops with its message
    shard = out / sorted(finished)[0]
    shard.write_bytes(finished[sorted(finished)[0]][:-1] + b"\0")
    with pytest.raises(mp.ProcessRaisedException, match="corrupt shard"):
        run_ranks(_extract, 2, str(out))
    shard.write_bytes(finished[sorted(finished)[0]])
    stray = out / "shards" / "standard" / ".alpha-T00006-000.safetensors.x1y2.tmp"  # as a kill mid-write leaves
    stray.write_bytes(b"half")
    run_ranks(_extract, 2, str(out))
    assert not stray.exists()
    assert shard_bytes(out) == shard_bytes(single)
    assert _manifest_core(out) == _manifest_core(single)


def test_assign_balances_and_is_deterministic():
    costs = [5.0, 1.0, 4.0, 4.0, 2.0, 2.0]
    owner = distributed.assign(costs, 2)
    assert owner == distributed.assign(costs, 2)
    loads = [sum(c for c, o in zip(costs, owner) if o == r) for r in (0, 1)]
    assert loads == [9.0, 9.0]  # longest first: 5->0, 4->1, 4->1, 2->0, 2->0, 1->1
    assert distributed.assign(costs, 1) == [0] * 6
    assert [list(distributed.split_rows(7, 3, r)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


def test_environment_is_read_or_refused():
    assert distributed.from_env({}) is None
    w = distributed.from_env(
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    )
    assert (w.rank, w.size, w.main, w.several) == (1, 2, False, True)
    with pytest.raises(Exception, match="MASTER_ADDR"):
        distributed.from_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(Exception, match="RANK 2"):
        distributed.from_env(
            {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
        )
    assert distributed.world().size == 1 and distributed.broadcast(5) == 5 and distributed.gather(3) == [3]
