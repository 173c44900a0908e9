"""`fbt-probe bench patch`: what a researcher waits for in `fbt-probe patch`, on this machine's CPU.

1. Each experiment as the command a researcher runs (`fbt-probe patch RUN DATASET --experiment E
   --mode M --out TMP`, figures included), one process each: wall time and that process's peak
   RSS (its VmHWM, written on exit).
2. The same experiments as one command (`--experiment a,b,...`: the final-position experiments share
   each batch's prefill, `fbt_probe.interventions.combined`): wall time, peak RSS, and the largest
   difference between its summary tables and the separate commands'.
3. On a subset (`compare_pairs` pairs per task x length cell), each experiment in this process with
   prefix reuse on and off (`--no-prefix-reuse`, the full re-run per condition): the ratio of their
   compute times, and the largest difference between their summary tables (they must agree up to
   float rounding).

The default dataset is what `fbt-probe tasks generate completion` writes (1,600 samples, 14 to
1,038 tokens), generated into a temporary folder.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fbt_probe.interventions import PatchConfig
from fbt_probe.interventions.runner import analyse, run_experiment
from fbt_probe.loading import open_pairs
from fbt_probe.provenance import provenance
from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset

EXPERIMENTS = ("feedback-swap", "state-replacement", "gate-ablation", "residual", "probe-direction")


def default_dataset(folder: Path) -> Path:
    """The completion dataset of `fbt-probe tasks generate completion` (spec defaults), in `folder`."""
    spec = load_spec("completion")
    tok = build_tokenizer([spec])
    write_dataset(generate(spec, tokenizer=tok), folder, tok, tokenizer_source="builtin")
    return folder


# `python -m fbt_probe ARGS` that writes its own peak RSS to a file on exit (the child's ru_maxrss,
# as os.wait4 reports it, would also count the RSS of this process at the fork)
_CLI_WITH_PEAK = """
import atexit, sys
from fbt_probe.bench.model import peak_rss_mb
peak_file = sys.argv.pop(1)
atexit.register(lambda: open(peak_file, "w").write(str(peak_rss_mb())))
sys.argv[0] = "fbt-probe"
from fbt_probe.cli import main
main()
"""


def run_command(cli_args: list[str], peak_file: Path) -> dict:
    """Wall seconds, peak RSS (MB) and exit code of `fbt-probe CLI_ARGS` in a child process."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CLI_WITH_PEAK, str(peak_file), *cli_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    peak = float(peak_file.read_text()) if peak_file.is_file() else float("nan")
    rec = {"seconds": time.perf_counter() - t0, "peak_rss_mb": peak, "exit_code": proc.returncode}
    if proc.returncode != 0:
        rec["error"] = proc.stdout.decode(errors="replace").strip().splitlines()[-1:]
    return rec


def _summary_diff(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Largest |difference| of the summary numbers (the effect, its interval and the pairs' mean gap
    with its interval); inf if the tables differ in shape or keys."""
    cols = [c for c in ("mean", "ci_low", "ci_high", "gap", "gap_low", "gap_high") if c in a.columns]
    keys = [c for c in a.columns if c not in cols]
    if list(a.columns) != list(b.columns) or len(a) != len(b) or not a[keys].equals(b[keys]):
        return float("inf")
    x, y = a[cols].to_numpy(float), b[cols].to_numpy(float)
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return float("inf")
    return float(np.nanmax(np.abs(x - y))) if np.isfinite(x).any() else 0.0


def compare_reuse(run: str, dataset: Path, experiments, mode: str, pairs: int, seed: int = 0) -> list[dict]:
    """Each experiment on `pairs` pairs per cell with prefix reuse on and off, in this process."""
    lm, df = open_pairs(run, dataset, seed=seed)
    model = lm.model
    rows = []
    for exp in experiments:
        times, summaries = {}, {}
        try:
            for reuse in (True, False):
                cfg = PatchConfig(experiment=exp, modes=(mode,), max_pairs=pairs, seed=seed, prefix_reuse=reuse)
                t0 = time.perf_counter()
                wide = run_experiment(model, df, cfg)
                times[reuse] = time.perf_counter() - t0
                summaries[reuse] = analyse(wide, cfg)[1]
        except Exception as exc:  # a failure is a result to report; the other experiments still run
            rows.append({"experiment": exp, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]})
            continue
        rows.append(
            {
                "experiment": exp,
                "reuse_s": times[True],
                "rerun_s": times[False],
                "speedup": times[False] / times[True],
                "max_summary_diff": _summary_diff(summaries[True], summaries[False]),
            }
        )
    return rows


def _patch_command(run: str, data: Path, experiment: str, mode: str, out: Path, seed: int, peak_file: Path) -> dict:
    """`fbt-probe patch` of `experiment` (one or comma-separated) into `out`, run by `run_command`."""
    args = ["patch", str(run), str(data), "--experiment", experiment, "--mode", mode, "--out", str(out)]
    args += ["--seed", str(seed)]
    return {"command": " ".join(["fbt-probe"] + args), **run_command(args, peak_file)}


def _together(run: str, data: Path, experiments, mode: str, seed: int, tmp: Path) -> dict:
    """The experiments as one command (they share each batch's prefill), and the largest difference
    of its summaries from those of the separate commands (in `tmp/out`); NaN where it failed."""
    together = _patch_command(run, data, ",".join(experiments), mode, tmp / "together", seed, tmp / "peak-together.txt")
    together["max_summary_diff"] = (
        max(
            (
                _summary_diff(
                    pd.read_parquet(tmp / "out" / e / "summary.parquet"),
                    pd.read_parquet(tmp / "together" / e / "summary.parquet"),
                )
                for e in experiments
            ),
            default=float("nan"),
        )
        if together["exit_code"] == 0
        else float("nan")
    )
    return together


def run_patch_bench(
    run: str = "tiny",
    dataset: Path | None = None,
    experiments=EXPERIMENTS,
    mode: str = "recurrent:1",
    compare_pairs: int = 2,
    seed: int = 0,
    progress=None,
) -> dict:
    """`progress(line)` hears each command's result as it finishes."""
    with tempfile.TemporaryDirectory(prefix="fbt-bench-patch-") as tmp:
        tmp = Path(tmp)
        data = Path(dataset) if dataset is not None else default_dataset(tmp / "data")
        frame = pd.concat(
            [pd.read_parquet(p) for p in sorted(data.glob("*.parquet"))] if data.is_dir() else [pd.read_parquet(data)],
            ignore_index=True,
        )
        commands = []
        for exp in experiments:
            c = _patch_command(run, data, exp, mode, tmp / "out", seed, tmp / f"peak-{exp}.txt")
            commands.append({"experiment": exp, **c})
            if progress is not None:
                progress(f"{exp}: {c['seconds']:.1f} s, peak RSS {c['peak_rss_mb']:.0f} MB, exit {c['exit_code']}")
        together = None
        if len(experiments) > 1:
            together = _together(run, data, experiments, mode, seed, tmp)
            if progress is not None:
                progress(
                    f"all in one command: {together['seconds']:.1f} s, peak RSS {together['peak_rss_mb']:.0f} MB, "
                    f"exit {together['exit_code']}"
                )
        compare = compare_reuse(run, data, experiments, mode, compare_pairs, seed) if compare_pairs > 0 else []
    return {
        "run": str(run),
        "mode": mode,
        "dataset": str(dataset) if dataset is not None else "fbt-probe tasks generate completion (defaults)",
        "samples": len(frame),
        "tokens": [int(frame["n_tokens"].min()), int(frame["n_tokens"].max())],
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "commands": commands,
        "total_s": sum(c["seconds"] for c in commands),
        "together": together,
        "compare_pairs": compare_pairs,
        "compare": compare,
        "provenance": provenance(seed=seed),
    }


def to_markdown(r: dict) -> str:
    lines = [
        f"### `fbt-probe patch` ({r['run']}, mode {r['mode']}, {r['threads']} threads)",
        "",
        f"Dataset: {r['dataset']}: {r['samples']:,} samples, {r['tokens'][0]}-{r['tokens'][1]} tokens.",
        "",
        "| experiment | wall time | peak RSS | exit |",
        "|---|---:|---:|---:|",
    ]
    for c in r["commands"]:
        note = f" ({c['error'][0]})" if c.get("error") else ""
        lines.append(
            f"| {c['experiment']} | {c['seconds']:.1f} s | {c['peak_rss_mb']:,.0f} MB | {c['exit_code']}{note} |"
        )
    lines.append(
        f"| **all {len(r['commands'])}**, one command each | **{r['total_s']:.1f} s** | max {max(c['peak_rss_mb'] for c in r['commands']):,.0f} MB | |"
    )
    t = r.get("together")
    if t:
        note = f" ({t['error'][0]})" if t.get("error") else ""
        lines.append(
            f"| **all {len(r['commands'])} in one command** (`--experiment {','.join(c['experiment'] for c in r['commands'])}`) "
            f"| **{t['seconds']:.1f} s** | {t['peak_rss_mb']:,.0f} MB | {t['exit_code']}{note} |"
        )
        lines += [
            "",
            f"The one command's summary tables against the separate commands': largest difference {t['max_summary_diff']:.1e}.",
        ]
    if r["compare"]:
        lines += [
            "",
            f"Prefix reuse vs the full re-run per condition ({r['compare_pairs']} pairs per cell, compute only):",
            "",
            "| experiment | reuse | full re-run | speed-up | largest summary difference |",
            "|---|---:|---:|---:|---:|",
        ]
        for c in r["compare"]:
            if "error" in c:
                lines.append(f"| {c['experiment']} | error: {c['error']} | | | |")
                continue
            lines.append(
                f"| {c['experiment']} | {c['reuse_s']:.1f} s | {c['rerun_s']:.1f} s | {c['speedup']:.1f}× | {c['max_summary_diff']:.1e} |"
            )
    return "\n".join(lines) + "\n"
