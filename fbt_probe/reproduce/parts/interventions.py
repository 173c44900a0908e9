"""Is the carried state used (stage `patch-*`): the exact causal experiments over the minimal pairs
(feedback swap, state replacement, gate ablation, residual patching, probe-direction erasure and
steering) on both models; the findings on the swap and on replacing the state, the table *Causal
tests* and the ablation, patching and decodable-versus-used figures."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.registry import EXPERIMENTS as REGISTRY
from fbt_probe.interventions.registry import PatchConfig, options_for
from fbt_probe.loading import checkpoint_hash, load_pairs
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import EXPERIMENTS, RECURRENT_1, ReproConfig, model_path
from fbt_probe.reproduce.part import MODEL_WORDS, Part, Section, headline_frame, md_table, study_model, trained_stages
from fbt_probe.reproduce.parts.evaluation import learned
from fbt_probe.reproduce.seeds import spread
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import (
    PAIRED_TABLE,
    _summary,
    paired_clause,
    per_length,
    replacement_accuracy,
    swap_by_length,
    swap_effect,
    swap_pairs,
)


def stage_patch(cfg: ReproConfig, out: Path, name: str) -> None:
    path = model_path(cfg, out, name)
    model = study_model(cfg, out, name)
    df = load_pairs(out / "data", tasks=set(cfg.patch_knobs))
    keep = [int(k) in cfg.patch_knobs[t] for t, k in zip(df["task"], df["length_knob"])]
    df = df[keep].reset_index(drop=True).__finalize__(df)  # each task at its own lengths
    info = {"model": str(path), "checkpoint_sha256": checkpoint_hash(path)}
    lengths = tuple(sorted({k for ks in cfg.patch_knobs.values() for k in ks}))
    study = dict(last_k=3 if cfg.quick else 4, scales=(1.0, 4.0), n_folds=4)  # the 15-minute study's budget
    pcs = [
        PatchConfig(
            experiment=exp,
            modes=REGISTRY[exp].study_modes,
            options=options_for(exp, **study),  # each takes the knobs it declares
            max_pairs=cfg.patch_pairs,
            lengths=lengths,
            seed=cfg.seed,
            n_boot=300 if cfg.quick else 1000,
        )
        for exp in EXPERIMENTS
    ]
    # one call: the final-position experiments share each batch's prefill (the same tables as one by one)
    run_several(
        model, df, pcs, out=out / "results" / "interventions" / name, force=True, model_info=info, figures=False
    )


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    return [
        Stage(
            f"patch-{name}",
            {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs},
            [out / "results" / "interventions" / name],
            partial(stage_patch, cfg, out, name),
            after=["data"] + trained_stages(cfg, name),
            rank=18,
        )
        for name in cfg.models()
    ]


def figures(cfg: ReproConfig, out: Path) -> list:
    jobs = []
    for n in cfg.models():
        words = {"model_label": MODEL_WORDS.get(n, n)}
        abl = [
            s
            for s in (_summary(out, n, e) for e in ("feedback-swap", "state-replacement", "gate-ablation"))
            if s is not None
        ]
        if abl:  # every task of the study is accounted for: one the causal experiments leave out is marked as such
            jobs.append(
                (
                    f"ablation-bars-{n}",
                    "ablation-bars",
                    pd.concat(abl, ignore_index=True),
                    {"tasks": ",".join(cfg.knobs), **words},
                )
            )
        for exp, fig, stem in (
            ("residual", "patching-heatmap", "patching"),
            ("probe-direction", "decodable-vs-used", "decodable-vs-used"),
        ):
            s = _summary(out, n, exp)
            if s is not None:
                jobs.append((f"{stem}-{n}", fig, s, words))
    return jobs


def swap_sentences(out: Path, task: str, seeds, answers: bool = True) -> list[str]:
    """The feedback swap on `task`: the normalized effect per length and how it changes with length
    (rule `trend`), the answer per swap direction (rule `directions`), zero replacement beside it
    (rule `redundancy`, only where the model answers the task)."""
    by_length = swap_by_length(out, "feedback", task)
    if not by_length:
        return []
    norm = swap_pairs(out, "feedback", task, "normalized")
    t = rules.trend(norm, "the effect") if len(norm) else None
    # the seeds table holds the pooled effect, so its spread follows the pooled number, named as such
    eff = swap_effect(out, "feedback", task)
    pooled = "" if eff is None else f"; pooled over lengths {rules.fmt(*eff)}"
    line = (
        f"Swapping the carried state at the final position with the partner sample's moves {task}'s answer by a "
        f"normalized {by_length}{pooled}{spread(seeds, 'feedback', 'swap-effect', task, RECURRENT_1)} (1 = the answer "
        "follows the swapped-in state, 0 = ignores it; group-bootstrap 95 % CI, the pairs of one group resampled "
        "together; Fig. *ablation-bars-feedback*)"
        + (f"; {t.sentence}" if t is not None and t.verdict != "single-length" else "")
        + "."
    )
    lines = [line]
    contrast = paired_clause(
        out, task, (("swap-normalized", "the normalized effect"), ("swap-accuracy", "the swap accuracy"))
    )
    if contrast:
        lines.append(
            f"Against the same swap on the no-feedback baseline, over the pairs both models share on {task}, "
            + contrast
            + f" ({PAIRED_TABLE})."
        )
    follows = swap_pairs(out, "feedback", task, "accuracy", by_label=True)
    if len(follows):
        d = rules.directions(follows, "the answer")
        lines.append(f"Per swap direction on {task}, {d.sentence} (Wilson 95 % CI with n = groups).")
    zero = replacement_accuracy(out, "feedback", task)
    if zero is not None and answers:  # redundancy means something only where the model answers the task
        mean = replacement_accuracy(out, "feedback", task, "mean")
        v = rules.redundancy(zero, None if eff is None else eff[0], task, mean)
        lines.append(v.sentence[0].upper() + v.sentence[1:] + " (table *Causal experiments*).")
    return lines


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    lines = []
    for task in [t for t in ("completion", "memory") if t in cfg.modes]:
        lines += swap_sentences(out, task, seeds, learned(out, "feedback", task))
    for task in [t for t in cfg.modes if t.startswith("registers") and learned(out, "feedback", t)]:
        lines += swap_sentences(out, task, seeds)
    return lines


def causal_table(out: Path, models: list[str]) -> pd.DataFrame:
    """One row per model × experiment × condition × decoding × task × length: normalized effect (mean
    [group-bootstrap 95 % CI]) and answer accuracy (share [Wilson 95 % CI, n = groups]), and the
    pairs and groups counted (docs/statistics.md)."""
    rows = []
    for n in models:
        for exp in ("feedback-swap", "state-replacement", "gate-ablation"):
            s = _summary(out, n, exp)
            if s is None:
                continue
            s = s[(s["length_knob"] != -1) & s["metric"].isin(["normalized", "accuracy"])]
            for keys, g in s.groupby(["condition", "decoding", "task", "length_knob"], sort=True):
                cell = {
                    "model": n,
                    "experiment": exp,
                    "condition": keys[0],
                    "decoding": keys[1],
                    "task": keys[2],
                    "length": int(keys[3]),
                }
                for r in g.itertuples():
                    cell[r.metric] = "n/a" if pd.isna(r.mean) else f"{r.mean:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
                    if r.metric == "normalized":
                        cell["pairs (tiny gap)"] = f"{int(r.n_pairs)} ({int(r.n_excluded)})"
                        cell["groups"] = int(getattr(r, "n_groups", r.n_pairs))
                rows.append(cell)
    cols = [
        "model",
        "experiment",
        "condition",
        "decoding",
        "task",
        "length",
        "normalized",
        "accuracy",
        "pairs (tiny gap)",
        "groups",
    ]
    return pd.DataFrame(rows).reindex(columns=cols).fillna("")


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    pick = lambda prefix: [f for f in figs if f.startswith(prefix)]  # noqa: E731
    return [
        Section(
            "Causal tests: is the carried state used?",
            "Metric: logit difference between the two label words at the final "
            "position; normalized = `(patched − corrupt)/(clean − corrupt)`. **Feedback swap** (run a sample with its "
            "partner's carried state, value or gate at the final position): 1 = the answer fully follows the swapped-in "
            "state, 0 = it ignores it (`gate` is an exact no-op control: both samples end in the same token). **State "
            "replacement / gate ablation** (noising): 1 = no effect, 0 = behaves like the partner; `accuracy` is the answer "
            "accuracy with the replacement (under `soft` decoding for the gate rows). Pairs whose clean–corrupt gap is "
            "below 0.1 are left out of `normalized` (counted). One row per length; `normalized` has a group-bootstrap "
            "95 % CI (the pairs of one group resampled together), `accuracy` a Wilson 95 % CI with n = groups "
            "(docs/statistics.md).\n\n" + md_table(causal_table(out, cfg.models())),
            pick("ablation-bars") + pick("patching") + pick("decodable-vs-used"),
        )
    ]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    rows = []
    for m in cfg.models():
        for task in [t for t in cfg.modes if t in ("completion", "memory") or t.startswith("registers")]:
            eff = swap_effect(out, m, task)
            if eff is None:
                continue
            rows.append((m, "swap-effect", task, RECURRENT_1, *eff))
            for r in per_length(_summary(out, m, "feedback-swap"), task, "state").itertuples():
                rows.append(
                    (m, f"swap-effect-length-{int(r.length_knob)}", task, RECURRENT_1, r.mean, r.ci_low, r.ci_high)
                )
    return headline_frame(rows, {m: checkpoint_hash(model_path(cfg, out, m)) for m in cfg.models()})


CAPTIONS = {
    "ablation-bars": (
        "Mean normalized effect of each intervention on the answer (feedback swap: 1 = the answer follows the "
        "swapped-in state, 0 = it ignores it; state replacement / gate ablation: 1 = no effect, 0 = behaves like the "
        "partner), group-bootstrap 95 % CIs, one colour per task. A × replaces a bar whose CI is too wide to read "
        "(note under the panels)."
    ),
    "patching": (
        "Exact residual patching: each cell is the mean normalized effect of patching one depth (row) at one "
        "position (column); denoising 1 = the clean answer restored, noising 0 = the answer destroyed. The columns "
        "are the last positions and the position where the pair's two samples differ ('differs'); cells outside "
        "[0, 1] carry their value."
    ),
    "decodable-vs-used": (
        "Per task and mode, by depth: probe accuracy (decodable, blue) against how far the answer moves when the "
        "probe direction is erased (1 − normalized: 0 = not at all, 1 = as far as the partner's answer); dotted: "
        "probe accuracy after erasure. Decodable but unused shows as high accuracy with an effect near 0; a band "
        "cut at the axis has its end written there."
    ),
}

PART = Part(
    "interventions",
    stages=stages,
    figures=figures,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("trend", "directions", "redundancy"),
)
