"""A tiny stage runner: each stage has a key (sha256 of its inputs, which include the keys of the
stages it reads), its outputs, and a function. A stage whose recorded key matches and whose outputs
exist is skipped, so a re-run after an interruption continues; `force` redoes named stages.

The runner writes only into a study folder: an absent or empty one, or one it marked as a study
(`.fbt-output.json` naming `reproduce`, see `fbt_probe.marker`; `check_out`), and one runner at a time
(an exclusive lock on `.fbt-study.lock`, released by the system when the process ends, however it
ends). The marker lists the sha256 of every file the finished stages wrote. A stage that is redone
moves its old outputs aside and deletes them only once it has finished; if it fails, the old outputs
are put back. Files in its output folders that the marker does not list (a user's notes, say) are
carried into the new outputs, and a listed file whose bytes changed is refused rather than replaced.
The files a stage is to keep are recorded when it starts, so that after a kill the rerun tells them
from the killed run's partial outputs.

`Runner.run_all(stages, jobs)` runs stages whose inputs are ready side by side in `jobs` worker
processes (each with `cpus // jobs` BLAS/torch threads); the parent alone decides, records and
moves outputs, so `stages.json` has one writer. A stage's function must then pickle (a
module-level function or a `functools.partial` of one)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from fbt_probe.errors import FbtError
from fbt_probe.io import is_empty_dir, read_json, sha256_file, write_json
from fbt_probe.marker import MARKER, carry, files_of, is_marked, list_files, read_marker, refuse_links, write_marker

STATE = "stages.json"
COMMAND = "reproduce"  # the study folder's marker
LOCK = ".fbt-study.lock"


@dataclass
class Stage:
    name: str
    inputs: dict
    outputs: list[Path]
    fn: Callable[[], None]
    after: list[str] = field(default_factory=list)  # stages whose keys feed this one
    resumable: bool = False  # outputs may be partially written and continued (training)
    rank: int = 50
    """Start order among the stages ready to run (lower first; not part of the key): the longest
    chains first (extract -> probe, AtP/DAS, the SAEs), the short stages last, so that under `--jobs`
    no long stage is left to run alone."""

    def key(self, keys: dict[str, str]) -> str:
        blob = json.dumps(
            {"inputs": self.inputs, "after": {a: keys[a] for a in self.after}}, sort_keys=True, default=str
        )
        return hashlib.sha256(blob.encode()).hexdigest()


class Runner:
    def __init__(self, out: Path, force: set[str] = frozenset(), echo: Callable[[str], None] = print):
        check_out(out)
        self.out, self.force, self.echo = Path(out), set(force), echo
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock = lock_study(self.out)
        try:  # a stage's outputs are moved aside and back: never through a link into another folder
            refuse_links(self.out)
        except FbtError:
            self.close()
            raise
        if not is_marked(self.out, COMMAND):  # a fresh study (check_out let only an empty folder through)
            write_marker(self.out, COMMAND, files={})
        self.files = dict(read_marker(self.out)["files"])
        self.state_path = self.out / STATE
        self.state = read_state(self.state_path) if self.state_path.is_file() else {}
        self.keys: dict[str, str] = {}
        self.times: dict[str, float] = {}
        self.ran: dict[str, bool] = {}  # stage -> run here (True) or skipped as up to date (False)

    def close(self) -> None:
        """Release the study's lock (also released when the process ends)."""
        if self._lock is not None:
            unlock_study(self._lock)
            self._lock = None

    def run(self, stage: Stage) -> None:
        """Run one stage here (or skip it as up to date)."""
        started = self._begin(stage)
        if started is None:
            return
        key, aside, t0 = started
        try:
            stage.fn()
        except BaseException:
            self._failed(stage, aside)
            raise
        self._finish(stage, key, aside, t0)

    def run_all(self, stages: list[Stage], jobs: int = 1) -> None:
        """Run `stages` (in list order where one must wait for another, through `after`), up to
        `jobs` at a time in worker processes. The first failure stops new stages from starting; the
        ones running finish and are recorded, then the failure is raised. An interruption stops the
        workers and puts back the old outputs of every stage that was running."""
        if jobs <= 1:
            for s in stages:
                self.run(s)
            return
        pending, running, error = list(stages), {}, None
        with _pool(jobs) as pool:
            try:
                while pending or running:
                    progressed = True
                    while error is None and progressed and len(running) < jobs:
                        progressed = False
                        for s in pending:
                            if all(a in self.keys for a in s.after):
                                pending.remove(s)
                                started = self._begin(s)
                                if started is not None:
                                    running[pool.submit(s.fn)] = (s, *started)
                                progressed = True
                                break
                    if not running:
                        if error is not None or not pending:
                            break
                        raise FbtError(
                            f"stages {', '.join(s.name for s in pending)}: wait for stages that never finish"
                        )
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        s, key, aside, t0 = running.pop(fut)
                        exc = fut.exception()
                        if exc is None:
                            self._finish(s, key, aside, t0)
                        else:
                            self._failed(s, aside)
                            error = error or exc
            except BaseException:
                _stop_workers(pool)
                for s, _key, aside, _t0 in running.values():
                    self._failed(s, aside)
                raise
        order = [s.name for s in stages]
        self.times = {
            n: self.times[n] for n in sorted(self.times, key=lambda n: order.index(n) if n in order else len(order))
        }
        if error is not None:
            raise error

    def _begin(self, stage: Stage) -> tuple[str, Path | None, float] | None:
        """Skip `stage` (None) if up to date, else record it as running with its old outputs moved aside."""
        key = stage.key(self.keys)
        rec = self.state.get(stage.name, {})
        done = rec.get("key") == key and rec.get("status") == "done" and all(p.exists() for p in stage.outputs)
        if done and stage.name not in self.force:
            self.keys[stage.name] = _chain(key, rec.get("finished"))
            self.times[stage.name] = rec.get("seconds", 0.0)
            self.ran[stage.name] = False
            self.echo(f"[skip] {stage.name:22s} up to date ({rec.get('seconds', 0):.0f} s when run)")
            return None
        stale_model = stage.resumable and rec.get("key") not in (None, key) and any(p.exists() for p in stage.outputs)
        if stale_model and stage.name not in self.force:  # never delete a trained model unasked
            raise FbtError(
                f"{self.out}: stage {stage.name}'s inputs changed since {stage.outputs[0]} was made; "
                f"pass --force {stage.name} to redo it (deletes it) or choose another --out"
            )
        for p in stage.outputs:  # a link made since the study started is not moved through either
            refuse_links(p)
        aside, keep = None, self._keep(stage, rec)
        if not (stage.resumable and rec.get("key") == key) or stage.name in self.force:
            # stale or forced: the outputs are made afresh (a model from its first step), the old ones kept aside until then
            aside = self._move_aside(stage)
        self.state[stage.name] = {"key": key, "status": "running", "keep": keep}
        write_json(self.state_path, self.state)
        self.echo(f"[run ] {stage.name:22s} ...")
        return key, aside, time.perf_counter()

    def _failed(self, stage: Stage, aside: Path | None) -> None:
        if aside is not None:
            self._put_back(stage, aside)

    def _keep(self, stage: Stage, rec: dict) -> list[str]:
        """The files under the stage's outputs that the study did not write (relative to OUT): kept
        through the redo. A listed file whose bytes changed, or a user's file where the stage writes
        a file, is refused before anything moves. After a kill (the record says running) only the files
        kept when that run started count as the user's; the rest are the killed run's partial outputs."""
        earlier = set(rec.get("keep") or []) if rec.get("status") == "running" else None
        keep = []
        for p in stage.outputs:
            found = [p.name] if p.is_file() else list_files(p) if p.is_dir() else []
            base = p if p.is_dir() else p.parent
            for sub in found:
                rel = (base / sub).relative_to(self.out).as_posix()
                if rel in self.files:
                    if sha256_file(base / sub) != self.files[rel]:
                        raise FbtError(
                            f"{self.out / rel}: changed since fbt-probe reproduce wrote it (its sha256 differs from "
                            f"the one in {self.out / MARKER}); refusing to redo stage {stage.name} over it "
                            "(move it away, then run again)"
                        )
                elif earlier is None or rel in earlier:
                    if p.is_file():
                        raise FbtError(
                            f"{p}: not written by fbt-probe reproduce (absent from {self.out / MARKER}); refusing to "
                            f"replace it with stage {stage.name}'s output (move it away, then run again)"
                        )
                    keep.append(rel)
        return keep

    def _finish(self, stage: Stage, key: str, aside: Path | None, t0: float) -> None:
        keep = self.state.get(stage.name, {}).get("keep") or []
        clash = [
            rel for rel in keep if (self.out / rel).exists() and aside is not None and not (self.out / rel).is_dir()
        ]
        if clash:
            self._put_back(stage, aside)
            raise FbtError(
                f"{self.out / clash[0]}: not written by fbt-probe reproduce and stage {stage.name} now writes a file "
                "of that name; its old outputs are back in place (move the file away, then run again)"
            )
        if aside is not None:
            self._carry(stage, aside, keep)
            shutil.rmtree(aside)
        self._record_files(stage, set(keep))
        dt = time.perf_counter() - t0
        self.times[stage.name] = dt
        self.ran[stage.name] = True
        finished = time.strftime("%Y-%m-%dT%H:%M:%S") + f".{time.time_ns() % 10**9:09d}"
        self.state[stage.name] = {"key": key, "status": "done", "seconds": dt, "finished": finished}
        self.keys[stage.name] = _chain(key, finished)  # a redone stage invalidates the stages that read it
        write_json(self.state_path, self.state)
        self.echo(f"[done] {stage.name:22s} {dt:6.1f} s")

    def _carry(self, stage: Stage, aside: Path, keep: list[str]) -> None:
        """Move the kept files from the old outputs (aside) into the new ones."""
        for i, p in enumerate(stage.outputs):
            subs = [(self.out / rel).relative_to(p) for rel in keep if (self.out / rel).is_relative_to(p)]
            carry(aside / str(i), p, [sub for sub in subs if (aside / str(i) / sub).exists()])

    def _record_files(self, stage: Stage, keep: set[str]) -> None:
        """The marker lists the stage's new outputs (their sha256), not the files it kept."""
        for p in stage.outputs:
            prefix = p.relative_to(self.out).as_posix()
            self.files = {r: h for r, h in self.files.items() if r != prefix and not r.startswith(prefix + "/")}
            if p.is_file():
                self.files[prefix] = sha256_file(p)
            elif p.is_dir():
                for sub, sha in files_of(p).items():
                    if f"{prefix}/{sub}" not in keep:
                        self.files[f"{prefix}/{sub}"] = sha
        write_marker(self.out, COMMAND, files=dict(sorted(self.files.items())))

    def _move_aside(self, stage: Stage) -> Path | None:
        present = [(i, p) for i, p in enumerate(stage.outputs) if p.exists() or p.is_symlink()]
        if not present:
            return None
        aside = Path(tempfile.mkdtemp(prefix=f".{stage.name}.", suffix=".old", dir=self.out))
        for i, p in present:
            os.replace(p, aside / str(i))
        return aside

    def _put_back(self, stage: Stage, aside: Path) -> None:
        for i, p in enumerate(stage.outputs):
            old = aside / str(i)
            if old.exists() or old.is_symlink():
                _remove(p)  # whatever the failed run left half-written
                os.replace(old, p)
        shutil.rmtree(aside)


def time_table(times: dict[str, float], ran: dict[str, bool]) -> str:
    """The stages in the study's order with their seconds: run here, or skipped (the seconds recorded
    when the stage last ran), and the sum of those run here (more than the wall time where stages ran
    side by side)."""
    width = max([len(n) for n in times] + [len("stage")])
    lines = [f"{'stage':{width}s}  {'':4s}  {'seconds':>8s}"]
    for name, sec in times.items():
        lines.append(f"{name:{width}s}  {'run' if ran.get(name) else 'skip':4s}  {sec:8.1f}")
    total = sum(sec for name, sec in times.items() if ran.get(name))
    lines.append(f"{'sum run here':{width}s}  {'':4s}  {total:8.1f}")
    return "\n".join(lines)


def _remove(p: Path) -> None:
    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def read_state(path: Path) -> dict:
    state = read_json(path, "stage record")
    if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
        raise FbtError(f"{path}: expected an object of stage records (written by fbt-probe reproduce)")
    return state


def is_study(folder: Path) -> bool:
    """`folder` holds a study of `fbt-probe reproduce`: its marker names the command (a stage record
    alone, stages.json, is a file name anyone can make)."""
    if not is_marked(folder, COMMAND):
        return False
    try:
        if (Path(folder) / STATE).is_file():
            read_state(Path(folder) / STATE)
    except FbtError:
        return False
    return True


_HELD: dict[str, list] = {}  # study folder -> [open lock file, runners of this process holding it]


def lock_study(out: Path) -> str:
    """Take OUT's study lock (an exclusive flock on its lock file, which the system releases when the
    process ends, however it ends): a study of another process on the same OUT is refused at once,
    not mixed into this one. Runners of one process share the lock."""
    key = str(Path(out).resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    f = open(Path(out) / LOCK, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise FbtError(
            f"--out {out}: another fbt-probe reproduce is running in this study; wait for it to finish "
            "(a rerun then continues where it stopped), or choose another --out"
        ) from None
    _HELD[key] = [f, 1]
    return key


def unlock_study(key: str) -> None:
    held = _HELD.get(key)
    if held is not None:
        held[1] -= 1
        if held[1] == 0:
            held[0].close()
            del _HELD[key]


SEED_ENTRY = re.compile(r"seed-\d+")


def is_seeds_study(folder: Path) -> bool:
    """`folder` holds only a study over seeds: seed-S/ studies and seeds.csv (hidden temporary files aside)."""
    entries = [e for e in Path(folder).iterdir() if not e.name.startswith(".")]
    return all(
        e.name == "seeds.csv"
        and e.is_file()
        or SEED_ENTRY.fullmatch(e.name)
        and e.is_dir()
        and (is_study(e) or is_empty_dir(e))
        for e in entries
    )


def check_out(out: Path, seeds: bool = False) -> None:
    """Refuse an OUT the study may not write into: a file, or a folder with content that is not a
    study (`seeds`: nor a study over seeds) - its files would be replaced by the stages' outputs."""
    out = Path(out)
    if out.is_symlink():
        refuse_links(out)
    if out.exists() and not out.is_dir():
        raise FbtError(f"--out {out}: is a file; expected a study folder (absent, empty, or an earlier study's)")
    if not out.is_dir() or is_empty_dir(out) or is_study(out) or (seeds and is_seeds_study(out)):
        return
    what = (
        "a study over seeds (seed-S/ and seeds.csv)"
        if seeds
        else f"a study folder (it has no {MARKER} marker of fbt-probe reproduce)"
    )
    raise FbtError(
        f"--out {out}: exists and is not {what}; refusing to write into it, the stages would replace "
        "its files (choose another --out, or an empty folder)"
    )


def _chain(key: str, finished: str | None) -> str:
    return hashlib.sha256(f"{key}:{finished}".encode()).hexdigest()


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_jobs() -> int:
    """Two stages side by side where there are two cores: the study's stages use about 1.5 cores
    each on 2 (tokenising, pandas and small GEMMs are serial), two on one thread each fill both."""
    return min(2, cpus())


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# What a worker imports before its first stage: with the forkserver start method its server imports
# these once and every worker is forked from it ready (a spawned worker pays them itself, ~7 s on
# 2 cores). The server never runs torch, so forking it is safe.
PRELOAD = ["fbt_probe.reproduce.pipeline"]


def _context():
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


@contextmanager
def _thread_env(threads: int) -> Iterator[None]:
    """The thread variables set to `threads` while the block runs (what a process started inside
    it inherits; this process's BLAS libraries are already started and keep theirs)."""
    saved = {v: os.environ.get(v) for v in THREAD_VARS}
    os.environ.update({v: str(threads) for v in THREAD_VARS})
    try:
        yield
    finally:
        for v, val in saved.items():
            os.environ.pop(v, None) if val is None else os.environ.__setitem__(v, val)


def worker_threads(jobs: int) -> int:
    return max(1, cpus() // jobs)


def _start_server(ctx) -> None:
    """The forkserver running (started with the environment of the moment), where `ctx` uses one."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def start_workers(jobs: int) -> None:
    """Start the worker server now (forkserver platforms), so that it imports the pipeline while
    this process imports its own; `run_all` then forks its workers from it at once."""
    if jobs > 1:
        with _thread_env(worker_threads(jobs)):
            _start_server(_context())


@contextmanager
def _pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """`jobs` workers, each with `cpus() // jobs` threads (the thread variables are set while the
    workers start, and torch's count by the initializer)."""
    threads = worker_threads(jobs)
    with _thread_env(threads):  # for the whole pool: spawned workers start when stages are submitted
        ctx = _context()
        _start_server(ctx)  # started here unless `start_workers` started it
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker, initargs=(threads,)) as pool:
            yield pool


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now (an interruption): a stage's old outputs go back only once nothing writes to them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the executor has no public terminate
    for p in procs:
        p.terminate()
    for p in procs:
        p.join()
    pool.shutdown(wait=True, cancel_futures=True)
