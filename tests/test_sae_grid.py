"""The study's SAE grid (stage `sae-feedback`, fbt_probe/reproduce/sae.py): TopK SAEs over SAE seeds ×
widths and one on demo-sized data, each tested with its own label latents and random-active control
on the same pairs, in one table that the grid rule reads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.parts.sae import demo_rows, grid_plan, sae_settings

TASKS = ["completion", "registers"]  # a final-position task and a register task (the stage is per task)


def test_the_full_study_grid_is_two_seeds_by_two_widths_and_the_demo_data_sae():
    full = sae_settings(ReproConfig(seed=3))
    plan = grid_plan(full, 3)
    assert [g["sae"] for g in plan] == ["topk-x4-s3", "topk-x4-s4", "topk-x8-s3", "topk-x8-s4", "topk-x4-s3-demo"]
    assert plan[0]["folder"] == "topk" and plan[-1]["data"] == "demo-sized"
    assert full["demo_groups"] == {"completion": 40, "memory": 64, "registers": 8, "registers-count": 8}
    quick = sae_settings(ReproConfig.quick_config())
    assert [g["sae"] for g in grid_plan(quick, 0)] == ["topk-x2-s0"]  # the quick study: one small SAE
    assert sae_settings(ReproConfig.demo_config()) is None  # the demo: no SAE stage
    with pytest.raises(ValueError, match="first SAE"):
        grid_plan({**full, "grid_expansions": [8, 4]}, 3)


def test_demo_rows_keep_the_first_groups_per_task_and_length():
    rows = []
    for task, knobs, groups in (("completion", (0, 8), range(10)), ("registers", (2, 4), None)):
        for kn in knobs:
            ids = groups if groups is not None else range(100 * kn, 100 * kn + 6)  # a register group per cell
            rows += [{"task": task, "length_knob": kn, "group_id": g} for g in ids for _ in range(2)]
    df = pd.DataFrame(rows).sample(frac=1, random_state=0)  # any row order
    keep = demo_rows(df, {"completion": 4, "registers": 2})
    got = df[keep].groupby(["task", "length_knob"])["group_id"].apply(lambda g: sorted(set(g))).to_dict()
    assert got == {
        ("completion", 0): [0, 1, 2, 3],
        ("completion", 8): [0, 1, 2, 3],
        ("registers", 2): [200, 201],
        ("registers", 4): [400, 401],
    }
    assert keep.sum() == 2 * (8 + 4)
    assert demo_rows(df, {"completion": 4}).sum() == 2 * (8 + 12)  # a task not named is kept whole


@pytest.fixture(scope="module")
def grid_study(tmp_path_factory, one_thread):
    """The quick study's data on two of its tasks and the SAE stage with a grid (2 seeds × 2 widths,
    demo-sized data cut below the quick plan's groups), on the shipped feedback model."""
    from fbt_probe.reproduce.parts.data import stage_data
    from fbt_probe.reproduce.parts.sae import stage_sae

    out = tmp_path_factory.mktemp("sae-grid")
    quick = ReproConfig.quick_config(shipped=True)
    cfg = ReproConfig.quick_config(
        shipped=True, **{f: {t: getattr(quick, f)[t] for t in TASKS} for f in ("groups", "knobs", "modes")}
    )
    stage_data(cfg, out)
    s = {
        **sae_settings(cfg),
        "steps": 60,
        "grid_expansions": [2, 4],
        "grid_seeds": [0, 1],
        "demo_groups": {"completion": 6, "registers": 3},
    }
    stage_sae(cfg, out, s)
    return cfg, out, s


@pytest.mark.slow
def test_the_stage_writes_one_row_group_per_sae_from_different_saes(grid_study):
    from fbt_probe.modes import parse_mode
    from fbt_probe.reproduce.part import study_model
    from fbt_probe.reproduce.parts.methods import _task_pairs
    from fbt_probe.sae.analyze import fractions
    from fbt_probe.sae.features import feature_tests
    from fbt_probe.sae.model import SparseAutoencoder

    cfg, out, s = grid_study
    f = out / "results" / "sae" / "feedback"
    sp = pd.read_parquet(f / "sparsity.parquet")
    ids = ["topk-x2-s0", "topk-x2-s1", "topk-x4-s0", "topk-x4-s1", "topk-x2-s0-demo"]
    assert list(dict.fromkeys(sp["sae"])) == ids
    for (sae, task), g in sp.groupby(["sae", "task"]):
        for cond in ("features", "random"):
            assert sorted(g.loc[g["condition"] == cond, "k"]) == s["ks"], (sae, task, cond)
    assert set(sp["task"]) == set(TASKS)
    feats = sp[sp["condition"].isin(["features", "random"])]
    assert (feats["ci_low"] <= feats["fraction"]).all() and (feats["fraction"] <= feats["ci_high"]).all()
    assert (feats["ci_low"] < feats["ci_high"]).all()
    assert (sp["max_active"] == 2 * s["k"]).all() and (sp["k_topk"] == s["k"]).all()
    assert sp["checkpoint_sha256"].nunique() == 1 and (sp["study_seed"] == cfg.seed).all()
    # the grid's SAEs are different SAEs: seeds, widths and the demo-sized data each give other weights
    saes = {i: SparseAutoencoder.load(f / sp.loc[sp["sae"] == i, "folder"].iloc[0]) for i in ids}
    d_in = saes[ids[0]].cfg.d_in
    assert [saes[i].cfg.d_sae for i in ids] == [2 * d_in, 2 * d_in, 4 * d_in, 4 * d_in, 2 * d_in]
    for a, b in (("topk-x2-s0", "topk-x2-s1"), ("topk-x4-s0", "topk-x4-s1"), ("topk-x2-s0", "topk-x2-s0-demo")):
        assert not torch.equal(saes[a].W_dec, saes[b].W_dec), (a, b)
    rows = sp.drop_duplicates("sae").set_index("sae")["training_rows"]
    assert rows["topk-x2-s0-demo"] < rows["topk-x2-s0"] == rows["topk-x4-s1"]
    assert saes["topk-x2-s0-demo"].cfg.metadata["training"]["train"]["seed"] == 0
    # the first SAE's rows are its own analysis's; another SAE's are what its saved folder gives
    first = pd.read_parquet(f / "analysis" / "completion" / "fractions.parquet")
    got = sp[(sp["sae"] == ids[0]) & (sp["task"] == "completion")]
    pd.testing.assert_frame_equal(got[first.columns].reset_index(drop=True), first)

    model = study_model(cfg, out, "feedback")
    task, df, _ = next(iter(_task_pairs(cfg, out)))
    wide = feature_tests(
        model, saes["topk-x4-s1"], df, s["hook"], parse_mode(s["mode"]), tuple(s["ks"]), s["max_pairs"], seed=cfg.seed
    )
    again = fractions(wide, s["n_boot"], cfg.seed)
    mine = sp[(sp["sae"] == "topk-x4-s1") & (sp["task"] == task)]
    np.testing.assert_allclose(
        mine.sort_values(["condition", "k"])["fraction"].to_numpy(),
        again.sort_values(["condition", "k"])["fraction"].to_numpy(),
    )
    by_sae = feats.pivot_table(index=["task", "condition", "k"], columns="sae", values="fraction")
    assert by_sae.nunique(axis=1).max() > 1  # not one SAE's numbers copied five times


@pytest.mark.slow
def test_the_report_section_shows_the_grid_and_its_sentence(grid_study):
    from fbt_probe.reproduce.parts.sae import figure_jobs, sentences
    from fbt_probe.reproduce.parts.sae import sections as sae_section

    cfg, out, _ = grid_study
    said = sentences(out)
    assert said[0].startswith("5 TopK SAEs (SAE seeds 0 and 1 × expansion 2 and 4 on the study's data")
    assert len(said) == 1 + len(TASKS) and all(x.split(":")[0] in TASKS for x in said[1:])
    assert all("SAEs" in x for x in said[1:])  # each task's sentence counts SAEs
    (title, text, _), _browser = sae_section(cfg, out, [])
    assert "**Over SAEs**" in text and "| topk-x2-s0-demo |" in text and "topk-x4-s1 |" in text
    for x in said[1:]:
        assert x in text
    ((stem, kind, table, _),) = [j for j in figure_jobs(cfg, out) if j[1] == "sae-swap"]
    assert "sae" in table and table["sae"].nunique() == 5


def test_the_feature_swap_figure_draws_one_line_per_sae_and_condition():
    import matplotlib.pyplot as plt

    from fbt_probe.figures import draw

    rows = [
        {"sae": s, "task": t, "condition": c, "k": k, "fraction": v, "ci_low": v - 0.05, "ci_high": v + 0.05}
        for s in ("topk-x4-s0", "topk-x8-s0", "topk-x4-s0-demo")
        for t in ("completion", "memory")
        for c, v in (("features", 0.9), ("random", 0.2))
        for k in (1, 4, 16)
    ]
    grid = pd.DataFrame(rows).assign(max_active=16)
    every = pd.DataFrame([{**rows[0], "condition": "all", "k": 512}]).assign(max_active=16)
    fig = draw("sae-swap", pd.concat([grid, every], ignore_index=True))
    ax = fig.axes[0]
    assert ax.get_title() == "completion" and "over 3 SAEs" in fig._suptitle.get_text()
    solid = [ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 3]
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--" and len(ln.get_xdata()) == 3]
    assert len(solid) == 3 and len(dashed) == 3  # label latents and random control of each SAE
    assert max(max(ln.get_xdata()) for ln in solid + dashed) < 32  # the every-latent row is not drawn at k = 512
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["topk-x4-s0", "topk-x8-s0", "topk-x4-s0-demo"]
    assert "at most 16 latents active in a pair" in labels
    plt.close(fig)
