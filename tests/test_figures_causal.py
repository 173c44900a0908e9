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


def test_ablation_bars_name_interventions_for_what_they_do_and_draw_one_intervention_once():
    """The zero gate and the zero state both set the fused input to zero (the token erased as well): under
    the same mode they are one intervention, drawn once, and its label says what it does."""
    gate = [
        _row(
            experiment="gate-ablation",
            condition=c,
            mode="recurrent:1",
            direction="noising",
            task=t,
            length_knob=-1,
            metric="normalized",
            mean=0.4,
            ci_low=0.3,
            ci_high=0.5,
        )
        for c in ("none", "zero", "ones", "bypass")
        for t in ("completion", "memory")
    ]
    table = pd.concat([ablation_table(("completion", "memory")), pd.DataFrame(gate)], ignore_index=True)
    fig = draw("ablation-bars", table)
    ticks = {ax.get_title().split("\n")[0]: [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes}
    assert ticks["gate-ablation"] == ["none", "gate 1 (token erased)", "bypass (plain input)"]
    assert "zero input (token erased)" in ticks["state-replacement"] and "mean state" in ticks["state-replacement"]
    # without a state replacement under the same mode, the zero gate is drawn, named as the zero input
    alone = draw("ablation-bars", pd.DataFrame(gate))
    labels = [t.get_text() for t in alone.axes[0].get_xticklabels()]
    assert "gate 0 = zero input" in labels


def test_depth_cells_below_the_floor_are_hollow_unconnected_markers_with_their_n():
    """A k of 3 held-out groups beside two of 40: its cells are hollow markers with "n=3", on no line and
    without an interval; the lines join the k with enough groups only. A swap with no normalized effect
    at any k (no pair set cleared the gap) says so on its panel."""
    modes = ("standard", "recurrent:1")
    rows = [
        {"model": m, "k": k, "mode": mode, "accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6, "groups": g}
        for m in ("feedback", "baseline")
        for k, g in ((4, 3), (8, 40), (16, 40))
        for mode in modes
    ]
    nan = float("nan")
    swap = pd.DataFrame(
        [
            {"model": m, "k": k, "normalized": nan, "ci_low": nan, "ci_high": nan, "groups": g}
            for m in ("feedback", "baseline")
            for k, g in ((4, 3), (8, 40), (16, 40))
        ]
    )
    fig = draw("depth", pd.DataFrame(rows), swap=swap)
    panels = fig.axes[:2]
    lines = [ln for ax in panels for ln in ax.get_lines() if str(ln.get_gid()).startswith("mode:")]
    assert len(lines) == 2 * len(modes) and all(len(ln.get_xdata()) == 2 for ln in lines)  # k = 8 and 16 only
    hollow = [ln for ax in panels for ln in ax.get_lines() if ln.get_markerfacecolor() == "none"]
    assert len(hollow) == 2 * len(modes) and all(len(ln.get_xdata()) == 1 for ln in hollow)
    x = sorted({round(float(ln.get_xdata()[0]), 9) for ln in hollow})
    assert x == pytest.approx([2 - 0.14, 2 + 0.14])  # log2(4), each mode dodged by its offset
    assert sum(t.get_text() == "n=3" for ax in panels for t in ax.texts) == 2 * len(modes)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[-1] == "too few groups (n < 8): no interval, no line"
    assert any(t.get_text().startswith("no normalized effect at any k") for t in fig.axes[2].texts)
    # with the swap's effect at some k, no such note
    fine = draw("depth", pd.DataFrame(rows), swap=swap.assign(normalized=0.5, ci_low=0.4, ci_high=0.6))
    assert not any(t.get_text().startswith("no normalized effect") for t in fine.axes[2].texts)


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
        assert [t.get_position()[0] for t in ax.get_xticklabels()] == [0, 1, 2, 3]  # under their columns
    many = draw("patching-heatmap", residual_table(range(0, 40)))
    labels = [t.get_text() for t in next(ax for ax in many.axes if ax.get_images()).get_xticklabels()]
    assert 1 < len(labels) <= 8 and labels[-1] == "39\nfinal"


def test_patching_colour_scale_covers_every_value_and_says_so():
    """A normalized mean of 3.61 (a small clean–corrupt gap) and one of −0.4 lie inside the colour
    scale, which is centred at 0 once a value is negative, shared by the panels, and the cells outside
    [0, 1] carry their value in text; a table inside [0, 1] keeps the [0, 1] scale."""
    t = residual_table()
    t.loc[(t.direction == "denoising") & (t.depth == 2) & (t.position == 44), ["mean", "ci_low", "ci_high"]] = 3.61
    t.loc[(t.direction == "noising") & (t.depth == 0) & (t.position == 42), ["mean", "ci_low", "ci_high"]] = -0.4
    fig = draw("patching-heatmap", t)
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 2
    for im in images:
        lo, hi = im.norm.vmin, im.norm.vmax
        assert lo <= -0.4 and hi >= 3.61 and float(im.norm(0.0)) == pytest.approx(0.5)  # diverging about 0
    texts = [x.get_text() for ax in fig.axes for x in ax.texts]
    assert "3.61" in texts and "-0.40" in texts
    assert len([ax for ax in fig.axes if ax.get_label() == "<colorbar>"]) == 1
    plain = next(ax for ax in draw("patching-heatmap", residual_table()).axes if ax.get_images()).get_images()[0]
    assert (plain.norm.vmin, plain.norm.vmax) == (0.0, 1.0)
    noise = residual_table()  # an exact recovery's float noise widens the scale, nothing more
    noise.loc[noise.index[0], "mean"] = -0.006
    fig = draw("patching-heatmap", noise)
    im = next(ax for ax in fig.axes if ax.get_images()).get_images()[0]
    assert im.norm.vmin == pytest.approx(-0.006) and im.get_cmap().name == "viridis"
    assert not [x for ax in fig.axes for x in ax.texts]


def test_patching_shows_the_position_where_the_pair_differs():
    t = residual_table(positions=[6, 10, 11, 12, 13]).assign(differs=lambda d: d["position"] == 6)
    fig = draw("patching-heatmap", t)
    ax = next(a for a in fig.axes if a.get_images())
    assert ax.get_images()[0].get_array().shape[1] == 5
    labels = [x.get_text() for x in ax.get_xticklabels()]
    assert labels[0].startswith("6\n") and labels[0].endswith("differs")
    assert sum(lab.endswith("differs") for lab in labels) == 1 and labels[-1].endswith("final")
    assert len([ln for ln in ax.get_lines() if ln.get_color() == "white"]) == 1  # 7-9 skipped


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


def test_atp_heatmap_panels_share_one_colour_scale_and_one_colorbar():
    small = atp_table()
    big = atp_table().assign(task="memory")
    big["mean"] = big["mean"] * 3  # memory's effects are three times completion's
    fig = draw("atp-heatmap", pd.concat([small, big], ignore_index=True))
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 2
    limits = {(round(im.norm.vmin, 9), round(im.norm.vmax, 9)) for im in images}
    assert limits == {(-1.8, 1.8)}  # the largest |value| of either panel
    assert len([ax for ax in fig.axes if ax.get_label() == "<colorbar>"]) == 1
    ax = next(a for a in fig.axes if a.get_images())
    assert min(x.get_fontsize() for x in ax.get_yticklabels() + ax.get_xticklabels()) >= 6.5


def parity_table() -> pd.DataFrame:
    """Checked cells at two lengths: within each length AtP ranks the cells as exact patching does,
    across lengths it does not (length 32's AtP values sit below length 8's)."""
    rows = []
    for knob, exact, atp in (
        (8, (0.1, 0.2, 0.3, 0.4), (0.5, 0.6, 0.7, 0.8)),
        (32, (0.5, 0.6, 0.7, 0.8), (0.1, 0.2, 0.3, 0.35)),
    ):
        for p, (e, a) in enumerate(zip(exact, atp)):
            for method, v in (("exact", e), ("atp", a)):
                rows.append(
                    _row(
                        experiment="attribution",
                        condition="blocks.0.hook_resid_post",
                        mode="recurrent:1",
                        direction="denoising",
                        method=method,
                        task="completion",
                        length_knob=knob,
                        position=p,
                        pass_index=1,
                        metric="normalized",
                        mean=v,
                        ci_low=v,
                        ci_high=v,
                    )
                )
    return pd.DataFrame(rows)


def test_atp_parity_gives_spearman_per_length_and_says_pooled():
    fig = draw("atp-parity", parity_table(), model_label="feedback model")
    title = fig.axes[0].get_title()
    assert "pooled over lengths" in title and "per length 8: 1.00, 32: 1.00" in title
    pooled = float(title.split("pooled over lengths ")[1].split()[0])
    assert pooled < 0.5  # the pooled rank correlation is not any length's
    one = draw("atp-parity", parity_table().query("length_knob == 8"))
    assert "(length 8)" in one.axes[0].get_title() and "pooled" not in one.axes[0].get_title()
    assert fig._suptitle.get_text().startswith("Feedback model:")


def test_the_lens_and_parity_titles_name_their_model():
    from fbt_probe.figures.lens import lens_depth

    lens = pd.DataFrame(
        [
            dict(
                task="completion",
                length_knob=-1,
                mode="standard",
                pass_index=1,
                lens="logit",
                depth=d,
                metric="p_correct",
                mean=0.5,
                ci_low=0.4,
                ci_high=0.6,
            )
            for d in range(3)
        ]
    )
    titles = {
        draw(name, table, model_label=label)._suptitle.get_text()
        for name, table in (("lens", lens), ("atp-parity", parity_table()))
        for label in ("feedback model", "no-feedback baseline")
    }
    assert len(titles) == 4 and all(t.startswith(("Feedback model:", "No-feedback baseline:")) for t in titles)
    assert lens_depth(lens)._suptitle.get_text().startswith("what each depth")  # no model known, no name


def probe_direction_table(spike: float | None = None, depths=range(3)) -> pd.DataFrame:
    rows = []
    for depth in depths:
        for cond, metric, m in (("probe", "probe_accuracy", 0.9), ("erase-orth", "normalized", 0.4)):
            lo, hi = m - 0.05, m + 0.05
            if spike is not None and cond == "erase-orth" and depth == 1:
                lo, hi = m - spike, m + spike  # one band with a huge CI
            rows.append(
                _row(
                    experiment="probe-direction",
                    condition=cond,
                    mode="recurrent:1",
                    direction="noising",
                    task="completion",
                    length_knob=-1,
                    depth=depth,
                    metric=metric,
                    mean=m,
                    ci_low=lo,
                    ci_high=hi,
                )
            )
    return pd.DataFrame(rows)


def test_decodable_vs_used_has_a_title_and_annotates_the_band_it_cuts():
    fig = draw("decodable-vs-used", probe_direction_table(spike=4.0), model_label="no-feedback baseline")
    assert fig._suptitle.get_text().startswith("No-feedback baseline: decodable vs used")
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert -0.2 < lo < 0 and 1 < hi < 1.2  # the axis is set by [0, 1] and the means, not by the one wide band
    cut = sorted(x.get_text() for x in ax.texts)
    assert cut == ["-3.4", "4.6"]  # 1 − normalized: 1 − (0.4 ± 4) — both ends written where they are cut
    assert "cut" in fig.legends[0].get_title().get_text()
    calm = draw("decodable-vs-used", probe_direction_table())
    assert not calm.axes[0].texts and not calm.legends[0].get_title().get_text()


def test_decodable_vs_used_plots_depths_and_leaves_the_carried_states_rows_out():
    """Rows at depth -1 (`probe_direction(feedback=True)`: the carried state) are not a depth."""
    xs = lambda fig: sorted({float(x) for line in fig.axes[0].lines for x in line.get_xdata()})  # noqa: E731
    assert xs(draw("decodable-vs-used", probe_direction_table(depths=range(-1, 3)))) == [0.0, 1.0, 2.0]
    assert xs(draw("decodable-vs-used", probe_direction_table(depths=range(3)))) == [0.0, 1.0, 2.0]


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


def test_das_points_are_not_joined_across_k_and_the_null_is_the_random_rotation():
    fig = draw("das-iia", das_table())
    ax = fig.axes[0]
    drawn = [ln for ln in ax.get_lines() if ln.get_linestyle() not in ("None", "none", "", " ")]
    # the only drawn line is the random-rotation null, read from the table (0.05 here), not 1 / labels
    assert len(drawn) == 1 and set(drawn[0].get_ydata()) == {0.05} and "random-rotation null" in drawn[0].get_label()
    assert not [ln for ln in ax.get_lines() if "chance" in ln.get_label()]
    for ln in ax.get_lines():
        if len(set(np.round(np.asarray(ln.get_xdata(), float)))) > 1:
            assert ln.get_linestyle() in ("None", "none", "", " ") or ln is drawn[0]
    assert not [c for c in ax.collections if type(c).__name__ == "PolyCollection"]  # no band spanning k
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "full\nvector"]
    assert len([c for c in ax.containers]) == 6  # hooks x (DAS, random, full): points with error bars
    higher = das_table()
    higher.loc[higher.method == "random-rotation", ["mean", "ci_low", "ci_high"]] = (0.2, 0.1, 0.3)
    null = next(ln for ln in draw("das-iia", higher).axes[0].get_lines() if "null" in ln.get_label())
    assert null.get_ydata()[0] == pytest.approx(0.2)
    bare = draw("das-iia", das_table().query("method != 'random-rotation'"))
    assert not [ln for ln in bare.axes[0].get_lines() if "null" in ln.get_label()]  # no null without its data


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
