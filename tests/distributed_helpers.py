"""Run a function in N gloo processes on loopback (torch.multiprocessing, a free port, a time limit).

`run_ranks(fn, n, *args)` starts n processes with the torchrun environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), each running `fn(*args)` inside
`fbt_probe.distributed.session()`: the same path `torchrun -m fbt_probe` takes. `fn` must be a
module-level function (the processes are spawned, so it is imported by name); results travel
through files.
"""

from __future__ import annotations

import os
import socket
import time

import torch.multiprocessing as mp

LIMIT_S = 120.0  # a test's processes are killed after this long (a hang is a failure, not a stall)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, size: int, port: int, fn, args) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    import torch

    from fbt_probe.distributed import session

    torch.set_num_threads(1)
    with session():
        fn(*args)


def run_ranks(fn, size: int, *args, limit_s: float = LIMIT_S) -> None:
    """Run `fn(*args)` on `size` ranks; raises (mp.ProcessRaisedException / ProcessExitedException)
    when one fails, after the others were stopped; TimeoutError past `limit_s`."""
    ctx = mp.start_processes(_entry, args=(size, free_port(), fn, args), nprocs=size, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{size} ranks still running after {limit_s:.0f} s")
