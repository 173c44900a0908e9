"""The general language model's study (`reproduce --preset small-lm --train`) on a corpus made in the
test: the seed's models trained from one shared one-pass run (each equal to its run from scratch),
the `passes` part's tables, verdicts and figures, and no task-document contraction or depth part."""

from __future__ import annotations

import pandas as pd
import pytest

from fbt_probe.io import sha256_file
from fbt_probe.reproduce.config import LM_MODELS, ReproConfig, lm_train_config
from fbt_probe.reproduce.pipeline import build_stages, reproduce
from tests.corpus_helpers import build_test_corpus

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

RECIPE = dict(tokens_per_step=64, seq_len=16, steps=6, lr=1e-3, one_pass_steps=3)
# one task at one length: every part of the LM study runs, on the fewest samples that exercise it
ONE_TASK = dict(
    groups={"completion": 12},
    knobs={"completion": [8]},
    modes={"completion": ["standard", "recurrent:1"]},
    patch_knobs={"completion": [8]},
)


@pytest.fixture(scope="module")
def lm_study(tmp_path_factory):
    base = tmp_path_factory.mktemp("lm")
    build_test_corpus(base / "src", base / "corpus")
    cfg = ReproConfig.quick_config(
        preset="small-lm", corpus=str(base / "corpus"), lm_recipe=RECIPE, lm_passes=33, methods=False, **ONE_TASK
    )
    reproduce(cfg, base / "study", echo=lambda _: None)
    return cfg, base


def test_the_lm_study_runs_its_own_stages(tmp_path, monkeypatch):
    from fbt_probe.reproduce import pipeline

    monkeypatch.setattr(pipeline, "record", lambda name: {"checkpoint_sha256": name})  # as if shipped
    cfg = ReproConfig(preset="small-lm", corpus="c", shipped=True)
    names = [s.name for s in build_stages(cfg, tmp_path)]
    assert "passes" in names and "contraction" not in names and "depth" not in names
    assert not any(n.startswith("train") for n in names)
    trained = [s.name for s in build_stages(ReproConfig(preset="small-lm", corpus="c"), tmp_path)]
    assert trained[1:5] == ["train-one-pass", "train-feedback", "train-feedback-75-25", "train-baseline"]
    assert ReproConfig(preset="small-lm", steps=800).steps == 1600  # the recipe's steps


def test_each_model_is_its_run_from_scratch(lm_study, tmp_path):
    """Oracle: fbt-probe train of a model's config from step 0 (the fork of the shared one-pass run
    changes nothing): a forked feedback model and the baseline continued from the shared run
    (`feedback-75-25` is forked by the same path, with another pass mix)."""
    from fbt_probe.training import run_training

    cfg, base = lm_study
    for name in ("feedback", "baseline"):
        run_training(lm_train_config(cfg, name), tmp_path / name, progress=False)
        assert sha256_file(tmp_path / name / "model.safetensors") == sha256_file(
            base / "study" / "models" / name / "model.safetensors"
        ), name


def test_the_passes_part_writes_its_tables_figures_and_verdicts(lm_study):
    cfg, base = lm_study
    out = base / "study"
    t = pd.read_parquet(out / "results" / "passes" / "passes.parquet")
    assert set(t["run"]) == set(LM_MODELS)
    assert t.groupby("run")["pass"].max().to_dict() == {"feedback": 33, "feedback-75-25": 33, "baseline": 5}
    per = t.groupby(["run", "pass"])["document"].nunique()
    assert per.nunique() == 1 and per.iloc[0] >= 8  # every run and pass on the same held-out files
    md = (out / "report.md").read_text()
    assert "### General language model: feedback passes" in md
    assert "(figures/fig3-lm.png)" in md and "(figures/fig4-lm.png)" in md
    assert "Fig. 4: held-out loss from 0 to 4 feedback passes at prefill" in md
    assert "The 3 % of three-pass batches:" in md and "75/22/3, seed 0:" in md
    assert "Contraction diagnostic" not in md and "Serial depth" not in md
    assert "never on these tasks" in md  # the setting a reader is told
    assert "(a two-way choice, chance 0.50" in md and "| choice (standard) |" in md
    head = pd.read_csv(out / "headline.csv")
    rise = head[(head["quantity"] == "fig3-loss-rise") & (head["model"] == "feedback")].iloc[0]
    loss = t[t["run"] == "feedback"].pivot(index="pass", columns="document", values="loss")
    assert rise["value"] == pytest.approx((loss.loc[32] - loss.loc[1]).mean(), rel=1e-5)  # headline.csv: 6 digits


def test_the_report_names_every_shipped_model_the_study_reads():
    """The LM study's two models, and the 75/25 run the passes part reads beside them; a tiny study's
    serial-depth pair; never an empty clause."""
    from fbt_probe.reproduce.report import _other_models

    lm = _other_models(ReproConfig(preset="small-lm", corpus="c", shipped=True))
    assert lm == ", and for the passes part `ref:small-lm-feedback-75-25`"
    tiny = _other_models(ReproConfig(preset="tiny", shipped=True))
    assert tiny == ", and for the serial-depth part `ref:tiny-depth-feedback`, `ref:tiny-depth-baseline`"
