"""Several experiments in one command (`fbt_probe.interventions.combined`): the same tables as each
experiment on its own, with one prefill per batch instead of one per experiment."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fbt_probe.interventions.experiments as E
import fbt_probe.interventions.pool as pool_module
from fbt_probe.cli import app
from fbt_probe.interventions import PatchConfig, label_token_ids, pair_batches, run
from fbt_probe.interventions.combined import run_several, units
from fbt_probe.model.checkpoint import save_checkpoint
from fbt_probe.tasks import build_tokenizer, generate, load_spec, save_tokenizer, write_dataset
from tests.helpers import make_model

pytestmark = pytest.mark.usefixtures("one_thread")
FIVE = ("feedback-swap", "state-replacement", "gate-ablation", "residual", "probe-direction")
OPTS = dict(n_boot=50, depths=(0, 3), scales=(1.0,), n_folds=2, batch_size=8)


@pytest.fixture(scope="module")
def model():
    return make_model()  # float64


@pytest.fixture(scope="module")
def data():
    """Two tasks at two lengths each: several batches per cell and several cells (units)."""
    tok = build_tokenizer()
    frames = [generate(dataclasses.replace(load_spec(t), length_grid=(0, 8)), groups=3, seed=0, tokenizer=tok)
              for t in ("completion", "memory")]
    df = pd.concat(frames, ignore_index=True)
    return df, label_token_ids(df, tok)


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Same rows in the same order; floats equal up to float64 rounding. The combined run computes
    the same shapes as the separate runs, so any real difference (a prefix of the wrong batch, a
    stale cache position, gates or donors from a part of the data) moves numbers by 1e-3 or more."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b) and len(a) > 0
    for c in a.columns:
        if a[c].dtype.kind == "f":
            np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-10, atol=1e-12, err_msg=c)
        else:
            assert a[c].tolist() == b[c].tolist(), c


@pytest.mark.parametrize("mode", ["recurrent:1", "jacobi:2"])
def test_five_together_equal_each_on_its_own(model, data, mode):
    df, ids = data
    cfgs = [PatchConfig(e, modes=(mode,), **OPTS) for e in FIVE]
    together = run_several(model, df, cfgs, label_ids=ids, figures=False)
    for cfg, res in zip(cfgs, together):
        alone = run(model, df, cfg, label_ids=ids, figures=False)
        same_frame(res.rows, alone.rows)
        same_frame(res.summary, alone.summary)
        assert res.manifest["experiment"] == cfg.experiment and res.manifest["notes"] == alone.manifest["notes"]


def test_experiments_with_different_modes_run_together_as_the_study_runs_them(model, data):
    """`fbt-probe reproduce` runs each experiment under its own study modes in one call: each mode
    runs the experiments that have it, and each experiment keeps its own mode order."""
    df, ids = data
    modes = {"feedback-swap": ("recurrent:1",), "probe-direction": ("standard", "recurrent:1"),
             "state-replacement": ("recurrent:1",), "residual": ("recurrent:1", "standard")}
    cfgs = [PatchConfig(e, modes=m, **OPTS) for e, m in modes.items()]
    for cfg, res in zip(cfgs, run_several(model, df, cfgs, label_ids=ids, figures=False)):
        alone = run(model, df, cfg, label_ids=ids, figures=False)
        assert list(dict.fromkeys(res.rows["mode"])) == list(cfg.modes)
        same_frame(res.rows, alone.rows)
        same_frame(res.summary, alone.summary)


def test_one_prefill_per_batch_serves_every_final_position_experiment(model, data, monkeypatch):
    """Builds counted: together, the four final-position experiments build each batch's prefix once,
    plus state replacement's second pass; on their own, once per experiment and pass (5 per batch)."""
    df, ids = data
    n_batches = len(list(pair_batches(df, ids, OPTS["batch_size"])))
    calls = []
    real = E.build_prefix

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(E, "build_prefix", counting)
    monkeypatch.setattr(pool_module, "build_prefix", counting)
    shared = ("state-replacement", "feedback-swap", "probe-direction", "gate-ablation")
    cfgs = [PatchConfig(e, decoding=False, **OPTS) for e in shared]
    run_several(model, df, cfgs, label_ids=ids, figures=False)
    assert len(calls) == 2 * n_batches
    calls.clear()
    for cfg in cfgs:
        run(model, df, cfg, label_ids=ids, figures=False)
    assert len(calls) == 5 * n_batches


def test_units_hold_whole_probe_cells_in_batch_order(data):
    df, ids = data
    batches = list(pair_batches(df, ids, batch_size=4))
    got = units(batches)
    assert [i for u in got for i in u] == list(range(len(batches)))  # contiguous, in order, complete
    key = lambda b: (b.meta["task"].iloc[0], int(b.meta["length_knob"].iloc[0]))  # noqa: E731
    where = {}
    for n, u in enumerate(got):
        for i in u:
            assert where.setdefault(key(batches[i]), n) == n  # a cell never spans two units
    assert len(got) == len(where) == 4  # completion and memory at lengths 0 and 8: one unit per cell


def test_units_merge_cells_that_interleave():
    class B:
        def __init__(self, task, knob):
            self.meta = pd.DataFrame({"task": [task], "length_knob": [knob]})

    got = units([B("a", 0), B("a", 1), B("a", 0), B("b", 0), B("b", 2)])
    assert [list(u) for u in got] == [[0, 1, 2], [3], [4]]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("combined")
    tok = build_tokenizer()
    for task in ("completion", "memory"):
        df = generate(dataclasses.replace(load_spec(task), length_grid=(0, 8)), groups=3, seed=0, tokenizer=tok)
        write_dataset(df, root / "data", tok)
    save_tokenizer(tok, root / "tokenizer.json")
    import torch

    save_checkpoint(make_model(dtype=torch.float32), root / "run", tokenizer_path=root / "tokenizer.json")
    return root


def test_cli_runs_several_experiments_into_their_folders(workdir):
    out = workdir / "results"
    args = ["patch", str(workdir / "run"), str(workdir / "data"), "--experiment", "feedback-swap,probe-direction,residual",
            "--out", str(out), "--n-boot", "20", "--depths", "0,2", "--scales", "1", "--folds", "2", "--no-figures"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    for name in ("feedback-swap", "probe-direction", "residual"):
        assert (out / name / "summary.parquet").is_file() and (out / name / "manifest.json").is_file()
        assert f"wrote {out / name}" in res.output
    # an existing folder of any of them: refused before anything runs, nothing else written
    again = CliRunner().invoke(app, args[:4] + ["gate-ablation,feedback-swap"] + args[5:])
    assert again.exit_code == 2 and "feedback-swap: already exists" in again.output
    assert not (out / "gate-ablation").exists()


def test_cli_refuses_a_repeated_experiment_in_one_line(workdir):
    res = CliRunner().invoke(app, ["patch", str(workdir / "run"), str(workdir / "data"), "--experiment",
                                   "feedback-swap,feedback-swap", "--out", str(workdir / "dup")])
    assert res.exit_code == 2 and "each experiment at most once" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (workdir / "dup").exists()
