"""Decodability (stages `extract-*`, `probe-*`; Fig. 7a / 7b): the final-position residual stream
at every depth under each prefill mode, grouped-CV linear probes per depth, the probe on the carried
state itself and the depth-0 reading across probe variants; the findings on depth-0 decodability
against the untrained-fusion baseline, and on the register tasks by mode."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.activations import extract
from fbt_probe.io import atomic_path, read_json
from fbt_probe.probes.robustness import pooled_by_variant, robustness
from fbt_probe.probes.sweep import ProbeConfig, probe_sweep, write_results
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import EXTRACT_BATCH, RECURRENT_1, STANDARD, ReproConfig, model_path
from fbt_probe.reproduce.part import (
    MODEL_WORDS,
    PAIRED_MODEL,
    Part,
    Section,
    headline_frame,
    md_table,
    model_hashes,
    trained_stages,
)
from fbt_probe.reproduce.parts.evaluation import learned
from fbt_probe.reproduce.seeds import per_seed, quote
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import (
    DEPTH0_CI,
    PAIRED_MODEL_ROWS,
    PAIRED_TABLE,
    PAPER_DEPTH0,
    answer_accuracy,
    carried_state_number,
    depth0,
    depth0_modes,
    depth0_number,
    depth0_scope,
    depth_mean_number,
    paired_clause,
    paired_diff,
    pooled_accuracy,
    probe_depths,
    setting,
    variant_range,
)
from fbt_probe.tasks.generators import suffix_modes

DEPTHS_Q = "depth1-L-decodability"  # headline: probe accuracy over depths 1..L (Fig. 7b's rule)
ROBUSTNESS_TASKS = ("completion", "memory")  # Fig. 7a's tasks: depth 0 under recurrent:1 across probe variants


def task_modes(cfg: ReproConfig, out: Path, task: str) -> list[str]:
    """The task's modes, the paper's register suffixes mapped to this tokenizer's token counts."""
    mapping = suffix_modes(read_json(out / "data" / f"{task}.manifest.json"))
    return list(dict.fromkeys(mapping.get(m, m) for m in cfg.modes[task]))


def stage_extract(cfg: ReproConfig, out: Path, name: str) -> None:
    for task in cfg.modes:
        extract(
            str(model_path(cfg, out, name)),
            out / "data" / f"{task}.parquet",
            task_modes(cfg, out, task),
            out / "acts" / name / task,
            force=True,
            batch_size=cfg.extract_batch(),
            device=cfg.device,
        )


def stage_probe(cfg: ReproConfig, out: Path, name: str) -> None:
    """Each task's sweep (with its per-sample held-out correctness, `probes_samples.parquet`, what
    the `paired` stage pairs across models) and every task's table in one `probes.parquet`."""
    tables = []
    for task in cfg.modes:
        res = probe_sweep(out / "acts" / name / task, ProbeConfig(seed=cfg.seed))
        write_results(res, out / "results" / "probes" / name / task, force=True)
        tables.append(res.table)
    with atomic_path(out / "results" / "probes" / name / "probes.parquet") as tmp:
        pd.concat(tables, ignore_index=True).to_parquet(tmp, index=False)
    panel = [
        robustness(out / "acts" / name / task, RECURRENT_1, 0, ProbeConfig(seed=cfg.seed))
        for task in ROBUSTNESS_TASKS
        if task in cfg.modes
    ]
    if panel:
        with atomic_path(out / "results" / "probes" / name / "robustness.parquet") as tmp:
            pd.concat(panel, ignore_index=True).assign(model=name).to_parquet(tmp, index=False)


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    st = []
    # the default batch adds nothing to the key, so a study at the default size keeps its stage key
    batch = {} if cfg.extract_batch() == EXTRACT_BATCH else {"batch": cfg.extract_batch()}
    for name in cfg.models():
        st.append(
            Stage(
                f"extract-{name}",
                {**ck, "modes": cfg.modes, **batch},
                [out / "acts" / name],
                partial(stage_extract, cfg, out, name),
                after=["data"] + trained_stages(cfg, name),
                rank=10,
            )
        )
        st.append(
            Stage(
                f"probe-{name}",
                {**ck, "outputs": "per-sample"},  # a study whose probes wrote no per-sample table redoes them
                [out / "results" / "probes" / name],
                partial(stage_probe, cfg, out, name),
                after=[f"extract-{name}"],
                rank=16,
            )
        )
    return st


def figures(cfg: ReproConfig, out: Path) -> list:
    probes = {n: pd.read_parquet(out / "results" / "probes" / n / "probes.parquet") for n in cfg.models()}
    base, jobs = probes.get("baseline"), []
    for n, t in probes.items():
        words = {"model_label": MODEL_WORDS.get(n, n)}
        opts = {"baseline": base, **words} if (n == "feedback" and base is not None) else words
        if {"completion", "memory"} & set(t["task"]):
            jobs.append((f"fig7a-{n}", "fig7a", t, opts))
        if {"registers", "registers-count"} & set(t["task"]):
            jobs.append((f"fig7b-{n}", "fig7b", t, words))
    return jobs


VARIANT_Q = ("depth0-variant-min", "depth0-variant-max")  # headline rows of the robustness panel's range


def _variants_sentence(cfg: ReproConfig, out: Path, task: str, seeds) -> str:
    """Rule `probe-variants` on each seed's range of the depth-0 reading over probe variants, both models."""
    keys = {f"{m}-{q}": (m, q, task, RECURRENT_1) for m in ("baseline", "feedback") for q in VARIANT_Q}
    b, f = variant_range(out, "baseline", task), variant_range(out, "feedback", task)
    own = None
    if b is not None and f is not None:
        n = depth0_number(out, "baseline", task, RECURRENT_1)[3]
        own = {
            f"{m}-{q}": (r[i], float("nan"), float("nan"), n)
            for m, r in (("baseline", b), ("feedback", f))
            for i, q in enumerate(VARIANT_Q)
        }
    verdicts = {
        s: None
        if nums is None
        else rules.probe_dependence(
            (nums["baseline-depth0-variant-min"][0], nums["baseline-depth0-variant-max"][0]),
            (nums["feedback-depth0-variant-min"][0], nums["feedback-depth0-variant-max"][0]),
            nums["baseline-depth0-variant-min"][3],
        )
        for s, nums in per_seed(seeds, keys, cfg.seed, own).items()
    }
    if not any(v is not None for v in verdicts.values()):
        return ""
    v = rules.stated(
        verdicts,
        cfg.seed,
        "The depth-0 reading across probe variants (standardised or raw features, C from 0.01 to 10)",
    )
    return f" {v.sentence} (table *Robustness of depth-0 decodability*)."


def fig7a_findings(cfg: ReproConfig, out: Path, task: str, seeds) -> list[str]:
    """Depth-0 decodability of `task` under `recurrent:1` and `standard`, Fig. 7a's verdict against the
    untrained-fusion control, the read-out of h(T-1), and the control beside it; every number the mean
    over the training seeds, every verdict stated where it holds on every seed."""
    lines, models = [], cfg.models()
    rec, std = depth0_number(out, "feedback", task, RECURRENT_1), depth0(out, "feedback", task, STANDARD)
    if rec[0] == rec[0]:
        paper = PAPER_DEPTH0.get(task)
        q = lambda m, mode, own: quote(seeds, m, "depth0-decodability", task, mode, cfg.seed, own)  # noqa: E731
        keys = {
            "rec": ("feedback", "depth0-decodability", task, RECURRENT_1),
            "gap": (PAIRED_MODEL, "paired-depth0-recurrent:1", task, PAIRED_MODEL_ROWS),
        }
        own = {"rec": rec, "gap": paired_diff(out, "depth0-recurrent:1", task)}
        by_seed = per_seed(seeds, keys, cfg.seed, {k: v for k, v in own.items() if v is not None})
        verdicts = {s: None if n is None else rules.fig7a(task, n["rec"], n["gap"], paper) for s, n in by_seed.items()}
        if own["gap"] is None:  # no control measured here: nothing to contrast this seed's reading with
            verdicts[cfg.seed] = rules.fig7a(task, rec, None, paper)
        v = rules.stated(verdicts, cfg.seed, f"Fig. 7a on {task}, as a contrast with the untrained-fusion control")
        lines.append(
            f"At depth 0, {task}'s label is linearly decodable at {q('feedback', RECURRENT_1, rec)} after one "
            f"recurrent prefill step (`recurrent:1`) against {q('feedback', STANDARD, std)} under standard prefill, "
            "chance by construction (every sample ends in the same token)"
            + (f" (paper: {paper:.3f} and chance, on its 1B general language model)" if paper else "")
            + f"; {depth0_scope(out, 'feedback', task)}; {DEPTH0_CI} (Fig. 7a). "
            + setting(cfg)
            + f" {v.sentence[0].upper()}{v.sentence[1:]}."
        )
        carried = {m: carried_state_number(out, m, task) for m in models}
        pairs = {m: (depth0_number(out, m, task, RECURRENT_1), c) for m, c in carried.items() if c[0] == c[0]}
        if pairs:
            keys = {
                f"{m}-{k}": (m, q_, task, mode)
                for m in pairs
                for k, q_, mode in (
                    ("depth0", "depth0-decodability", RECURRENT_1),
                    ("carried", "carried-state-decodability", "carried-state"),
                )
            }
            own = {f"{m}-{k}": v for m, (d, c) in pairs.items() for k, v in (("depth0", d), ("carried", c))}
            verdicts = {
                s: None if n is None else rules.readout(task, {m: (n[f"{m}-depth0"], n[f"{m}-carried"]) for m in pairs})
                for s, n in per_seed(seeds, keys, cfg.seed, own).items()
            }
            ro = rules.stated(verdicts, cfg.seed, f"On {task}, whether depth 0 under `recurrent:1` reads h(T-1)")
            gaps = paired_clause(
                out,
                task,
                (("depth0-recurrent:1", "at depth 0"), ("carried-state", "on h(T-1) itself")),
                cfg,
                seeds,
            )
            lines.append(
                ro.sentence
                + " (Fig. 7a's carried-state line)."
                + (f" Over the samples both models share: {gaps} ({PAIRED_TABLE})." if gaps else "")
            )
    if "baseline" in models:
        b = depth0(out, "baseline", task, RECURRENT_1)
        gap = paired_clause(out, task, (("depth0-recurrent:1", "The gap to the feedback model"),), cfg, seeds)
        if b[0] == b[0]:
            lines.append(
                f"The baseline, whose fusion weights were never trained, reads "
                f"{quote(seeds, 'baseline', 'depth0-decodability', task, RECURRENT_1, cfg.seed, b)} at depth 0 under "
                f"`recurrent:1` on {task}: a random map of a state that already encodes the label, so "
                "decodability alone does not show that the feedback was learned (Fig. 7a, dashed)."
                + (f" {gap} ({PAIRED_TABLE})." if gap else "")
                + _variants_sentence(cfg, out, task, seeds)
            )
    return lines


def register_findings(cfg: ReproConfig, out: Path, task: str, seeds) -> list[str]:
    """Fig. 7b in words for a register task the feedback model answers: depth-0 decodability of the
    answer under each mode, the baseline's `recurrent:1` beside it, and the modes over depth."""
    modes = depth0_modes(cfg, out, "feedback", task)
    if not modes:
        return []
    parts = [
        f"{quote(seeds, 'feedback', 'depth0-decodability', task, mode, cfg.seed, depth0(out, 'feedback', task, mode))}"
        f" under `{mode}`"
        for mode in modes
    ]
    line = (
        f"At depth 0, the {task} answer is linearly decodable at "
        + ", ".join(parts)
        + f" ({depth0_scope(out, 'feedback', task, modes[0])}; {DEPTH0_CI}; Fig. 7b)."
    )
    if "baseline" in cfg.models():
        b = depth0(out, "baseline", task, RECURRENT_1)
        if b[0] == b[0]:
            line += (
                f" The baseline, whose fusion was never trained, reads "
                f"{quote(seeds, 'baseline', 'depth0-decodability', task, RECURRENT_1, cfg.seed, b)} under `recurrent:1`."
            )
            gap = paired_clause(out, task, (("depth0-recurrent:1", "The gap to the feedback model"),), cfg, seeds)
            line += f" {gap} ({PAIRED_TABLE})." if gap else ""
    lines = [line]
    depths = deeper(out, task)  # Fig. 7b's claim is about the layers above the input
    if depths:
        keys = {m: ("feedback", DEPTHS_Q, task, m) for m in modes}
        own = {m: depth_mean_number(out, "feedback", task, m, depths) for m in modes}
        has_eval = (out / "eval" / "accuracy.parquet").is_file()
        full = answer_accuracy(out, "feedback", task, "full") if has_eval else (0, 0, 0, 0, 0)
        if full[3]:
            keys["answer"] = ("feedback", "answer-accuracy", task, "full")
            own["answer"] = (*full[:3], full[4])
        verdicts = {
            s: None if n is None else rules.fig7b(task, {m: n[m] for m in modes}, n.get("answer"))
            for s, n in per_seed(seeds, keys, cfg.seed, own).items()
        }
        v = rules.stated(verdicts, cfg.seed, f"Fig. 7b on {task} (table *Probe accuracy over depths 1..L*)")
        lines.append(v.sentence + ".")
    return lines


def deeper(out: Path, task: str) -> list[int]:
    """The probe depths above the input (1..L) of the feedback model on `task`: Fig. 7b's depths."""
    return sorted(set(probe_depths(out, "feedback", task)) - {0})


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    lines = []
    for task in [t for t in ("completion", "memory") if t in cfg.modes]:
        lines += fig7a_findings(cfg, out, task, seeds)
    regs = [t for t in cfg.modes if t.startswith("registers")]
    dead = [t for t in regs if not learned(out, "feedback", t)]
    if dead:
        lines.append(
            f"{' and '.join(dead).capitalize()}: the feedback model's answer accuracy (seed {cfg.seed}) is not above "
            "chance (the first findings give every seed's), so Fig. 7b's panels probe a model that has not learned "
            "the task; a flat line there says nothing about what latent feedback can carry."
        )
    for task in [t for t in regs if t not in dead]:
        lines += register_findings(cfg, out, task, seeds)
    return lines


def _pooled(r: dict) -> str:
    """A `pooled_accuracy` record as 'value [low, high]'."""
    if r["value"] != r["value"]:
        return ""
    if r["ci_low"] != r["ci_low"]:
        return f"{r['value']:.3f}"
    return f"{r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def depth0_table(out: Path, models: list[str]) -> pd.DataFrame:
    """Depth-0 probe accuracy per task × mode, pooled over the length × fold cells (correct over
    tested samples; Wilson 95 % CI with n = the distinct groups), the lengths and groups it pools,
    the fold spread (min–max over the cells), the majority baseline and the paper's value."""
    rows = []
    for n in models:
        t = pd.read_parquet(out / "results" / "probes" / n / "probes.parquet")
        t = t[t["depth"].isin([0, -1]) | (t["mode"] == "carried-state")]
        for (task, mode), g in t.groupby(["task", "mode"]):
            acc = g[g["metric"] == "accuracy"]
            maj = g[g["metric"] == "majority_baseline"]["value"].to_numpy()
            ctl = g[g["metric"] == "control_accuracy"]["value"].to_numpy()
            r = pooled_accuracy(out, acc, task)
            paper = PAPER_DEPTH0.get(task) if mode == RECURRENT_1 else (0.5 if mode == STANDARD else None)
            rows.append(
                {
                    "model": n,
                    "task": task,
                    "mode": mode,
                    "depth-0 accuracy [95% CI]": _pooled(r),
                    "lengths": ",".join(map(str, r["lengths"])),
                    "samples (groups)": f"{r['n']} ({r['groups']})",
                    "cell spread": f"{acc['value'].min():.3f}–{acc['value'].max():.3f}" if len(acc) else "",
                    "majority baseline": f"{maj.mean():.3f}" if len(maj) else "",
                    "control task": f"{ctl.mean():.3f}" if len(ctl) else "",
                    "paper": "" if paper is None else (f"{paper:.3f}" + (" (chance)" if mode == STANDARD else "")),
                }
            )
    return pd.DataFrame(rows)


def robustness_table(out: Path, models: list[str]) -> pd.DataFrame:
    """Model × task rows, one column per probe variant: pooled accuracy (control accuracy)."""
    rows = []
    for n in models:
        p = out / "results" / "probes" / n / "robustness.parquet"
        if not p.is_file():
            continue
        t = pd.read_parquet(p)
        for task, g in t.groupby("task", sort=False):
            row = {"model": n, "task": task}
            for v in pooled_by_variant(g).itertuples():
                row[f"{'std' if v.standardize else 'raw'} C={v.C:g}"] = f"{v.accuracy:.3f} ({v.control_accuracy:.2f})"
            rows.append(row)
    return pd.DataFrame(rows)


BASE_NOTE = (
    "The **no-feedback baseline** has the same data and steps but trains one pass only, so its fusion "
    "weights are random: whatever it shows at depth 0 under `recurrent:1` is a random, nearly linear "
    "map of a state that already encodes the label (docs/probes.md). Read every feedback number beside it."
)


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    models = cfg.models()
    return [
        Section(
            "Depth-0 decodability (Fig. 7a / 7b)",
            BASE_NOTE + " `carried-state` probes the state `recurrent:1` feeds in "
            "(top layer, previous position, `standard`).\n\n" + md_table(depth0_table(out, models)),
            [f for f in figs if f.startswith("fig7a")] + [f for f in figs if f.startswith("fig7b")],
        ),
        Section(
            "Probe accuracy over depths 1..L",
            "The feedback model's probe accuracy on each register task pooled over the depths above the input "
            "(1..L) and the lengths (the same samples at every depth, so the mean over depths), with its Wilson "
            "95 % CI at n = groups: what Fig. 7b's rule compares across modes.\n\n" + md_table(depths_table(cfg, out)),
        ),
        Section(
            "Robustness of depth-0 decodability",
            "Depth-0 accuracy under `recurrent:1`, pooled over lengths, refitted on "
            "the same folds with standardised or raw features and C from 0.01 to 10 (the main table's probe is "
            "standardised, C = 1); in brackets the control task (labels permuted across groups). A reading that moves "
            "with the probe is the probe's, not the model's.\n\n" + md_table(robustness_table(out, models)),
        ),
    ]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    rows = []
    for m in cfg.models():
        # completion and memory: Fig. 7a's two modes; the register tasks: every mode of Fig. 7b
        for task in [t for t in cfg.modes if t in ("completion", "memory") or t.startswith("registers")]:
            modes = depth0_modes(cfg, out, m, task) if task.startswith("registers") else (STANDARD, RECURRENT_1)
            rows += [(m, "depth0-decodability", task, mode, *depth0_number(out, m, task, mode)) for mode in modes]
            c = carried_state_number(out, m, task)
            if c[0] == c[0]:
                rows.append((m, "carried-state-decodability", task, "carried-state", *c))
            if m == "feedback" and task.startswith("registers") and (depths := deeper(out, task)):
                rows += [(m, DEPTHS_Q, task, mode, *depth_mean_number(out, m, task, mode, depths)) for mode in modes]
            rng = variant_range(out, m, task)
            if rng is not None:
                n = depth0_number(out, m, task, RECURRENT_1)[3]
                rows += [(m, q, task, RECURRENT_1, x, float("nan"), float("nan"), n) for q, x in zip(VARIANT_Q, rng)]
    return headline_frame(rows, model_hashes(cfg, out))


def depths_table(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    """Per register task × mode, the feedback model's probe accuracy over depths 1..L (the number Fig. 7b's
    rule reads) with its Wilson interval and groups."""
    rows = []
    for task in [t for t in cfg.modes if t.startswith("registers")]:
        depths = deeper(out, task)
        for mode in depth0_modes(cfg, out, "feedback", task) if depths else []:
            p, lo, hi, g = depth_mean_number(out, "feedback", task, mode, depths)
            rows.append(
                {
                    "task": task,
                    "mode": mode,
                    "depths": f"{min(depths)}-{max(depths)}",
                    "accuracy [95% CI]": "n/a" if p != p else f"{p:.3f} [{lo:.3f}, {hi:.3f}]",
                    "groups": g,
                }
            )
    return pd.DataFrame(rows)


CAPTIONS = {
    "fig7a": (
        "Held-out linear-probe accuracy of the label at each depth (0 = model input), under standard prefill (left) "
        "and recurrent:1 (right), one line per length, bands = min–max over folds. Read the recurrent:1 panels at "
        "depth 0: high accuracy there means the fed-back state makes the label readable at the input; the wide pale red line "
        "is the probe on the carried state h(T−1) itself, black squares the no-feedback baseline."
    ),
    "fig7b": (
        "Register tasks: probe accuracy by depth, one panel per register count m (registers-count) and per writes "
        "per register at m = 8 (registers), one line per prefill mode, bands = min–max over folds. A line near 0.5 "
        "(chance) does not track the latest write; a line near 1 does, from that depth on."
    ),
}

PART = Part(
    "probes",
    stages=stages,
    figures=figures,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("readout", "fig7a", "fig7b", "paired", "probe-variants"),
)
