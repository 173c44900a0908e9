"""The manual's notebooks (docs/notebooks/*.py, Jupytext percent format): running one as Jupyter
does, and the checks on the numbers each one records.

Every notebook asserts its own numbers cell by cell; at its end it writes them as JSON into the
folder named by FBT_NOTEBOOK_RECORDS (`<notebook>.json`). The manual's build runs every notebook
(tests/test_docs.py) and tests/test_wheel.py runs one from the installed wheel; both read these
records. `record_problems` checks a record against relations that hold whatever the models
compute (an accuracy inside its interval, chance where the design puts it, two computations of one
number equal), and returns the problems found, so that a crafted bad record shows that it can fail."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "docs" / "notebooks"
RECORDS = "FBT_NOTEBOOK_RECORDS"
MODES = ["standard", "recurrent:1", "jacobi:2", "jacobi:3", "full"]


def notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.py"))


def execute(path: Path, cwd: Path, env: dict, timeout: int = 600):
    """Run the notebook at `path` top to bottom in a fresh python3 kernel of this interpreter, in
    folder `cwd` with environment `env`; a cell that raises raises nbclient's CellExecutionError
    (naming the cell and the error). Returns the executed notebook."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(path)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)
    return nb


def run_in_this_process(path: Path, records: Path) -> None:
    """The notebook's code top to bottom as a script in this process, on the package this process
    imports (its imports already paid), with one torch thread as in a kernel started with
    OMP_NUM_THREADS=1; the process's environment, torch thread count and random state, warning
    filters and pyplot figures are as before afterwards."""
    import os
    import runpy
    import warnings

    import matplotlib.pyplot as plt
    import torch

    environ, threads = dict(os.environ), torch.get_num_threads()
    try:
        os.environ[RECORDS] = str(records)
        torch.set_num_threads(1)
        with warnings.catch_warnings(), torch.random.fork_rng():
            warnings.simplefilter("ignore")  # plt.show() without a display, progress-bar notes
            runpy.run_path(str(path), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
        plt.close("all")


def read_record(folder: Path, notebook: Path) -> dict:
    return json.loads((Path(folder) / f"{notebook.stem}.json").read_text())


def leaves(value, path: str = "") -> dict[str, object]:
    """Every number and string of a JSON value by its path (`a/0/b`)."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in leaves(item, f"{path}/{i}").items()}
    return {path: value}


def png_images(html: str) -> int:
    """How many PNG images a rendered page shows (the notebooks' figures, inlined)."""
    return len(re.findall(r'<img[^>]*src="data:image/png;base64,', html))


def figure_calls(source: str) -> int:
    """How many figures a notebook's code shows: each `plt.show()` and each displayed image."""
    return source.count("plt.show()") + source.count("display(Image(")


def _model_and_modes(r: dict) -> list[str]:
    p = []
    T = len(r["tokens"][0])
    if sorted(r["logit_diff"]) != sorted(MODES):
        p.append(f"logit_diff: modes {sorted(r['logit_diff'])}")
    gaps = r["jacobi_gap"]
    if len(gaps) != T or not (gaps[-1] < 1e-4 and gaps[0] > 0.1):
        p.append(
            f"jacobi_gap: jacobi:T must equal full and jacobi:1 must not ({gaps[0]}, {gaps[-1]}, {len(gaps)} of {T})"
        )
    if not (r["jacobi_prefix_gap"] < 1e-4 and r["full_serial_gap"] < 1e-4):
        p.append(f"full: {r['full_serial_gap']} from the hooked serial run, {r['jacobi_prefix_gap']} from jacobi:K")
    for mode, lens in r["lens"].items():  # the last depth of the lens is the output
        if any(abs(a - b) > 1e-4 for a, b in zip(lens[-1], r["logit_diff"][mode])):
            p.append(f"lens: last depth under {mode} is not the output")
    if not abs(r["grad_hook"] - r["grad_fd"]) <= 1e-6 * abs(r["grad_fd"]) or abs(r["grad_fd"]) < 1e-3:
        p.append(f"gradient: hook {r['grad_hook']} vs finite differences {r['grad_fd']}")
    for key in ("state_err", "fused_err", "nnsight_trace_err"):
        if not r[key] < 1e-4:
            p.append(f"{key}: {r[key]}")
    if not (abs(r["patch_carried_part"]) > 0.1 and r["nnsight_moved"] > 1e-3):
        p.append("a patch before the last position does not reach the answer through the carried state")
    if [len(row) for row in r["patch_effect"]] != [T] * len(r["patch_effect"]):
        p.append("patch_effect: expected [layer, position]")
    return p


def _decodable_vs_used(r: dict) -> list[str]:
    p = []
    cells = {(c["model"], c["mode"], c["depth"]): c for c in r["fig7a"]}
    for key, c in cells.items():
        if not c["ci_low"] <= c["accuracy"] <= c["ci_high"]:
            p.append(f"fig7a {key}: {c['accuracy']} outside [{c['ci_low']}, {c['ci_high']}]")
    for model in ("feedback", "baseline"):
        if cells[(model, "standard", 0)]["accuracy"] != 0.5:  # one vector for every sample: chance exactly
            p.append(f"fig7a {model}: depth 0 under standard reads {cells[(model, 'standard', 0)]['accuracy']}")
    if {c["n_groups"] for c in r["fig7a"]} != {32}:
        p.append("fig7a: intervals not at n = 32 groups")
    for key, refit in r["sklearn_refit"].items():
        model, mode, depth = key.split("/")
        c = cells[(model, mode, int(depth.removeprefix("depth")))]
        if not (c["ci_low"] <= refit <= c["ci_high"] and abs(refit - c["accuracy"]) <= 0.03):
            p.append(f"sklearn refit {key}: {refit} against {c['accuracy']}")
    for e in r["effects"]:
        if e["metric"] == "accuracy" and not e["ci_low"] <= e["mean"] <= e["ci_high"]:
            p.append(f"effects {e['model']} {e['experiment']}: accuracy outside its Wilson interval")
        if not e["ci_low"] <= e["ci_high"]:
            p.append(f"effects {e['model']} {e['experiment']} {e['metric']}: empty interval")
    d, lo, hi, n = r["swap_paired_difference"]
    if not (lo <= hi and n == 32 and math.isfinite(d)):
        p.append(f"paired difference: {r['swap_paired_difference']}")
    return p


def _your_checkpoint(r: dict) -> list[str]:
    p = []
    if r["study_depth0_standard"] != 0.5:
        p.append(f"the study's depth 0 under standard reads {r['study_depth0_standard']}")
    head = [h for h in r["study_headline"] if h["quantity"] == "depth0-decodability" and h["mode"] == "standard"]
    if [h["value"] for h in head] != [r["study_depth0_standard"]]:
        p.append(f"headline.csv's depth 0 under standard is not the probe table's: {head}")
    if not r["load_gap"] < 1e-5:
        p.append(f"imported folder vs nanochat's folder: {r['load_gap']}")
    if not (0 < r["sae_fvu"] < 1 and r["sae_l0"] <= 8 and max(r["sae_checks"].values()) < 1e-5):
        p.append(f"SAE: fvu {r['sae_fvu']}, L0 {r['sae_l0']}, checks {r['sae_checks']}")
    return p


CHECKS = {
    "model-and-modes": _model_and_modes,
    "decodable-vs-used": _decodable_vs_used,
    "your-checkpoint": _your_checkpoint,
}


def record_problems(notebook: str, record: dict) -> list[str]:
    """What is wrong with the numbers `notebook` (its stem) recorded; [] when nothing is."""
    try:
        return CHECKS[notebook](record)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return [f"{notebook}: record lacks or mistypes {exc!r}"]
