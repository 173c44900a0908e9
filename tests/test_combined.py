"""Several experiments in one command (`fbt_probe.interventions.combined`; its CLI in test_interventions_cli): the same
tables as each experiment on its own, with one prefill per batch instead of one per experiment."""

import dataclasses

import pandas as pd
import pytest

import fbt_probe.interventions.forwards as forwards_module
from fbt_probe.interventions import PatchConfig, label_token_ids, pair_batches, run
from fbt_probe.interventions.combined import run_several, units
from fbt_probe.interventions.registry import options_for
from fbt_probe.tasks import build_tokenizer, generate, load_spec
from tests.helpers import assert_same_rows, make_model

pytestmark = pytest.mark.usefixtures("one_thread")
FIVE = ("feedback-swap", "state-replacement", "gate-ablation", "residual", "probe-direction")
OPTS = dict(n_boot=50, batch_size=8)
KNOBS = dict(depths=(0, 3), scales=(1.0,), n_folds=2, last_k=8)  # residual: the last 8 positions and the differing one


def config(experiment, **kw) -> PatchConfig:
    knobs = {**KNOBS, **kw.pop("knobs", {})}
    return PatchConfig(experiment, options=options_for(experiment, **knobs), **OPTS, **kw)


@pytest.fixture(scope="module")
def model():
    return make_model()  # float64


@pytest.fixture(scope="module")
def data():
    """Two tasks at two lengths each: several batches per cell and several cells (units)."""
    tok = build_tokenizer()
    frames = [
        generate(dataclasses.replace(load_spec(t), length_grid=(0, 8)), groups=3, seed=0, tokenizer=tok)
        for t in ("completion", "memory")
    ]
    df = pd.concat(frames, ignore_index=True)
    return df, label_token_ids(df, tok)


def same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """The combined run computes the same shapes as the separate runs, so any real difference (a
    prefix of the wrong batch, gates or donors from a part of the data) moves numbers by 1e-3 or more."""
    assert_same_rows(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent:1", "jacobi:2"])
def test_five_together_equal_each_on_its_own(model, data, mode):
    df, ids = data
    cfgs = [config(e, modes=(mode,)) for e in FIVE]
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
    modes = {
        "feedback-swap": ("recurrent:1",),
        "probe-direction": ("standard", "recurrent:1"),
        "state-replacement": ("recurrent:1",),
        "residual": ("recurrent:1", "standard"),
    }
    cfgs = [config(e, modes=m) for e, m in modes.items()]
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
    real = forwards_module.build_prefix

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(forwards_module, "build_prefix", counting)  # the one place prefixes are built
    shared = ("state-replacement", "feedback-swap", "probe-direction", "gate-ablation")
    cfgs = [config(e, knobs=dict(decoding=False)) for e in shared]
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
