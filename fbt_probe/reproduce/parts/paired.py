"""Feedback - baseline as paired differences (stage `paired`, `results/paired/paired.parquet`).

Both models are probed on the same samples and intervened on with the same pairs, so a contrast
between them is a paired difference: each model's mean over the groups both share, and the
percentile group bootstrap that draws those groups once and applies the draw to both models
(`fbt_probe.stats.paired_difference`; docs/statistics.md). What shifts a group in both models (an
easy context, a long one) cancels in the difference, so the interval is narrower than the one that
two models' separate intervals suggest.

| what                        | per-unit values it pairs                                                      |
|-----------------------------|-------------------------------------------------------------------------------|
| `depth0-recurrent:1`        | held-out probe correctness per sample, depth 0 under `recurrent:1`            |
| `carried-state`             | held-out probe correctness per sample, the probe on h(T-1) itself             |
| `swap-normalized`           | the feedback swap's normalized effect: a ratio of means over pairs (below)    |
| `swap-accuracy`             | the feedback swap's answer accuracy per pair (the answer follows the swap)    |
| `zero-replacement-accuracy` | answer accuracy per pair with the fused input set to zero (token erased too)  |

One row per quantity x task x length (`length_knob`), and pooled over the lengths (`length_knob`
= -1, a group's values at every length together).

A normalized effect is each model's ratio of means over the shared pairs, Σ(patched − corrupt) /
Σ(clean − corrupt) (tiny-gap pairs left out, as the experiments' summaries), resampled with the same
draws for both models. It is compared only where both models have the gap: each model's mean
clean–corrupt gap over the shared groups has its group-bootstrap interval above `MIN_GAP`; elsewhere
the row's difference is NaN (`gap` names the model without it), for a ratio over a near-zero gap is
noise, and a difference of two such ratios more so."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from fbt_probe.io import atomic_dir, write_json
from fbt_probe.probes.sweep import SAMPLES_FILE
from fbt_probe.provenance import git_commit, provenance
from fbt_probe.reproduce.config import RATIO_OF_MEANS, RECURRENT_1, ReproConfig
from fbt_probe.reproduce.part import PAIRED_MODEL, Part, Section, headline_frame, md_table, model_hashes
from fbt_probe.reproduce.rules import bound, signed
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import _summary, study_kind
from fbt_probe.stats import LEVEL, N_BOOT, group_bootstrap_ratios, paired_difference

MODELS = ("feedback", "baseline")
MIN_GAP = 0.1  # logits: the experiments' min_gap, which each model's mean gap must clear for a normalized contrast
PROBES = {  # what -> (probe mode, depth; None: the mode's one depth)
    "depth0-recurrent:1": (RECURRENT_1, 0),
    "carried-state": ("carried-state", None),
}
CAUSAL = {  # what -> (experiment, condition, metric)
    "swap-normalized": ("feedback-swap", "state", "normalized"),
    "swap-accuracy": ("feedback-swap", "state", "accuracy"),
    "zero-replacement-accuracy": ("state-replacement", "zero", "accuracy"),
}
DESCRIPTION = {
    "depth0-recurrent:1": "probe accuracy at depth 0 under `recurrent:1`",
    "carried-state": "probe accuracy on the carried state h(T-1)",
    "swap-normalized": "the feedback swap's normalized effect",
    "swap-accuracy": "the feedback swap's accuracy (the answer follows the swapped-in state)",
    "zero-replacement-accuracy": "answer accuracy with the fused input set to zero (the token erased as well)",
}
COLUMNS = [
    "what",
    "task",
    "length_knob",
    "difference",
    "ci_low",
    "ci_high",
    "n_groups",
    "feedback",
    "baseline",
    "n_feedback",
    "n_baseline",
    "unit",
    "interval",
    "gap",
]
FOLDER, TABLE = ("results", "paired"), "paired.parquet"


def probe_values(out: Path, model: str, mode: str, depth: int | None) -> pd.DataFrame:
    """Per-sample held-out correctness of `model`'s probes in one mode (at `depth`): task,
    length_knob, group_id, value. Empty without the per-sample table."""
    frames = []
    root = Path(out) / "results" / "probes" / model
    for p in sorted(root.glob(f"*/{SAMPLES_FILE}")):
        s = pd.read_parquet(p, columns=["task", "mode", "length", "depth", "group_id", "correct"])
        s = s[s["mode"] == mode]
        if depth is not None:
            s = s[s["depth"] == depth]
        frames.append(s)
    if not frames:
        return pd.DataFrame(columns=["task", "length_knob", "group_id", "value"])
    s = pd.concat(frames, ignore_index=True)
    return pd.DataFrame(
        {
            "task": s["task"],
            "length_knob": s["length"].astype(np.int64),
            "group_id": s["group_id"].astype(str),
            "value": s["correct"].astype(np.float64),
        }
    )


def pair_values(out: Path, model: str, exp: str, condition: str, metric: str) -> pd.DataFrame:
    """Per-pair values of one intervention condition and metric (a pair's value: the mean of its
    rows, as the experiment's summary): task, length_knob, group_id, value. Empty where not run.
    `normalized`: value is the pair's mean (patched − corrupt) and `den` its mean (clean − corrupt),
    the two sums of a ratio of means."""
    empty = pd.DataFrame(columns=["task", "length_knob", "group_id", "value"])
    r = _summary(Path(out), model, exp, "rows")
    if r is None:
        return empty
    r = r[(r["condition"] == condition) & (r["metric"] == metric) & (r["position"] == -1)]
    if "decoding" in r.columns:  # the prefill rows (gate ablation adds soft-decoding ones)
        r = r[r["decoding"] == "prefill"]
    if metric == "normalized" and "tiny_gap" in r.columns:  # as the summary: tiny-gap pairs left out
        r = r[~r["tiny_gap"].astype(bool)]
    r = r[r["value"].notna()]
    if r.empty:
        return empty
    cols = ["task", "length_knob", "group_id", "value"]
    if metric == "normalized":
        gap = r["clean_logit_diff"] - r["corrupt_logit_diff"]
        r = r.assign(value=r["value"] * gap, den=gap)
        cols.append("den")
    per = r.groupby(["task", "length_knob", "pair_id"], sort=True).agg(
        group_id=("group_id", "first"), **{c: (c, "mean") for c in cols[3:]}
    )
    per = per.reset_index()
    return per.assign(group_id=per["group_id"].astype(str), length_knob=per["length_knob"].astype(np.int64))[cols]


def paired_rows(what: str, unit: str, f: pd.DataFrame, b: pd.DataFrame, n_boot: int, seed: int) -> list[dict]:
    """One row per task x length and per task pooled over lengths (length_knob = -1)."""
    rows = []
    for task in sorted(set(f["task"]) & set(b["task"])):
        ft, bt = f[f["task"] == task], b[b["task"] == task]
        knobs = sorted(set(ft["length_knob"]) & set(bt["length_knob"]))
        for knob in knobs + ([-1] if len(knobs) > 1 else []):
            fk = ft if knob == -1 else ft[ft["length_knob"] == knob]
            bk = bt if knob == -1 else bt[bt["length_knob"] == knob]
            if knob == -1:  # pooled over the lengths both have
                fk, bk = fk[fk["length_knob"].isin(knobs)], bk[bk["length_knob"].isin(knobs)]
            ratio = "den" in fk.columns
            dens = {"a_den": fk["den"], "b_den": bk["den"]} if ratio else {}
            d, lo, hi, g = paired_difference(
                fk["value"], fk["group_id"], bk["value"], bk["group_id"], n_boot=n_boot, seed=seed, **dens
            )
            if g == 0:
                continue
            shared = set(fk["group_id"]) & set(bk["group_id"])
            fs, bs = fk[fk["group_id"].isin(shared)], bk[bk["group_id"].isin(shared)]
            means, missing = [], []
            for name, t in (("feedback", fs), ("baseline", bs)):
                if not ratio:
                    means.append(float(t["value"].mean()))
                    continue
                ((v, *_, den_lo, _),) = group_bootstrap_ratios(
                    [t["value"]], [t["den"]], [t["group_id"]], n_boot, seed=seed, min_den=MIN_GAP
                )
                means.append(v)
                if v != v:
                    missing.append(name)
            if missing:  # a ratio over a near-zero gap is noise: no contrast
                d = lo = hi = float("nan")
            rows.append(
                {
                    "what": what,
                    "task": task,
                    "length_knob": int(knob),
                    "difference": d,
                    "ci_low": lo,
                    "ci_high": hi,
                    "n_groups": g,
                    "feedback": means[0],
                    "baseline": means[1],
                    "n_feedback": len(fs),
                    "n_baseline": len(bs),
                    "unit": unit,
                    "interval": "paired-group-bootstrap-ratio" if ratio else "paired-group-bootstrap",
                    "gap": ("no gap: " + " and ".join(missing)) if missing else ("both" if ratio else ""),
                }
            )
    return rows


def paired_table(out: Path, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Every quantity of `PROBES` and `CAUSAL` as feedback - baseline (COLUMNS), where both models have it."""
    out = Path(out)
    rows = []
    for what, (mode, depth) in PROBES.items():
        f, b = (probe_values(out, m, mode, depth) for m in MODELS)
        rows += paired_rows(what, "samples", f, b, n_boot, seed)
    for what, (exp, condition, metric) in CAUSAL.items():
        f, b = (pair_values(out, m, exp, condition, metric) for m in MODELS)
        rows += paired_rows(what, "pairs", f, b, n_boot, seed)
    return pd.DataFrame(rows, columns=COLUMNS)


def paired_settings(cfg: ReproConfig) -> dict:
    return {"n_boot": 300 if cfg.quick else N_BOOT, "seed": cfg.seed, "level": LEVEL}


def stage_paired(cfg: ReproConfig, out: Path) -> None:
    """results/paired/: paired.parquet and paired.csv (the table, with the study's seed and kind, the
    commit and both models' checkpoint hashes), paired.provenance.json."""
    out = Path(out)
    s = paired_settings(cfg)
    t = paired_table(out, s["n_boot"], s["seed"])
    sha = model_hashes(cfg, out, MODELS)
    t = t.assign(
        seed=cfg.seed,
        study=study_kind(cfg),
        feedback_sha256=sha["feedback"],
        baseline_sha256=sha["baseline"],
        commit=git_commit(),
    )
    with atomic_dir(out.joinpath(*FOLDER), force=True) as tmp:
        t.to_parquet(tmp / TABLE, index=False)
        t.to_csv(tmp / "paired.csv", index=False, float_format="%.6g")
        write_json(
            tmp / "paired.provenance.json",
            provenance(
                **s,
                interval="percentile paired group bootstrap: the groups both models share, one draw for both",
                sources={
                    **{w: f"results/probes/<model>/*/{SAMPLES_FILE} ({m}, depth {d})" for w, (m, d) in PROBES.items()},
                    **{
                        w: f"results/interventions/<model>/{e}/rows.parquet ({c}, {k})"
                        for w, (e, c, k) in CAUSAL.items()
                    },
                },
                checkpoint_sha256=sha,
                files=[TABLE, "paired.csv"],
            ),
        )


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if "baseline" not in cfg.models():  # feedback - baseline over the samples and pairs both models share
        return []
    after = [f"{kind}-{m}" for kind in ("probe", "patch") for m in cfg.models()]
    return [
        Stage(
            "paired",
            {**ck, **paired_settings(cfg), "normalized": RATIO_OF_MEANS},
            [out.joinpath(*FOLDER)],
            partial(stage_paired, cfg, out),
            after=after,
            rank=19,
        )
    ]


def report_table(out: Path) -> pd.DataFrame | None:
    """The stage's table as the report shows it (None without one): per quantity x task x length,
    feedback − baseline with its paired group-bootstrap 95 % CI, each model's mean over the shared
    groups, the groups and the values counted."""
    p = out.joinpath(*FOLDER, TABLE)
    if not p.is_file():
        return None
    rows = []
    for r in pd.read_parquet(p).itertuples():
        gap = str(getattr(r, "gap", "") or "")
        diff = (
            f"not compared ({gap}: the mean clean–corrupt gap's interval is not above {MIN_GAP})"
            if r.difference != r.difference and gap.startswith("no gap")
            else f"{signed(r.difference, 3)} (every group)"
            if r.ci_low == r.ci_high
            else f"{signed(r.difference, 3)} [{bound(r.ci_low, 3)}, {bound(r.ci_high, 3)}]"
        )
        rows.append(
            {
                "quantity": DESCRIPTION.get(r.what, r.what),
                "task": r.task,
                "length": "pooled" if r.length_knob == -1 else int(r.length_knob),
                "feedback − baseline [95% CI]": diff,
                "feedback": "no gap" if r.feedback != r.feedback else f"{r.feedback:.3f}",
                "baseline": "no gap" if r.baseline != r.baseline else f"{r.baseline:.3f}",
                "groups": int(r.n_groups),
                "values (feedback / baseline)": f"{int(r.n_feedback)} / {int(r.n_baseline)} {r.unit}",
            }
        )
    return pd.DataFrame(rows)


NOTE = (
    "Each row is the feedback model's mean minus the baseline's over the groups both models share "
    "(held-out probe predictions per sample; the swap and the zero replacement per pair; a normalized effect "
    "is each model's ratio of means over the shared pairs, compared only where both models' mean clean–corrupt "
    "gap clears 0.1), with a "
    "percentile group-bootstrap 95 % CI that draws the shared groups once and applies the draw to both "
    "models, so what a group shifts in both cancels (docs/statistics.md). `pooled` takes a group's values "
    "at every length together; `(every group)`: every resample gave the same difference, so there is no "
    "interval to show."
)


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    """The section *Feedback − baseline, paired* where the study has the `paired` table."""
    t = report_table(out)
    return [] if t is None else [Section("Feedback − baseline, paired", NOTE + "\n\n" + md_table(t))]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    """Each quantity's feedback − baseline per task (pooled over lengths, or its one length) as headline
    rows of model `feedback-baseline`: the seeds table then gives every seed's paired difference, so the
    rule `paired` is applied seed by seed."""
    p = out.joinpath(*FOLDER, TABLE)
    if not p.is_file():
        return headline_frame([], {})
    t = pd.read_parquet(p)
    rows = []
    for (what, task), g in t.groupby(["what", "task"], sort=True):
        r = g[g["length_knob"] == -1] if (g["length_knob"] == -1).any() else g
        if len(r) != 1:  # several lengths and no pooled row: no one number stands for the task
            continue
        r = r.iloc[0]
        rows.append(
            (
                PAIRED_MODEL,
                f"paired-{what}",
                task,
                "paired",
                r["difference"],
                r["ci_low"],
                r["ci_high"],
                int(r["n_groups"]),
            )
        )
    return headline_frame(rows, model_hashes(cfg, out, MODELS))


PART = Part("paired", stages=stages, sections=sections, headline=headline, criteria=("paired",))
