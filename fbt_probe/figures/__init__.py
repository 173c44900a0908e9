"""Figures: one function per figure, `table -> matplotlib Figure`; a figure never runs a model.

Each figure is registered here by name; `fbt-probe figures NAME RESULTS --out DIR` looks it up, loads
its table (a Parquet/CSV file, or the entry's default file inside a results folder), calls the
function and writes NAME.png and NAME.svg. To add a figure: write a module in this package with a
function `my_fig(table: pd.DataFrame, **options) -> Figure`, then add one line to `FIGURES` (or call
`register_figure` from your own code). Options are keyword arguments of the function; a DataFrame
option (e.g. `baseline`) is passed on the command line as a table path.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, refuse_existing
from fbt_probe.marker import named_outputs

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class FigureEntry:
    module: str
    """Module holding the figure function (imported only when the figure is drawn)."""
    function: str
    table: str
    """File name looked for when RESULTS is a folder."""
    help: str = ""


FIGURES: dict[str, FigureEntry] = {
    "fig3": FigureEntry(
        "fbt_probe.figures.contraction",
        "fig3",
        "contraction.parquet",
        "contraction diagnostic: validation loss and carried-state change vs feedback passes",
    ),
    "fig3-lm": FigureEntry(
        "fbt_probe.figures.passes",
        "fig3_lm",
        "summary.parquet",
        "general LM, Fig. 3: held-out loss and carried-state change vs passes, per schedule and seed (fbt-probe diagnose passes)",
    ),
    "fig4-lm": FigureEntry(
        "fbt_probe.figures.passes",
        "fig4_lm",
        "summary.parquet",
        "general LM, Fig. 4: held-out loss vs feedback passes at prefill, beside the no-feedback baseline",
    ),
    "fig7a": FigureEntry(
        "fbt_probe.figures.probes",
        "fig7a",
        "probes.parquet",
        "probe accuracy vs depth; panels task x {standard, recurrent:1}; colour = length",
    ),
    "fig7b": FigureEntry(
        "fbt_probe.figures.probes",
        "fig7b",
        "probes.parquet",
        "register sweeps (count m, writes per register): probe accuracy vs depth; lines = prefill modes, band = min-max over folds",
    ),
    "hidden": FigureEntry(
        "fbt_probe.figures.hidden",
        "hidden_streams",
        "probes.parquet",
        "Hidden Decoding: accuracy along (stream, depth), next to the feedback model's depth curve",
    ),
    "patching-heatmap": FigureEntry(
        "fbt_probe.figures.interventions",
        "patching_heatmap",
        "summary.parquet",
        "residual patching (fbt-probe patch --experiment residual): depth x position",
    ),
    "ablation-bars": FigureEntry(
        "fbt_probe.figures.interventions",
        "ablation_bars",
        "summary.parquet",
        "feedback swap / state replacement / gate ablation: means with 95 % CIs over groups",
    ),
    "decodable-vs-used": FigureEntry(
        "fbt_probe.figures.interventions",
        "decodable_vs_used",
        "summary.parquet",
        "probe accuracy and causal effect of erasing its direction, per depth",
    ),
    "steering-sweep": FigureEntry(
        "fbt_probe.figures.interventions",
        "steering_sweep",
        "summary.parquet",
        "answer movement vs steering scale, probe vs random direction",
    ),
    "atp-heatmap": FigureEntry(
        "fbt_probe.figures.methods",
        "atp_heatmap",
        "summary.parquet",
        "attribution patching: (pass x) hook x position map, checked cells ringed",
    ),
    "atp-parity": FigureEntry(
        "fbt_probe.figures.methods",
        "atp_parity",
        "summary.parquet",
        "attribution patching against exact patching on the --check cells",
    ),
    "das-iia": FigureEntry(
        "fbt_probe.figures.methods",
        "das_iia",
        "summary.parquet",
        "DAS: interchange intervention accuracy vs subspace dimension, with baselines",
    ),
    "sae-swap": FigureEntry(
        "fbt_probe.figures.sae",
        "sae_swap",
        "fractions.parquet",
        "SAE feature swap: share of the full-state swap carried by the top-k label latents vs k, random control "
        "(one line per SAE where sparsity.parquet holds the grid)",
    ),
    "sae-features": FigureEntry(
        "fbt_probe.figures.sae",
        "sae_features",
        "activations.parquet",
        "SAE feature browser: each task's top label latents, activation at the final position by label",
    ),
    "sae-vs-das": FigureEntry(
        "fbt_probe.figures.sae",
        "sae_vs_das",
        "fractions.parquet",
        "feature swap vs k beside DAS IIA vs k and the depth-0 probe (options das=DAS summary, probe=task,accuracy)",
    ),
    "depth": FigureEntry(
        "fbt_probe.figures.depth",
        "depth",
        "accuracy.parquet",
        "serial depth: answer accuracy vs dependent steps k per mode, one panel per model, the carried-state swap vs k beside (option swap=swap.parquet)",
    ),
    "depth-grid": FigureEntry(
        "fbt_probe.figures.depth",
        "depth_grid",
        "depth-grid.csv",
        "serial-depth research grid: answer accuracy vs k per mode, a row per design x schedule x model, a column per seed (option min_groups=N)",
    ),
    "lens": FigureEntry(
        "fbt_probe.figures.lens",
        "lens_depth",
        "lens_summary.parquet",
        "logit / tuned lens: probability of the correct label word by depth, per mode and pass",
    ),
}


def register_figure(name: str, entry: FigureEntry, replace: bool = False) -> None:
    if name in FIGURES and not replace:
        raise ValueError(f"figure '{name}' is already registered")
    FIGURES[name] = entry


def figure_names() -> list[str]:
    return sorted(FIGURES)


def get_figure(name: str) -> Callable[..., "object"]:
    if name not in FIGURES:
        raise FbtError(f"figure '{name}': unknown (available: {', '.join(figure_names())})")
    entry = FIGURES[name]
    return getattr(importlib.import_module(entry.module), entry.function)


def load_table(path: str | Path, default_file: str | None = None) -> pd.DataFrame:
    """A results table from a .parquet or .csv file, or `default_file` inside a folder."""
    import pandas as pd

    path = Path(path)
    if path.is_dir():
        if default_file is None or not (path / default_file).is_file():
            raise FbtError(f"{path}: no {default_file or 'results table'} in this folder")
        path = path / default_file
    if not path.is_file():
        raise FbtError(f"{path}: results table not found")
    try:
        if path.suffix == ".csv":
            return pd.read_csv(path)
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow / pandas raise several types for a damaged file
        raise FbtError(f"{path}: not a readable results table ({type(exc).__name__}: {exc})") from None


def draw(name: str, results, **options):
    """The Figure `name` drawn from `results` (a DataFrame, a table file or a results folder)."""
    import pandas as pd

    fn = get_figure(name)
    table = results if isinstance(results, pd.DataFrame) else load_table(results, FIGURES[name].table)
    params = inspect.signature(fn).parameters
    unknown = sorted(set(options) - set(params) - {"table"})
    if unknown:
        known = [p for p in params if p != "table"]
        raise FbtError(f"figure '{name}': no option {unknown} (options: {', '.join(known) or 'none'})")
    for key, value in list(options.items()):  # table-valued options may be given as paths
        if "DataFrame" in str(params[key].annotation) and isinstance(value, (str, Path)):
            options[key] = load_table(value, FIGURES[name].table)
        elif isinstance(value, str):  # a number given on the command line as text
            options[key] = _number(name, key, value, str(params[key].annotation))
    return fn(table, **options)


def _number(figure: str, key: str, value: str, annotation: str):
    """`value` converted to the option's annotated type (int or float; other options stay text)."""
    kinds = {part.strip() for part in annotation.split("|")}
    for kind, convert, words in (("int", int, "an integer"), ("float", float, "a number")):
        if kind in kinds:
            try:
                return convert(value)
            except ValueError:
                raise FbtError(f"figure '{figure}': option {key}={value!r}: expected {words}") from None
    return value


def save_figure(
    fig,
    out_dir: str | Path,
    stem: str,
    force: bool = False,
    formats: tuple[str, ...] = ("png", "svg"),
    dpi: int = 200,
    mark: bool = False,
    command: str = "figures",
) -> list[Path]:
    """Write `stem.png` / `stem.svg` into `out_dir` (atomically; existing files need `force`). `mark`
    (a command's named output): the files are recorded in the folder's marker as `command`'s, under
    the folder's lock, and `force` replaces only files recorded there (`fbt_probe.marker.refuse_named`)."""
    out_dir = Path(out_dir)
    paths = [out_dir / f"{stem}.{fmt}" for fmt in formats]
    if not mark:  # a file of a folder its caller writes (a temporary one, a study stage's)
        for p in paths:
            refuse_existing(p, force)
        _save(fig, paths, formats, dpi)
        return paths
    with named_outputs(paths, command, force):
        _save(fig, paths, formats, dpi)
    return paths


def _save(fig, paths: list[Path], formats: tuple[str, ...], dpi: int) -> None:
    for p, fmt in zip(paths, formats):
        with atomic_path(p) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")


def _draw_and_save(job: tuple, out_dir: Path, formats: tuple[str, ...], dpi: int) -> None:
    stem, name, table, options = job
    save_figure(draw(name, table, **options), out_dir, stem, force=True, dpi=dpi, formats=formats)


def draw_all(
    jobs: list[tuple], out_dir: str | Path, formats: tuple[str, ...] = ("png", "svg"), dpi: int = 200, workers: int = 1
) -> None:
    """Draw and save each job `(stem, figure name, table, options)` into `out_dir`, replacing files of
    the same stem; `workers` > 1 draws them side by side in spawned processes (a figure is a pure
    function of its table, so the files are the same either way; most of a figure's time is the
    rendering of its PNG)."""
    out_dir = Path(out_dir)
    if workers <= 1 or len(jobs) < 2:
        for job in jobs:
            _draw_and_save(job, out_dir, formats, dpi)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in [pool.submit(_draw_and_save, job, out_dir, formats, dpi) for job in jobs]:
            fut.result()  # the first failure is raised here


__all__ = [
    "FIGURES",
    "FigureEntry",
    "draw",
    "draw_all",
    "figure_names",
    "get_figure",
    "load_table",
    "register_figure",
    "save_figure",
]
