"""The serial-depth part of `fbt-probe reproduce`: the shipped compose-s3 models, the stage's tables
(intervals, groups, an independent recount of the answers), its rule, figure and report section."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe import reference
from fbt_probe.errors import FbtError
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import (
    DEMO_DEPTH,
    DEPTH_MODES,
    DEPTH_TASK,
    FULL_DEPTH,
    ReproConfig,
    depth_name,
    depth_train_config,
)
from fbt_probe.stats import group_wilson

DEPTH_REFS = ("tiny-depth-feedback", "tiny-depth-baseline")


# ----------------------------------------------------------------------------- the shipped models
@pytest.mark.parametrize("name", DEPTH_REFS)
def test_the_shipped_depth_models_records_validate_and_match_the_studys_training(name):
    """Each record passes the schema, every file its sha256, and its training is what `--train`
    runs (so the shipped study and a retrained one measure the same recipe); its card says plainly
    that the model does not separate the modes and gives the retrain command."""
    folder = reference.folder(f"ref:{name}")
    rec = reference.check_record(json.loads((folder / reference.RECORD).read_text()), folder)
    baseline = name.endswith("baseline")
    assert rec["baseline"] is baseline and rec["seed"] == 0 and rec["steps"] == 800
    assert rec["train"] == depth_train_config(ReproConfig(), baseline).to_dict()
    assert depth_name(ReproConfig(), "baseline" if baseline else "feedback") == name
    assert not (folder / "train_state.pt").exists()
    card = (folder / "card.md").read_text()
    assert "does not separate" in card and f"**{rec['note']}**" in card and rec["checkpoint_sha256"] in card
    command = f"fbt-probe train --tasks compose-s3 --steps 800 --seed 0{' --baseline' if baseline else ''}"
    assert command in card and rec["command"].startswith(command)
    # the recorded accuracy rows are the held-out grid, every mode
    rows = pd.DataFrame(rec["accuracy"]["rows"])
    assert set(rows["length_knob"]) == set(FULL_DEPTH.knobs) and set(rows["mode"]) == set(DEPTH_MODES)


def test_the_card_claim_is_the_rule_on_the_recorded_numbers():
    """The cards say the models do not separate: the rule on their own recorded accuracy agrees."""
    frames = []
    for name in DEPTH_REFS:
        rows = pd.DataFrame(reference.record(name)["accuracy"]["rows"])
        model = "baseline" if name.endswith("baseline") else "feedback"
        ci = [group_wilson(r.accuracy, r.n // 2) for r in rows.itertuples()]  # one pair per group
        frames.append(
            rows.rename(columns={"length_knob": "k"}).assign(
                model=model, ci_low=[c[1] for c in ci], ci_high=[c[2] for c in ci], groups=rows["n"] // 2
            )
        )
    v = rules.depth_separation(pd.concat(frames, ignore_index=True))
    assert v.verdict == "does not separate", v.sentence
    assert "k = 2, 4: too few groups" in v.sentence  # 1 and 3 held-out groups: read for nothing


# ----------------------------------------------------------------------------- the rule
def _table(cells: dict) -> pd.DataFrame:
    """{(model, k, mode): (value, groups)} -> the rule's table with Wilson intervals at n = groups."""
    rows = []
    for (model, k, mode), (p, g) in cells.items():
        _, lo, hi = group_wilson(p, g)
        rows.append({"model": model, "k": k, "mode": mode, "accuracy": p, "ci_low": lo, "ci_high": hi, "groups": g})
    return pd.DataFrame(rows)


def _grid(feedback: dict, baseline: dict, groups: int = 64) -> pd.DataFrame:
    """feedback / baseline: k -> {mode: accuracy}."""
    cells = {}
    for model, grid in (("feedback", feedback), ("baseline", baseline)):
        for k, by_mode in grid.items():
            for mode, p in by_mode.items():
                cells[(model, k, mode)] = (p, groups)
    return _table(cells)


MODES = ("standard", "recurrent:1", "jacobi:2", "jacobi:3", "full")


def _all(p):
    return {m: p for m in MODES}


def test_depth_rule_states_the_separation_where_it_holds():
    fb = {
        4: {"standard": 1.0, "recurrent:1": 1.0, "jacobi:2": 1.0, "jacobi:3": 1.0, "full": 1.0},
        8: {"standard": 0.8, "recurrent:1": 1.0, "jacobi:2": 1.0, "jacobi:3": 0.97, "full": 0.95},
        16: {"standard": 0.55, "recurrent:1": 0.95, "jacobi:2": 0.97, "jacobi:3": 0.6, "full": 0.94},
        32: {"standard": 0.5, "recurrent:1": 0.6, "jacobi:2": 0.93, "jacobi:3": 0.5, "full": 0.5},
    }
    base = {4: _all(1.0), 8: _all(0.9), 16: _all(0.5), 32: _all(0.45)}
    v = rules.depth_separation(_grid(fb, base))
    assert v.verdict == "separates at k = 16, 32", v.sentence
    s = v.sentence
    assert "standard prefill answers at chance (at or below 0.65) from k = 16 on" in s
    assert "`recurrent:1` up to k = 16" in s and "`jacobi:2` up to k = 32" in s and "`full` up to k = 16" in s
    assert "`jacobi:3` up to k = 8" in s
    assert "at k = 16, `standard` **0.55**" in s and "against `jacobi:2` **0.97**" in s
    # the baseline answering the same k (above 0.65 under some mode) takes that k away
    base_solves = {**base, 16: {**_all(0.5), "standard": 0.9}}
    assert rules.depth_separation(_grid(fb, base_solves)).verdict == "separates at k = 32"


def test_depth_rule_states_the_negative_result_with_the_best_cells():
    # the shipped models' pattern: everything near chance, `full` off the label words
    fb = {
        8: {"standard": 0.57, "recurrent:1": 0.56, "jacobi:2": 0.55, "jacobi:3": 0.5, "full": 0.0},
        16: {"standard": 0.5, "recurrent:1": 0.46, "jacobi:2": 0.52, "jacobi:3": 0.49, "full": 0.0},
    }
    base = {8: {**_all(0.0), "standard": 0.67}, 16: {**_all(0.0), "standard": 0.48}}
    v = rules.depth_separation(_grid(fb, base, groups=47))
    assert v.verdict == "does not separate"
    s = v.sentence
    assert s.startswith("no knob value separates the modes on compose-s3")
    assert "k = 8: best feedback mode `recurrent:1` **0.56**" in s and "`standard` **0.57**" in s
    assert "k = 16: best feedback mode `jacobi:2` **0.52**" in s
    assert "the baseline's best **0.67**" in s and "(`standard`)" in s


def test_depth_rule_reads_nothing_from_a_cell_below_the_floor():
    """A feedback mode at 1.00 on one held-out group (k = 2 of compose-s3 has one or two held-out
    words) is too few groups: no verdict either way, and the k is named as such; at 8 groups the same
    cells separate."""
    fb = {2: {"standard": 0.5, "recurrent:1": 1.0}}
    base = {2: {"standard": 0.5, "recurrent:1": 0.0}}
    one = rules.depth_separation(_grid(fb, base, groups=1))
    assert one.verdict == "cannot say" and "k = 2: too few groups" in one.sentence and "**1.00**" not in one.sentence
    assert rules.depth_separation(_grid(fb, base, groups=8)).verdict == "separates at k = 2"
    # beside k with enough groups, a k below the floor is listed and read for nothing
    both = pd.concat([_grid(fb, base, groups=1), _grid({16: _all(0.5)}, {16: _all(0.5)}, groups=64)])
    v = rules.depth_separation(both)
    assert v.verdict == "does not separate" and "k = 2: too few groups" in v.sentence
    assert "depth" in rules.CRITERIA and "Wilson lower bound" in rules.CRITERIA["depth"]


def _seeds_table(per_seed: dict) -> pd.DataFrame:
    """A stacked headline table (seeds.csv) holding each seed's depth grid, as `findings.headline` writes it."""
    from fbt_probe.reproduce.parts.depth import ACCURACY_Q

    frames = []
    for seed, (fb, base, groups) in per_seed.items():
        t = _grid(fb, base, groups)
        frames.append(
            t.assign(quantity=[f"{ACCURACY_Q}{k}" for k in t["k"]], task="compose-s3", seed=seed)
            .drop(columns="k")
            .rename(columns={"accuracy": "value"})
        )
    return pd.concat(frames, ignore_index=True)


def test_depth_over_seeds_applies_the_rule_to_each_seeds_table():
    from fbt_probe.reproduce.parts.depth import seed_tables, seeds_verdict

    sep_fb = {16: {"standard": 0.5, "recurrent:1": 0.97, "jacobi:2": 0.98, "jacobi:3": 0.6, "full": 0.5}}
    sep_base = {16: _all(0.5)}
    none_fb = {16: _all(0.5)}
    # every seed separates
    t = _seeds_table({0: (sep_fb, sep_base, 64), 1: (sep_fb, sep_base, 64), 2: (sep_fb, sep_base, 64)})
    assert set(seed_tables(t)) == {0, 1, 2}
    back = seed_tables(t)[1].set_index(["model", "k", "mode"])["value"]
    assert back[("feedback", 16, "jacobi:2")] == 0.98 and back[("baseline", 16, "standard")] == 0.5
    v = seeds_verdict(t)
    assert v.verdict == "on every seed" and v.sentence.startswith("the modes separate on all 3 training seeds")
    # one seed of three: said as a separation that does not hold on every seed
    t = _seeds_table({0: (sep_fb, sep_base, 64), 1: (none_fb, sep_base, 64), 2: (none_fb, sep_base, 64)})
    v = seeds_verdict(t)
    assert v.verdict == "on 1 of 3 seeds"
    assert "seed 0: separates at k = 16" in v.sentence and "not on seeds 1, 2" in v.sentence
    # none: the negative result over seeds
    t = _seeds_table({0: (none_fb, sep_base, 64), 1: (none_fb, sep_base, 64), 2: (none_fb, sep_base, 64)})
    v = seeds_verdict(t)
    assert v.verdict == "on no seed" and "on any of the 3 training seeds (0, 1, 2)" in v.sentence
    # a single seed (or none) gives no seed-level sentence
    assert seeds_verdict(_seeds_table({0: (sep_fb, sep_base, 64)})) is None and seeds_verdict(None) is None
    assert "depth-seeds" in rules.CRITERIA


# ----------------------------------------------------------------------------- the stage, its section and figure
@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    """The depth stage on the shipped models, a small slice (one k, a few pairs), its figure and section."""
    from fbt_probe.reproduce.parts.depth import stage_depth

    out = tmp_path_factory.mktemp("depth-study")
    cfg = ReproConfig.demo_config(shipped=True, depth_knobs=[8, 16], depth_pairs=6)
    stage_depth(cfg, out)
    return cfg, out


@pytest.mark.slow
def test_the_depth_stage_writes_both_tables_with_intervals_around_their_estimates(small_study):
    cfg, out = small_study
    acc = pd.read_parquet(out / "results" / "depth" / "accuracy.parquet")
    sw = pd.read_parquet(out / "results" / "depth" / "swap.parquet")
    assert set(acc["model"]) == set(sw["model"]) == {"feedback", "baseline"}
    assert set(acc["k"]) == set(sw["k"]) == {8, 16} and set(acc["mode"]) == set(DEPTH_MODES)
    assert len(acc) == 2 * 2 * len(DEPTH_MODES) and len(sw) == 2 * 2
    assert (acc["ci_low"] <= acc["accuracy"]).all() and (acc["accuracy"] <= acc["ci_high"]).all()
    assert (acc["ci_high"] > acc["ci_low"]).all() and np.allclose(acc["accuracy"], acc["correct"] / acc["n"])
    assert (acc["groups"] == acc["n"] // 2).all() and (acc["groups"] == 6).all()  # one pair per held-out group
    for r in acc.itertuples():
        assert (r.ci_low, r.ci_high) == group_wilson(r.accuracy, r.groups)[1:]
    ok = sw["normalized"].notna()
    assert ((sw["ci_low"] <= sw["normalized"]) & (sw["normalized"] <= sw["ci_high"]))[ok].all()
    assert ((sw["swap_accuracy_low"] <= sw["swap_accuracy"]) & (sw["swap_accuracy"] <= sw["swap_accuracy_high"])).all()
    assert (sw["pairs"] + sw["excluded"] == 6).all()
    shas = {n: reference.record(f"tiny-depth-{n}")["checkpoint_sha256"] for n in ("feedback", "baseline")}
    assert dict(zip(acc["model"], acc["checkpoint_sha256"])) == shas
    man = json.loads((out / "results" / "depth" / "manifest.json").read_text())
    assert man["provenance"]["checkpoints"] == shas and man["provenance"]["config"]["knobs"] == [8, 16]
    assert (out / "results" / "depth" / "interventions" / "feedback" / "feedback-swap" / "summary.parquet").is_file()


@pytest.mark.slow
def test_the_depth_stage_counts_the_answers_a_plain_forward_gives(small_study):
    """Oracle: the held-out pairs rebuilt and each model run by hand (top-1 token at the final
    position against the label word's token); the stage's correct counts must agree."""
    import fbt_probe as fp
    from fbt_probe.interventions.pairs import label_token_ids
    from fbt_probe.reproduce.parts.depth import depth_samples
    from fbt_probe.tasks import build_tokenizer

    cfg, out = small_study
    acc = pd.read_parquet(out / "results" / "depth" / "accuracy.parquet")
    tok = build_tokenizer()
    samples = depth_samples(cfg, tok)
    ids = label_token_ids(samples, tok)[DEPTH_TASK]
    want = np.array([ids[int(label)] for label in samples["label"]])
    for name in ("feedback", "baseline"):
        model = fp.load_model(f"ref:tiny-depth-{name}")
        for mode in ("standard", "recurrent:1"):
            for k in (8, 16):
                rows = samples[samples["length_knob"] == k]
                toks = torch.tensor(rows["token_ids"].tolist())
                got = model(toks, mode=mode)[:, -1].argmax(-1).numpy()
                hits = int((got == want[rows.index.to_numpy()]).sum())
                cell = acc[(acc["model"] == name) & (acc["k"] == k) & (acc["mode"] == mode)].iloc[0]
                assert (cell["correct"], cell["n"]) == (hits, len(rows)), (name, mode, k)


@pytest.mark.slow
def test_the_depth_figure_and_section_read_the_tables(small_study, tmp_path):
    from fbt_probe.figures import draw
    from fbt_probe.reproduce.parts.depth import figure_jobs, sentences
    from fbt_probe.reproduce.parts.depth import sections as depth_section
    from fbt_probe.reproduce.report import figure_caption

    cfg, out = small_study
    ((stem, name, table, opts),) = figure_jobs(cfg, out)
    fig = draw(name, table, **opts)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("compose-s3, feedback model\nanswer accuracy")
    assert titles[1].startswith("compose-s3, no-feedback baseline\nanswer accuracy")
    assert titles[2].startswith("compose-s3, both models\ncarried-state swap")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    # six pairs per k: every cell below the floor of 8 groups, drawn hollow and unconnected
    assert legend == [
        *DEPTH_MODES,
        "chance (0.5)",
        "swap, feedback model",
        "swap, no-feedback baseline",
        "too few groups (n < 8): no interval, no line",
    ]
    mode_lines = [line for ax in fig.axes[:2] for line in ax.get_lines() if str(line.get_gid()).startswith("mode:")]
    assert len(mode_lines) == 2 * len(DEPTH_MODES)  # each mode's line in each model's panel...
    assert all(len(line.get_xdata()) == 0 for line in mode_lines)  # ...joins no cell of six groups
    hollow = [line for ax in fig.axes[:2] for line in ax.get_lines() if line.get_markerfacecolor() == "none"]
    assert len(hollow) == 2 * 2 * len(DEPTH_MODES)
    assert any(t.get_text() == "n=6" for t in fig.axes[0].texts)
    assert "Serial depth" in figure_caption(stem)
    ((title, text, figs),) = depth_section(cfg, out, ["depth", "fig3-contraction"])
    assert figs == ["depth"] and "The demo runs a reduced range" in text and "Criterion:" in text
    assert rules.depth_separation(pd.read_parquet(out / "results" / "depth" / "accuracy.parquet")).sentence in text
    said = sentences(cfg, out)
    assert said[0].startswith("Serial depth (compose-s3") and "reduced range, k = 8, 16" in said[0]
    assert (
        "cannot say" in said[0] and "too few groups" in said[0] and "(one training seed's numbers: seed 0)" in said[0]
    )
    assert "Swapping the carried state" in said[1] and "no-feedback baseline's at no k with enough groups" in said[1]


# ----------------------------------------------------------------------------- the stages of each study
def test_each_study_kind_runs_the_depth_part_it_should(tmp_path):
    from fbt_probe.reproduce.parts.depth import sections as depth_section
    from fbt_probe.reproduce.pipeline import build_stages

    def stages(cfg):
        return {s.name: s for s in build_stages(cfg, tmp_path)}

    shipped = stages(ReproConfig(shipped=True))
    assert "depth" in shipped and not any(n.startswith("train-depth") for n in shipped)
    assert shipped["depth"].inputs["knobs"] == list(FULL_DEPTH.knobs) and "shipped_depth" in shipped["depth"].inputs
    demo = stages(ReproConfig.demo_config(shipped=True))["depth"]
    assert demo.inputs["knobs"] == list(DEMO_DEPTH.knobs) and demo.inputs["pairs"] == DEMO_DEPTH.pairs
    trained = stages(ReproConfig())
    assert trained["depth"].after == ["train-depth-feedback", "train-depth-baseline"]
    assert trained["train-depth-baseline"].resumable and trained["train-depth-feedback"].inputs["steps"] == 800
    quick = stages(ReproConfig.quick_config(steps=8))
    assert quick["train-depth-feedback"].inputs["steps"] == 8 and quick["depth"].inputs["knobs"] == [8]
    user = ReproConfig(model=str(tmp_path / "ckpt"))
    assert not any("depth" in n for n in stages(user))
    ((title, text, figs),) = depth_section(user, tmp_path, ["depth"])
    assert "not run" in text and "user checkpoint" in text and not figs


def test_a_shipped_study_with_another_seed_is_refused_in_one_line_naming_train(monkeypatch):
    from fbt_probe.reproduce import pipeline

    real = pipeline.record
    # the main shipped models as if trained with seed 3, the depth ones with their own seed 0
    monkeypatch.setattr(pipeline, "record", lambda name: {**real(name), "seed": 0 if "depth" in name else 3})
    with pytest.raises(FbtError) as e:
        pipeline.check_shipped(ReproConfig(shipped=True, seed=3))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        "--seed 3: the shipped serial-depth model ref:tiny-depth-feedback was trained with seed 0"
    )
    assert msg.endswith("pass --train to train these")
    monkeypatch.setattr(pipeline, "record", real)
    pipeline.check_shipped(ReproConfig(shipped=True))  # the shipped seed passes


def test_figure_depth_is_registered():
    from fbt_probe.figures import FIGURES, figure_names

    assert "depth" in figure_names() and FIGURES["depth"].table == "accuracy.parquet"


@pytest.mark.slow
def test_a_trained_studys_depth_part_trains_measures_and_then_skips(tmp_path):
    """--train / --quick: the two depth models are trained as `fbt-probe train --tasks compose-s3`
    would (the quick study at its own steps), the stage measures them, and a rerun skips all three."""
    from fbt_probe.reproduce.pipeline import build_stages
    from fbt_probe.reproduce.stages import Runner

    cfg = ReproConfig.quick_config(steps=2)
    stages = [s for s in build_stages(cfg, tmp_path) if "depth" in s.name]
    assert [s.name for s in stages] == ["train-depth-feedback", "train-depth-baseline", "depth"]
    log = []
    for _ in range(2):
        r = Runner(tmp_path, echo=log.append)
        for s in stages:
            r.run(s)
        r.close()
    assert sum(line.startswith("[run ]") for line in log) == 3 and sum(line.startswith("[skip]") for line in log) == 3
    for name in ("feedback", "baseline"):
        rec = json.loads((tmp_path / "models" / f"depth-{name}" / "config.json").read_text())
        assert rec["train"] == depth_train_config(cfg, name == "baseline").to_dict() and rec["step"] == 2
    acc = pd.read_parquet(tmp_path / "results" / "depth" / "accuracy.parquet")
    assert set(acc["k"]) == {8} and (acc["groups"] == 4).all() and set(acc["mode"]) == set(DEPTH_MODES)
    assert (acc["ci_low"] <= acc["accuracy"]).all() and (acc["accuracy"] <= acc["ci_high"]).all()
    man = json.loads((tmp_path / "results" / "depth" / "manifest.json").read_text())
    assert man["provenance"]["models"] == {"feedback": "models/depth-feedback", "baseline": "models/depth-baseline"}
