"""The serial-depth research grid: its committed table recomputes (Wilson with n = groups, the shipped
depth models' hashes on the seed-0 rows), and the figure `depth-grid` draws exactly that table."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fbt_probe.errors import FbtError
from fbt_probe.figures import draw
from fbt_probe.stats import group_wilson

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "docs" / "research" / "data" / "serial-depth-grid.csv"
MODES = ("standard", "recurrent:1", "jacobi:2", "jacobi:3", "full")


def _table(settings, seeds=(0, 1), ks=(2, 8, 32), groups=64, missing=()):
    rows = []
    rng = np.random.default_rng(0)
    for design, schedule, model in settings:
        for seed in seeds:
            if (design, seed) in missing:
                continue
            for k in ks:
                for mode in MODES:
                    g = 3 if k == 2 else groups
                    correct = int(rng.integers(0, 2 * g + 1))
                    p, lo, hi = group_wilson(correct / (2 * g), g)
                    rows.append(
                        dict(design=design, schedule=schedule, model=model, seed=seed, k=k, mode=mode,
                             groups=g, accuracy=p, ci_low=lo, ci_high=hi)
                    )  # fmt: skip
    return pd.DataFrame(rows)


def _mode_line(ax, mode):
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == f"mode:{mode}"]
    return line


def test_the_grid_figure_draws_one_panel_per_run_and_seed_with_the_tables_values():
    settings = [
        ("compose-s3", "paper", "feedback"),
        ("compose-s3", "paper", "baseline"),
        ("compose", "deep", "feedback"),
    ]
    t = _table(settings, missing={("compose", 1)})
    fig = draw("depth-grid", t, min_groups="8")  # the command line gives options as text
    axes = np.array(fig.axes).reshape(3, 2)
    assert not axes[2][1].axison and "seed 1: not trained" in axes[2][1].texts[0].get_text()
    for r, (design, schedule, model) in enumerate(settings):
        for c, seed in enumerate((0, 1)):
            if (design, seed) == ("compose", 1):
                continue
            ax = axes[r][c]
            assert f"seed {seed}" in ax.get_title() and design in ax.get_title() and schedule in ax.get_title()
            sel = t[(t.design == design) & (t.model == model) & (t.seed == seed) & (t.k >= 8)]
            for mode in MODES:
                x, y = _mode_line(ax, mode).get_data()
                want = sel[sel["mode"] == mode].sort_values("k")
                np.testing.assert_allclose(y, want["accuracy"])  # k = 2 (3 groups) left out
                np.testing.assert_allclose(np.round(x), np.log2(want["k"]))  # dodged on the log2 axis, not off k
    assert "cells with fewer than 8 held-out groups left out" in fig.legends[0].get_title().get_text()
    kept = draw("depth-grid", t)
    x, _ = _mode_line(np.array(kept.axes).reshape(3, 2)[0][0], "standard").get_data()
    assert len(x) == 3 and "left out" not in kept.legends[0].get_title().get_text()


def test_the_grid_figure_refuses_a_table_without_its_columns_and_a_bad_option():
    t = _table([("compose-s3", "paper", "feedback")])
    with pytest.raises(FbtError, match=r"depth-grid.*no column \['schedule'\]"):
        draw("depth-grid", t.drop(columns=["schedule"]))
    with pytest.raises(FbtError, match=r"option min_groups='eight': expected an integer"):
        draw("depth-grid", t, min_groups="eight")


def test_the_committed_grid_recomputes_and_its_seed_0_rows_are_the_shipped_depth_models():
    g = pd.read_csv(GRID)
    p = g["correct"] / g["samples"]
    np.testing.assert_allclose(g["accuracy"], p, atol=1e-6)
    assert (g["groups"] == g["samples"] // 2).all()  # one pair (two samples) per held-out group
    for row in g.itertuples():
        _, lo, hi = group_wilson(row.correct / row.samples, row.groups)
        assert abs(row.ci_low - lo) < 1e-6 and abs(row.ci_high - hi) < 1e-6
        assert row.ci_low < row.ci_high and row.ci_low - 1e-6 <= row.accuracy <= row.ci_high + 1e-6
    # two designs x two schedules x three seeds of feedback models, the S3 baseline on three seeds
    runs = g.groupby(["design", "schedule", "model"])["seed"].unique()
    for (design, schedule, model), seeds in runs.items():
        if design != "compose":
            assert sorted(seeds) == [0, 1, 2], (design, schedule, model)
    assert len(runs) == 6 and (runs.index.get_level_values("model") == "baseline").sum() == 1
    ref = ROOT / "fbt_probe" / "reference" / "models"
    for model, name in (("feedback", "tiny-depth-feedback"), ("baseline", "tiny-depth-baseline")):
        rows = g[(g.design == "compose-s3") & (g.model == model) & (g.seed == 0) & g.schedule.str.match("paper|one")]
        digest = hashlib.sha256((ref / name / "model.safetensors").read_bytes()).hexdigest()
        assert set(rows["checkpoint_sha256"]) == {digest}
        assert rows["train"].iloc[0] == "fbt-probe train --tasks compose-s3 --steps 800 --seed 0" + (
            " --baseline" if model == "baseline" else ""
        )
