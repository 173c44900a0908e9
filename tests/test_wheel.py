"""The built wheel works outside the checkout: its task specs, shipped reference models and seeds
table are package data, read through importlib.resources, so an installed package generates tasks,
lists and loads the shipped models and runs a forward from any working directory."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from tests.notebook_helpers import (
    NOTEBOOK_DIR,
    RECORDS,
    execute,
    leaves,
    read_record,
    record_problems,
    run_in_this_process,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout, installed (without its dependencies, which this
    environment has) into a fresh target folder; commands run from another folder."""
    root = tmp_path_factory.mktemp("wheel")
    src = (
        root / "src"
    )  # a copy: setuptools builds in the source tree, and a stale build/ there could leak into the wheel
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__")
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(root / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = (root / "dist").glob("fbt_probe-*.whl")
    target = root / "site"
    inst = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert inst.returncode == 0, inst.stderr
    work = root / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    return wheel, target, work, env


def run(installed, *args):
    _, _, work, env = installed
    return subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_the_wheel_holds_the_package_data(installed):
    wheel = installed[0]
    names = zipfile.ZipFile(wheel).namelist()
    from fbt_probe.reference import names as shipped
    from fbt_probe.tasks.spec import builtin_spec_paths

    specs = sorted(builtin_spec_paths())
    assert {"completion", "memory", "registers", "registers-count", "compose-s3"} <= set(specs)
    for spec in specs:  # every built-in spec of the checkout, the serial-depth ones included
        assert f"fbt_probe/tasks/specs/{spec}.json" in names
    refs = shipped()
    assert {"tiny-feedback", "tiny-baseline", "tiny-depth-feedback", "tiny-depth-baseline"} <= set(refs)
    for ref in refs:  # every shipped reference model of the checkout
        for f in ("config.json", "model.safetensors", "tokenizer.json", "reference.json"):
            assert f"fbt_probe/reference/models/{ref}/{f}" in names
    assert "fbt_probe/reference/seeds-tiny.csv" in names
    from fbt_probe._version import __version__

    (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = zipfile.ZipFile(wheel).read(meta_name).decode()
    assert f"\nVersion: {__version__}\n" in meta and "\nLicense-Expression: MIT\n" in meta  # the version from one place
    assert any(n.endswith("/licenses/LICENSE") for n in names)
    cff = (REPO / "CITATION.cff").read_text()
    assert f'\nversion: "{__version__}"\n' in cff


@pytest.mark.slow
def test_the_installed_package_runs_from_another_folder(installed):
    _, target, work, _ = installed
    where = run(installed, "-c", "import fbt_probe; print(fbt_probe.__file__)")
    assert where.returncode == 0 and Path(where.stdout.strip()).is_relative_to(target), where.stdout + where.stderr
    tasks = run(installed, "-m", "fbt_probe", "tasks", "list")
    assert tasks.returncode == 0, tasks.stderr
    specs = sorted(p.stem for p in (REPO / "fbt_probe" / "tasks" / "specs").glob("*.json"))  # the checkout's
    assert {"completion", "memory", "registers", "registers-count", "chain-s3"} <= set(specs)
    assert sorted(ln.split()[0] for ln in tasks.stdout.splitlines()) == specs  # every spec file in the wheel
    assert str(target) in tasks.stdout  # the specs are read from the installed package
    gen = run(installed, "-m", "fbt_probe", "tasks", "generate", "completion", "--groups", "4", "--out", "data")
    assert gen.returncode == 0, gen.stderr
    df = pd.read_parquet(work / "data" / "completion.parquet")
    assert len(df) > 0 and set(df["task"]) == {"completion"}
    assert json.loads((work / "data" / "completion.manifest.json").read_text())  # written beside it
    refs = run(installed, "-m", "fbt_probe", "model", "refs")
    assert refs.returncode == 0 and "tiny-feedback" in refs.stdout and "tiny-baseline" in refs.stdout, refs.stderr
    forward = run(
        installed,
        "-c",
        (
            "import torch, fbt_probe as fp\n"
            "m = fp.load_model('ref:tiny-feedback')\n"
            "print(m.cfg.d_vocab, tuple(m(torch.tensor([[1, 2, 3, 4]])).shape))\n"
            "from fbt_probe.reproduce.seeds import packaged\n"
            "print(packaged('tiny').is_file())"
        ),
    )
    assert forward.returncode == 0, forward.stderr
    vocab_and_shape, seeds = forward.stdout.strip().splitlines()
    d_vocab, shape = vocab_and_shape.split(" ", 1)
    assert shape == f"(1, 4, {d_vocab})" and seeds == "True", forward.stdout


@pytest.mark.slow
def test_provenance_inside_a_users_repository_names_the_package_not_the_repository(installed, tmp_path):
    """A user's repository as the working directory, the package installed from the wheel: the
    record's own commit is 'unknown' (no checkout of fbt-probe), the package's version and install
    come from its metadata, and the user's commit is recorded under its own label."""
    _, target, _, env = installed
    repo = tmp_path / "users-repo"
    repo.mkdir()
    git = {
        **env,
        "GIT_AUTHOR_NAME": "u",
        "GIT_AUTHOR_EMAIL": "u@x",
        "GIT_COMMITTER_NAME": "u",
        "GIT_COMMITTER_EMAIL": "u@x",
    }
    for cmd in (["git", "init", "-q"], ["git", "commit", "-q", "--allow-empty", "-m", "theirs"]):
        subprocess.run(cmd, cwd=repo, env=git, check=True)
    theirs = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    shutil.copytree(target, repo / "site")  # the install inside their repository, as a venv inside it would be
    env = {**env, "PYTHONPATH": str(repo / "site")}
    res = subprocess.run(
        [sys.executable, "-c", "import json, fbt_probe.provenance as p; print(json.dumps(p.provenance()))"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    from fbt_probe._version import __version__

    assert rec["git_commit"] == "unknown" and rec["working_directory_commit"] == theirs
    assert rec["package"]["version"] == __version__ and rec["versions"]["fbt-probe"] == __version__
    assert rec["package"]["kind"] == "local folder or file" and rec["package"]["url"].endswith(
        ".whl"
    )  # pip's direct_url.json


@pytest.mark.slow
def test_a_notebook_outside_the_checkout_gives_the_checkouts_numbers(installed, tmp_path):
    """The notebook `model-and-modes` copied into a folder outside the checkout and run there in a
    Jupyter kernel on the installed wheel records the numbers its code records in the checkout (run
    here, as a script on the checkout's package: the imports this process has already paid for), one
    torch thread each: the same arithmetic. Both records pass their checks; the wheel's names the
    wheel's package."""
    _, target, work, wheel_env = installed
    notebook = NOTEBOOK_DIR / "model-and-modes.py"
    outside = work / "notebook"
    outside.mkdir()
    shutil.copy(notebook, outside / notebook.name)
    execute(outside / notebook.name, outside, {**wheel_env, RECORDS: str(tmp_path / "wheel")})
    run_in_this_process(notebook, tmp_path / "checkout")
    for side in ("checkout", "wheel"):
        assert record_problems(notebook.stem, read_record(tmp_path / side, notebook)) == [], side
    here, there = (leaves(read_record(tmp_path / side, notebook)) for side in ("checkout", "wheel"))
    assert Path(here.pop("/fbt_probe_file")).is_relative_to(REPO)
    assert Path(there.pop("/fbt_probe_file")).is_relative_to(target)  # the wheel's package, not the checkout's
    assert sorted(here) == sorted(there) and len(here) > 100
    differ = {k: (here[k], there[k]) for k in here if abs(here[k] - there[k]) > 1e-6 * max(1.0, abs(here[k]))}
    assert differ == {}
    assert sorted(p.name for p in outside.iterdir()) == [notebook.name]  # it wrote nothing beside itself
