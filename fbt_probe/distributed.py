"""Several processes (`torchrun`): the process group, read from the launcher's environment, and the
few collectives the commands use.

`torchrun --nproc_per_node N -m fbt_probe <command> ...` starts N copies of the command with RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set. `session()` (entered once by the CLI)
initialises `torch.distributed` from them: gloo for CPU tensors and nccl for CUDA tensors when CUDA
is present. Without those variables nothing is initialised; with one process (or none) every helper
here answers as the one process of a world of one, so single-process behaviour is unchanged.

What each command shares out (docs/distributed.md): `extract` the shards of its plan
(`assign`), `patch` the minimal pairs, `train` the documents of every step (DDP, or FSDP2).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from fbt_probe.errors import FbtError

T = TypeVar("T")
TIMEOUT = datetime.timedelta(minutes=30)  # a collective waits this long for a rank before failing
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.size > 1


def from_env(env=None) -> World | None:
    """The world torchrun describes in `env` (default os.environ); None when not launched by it."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return None
    missing = [k for k in _ENV if k not in env]
    if missing:
        raise FbtError(
            f"environment: WORLD_SIZE is set but {', '.join(missing)} missing "
            f"(launch with torchrun, or unset WORLD_SIZE)"
        )
    try:
        w = World(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    except ValueError:
        raise FbtError("environment: RANK, WORLD_SIZE and LOCAL_RANK: expected integers") from None
    if not 0 <= w.rank < w.size:
        raise FbtError(f"environment: RANK {w.rank}: expected 0 <= RANK < WORLD_SIZE ({w.size})")
    return w


def backend() -> str:
    """gloo for CPU tensors; with CUDA present, nccl for CUDA tensors too."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def world() -> World:
    """This process's place: from the initialised process group, else a world of one."""
    if dist.is_available() and dist.is_initialized():
        env = from_env()
        local = env.local_rank if env is not None else 0
        return World(dist.get_rank(), dist.get_world_size(), local)
    return World()


@contextlib.contextmanager
def session(env=None) -> Iterator[World]:
    """Initialise the process group from the torchrun environment (if launched by it and not
    already initialised); torn down on exit."""
    w = from_env(env)
    started = False
    if w is not None and not dist.is_initialized():  # a world of one too: FSDP2 on one device needs a group
        if torch.cuda.is_available():
            torch.cuda.set_device(w.local_rank)
        dist.init_process_group(backend(), timeout=TIMEOUT)
        started = True
    try:
        yield world()
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


def device_for(device: str | None) -> str | None:
    """A bare 'cuda' becomes this rank's GPU (cuda:LOCAL_RANK) when several processes run."""
    w = world()
    if w.several and device == "cuda":
        return f"cuda:{w.local_rank}"
    return device


def barrier() -> None:
    if world().several:
        dist.barrier()


def broadcast(obj: T, src: int = 0) -> T:
    """`obj` as rank `src` has it (any picklable object)."""
    if not world().several:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather(obj: T) -> list[T] | None:
    """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
    w = world()
    if not w.several:
        return [obj]
    out = [None] * w.size if w.main else None
    dist.gather_object(obj, out, dst=0)
    return out


def all_gather(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order, on every rank."""
    w = world()
    if not w.several:
        return [obj]
    out = [None] * w.size
    dist.all_gather_object(out, obj)
    return out


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 only (e.g. the first write into an output folder) and give every rank its
    result; an `FbtError` there is raised on every rank, so none waits for a rank that stopped."""
    w = world()
    if not w.several:
        return fn()
    result, error = None, None
    if w.main:
        try:
            result = fn()
        except FbtError as exc:
            error = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    result, error = broadcast((result, error))
    if error is not None:
        raise FbtError(error)
    return result


def all_ok(error: str | None) -> None:
    """Each rank reports its own failure (or None); every rank raises the first rank's, so a rank
    that failed a check does not leave the others waiting at the next collective."""
    errors = [e for e in all_gather(error) if e is not None]
    if errors:
        raise FbtError(errors[0])


def assign(costs: list[float], size: int) -> list[int]:
    """The rank of each item: longest first, each to the least-loaded rank (ties: the lower rank).
    Deterministic in (costs, size), so every rank computes the same assignment on its own."""
    load = [0.0] * size
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


def split_rows(n: int, size: int, rank: int) -> range:
    """Rank `rank`'s contiguous block of `n` items (the first n % size ranks take one more)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))
