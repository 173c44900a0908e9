"""`torchrun --nproc_per_node 2 -m fbt_probe patch` (gloo, loopback, a free port): the launcher, the
CLI's process group and the gathered tables are the single-process tables. Each pair batch runs
whole on one rank, on the shapes one process uses, so they are compared exactly. (Extraction over
ranks: tests/test_distributed_extract.py, which starts its processes as torchrun would.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app
from tests.test_interventions_cli import workdir  # noqa: F401  (fixture: a saved small run and dataset)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # torchrun's 2 processes ~15 s on 2 busy cores


def torchrun(*args: str, n: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        "-m",
        "fbt_probe",
        *args,
    ]  # --standalone: rendezvous on localhost, a free port
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def test_patch_on_two_ranks_writes_the_single_process_tables(workdir, tmp_path):  # noqa: F811
    args = [
        "patch",
        str(workdir / "run"),
        str(workdir / "data"),
        "--experiment",
        "feedback-swap",
        "--mode",
        "recurrent:1",
        "--batch-size",
        "4",
        "--n-boot",
        "50",
        "--no-figures",
    ]
    one = CliRunner().invoke(app, args + ["--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    two = torchrun(*args, "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("wrote ") == 1  # rank 0 reports; the other rank is silent
    for name in ("rows.parquet", "summary.parquet"):
        a, b = (pd.read_parquet(tmp_path / d / "feedback-swap" / name) for d in ("one", "two"))
        assert len(a) > 50
        pd.testing.assert_frame_equal(b, a, check_exact=True)
    m1, m2 = (json.loads((tmp_path / d / "feedback-swap" / "manifest.json").read_text()) for d in ("one", "two"))
    m1.pop("provenance"), m2.pop("provenance")  # the same but for when and where it ran
    assert m1 == m2
