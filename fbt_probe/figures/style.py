"""Shared look of every figure: sized for a paper page (7 in wide), fonts readable when printed.

Figures are `matplotlib.figure.Figure` objects on an Agg canvas, made without pyplot: they are
files and need no display, so importing the package leaves matplotlib's backend as the caller set it
(a Jupyter kernel's inline plots keep working), and a figure the package draws is never shown by
pyplot. A notebook displays one by evaluating it (`fig` as a cell's last line)."""

from __future__ import annotations

import contextlib

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PAGE_WIDTH_IN = 7.0  # a two-column paper's full text width

RC = {
    "font.size": 8,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7.5,
    "figure.titlesize": 9.5,
    "lines.linewidth": 1.3,
    "lines.markersize": 3.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.25,
    "grid.linewidth": 0.5,
    "svg.fonttype": "none",
    "savefig.facecolor": "white",
}


@contextlib.contextmanager
def paper_style():
    with matplotlib.rc_context(RC):
        yield


def subplots(n_rows: int, n_cols: int, panel_height_in: float = 2.0, width_in: float = PAGE_WIDTH_IN, **kw):
    """(figure, axes [n_rows, n_cols]) of a new figure on an Agg canvas, not registered with pyplot."""
    fig = Figure(figsize=(width_in, panel_height_in * n_rows), layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: draw() and get_renderer() work as under pyplot's Agg
    return fig, fig.subplots(n_rows, n_cols, squeeze=False, **kw)


def legend_handles(axes) -> dict:
    """{label: handle} of every series once, whichever panel draws it (a figure-level legend)."""
    handles: dict = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    return handles


def model_words(table, label: str | None = None) -> str:
    """Which model a figure shows, for its title: `label` when given (the study names its models:
    "feedback model", "no-feedback baseline"), else the folder name of the table's one `model`
    (a checkpoint path), else ""."""
    if label:
        return str(label)
    if table is not None and "model" in getattr(table, "columns", ()):
        names = sorted({str(m).rstrip("/").rsplit("/", 1)[-1] for m in table["model"].dropna().unique()})
        if len(names) == 1 and names[0]:
            return f"model {names[0]}"
    return ""


def titled(text: str, model: str) -> str:
    """`Model: text` (the model's words first, where a reader looks, when known)."""
    if not model:
        return text
    lead = text[0].lower() if text[1:2].islower() else text[0]  # an acronym (DAS) keeps its case
    return f"{model[0].upper()}{model[1:]}: {lead}{text[1:]}"
