"""The intervention and method figures, checked on the figure objects: which model a title names,
every task of a study accounted for, legends off the bars, unstable normalized bars left out with a
note, labelled positions, AtP maps cropped to the positions that carry the effect, DAS points not
joined across k with a chance line. Tables are made up (shaped like the experiments' summaries)."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pandas as pd
import pytest
from matplotlib.patches import Rectangle

from fbt_probe.figures import draw
from tests.test_figures import probe_table


@pytest.fixture(autouse=True)
def _close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


COLS = dict(
    hook_rule="one-pass", decoding="prefill", method="", depth=-1, position=-1, scale=0.0, n_pairs=10, n_excluded=0
)


def _row(**kw) -> dict:
    return {**COLS, **kw}


def ablation_table(tasks=("completion", "memory", "registers"), unstable=None) -> pd.DataFrame:
    """Feedback-swap and state-replacement summaries; every bar tall (0.85-1.0), so that no corner of a
    panel is free of bars; `unstable`: (task, condition) whose normalized CI is far wider than 1."""
    rows = []
    for exp, direction, conds in (
        ("feedback-swap", "denoising", ("state", "value", "gate")),
        ("state-replacement", "noising", ("none", "zero", "mean", "random")),
    ):
        for i, task in enumerate(tasks):
            for j, cond in enumerate(conds):
                m = 0.85 + 0.05 * ((i + j) % 3)
                lo, hi = m - 0.04, m + 0.04
                if unstable == (task, cond):
                    m, lo, hi = 3.6, -1.4, 9.2
                for metric in ("normalized", "accuracy"):
                    rows.append(
                        _row(
                            experiment=exp,
                            condition=cond,
                            mode="recurrent:1",
                            direction=direction,
                            task=task,
                            length_knob=-1,
                            metric=metric,
                            mean=m,
                            ci_low=lo,
                            ci_high=hi,
                        )
                    )
    return pd.DataFrame(rows)


def _window(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig) -> list[str]:
    out = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    out += [leg.get_title().get_text() for leg in fig.legends]
    for ax in fig.axes:
        out += [t.get_text() for t in ax.get_xticklabels()] + [ax.get_title()]
    return out


def test_fig7a_titles_name_the_model_they_show():
    # the title names the checkpoint folder of the table's model column ...
    x = draw("fig7a", probe_table(model="runs/tiny-feedback")).get_suptitle()
    y = draw("fig7a", probe_table(model="runs/tiny-baseline")).get_suptitle()
    assert x != y and "tiny-feedback" in x and "tiny-baseline" in y
    # ... or the words the study gives it
    feedback = draw("fig7a", probe_table(), baseline=probe_table(model="baseline"), model_label="feedback model")
    baseline = draw("fig7a", probe_table(model="baseline"), model_label="no-feedback baseline")
    a, b = feedback.get_suptitle(), baseline.get_suptitle()
    assert a != b and "feedback model" in a.lower() and "no-feedback baseline" in b.lower()


def test_ablation_bars_account_for_every_task_of_the_study():
    """A task the experiments were not run on (no rows) is named, marked as such, not silently missing."""
    fig = draw("ablation-bars", ablation_table(), tasks="completion,memory,registers,registers-count")
    texts = _texts(fig)
    assert any(t.startswith("registers-count") and "not run" in t for t in texts), texts
    assert all(any(t == task for t in texts) for task in ("completion", "memory", "registers"))


def test_ablation_bars_legend_covers_no_bar():
    fig = draw("ablation-bars", ablation_table(), model_label="feedback model")
    renderer = _window(fig)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    bars = [
        p.get_window_extent(renderer)
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and p.get_height() > 0
    ]
    assert len(bars) >= 20
    for leg in legends:
        box = leg.get_window_extent(renderer)
        assert not any(box.overlaps(b) for b in bars)
    assert "feedback model" in fig.get_suptitle().lower()


def test_ablation_bars_leave_out_a_bar_whose_ci_is_wider_than_the_whole_scale():
    table = ablation_table(unstable=("registers", "zero"))
    fig = draw("ablation-bars", table)
    ax = next(a for a in fig.axes if a.get_title().startswith("state-replacement"))
    heights = [p.get_height() for p in ax.patches if isinstance(p, Rectangle)]
    assert heights and max(heights) < 1.5  # the 3.6 bar is not drawn, so it does not set the scale
    assert ax.get_ylim()[1] < 2
    crosses = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_ydata()) == [0]
    note = " ".join(leg.get_title().get_text() for leg in fig.legends).replace("\n", " ")
    assert "registers — state-replacement: zero" in note and "clean–corrupt gap" in note
    # a CI just inside the limit is drawn, and a wider limit draws the unstable bar too
    assert not [
        ln for a in draw("ablation-bars", ablation_table()).axes for ln in a.get_lines() if ln.get_marker() == "x"
    ]
    wide = draw("ablation-bars", table, max_ci_width=20)
    ax = next(a for a in wide.axes if a.get_title().startswith("state-replacement"))
    assert max(p.get_height() for p in ax.patches if isinstance(p, Rectangle)) == pytest.approx(3.6)


def residual_table(positions=range(42, 46)) -> pd.DataFrame:
    rows = []
    for d in ("denoising", "noising"):
        for depth in range(3):
            for p in positions:
                v = (1.0 if p == max(positions) else 0.1) if d == "denoising" else 0.5
                rows.append(
                    _row(
                        experiment="residual",
                        condition="resid",
                        mode="standard",
                        direction=d,
                        task="completion",
                        length_knob=8,
                        depth=depth,
                        position=p,
                        metric="normalized",
                        mean=v,
                        ci_low=v,
                        ci_high=v,
                    )
                )
    return pd.DataFrame(rows)


def test_patching_heatmap_labels_every_position_and_the_final_one():
    fig = draw("patching-heatmap", residual_table())
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2
    for ax in panels:
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert len(labels) == 4 and all(labels)
        assert [lab.split("\n")[0] for lab in labels] == ["42", "43", "44", "45"]
        assert labels[-1].endswith("final") and sum("final" == lab.split("\n")[-1] for lab in labels) == 1
        assert [t.get_position()[0] for t in ax.get_xticklabels()] == [42, 43, 44, 45]  # under their columns
    many = draw("patching-heatmap", residual_table(range(0, 40)))
    labels = [t.get_text() for t in next(ax for ax in many.axes if ax.get_images()).get_xticklabels()]
    assert 1 < len(labels) <= 8 and labels[-1] == "39\nfinal"


def atp_table(n_pos=40, strong=(3, 17)) -> pd.DataFrame:
    """An AtP map whose effect sits at the final position and two others (`strong`), 1 % elsewhere."""
    rows = []
    hooks = ["fusion.hook_feedback", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    for h, hook in enumerate(hooks):
        for p in range(n_pos):
            v = 0.6 if p == n_pos - 1 else (0.3 if p in strong else 0.01 * ((p + h) % 3))
            rows.append(
                _row(
                    experiment="attribution",
                    condition=hook,
                    mode="recurrent:1",
                    direction="denoising",
                    method="atp",
                    task="completion",
                    length_knob=8,
                    position=p,
                    pass_index=1,
                    metric="normalized",
                    mean=v,
                    ci_low=v,
                    ci_high=v,
                )
            )
    rows.append(
        _row(
            experiment="attribution",
            condition=hooks[1],
            mode="recurrent:1",
            direction="denoising",
            method="exact",
            task="completion",
            length_knob=8,
            position=n_pos - 1,
            pass_index=1,
            metric="normalized",
            mean=0.5,
            ci_low=0.5,
            ci_high=0.5,
        )
    )
    return pd.DataFrame(rows)


def test_atp_heatmap_shows_the_positions_that_carry_the_effect():
    fig = draw("atp-heatmap", atp_table())
    ax = next(a for a in fig.axes if a.get_images())
    values = ax.get_images()[0].get_array()
    assert values.shape == (4, 3)  # the final position and the two strong ones, not all 40
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["3", "17", "39\nfinal"]
    gaps = [ln for ln in ax.get_lines() if ln.get_color() == "white"]
    assert len(gaps) == 2  # 3 | 17 | 39: two skipped stretches
    assert len(ax.collections) == 1  # the checked cell at the final position stays ringed
    assert draw("atp-heatmap", atp_table(), positions=2).axes[0].get_images()[0].get_array().shape == (4, 2)
    whole = draw("atp-heatmap", atp_table(), positions=0)
    assert whole.axes[0].get_images()[0].get_array().shape == (4, 40)


def das_table(ks=(1, 4), task="completion") -> pd.DataFrame:
    rows = []
    for hook in ("fusion.hook_feedback", "blocks.0.hook_resid_pre"):
        for method in ("das", "random-rotation"):
            for k in ks:
                m = 0.7 if method == "das" else 0.05
                rows.append(
                    _row(
                        experiment="das",
                        condition=hook,
                        mode="recurrent:1",
                        direction="interchange",
                        method=method,
                        task=task,
                        length_knob=-1,
                        subspace_dim=k,
                        metric="iia",
                        mean=m,
                        ci_low=m - 0.1,
                        ci_high=m + 0.1,
                    )
                )
        rows.append(
            _row(
                experiment="das",
                condition=hook,
                mode="recurrent:1",
                direction="interchange",
                method="full-interchange",
                task=task,
                length_knob=-1,
                subspace_dim=-1,
                metric="iia",
                mean=0.9,
                ci_low=0.8,
                ci_high=1.0,
            )
        )
    return pd.DataFrame(rows)


def test_das_points_are_not_joined_across_k_and_chance_is_one_over_the_label_count():
    from fbt_probe.tasks import load_spec

    fig = draw("das-iia", das_table())
    ax = fig.axes[0]
    chance = 1 / len(load_spec("completion").label_words)
    drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() not in ("None", "none", "", " ")]
    # the only drawn line is the horizontal chance line; nothing joins points at different k
    assert len(drawn) == 1 and set(drawn[0].get_ydata()) == {chance} and "chance" in drawn[0].get_label()
    for ln in ax.get_lines():
        if len(set(np.round(np.asarray(ln.get_xdata(), float)))) > 1:
            assert ln.get_linestyle() in ("None", "none", "", " ") or ln is drawn[0]
    assert not [c for c in ax.collections if type(c).__name__ == "PolyCollection"]  # no band spanning k
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "full\nvector"]
    assert len([c for c in ax.containers]) == 6  # hooks x (DAS, random, full): points with error bars
    from fbt_probe.figures.methods import n_classes

    assert n_classes("completion") == 2 and n_classes("x", pd.DataFrame({"task": ["x"], "n_classes": [4]})) == 4
    four = draw("das-iia", das_table().assign(n_classes=4))
    assert next(ln for ln in four.axes[0].get_lines() if "chance" in ln.get_label()).get_ydata()[0] == 0.25


@pytest.mark.parametrize(
    "name,table,opts",
    [
        ("ablation-bars", ablation_table(unstable=("registers", "zero")), {"tasks": "completion,registers-count"}),
        ("patching-heatmap", residual_table(), {}),
        ("atp-heatmap", atp_table(), {}),
        ("das-iia", das_table(), {}),
    ],
)
def test_the_figures_are_the_same_bytes_for_the_same_table(name, table, opts):
    import matplotlib.pyplot as plt

    def png():
        fig = draw(name, table.copy(), **opts)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=60)
        plt.close(fig)
        return hashlib.sha256(buf.getvalue()).hexdigest()

    assert png() == png()
