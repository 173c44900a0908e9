"""Figures are drawn from tables only: registry, Fig. 7a / 7b content, files, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fbt_probe.errors import FbtError
from fbt_probe.figures import FIGURES, FigureEntry, draw, figure_names, load_table, register_figure, save_figure

L = 4


def probe_table(
    model="feedback", tasks=("completion", "memory", "registers", "registers-count"), seed=0
) -> pd.DataFrame:
    """A tidy probe table shaped like `probe_sweep`'s output (values are made up)."""
    rng = np.random.default_rng(seed)
    rows = []
    modes = {
        "completion": ("standard", "recurrent:1", "carried-state"),
        "memory": ("standard", "recurrent:1"),
        "registers": ("standard", "recurrent:1", "recurrent:2", "recurrent:4", "full"),
    }
    modes["registers-count"] = modes["registers"]
    lengths = {"completion": (0, 8, 32), "memory": (8, 32), "registers": (2, 4, 8), "registers-count": (1, 2, 4, 8)}
    for task in tasks:
        for mode in modes[task]:
            for length in lengths[task]:
                for depth in [L] if mode == "carried-state" else range(L + 1):
                    for fold in range(4):
                        acc = 0.95 if mode != "standard" else 0.4 + 0.15 * depth
                        for metric, value in (
                            ("accuracy", acc + rng.normal(0, 0.02)),
                            ("majority_baseline", 0.37),
                            ("control_accuracy", 0.5),
                        ):
                            rows.append(
                                {
                                    "model": model,
                                    "task": task,
                                    "mode": mode,
                                    "length": length,
                                    "depth": depth,
                                    "hook": "",
                                    "fold": fold,
                                    "metric": metric,
                                    "value": value,
                                    "n_train": 80,
                                    "n_test": 20,
                                }
                            )
    return pd.DataFrame(rows)


def lines(ax) -> list[str]:
    return [ln.get_label() for ln in ax.get_lines()]


def test_registry_lists_the_probe_figures():
    assert {"fig7a", "fig7b"} <= set(figure_names())
    with pytest.raises(FbtError, match="unknown .*fig7a"):
        draw("fig99", probe_table())


def test_fig7a_panels_colours_and_reference_lines():
    fig = draw("fig7a", probe_table(), baseline=probe_table(model="baseline"))
    axes = fig.axes[:4]
    assert [ax.get_title() for ax in axes] == [
        "Completion: standard prefill",
        "Completion: one-step recurrent prefill (recurrent:1)",
        "Memory: standard prefill",
        "Memory: one-step recurrent prefill (recurrent:1)",
    ]
    assert lines(axes[0])[:3] == ["0", "8", "32"]  # one line per length
    assert "chance (0.5)" in lines(axes[0])
    assert any(lab.startswith("majority baseline") for lab in lines(axes[0]))
    assert "probe on carried state h(T-1)" in lines(axes[1])
    assert "no-feedback baseline (mean over lengths)" in lines(axes[1])
    assert "probe on carried state h(T-1)" not in lines(axes[0])
    ys = axes[0].get_lines()[0].get_ydata()
    assert ys[0] < 0.5 < ys[-1]  # standard climbs with depth in this table
    assert axes[2].get_xlabel().startswith("Depth") and axes[0].get_ylabel() == "Held-out probe accuracy"


def test_fig7b_one_panel_per_register_count_and_writes_and_a_line_per_mode():
    fig = draw("fig7b", probe_table())
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    titles = [ax.get_title() for ax in axes]
    assert titles == [
        "registers-count\nm = 1, 16 writes each",
        "registers-count\nm = 2, 8 writes each",
        "registers-count\nm = 4, 4 writes each",
        "registers-count\nm = 8, 2 writes each",
        "registers\nm = 8, 2 writes each",
        "registers\nm = 8, 4 writes each",
        "registers\nm = 8, 8 writes each",
    ]  # short: four panels in a row
    assert len(set(titles)) == len(titles)  # the two sweeps meet at m = 8, 2 writes: the task tells them apart
    assert lines(axes[0])[:5] == ["standard", "recurrent:1", "recurrent:2", "recurrent:4", "full"]
    assert "chance (0.5)" in lines(axes[0]) and any(s.startswith("majority baseline") for s in lines(axes[0]))
    one = draw("fig7b", probe_table(tasks=("registers",)))  # one sweep alone: one row
    assert len([ax for ax in one.axes if ax.get_visible() and ax.get_title()]) == 3


def _styles(ax, labels) -> dict:
    return {
        ln.get_label(): (ln.get_marker(), str(ln.get_linestyle()), round(float(ln.get_xdata()[0]), 3))
        for ln in ax.get_lines()
        if ln.get_label() in labels
    }


def test_coincident_lines_keep_their_own_marker_dash_and_offset():
    """Lines at the same accuracy (every feedback mode at 1.0) stay visible: each line of a panel has its
    own marker, dash pattern and depth offset, and fig7a's carried-state reference is drawn under the
    length lines."""
    table = probe_table()
    table.loc[table["metric"] == "accuracy", "value"] = 1.0  # every line on top of every other
    fig7b = draw("fig7b", table)
    modes = ["standard", "recurrent:1", "recurrent:2", "recurrent:4", "full"]
    styles = _styles(fig7b.axes[0], modes)
    assert len(styles) == 5 and len(set(styles.values())) == 5
    assert len({m for m, _, _ in styles.values()}) == 5 and len({x for _, _, x in styles.values()}) == 5
    fig7a = draw("fig7a", table)
    ax = fig7a.axes[1]  # completion, recurrent:1
    lengths = _styles(ax, ["0", "8", "32"])
    assert len({m for m, _, _ in lengths.values()}) == 3 and len({x for _, _, x in lengths.values()}) == 3
    ref = next(ln for ln in ax.get_lines() if ln.get_label() == "probe on carried state h(T-1)")
    assert all(ref.get_zorder() < ln.get_zorder() for ln in ax.get_lines() if ln.get_label() in lengths)


def test_the_majority_baseline_is_a_visible_legend_entry():
    """The majority line is drawn over the chance line (a balanced task puts both at 0.5) in a colour of
    its own, and its legend entry is a line of that colour."""
    from matplotlib.colors import to_hex

    table = probe_table()
    table.loc[table["metric"] == "majority_baseline", "value"] = 0.5
    fig = draw("fig7a", table)
    ax = fig.axes[0]
    chance = next(ln for ln in ax.get_lines() if ln.get_label() == "chance (0.5)")
    majority = next(ln for ln in ax.get_lines() if ln.get_label().startswith("majority"))
    assert majority.get_zorder() > chance.get_zorder()
    assert to_hex(majority.get_color()) not in (to_hex(chance.get_color()), to_hex("white"))
    entry = next(
        h
        for leg in fig.legends
        for h, t in zip(leg.legend_handles, leg.get_texts())
        if t.get_text().startswith("majority")
    )
    assert to_hex(entry.get_color()) == to_hex(majority.get_color()) and entry.get_linewidth() >= 1.2


def test_fold_spread_is_the_min_max_over_folds_not_an_interval():
    from fbt_probe.figures.probes import fold_spread

    t = pd.DataFrame({"length": 2, "depth": 0, "metric": "accuracy", "value": [0.6, 0.7, 0.8, 0.95]})
    row = fold_spread(t).iloc[0]
    assert row["mean"] == pytest.approx(0.7625) and row["low"] == 0.6 and row["high"] == 0.95


def test_figures_are_written_as_png_and_svg_and_not_overwritten(tmp_path):
    fig = draw("fig7a", probe_table())
    paths = save_figure(fig, tmp_path, "fig7a")
    assert [p.name for p in paths] == ["fig7a.png", "fig7a.svg"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and b"<svg" in paths[1].read_bytes()[:400]
    width, height = fig.get_size_inches()
    assert width <= 7.5  # fits a paper page
    with pytest.raises(FbtError, match="already exists"):
        save_figure(fig, tmp_path, "fig7a")
    save_figure(fig, tmp_path, "fig7a", force=True)


def test_tables_load_from_parquet_csv_or_a_results_folder(tmp_path):
    table = probe_table()
    table.to_parquet(tmp_path / "probes.parquet")
    table.to_csv(tmp_path / "t.csv", index=False)
    assert len(load_table(tmp_path, "probes.parquet")) == len(table)
    assert len(load_table(tmp_path / "t.csv")) == len(table)
    draw("fig7b", tmp_path / "t.csv")
    (tmp_path / "bad.parquet").write_bytes(b"nope")
    with pytest.raises(FbtError, match="not a readable results table"):
        load_table(tmp_path / "bad.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FbtError, match="no probes.parquet"):
        load_table(tmp_path / "empty", "probes.parquet")


def test_bad_tables_and_options_are_refused():
    with pytest.raises(FbtError, match="no rows for task\\(s\\) registers-count,registers"):
        draw("fig7b", probe_table(tasks=("completion",)))
    with pytest.raises(FbtError, match="no rows for tasks"):
        draw("fig7a", probe_table(tasks=("registers", "registers-count")), tasks="completion")
    with pytest.raises(FbtError, match="several models"):
        draw("fig7a", pd.concat([probe_table(), probe_table(model="other")]))
    draw("fig7a", pd.concat([probe_table(), probe_table(model="other")]), model="other")
    with pytest.raises(FbtError, match="no option"):
        draw("fig7a", probe_table(), colour="red")
    with pytest.raises(FbtError, match="not a probe table"):
        draw("fig7a", pd.DataFrame({"x": [1]}))


def test_a_new_figure_is_one_registry_entry(monkeypatch):
    monkeypatch.setitem(FIGURES, "fig7a_copy", FigureEntry("fbt_probe.figures.probes", "fig7a", "probes.parquet"))
    assert "fig7a_copy" in figure_names()
    draw("fig7a_copy", probe_table())
    with pytest.raises(ValueError, match="already registered"):
        register_figure("fig7a", FIGURES["fig7a"])


def test_fig3_marks_each_runs_trained_depth_in_its_colour():
    """Runs trained to different depths (paper schedule: 3; a 16-pass schedule: 16) each get a dotted
    line at their own depth, in their line's colour; one depth for every run is one grey line."""
    from matplotlib.colors import to_hex

    from fbt_probe.figures.contraction import fig3

    rows = [
        {"run": run, "schedule": s, "pass": k, "val_loss": 0.3 + 0.01 * k, "state_change": None if k == 1 else 10.0 / k}
        for run, s in (("paper", "p"), ("deep", "d"))
        for k in range(1, 33)
    ]
    table = pd.DataFrame(rows)

    def dotted(fig):
        ax = fig.axes[0]
        return sorted(
            (round(line.get_xdata()[0]), to_hex(line.get_color()))
            for line in ax.get_lines()
            if line.get_linestyle() == ":"
        )

    fig = fig3(table, trained_passes={"paper": 3, "deep": 16})
    curves = {
        line.get_label(): to_hex(line.get_color()) for line in fig.axes[0].get_lines() if line.get_linestyle() != ":"
    }
    assert dotted(fig) == [(3, curves["paper (p)"]), (16, curves["deep (d)"])]
    assert curves["paper (p)"] != curves["deep (d)"]
    assert dotted(fig3(table, trained_passes={"paper": 3, "deep": 3})) == [(3, to_hex("grey"))]
    # a one-pass run (the no-feedback baseline) was trained at no feedback depth: no marker for it
    assert dotted(fig3(table, trained_passes={"paper": 3, "deep": 1})) == [(3, curves["paper (p)"])]
    assert dotted(fig3(table, trained_passes={"paper": 1, "deep": 1})) == []
    assert dotted(fig3(table, trained_passes=1)) == []
    assert dotted(fig3(table, trained_passes=3)) == [(3, to_hex("grey"))]
    assert dotted(fig3(table)) == []


def test_the_package_leaves_the_matplotlib_backend_alone(monkeypatch, tmp_path):
    """A Jupyter kernel chooses its inline backend before a notebook imports the package: importing
    the figures' style module does not switch the backend (matplotlib.use refuses here), and a figure
    the package draws is not pyplot's (a notebook's inline display shows only its own plots), yet it
    draws and saves. The manual's build checks the end of it: every plot of a notebook that imports
    the interventions is on its page (tests/test_docs.py)."""
    import importlib

    import matplotlib
    import matplotlib.pyplot as plt

    from fbt_probe.figures import style

    def refuse(*args, **kwargs):
        raise AssertionError(f"the package switched matplotlib's backend: use{args}")

    monkeypatch.setattr(matplotlib, "use", refuse)
    importlib.reload(style)  # the module's import, as a notebook's `import fbt_probe.interventions` runs it
    open_before = plt.get_fignums()
    fig, axes = style.subplots(1, 2)
    axes[0, 1].plot([0, 1], [1, 0])
    fig.canvas.draw()
    assert fig.canvas.get_renderer().width > 0 and plt.get_fignums() == open_before
    fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
