"""The stage runner with worker processes (`Runner.run_all(stages, jobs)`): a stage starts only
after the stages it reads, outputs and records are those of the serial runner, a failure in a
worker reaches the caller with its message and puts the stage's old outputs back, and an
interruption stops the workers and puts back the outputs of every stage that was running."""

import json
import os
import time
from functools import partial
from pathlib import Path

import pytest

from fbt_probe.errors import FbtError
from fbt_probe.reproduce.stages import Runner, Stage, cpus


def write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def append(src: str, dst: str, tag: str) -> None:
    write(dst, Path(src).read_text() + tag)


def fail(path: str) -> None:
    write(path, "half-written")
    raise FbtError("stage b: the input is bad")


def threads(path: str) -> None:
    import torch

    write(path, json.dumps({"torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}))


def sleep_then_write(path: str) -> None:
    write(path, "new")
    time.sleep(120)
    write(path + ".late", "a worker that was not stopped")


def stages(out: Path, b_fn=None) -> list[Stage]:
    a, b, c, d = (str(out / n) for n in "abcd")
    return [
        Stage("a", {"v": 1}, [Path(a)], partial(write, a, "a")),
        Stage("b", {"v": 1}, [Path(b)], b_fn or partial(append, a, b, "b"), after=["a"]),
        Stage("c", {"v": 1}, [Path(c)], partial(write, c, "c")),
        Stage("d", {"v": 1}, [Path(d)], partial(append, b, d, "d"), after=["b", "c"]),
    ]


def quiet(_):
    return None


def test_dependent_stages_wait_and_the_record_is_the_serial_runners(tmp_path):
    par, ser = tmp_path / "par", tmp_path / "ser"
    r = Runner(par, echo=quiet)
    r.run_all(stages(par), jobs=2)
    Runner(ser, echo=quiet).run_all(stages(ser), jobs=1)
    for n, text in {"a": "a", "b": "ab", "c": "c", "d": "abd"}.items():
        assert (par / n).read_text() == (ser / n).read_text() == text
    state = json.loads((par / "stages.json").read_text())
    assert sorted(state) == ["a", "b", "c", "d"] and {v["status"] for v in state.values()} == {"done"}
    assert list(r.times) == ["a", "b", "c", "d"] and all(r.ran.values())  # the time table's order is the list's
    again = Runner(par, echo=quiet)
    again.run_all(stages(par), jobs=2)
    assert not any(again.ran.values())  # every stage up to date
    (par / "a").write_text("a")
    forced = Runner(par, force={"a"}, echo=quiet)
    forced.run_all(stages(par), jobs=2)
    assert forced.ran == {"a": True, "b": True, "c": False, "d": True}  # a redone stage redoes its readers


def test_a_failure_in_a_worker_is_raised_and_puts_the_old_outputs_back(tmp_path):
    out = tmp_path / "s"
    Runner(out, echo=quiet).run_all(stages(out), jobs=2)
    broken = stages(out, b_fn=partial(fail, str(out / "b")))
    broken[1].inputs = {"v": 2}
    r = Runner(out, echo=quiet)
    with pytest.raises(FbtError, match="stage b: the input is bad"):
        r.run_all(broken, jobs=2)
    assert (out / "b").read_text() == "ab"  # the old output, not the half-written one
    assert [p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp"))] == []
    state = json.loads((out / "stages.json").read_text())
    assert state["b"]["status"] == "running" and state["d"]["status"] == "done"  # d never started
    assert "d" not in r.ran


def test_workers_run_with_their_share_of_the_threads_and_the_parent_keeps_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    out = tmp_path / "s"
    st = [Stage(n, {}, [out / n], partial(threads, str(out / n))) for n in "xy"]
    Runner(out, echo=quiet).run_all(st, jobs=2)
    want = max(1, cpus() // 2)
    for n in "xy":
        assert json.loads((out / n).read_text()) == {"torch": want, "omp": str(want)}
    assert os.environ["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in os.environ


def test_an_interruption_stops_the_workers_and_puts_back_what_was_running(tmp_path):
    out = tmp_path / "s"
    first = [
        Stage("slow", {"v": 1}, [out / "slow"], partial(write, str(out / "slow"), "old")),
        Stage("fast", {"v": 1}, [out / "fast"], partial(write, str(out / "fast"), "old")),
    ]
    Runner(out, echo=quiet).run_all(first, jobs=2)
    second = [
        Stage("slow", {"v": 2}, [out / "slow"], partial(sleep_then_write, str(out / "slow"))),
        Stage("fast", {"v": 2}, [out / "fast"], partial(write, str(out / "fast"), "new")),
    ]

    def interrupt_after_fast(line):
        if line.startswith("[done] fast"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Runner(out, echo=interrupt_after_fast).run_all(second, jobs=2)
    assert not (out / "slow.late").exists()  # the sleeping worker was stopped, not waited for
    assert (out / "slow").read_text() == "old" and (out / "fast").read_text() == "new"
    assert [p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp"))] == []
