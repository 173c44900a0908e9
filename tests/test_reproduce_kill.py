"""A study killed with SIGKILL in any stage, then run again: the finished stages are skipped with
their bytes intact, the killed one is redone from scratch (its partial outputs replaced), and the study ends equal to an uninterrupted one. The study runs in a
child process (the stage runner of `fbt-probe reproduce` with three small stages) so that the kill
is a real one: no handler, no cleanup."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

STUDY = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from fbt_probe.reproduce.stages import Runner, Stage

    out, kill_at = Path(sys.argv[1]), sys.argv[2]

    def stage(name, reads):
        def fn():
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            text = name + "".join((out / r / "b.txt").read_text() for r in reads)
            (folder / "a.txt").write_text(text)  # written before the kill: a partial output
            if name == kill_at:
                (folder / "scratch.txt").write_text("half")  # what only a killed run leaves
                (out.parent / "ready").write_text(name)
                time.sleep(300)
            (folder / "b.txt").write_text(text + "!")
        return fn

    runner = Runner(out, echo=print)
    runner.run_all([
        Stage("a", {"v": 1}, [out / "a"], stage("a", [])),
        Stage("b", {"v": 1}, [out / "b"], stage("b", ["a"]), after=["a"]),
        Stage("c", {"v": 1}, [out / "c"], stage("c", ["a", "b"]), after=["a", "b"]),
    ])
    runner.close()
    """
)
STATE_FILES = {".fbt-output.json", "stages.json", ".fbt-study.lock"}


def study(out, kill_at="-"):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen(
        [sys.executable, "-c", STUDY, str(out), kill_at], stdout=subprocess.PIPE, text=True, env=env
    )


def tree(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in STATE_FILES
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "study"
    proc = study(out)
    assert proc.wait(timeout=120) == 0
    return tree(out)


@pytest.mark.parametrize("kill_at", ["a", "b", "c"])
def test_a_study_killed_in_a_stage_continues_and_ends_as_an_uninterrupted_one(tmp_path, uninterrupted, kill_at):
    out = tmp_path / "study"
    proc = study(out, kill_at)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the study never reached the stage"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    before = {k: v for k, v in tree(out).items() if k.split("/")[0] != kill_at}
    assert sorted(p.name for p in (out / kill_at).iterdir()) == ["a.txt", "scratch.txt"]  # the partial output
    rerun = study(out)
    log, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, log
    done = [n for n in "abc" if n < kill_at]
    assert [line.split()[1] for line in log.splitlines() if line.startswith("[skip]")] == done
    assert {k: v for k, v in tree(out).items() if k.split("/")[0] in done} == before  # untouched
    assert tree(out) == uninterrupted
    assert not [p for p in out.iterdir() if p.name.endswith((".old", ".tmp"))]
