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
from fbt_probe.reproduce.config import EXPERIMENTS, RATIO_OF_MEANS, RECURRENT_1, ReproConfig, model_path
from fbt_probe.reproduce.part import (
    MODEL_WORDS,
    Part,
    Section,
    headline_frame,
    md_table,
    model_hashes,
    study_model,
    trained_stages,
)
from fbt_probe.reproduce.parts.evaluation import learned
from fbt_probe.reproduce.seeds import per_seed, quote
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import (
    PAIRED_TABLE,
    _summary,
    paired_clause,
    per_length,
    summary_number,
    swap_effect,
    swap_pairs,
    swap_ratio_pairs,
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
            # "normalized": a summary's normalized effect is a ratio of means over pairs (the stage's tables changed)
            {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs, "normalized": RATIO_OF_MEANS},
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


SWAP_Q = "swap-normalized"  # the pooled effect; per length f"{SWAP_Q}-length-{k}", the slope f"{SWAP_Q}-slope"
FOLLOWS_Q = "swap-follows-label-"  # + the receiving sample's label: the share whose answer follows the swap
NEEDED_Q = {  # the runs without the state's information (rule `redundancy`) and the zero input it quotes
    "bypass": ("gate-ablation", "bypass", "bypass-accuracy"),
    "mean": ("state-replacement", "mean", "mean-state-accuracy"),
    "zero": ("state-replacement", "zero", "zero-input-accuracy"),
}


def trend_numbers_of(out: Path, model: str, task: str) -> dict | None:
    """This seed's trend numbers of the swap's normalized effect (a ratio of means per length)."""
    pairs = swap_ratio_pairs(out, model, task)
    return rules.trend_numbers(pairs) if len(pairs) else None


def seed_trends(cfg: ReproConfig, out: Path, task: str, seeds) -> dict[int, dict | None]:
    """{seed: trend numbers}: this study's from its pairs, the others from their headline rows (the
    per-length effects and the slope with its interval; a seed without the slope gets none)."""
    found: dict[int, dict | None] = {}
    table = seeds if seeds is not None else None
    if table is not None and len(table):
        rows = table[(table["model"] == "feedback") & (table["task"] == task)]
        for s, g in rows.groupby("seed"):
            per = g[g["quantity"].str.startswith(f"{SWAP_Q}-length-")]
            if per.empty:
                found[int(s)] = None
                continue
            means = {int(q.rsplit("-", 1)[1]): float(v) for q, v in zip(per["quantity"], per["value"])}
            slope = g[g["quantity"] == f"{SWAP_Q}-slope"]
            n = per["n_groups"].max() if "n_groups" in per else float("nan")
            found[int(s)] = {
                "means": dict(sorted(means.items())),
                "slope": None
                if slope.empty
                else tuple(float(x) for x in slope.iloc[0][["value", "ci_low", "ci_high"]]),
                "groups": None if n != n else int(n),
            }
    own = trend_numbers_of(out, "feedback", task)
    if own is not None:
        found[cfg.seed] = own
    return dict(sorted(found.items()))


def swap_sentences(cfg: ReproConfig, out: Path, task: str, seeds, answers: bool = True) -> list[str]:
    """The feedback swap on `task`: the normalized effect pooled and per length, each the mean over the
    training seeds, and how it changes with length (rule `trend`, seed by seed), the answer per swap
    direction (rule `directions`), and whether the state is needed (rule `redundancy`, only where the
    model answers the task)."""
    summary = _summary(out, "feedback", "feedback-swap")
    lengths = per_length(summary, task, "state")
    eff = swap_effect(out, "feedback", task)
    if lengths.empty and eff is None:
        return []

    def q(quantity: str, own: tuple) -> str:
        said = quote(seeds, "feedback", quantity, task, RECURRENT_1, cfg.seed, own)
        return "no effect (the pairs' mean clean–corrupt gap does not clear 0.1)" if said == "n/a" else said

    per = []
    for r in lengths.itertuples():
        groups = int(getattr(r, "n_groups", r.n_pairs))
        number = q(f"{SWAP_Q}-length-{int(r.length_knob)}", (r.mean, r.ci_low, r.ci_high, groups))
        per.append(f"{number} at length {int(r.length_knob)} ({groups} groups)")
    by_length = ", ".join(per)
    pooled = "" if eff is None else f"{q(SWAP_Q, eff)} pooled over lengths"
    trends = {
        s: None if n is None else rules.trend_verdict("the effect", n)
        for s, n in seed_trends(cfg, out, task, seeds).items()
    }
    t = rules.stated(trends, cfg.seed, "With length, the effect") if trends else None
    line = (
        f"Swapping the carried state at the final position with the partner sample's moves {task}'s answer by a "
        f"normalized {pooled}{'; by length, ' if pooled and by_length else ''}{by_length} (a ratio of means over "
        "pairs, mean(patched − corrupt) / mean(clean − corrupt): 1 = the answer follows the swapped-in state, 0 = "
        "ignores it; group-bootstrap 95 % CI, the pairs of one group resampled together; Fig. "
        "*ablation-bars-feedback*)"
        + (f". {t.sentence[0].upper()}{t.sentence[1:]}" if t is not None and t.verdict != "single-length" else "")
        + "."
    )
    lines = [line]
    contrast = paired_clause(
        out, task, (("swap-normalized", "the normalized effect"), ("swap-accuracy", "the swap accuracy")), cfg, seeds
    )
    if contrast:
        lines.append(
            f"Against the same swap on the no-feedback baseline, over the pairs both models share on {task}: "
            + contrast
            + f" ({PAIRED_TABLE})."
        )
    follows = swap_pairs(out, "feedback", task, "accuracy", by_label=True)
    if len(follows):
        rates = rules.direction_rates(follows)
        keys = {lab: ("feedback", f"{FOLLOWS_Q}{lab}", task, RECURRENT_1) for lab in rates}
        verdicts = {
            s: None if n is None else rules.directions_verdict(n, "the answer")
            for s, n in per_seed(seeds, keys, cfg.seed, rates).items()
        }
        d = rules.stated(
            verdicts, cfg.seed, f"Per swap direction on {task}, whether the answer follows the swapped-in state"
        )
        lead = "" if len(verdicts) > 1 else f"Per swap direction on {task}, "
        lines.append(f"{lead}{d.sentence} (Wilson 95 % CI with n = groups).")
    if answers:  # whether the state is needed means something only where the model answers the task
        own = {k: summary_number(out, "feedback", exp, task, cond) for k, (exp, cond, _) in NEEDED_Q.items()}
        if own["bypass"] is not None or own["mean"] is not None:
            keys = {k: ("feedback", q_, task, RECURRENT_1) for k, (_, _, q_) in NEEDED_Q.items() if own[k] is not None}
            verdicts = {
                s: None if n is None else rules.redundancy(task, n.get("bypass"), n.get("mean"), n.get("zero"))
                for s, n in per_seed(seeds, keys, cfg.seed, {k: v for k, v in own.items() if v is not None}).items()
            }
            v = rules.stated(
                verdicts,
                cfg.seed,
                f"Whether {task}'s answer needs the carried state (read from the gate bypassed and the mean state; "
                "the fused input set to zero erases the token as well)",
            )
            lines.append(v.sentence[0].upper() + v.sentence[1:] + " (table *Causal experiments*).")
    return lines


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    lines = []
    for task in [t for t in ("completion", "memory") if t in cfg.modes]:
        lines += swap_sentences(cfg, out, task, seeds, learned(out, "feedback", task))
    for task in [t for t in cfg.modes if t.startswith("registers") and learned(out, "feedback", t)]:
        lines += swap_sentences(cfg, out, task, seeds)
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
            "accuracy with the replacement (under `soft` decoding for the gate rows). The fused input "
            "RMSNorm((W_U h) ⊙ σ(W_G e)) *replaces* the token embedding, so the state replaced by zeros (`zero`) sets "
            "the fused input to zero and erases the token as well, as the gate set to zero does (the same intervention, "
            "drawn once) and the gate set to ones erases the token's gate; whether the state is *needed* is read from "
            "the gate `bypass` (the plain token input, no state) and the `mean` state. Pairs whose clean–corrupt gap is "
            "below 0.1 are left out of `normalized` (counted), which is a ratio of means over the kept pairs, "
            "mean(patched − corrupt) / mean(clean − corrupt), given where their mean gap clears 0.1. One row per length; "
            "`normalized` has a normal group-bootstrap 95 % CI (the pairs of one group resampled together), `accuracy` a "
            "Wilson 95 % CI with n = groups (docs/statistics.md).\n\n" + md_table(causal_table(out, cfg.models())),
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
            rows.append((m, SWAP_Q, task, RECURRENT_1, *eff))
            for r in per_length(_summary(out, m, "feedback-swap"), task, "state").itertuples():
                rows.append(
                    (
                        m,
                        f"{SWAP_Q}-length-{int(r.length_knob)}",
                        task,
                        RECURRENT_1,
                        r.mean,
                        r.ci_low,
                        r.ci_high,
                        r.n_groups,
                    )
                )
            if m != "feedback":
                continue
            t = trend_numbers_of(out, m, task)
            if t is not None and t["slope"] is not None:
                rows.append((m, f"{SWAP_Q}-slope", task, RECURRENT_1, *t["slope"], t["groups"]))
            follows = swap_pairs(out, m, task, "accuracy", by_label=True)
            if len(follows):
                for lab, r in rules.direction_rates(follows).items():
                    rows.append((m, f"{FOLLOWS_Q}{lab}", task, RECURRENT_1, *r))
            for exp, cond, q in NEEDED_Q.values():
                n = summary_number(out, m, exp, task, cond)
                if n is not None:
                    rows.append((m, q, task, RECURRENT_1, *n))
    return headline_frame(rows, model_hashes(cfg, out))


CAPTIONS = {
    "ablation-bars": (
        "Normalized effect of each intervention on the answer, a ratio of means over pairs (feedback swap: 1 = the "
        "answer follows the swapped-in state, 0 = it ignores it; state replacement / gate ablation: 1 = no effect, 0 = "
        "behaves like the partner), group-bootstrap 95 % CIs, one colour per task. Each bar is named for what it does: "
        "the fused input set to zero erases the token as well (the zero gate is the same intervention and is drawn "
        "once); the bypass (plain input, no state) and the mean state remove the state's information alone. A × "
        "replaces a bar whose CI is too wide to read (note under the panels)."
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
