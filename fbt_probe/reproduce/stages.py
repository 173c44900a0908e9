"""A tiny stage runner: each stage has a key (sha256 of its inputs, which include the keys of the
stages it reads), its outputs, and a function. A stage whose recorded key matches and whose outputs
exist is skipped, so a re-run after an interruption continues; `force` redoes named stages."""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fbt_probe.errors import FbtError
from fbt_probe.io import read_json, write_json


@dataclass
class Stage:
    name: str
    inputs: dict
    outputs: list[Path]
    fn: Callable[[], None]
    after: list[str] = field(default_factory=list)  # stages whose keys feed this one
    resumable: bool = False  # outputs may be partially written and continued (training)

    def key(self, keys: dict[str, str]) -> str:
        blob = json.dumps({"inputs": self.inputs, "after": {a: keys[a] for a in self.after}}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


class Runner:
    def __init__(self, out: Path, force: set[str] = frozenset(), echo: Callable[[str], None] = print):
        self.out, self.force, self.echo = out, set(force), echo
        self.state_path = out / "stages.json"
        self.state = read_json(self.state_path) if self.state_path.is_file() else {}
        self.keys: dict[str, str] = {}
        self.times: dict[str, float] = {}

    def run(self, stage: Stage) -> None:
        key = stage.key(self.keys)
        rec = self.state.get(stage.name, {})
        done = rec.get("key") == key and rec.get("status") == "done" and all(p.exists() for p in stage.outputs)
        if done and stage.name not in self.force:
            self.keys[stage.name] = _chain(key, rec.get("finished"))
            self.times[stage.name] = rec.get("seconds", 0.0)
            self.echo(f"[skip] {stage.name:22s} up to date ({rec.get('seconds', 0):.0f} s when run)")
            return
        stale_model = stage.resumable and rec.get("key") not in (None, key) and any(p.exists() for p in stage.outputs)
        if stale_model and stage.name not in self.force:  # never delete a trained model unasked
            raise FbtError(f"{self.out}: stage {stage.name}'s inputs changed since {stage.outputs[0]} was made; "
                           f"pass --force {stage.name} to redo it (deletes it) or choose another --out")
        if not (stage.resumable and rec.get("key") == key) or stage.name in self.force:
            for p in stage.outputs:  # stale or forced: start the stage's outputs afresh
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.state[stage.name] = {"key": key, "status": "running"}
        write_json(self.state_path, self.state)
        self.echo(f"[run ] {stage.name:22s} ...")
        t0 = time.perf_counter()
        stage.fn()
        dt = time.perf_counter() - t0
        self.times[stage.name] = dt
        finished = time.strftime("%Y-%m-%dT%H:%M:%S") + f".{time.time_ns() % 10**9:09d}"
        self.state[stage.name] = {"key": key, "status": "done", "seconds": dt, "finished": finished}
        self.keys[stage.name] = _chain(key, finished)  # a redone stage invalidates the stages that read it
        write_json(self.state_path, self.state)
        self.echo(f"[done] {stage.name:22s} {dt:6.1f} s")


def _chain(key: str, finished: str | None) -> str:
    return hashlib.sha256(f"{key}:{finished}".encode()).hexdigest()
