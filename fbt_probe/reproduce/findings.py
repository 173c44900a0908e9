"""The report's opening section: each finding one sentence with its number, its 95 % CI and the figure
or table that shows it, computed from the tables earlier stages wrote (nothing here runs a model)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fbt_probe.loading import checkpoint_hash
from fbt_probe.probes.robustness import pooled_by_variant
from fbt_probe.provenance import git_commit
from fbt_probe.reference import names, record
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import RECURRENT_1, STANDARD, model_path, shipped_name
from fbt_probe.reproduce.depth import headline_rows as depth_headline
from fbt_probe.reproduce.depth import sentences as depth_sentences
from fbt_probe.reproduce.seeds import rows as seed_rows
from fbt_probe.reproduce.seeds import spread
from fbt_probe.reproduce.tables import (
    CHECKPOINT_SETTING,
    PAPER_DEPTH0,
    SETTING,
    _summary,
    eval_table,
    paired_diff,
    per_length,
    pooled_accuracy,
    probe_cells,
    probe_table,
    tested_mean,
)
from fbt_probe.stats import group_wilson, wilson

CHANCE = rules.CHANCE
fmt = rules.fmt


def answer_groups(g: pd.DataFrame) -> int:
    """The n of a pooled answer accuracy: the most distinct groups of one length cell. Samples are
    not independent (the two of a pair share a context) and a group may recur at every length
    (completion and memory), so the groups of one cell are the draws the pooling can count on. An
    eval table without `groups` counts pairs (half its samples)."""
    if "groups" in g.columns and g["groups"].notna().all():
        return int(g["groups"].max()) if len(g) else 0
    return int(g["n"].max()) // 2 if len(g) else 0


def answer_accuracy(out: Path, model: str, task: str, mode: str = STANDARD) -> tuple[float, float, float, int]:
    """(accuracy over every length's samples, Wilson low, high, samples); the Wilson interval has
    n = `answer_groups` (docs/statistics.md)."""
    acc = eval_table(out)
    g = acc[(acc["model"] == model) & (acc["task"] == task) & (acc["mode"] == mode)]
    c, n = int(g["correct"].sum()), int(g["n"].sum())
    if n == 0:
        return (*wilson(c, n), n)
    return (*group_wilson(c / n, answer_groups(g)), n)


def depth0(out: Path, model: str, task: str, mode: str) -> tuple[float, float, float]:
    """Depth-0 probe accuracy pooled over the length x fold cells, Wilson interval at n = groups."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    return r["value"], r["ci_low"], r["ci_high"]


def depth0_scope(out: Path, model: str, task: str, mode: str = RECURRENT_1) -> str:
    """'pooled over lengths 0, 8, 32: 1152 held-out predictions of 64 groups'."""
    r = pooled_accuracy(out, probe_cells(out, model, task, mode), task)
    if not r["n"]:
        return ""
    return (
        f"pooled over length{'s' if len(r['lengths']) > 1 else ''} {', '.join(map(str, r['lengths']))}: "
        f"{r['n']} held-out predictions of {r['groups']} groups"
    )


DEPTH0_CI = "Wilson 95 % CI with n = groups (a group's samples counted as one draw)"


def swap_effect(out: Path, model: str, task: str, condition: str = "state") -> tuple[float, float, float] | None:
    """The pooled (length_knob = -1) normalized swap effect; `swap_by_length` gives each length."""
    s = _summary(out, model, "feedback-swap")
    if s is None:
        return None
    g = s[
        (s["length_knob"] == -1) & (s["metric"] == "normalized") & (s["task"] == task) & (s["condition"] == condition)
    ]
    if g.empty or g["mean"].isna().all():
        return None
    r = g.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])


def swap_by_length(out: Path, model: str, task: str, condition: str = "state") -> str:
    """'**0.56** [0.55, 0.57] at length 8 (10 pairs, 10 groups)', one entry per length run."""
    g = per_length(_summary(out, model, "feedback-swap"), task, condition)
    parts = [
        f"{fmt(r.mean, r.ci_low, r.ci_high)} at length {int(r.length_knob)} ({int(r.n_pairs)} pairs, "
        f"{int(getattr(r, 'n_groups', r.n_pairs))} groups)"
        for r in g.itertuples()
        if r.mean == r.mean
    ]
    return ", ".join(parts)


def swap_pairs(out: Path, model: str, task: str, metric: str, by_label: bool = False) -> pd.DataFrame:
    """The feedback swap's per-pair values of `metric` (condition `state`, every length; with
    `by_label` one value per pair and receiving sample's label): group_id, length_knob, [label], value."""
    r = _summary(out, model, "feedback-swap", "rows")
    if r is None:
        return pd.DataFrame(columns=["group_id", "length_knob", "label", "value"])
    r = r[(r["task"] == task) & (r["condition"] == "state") & (r["metric"] == metric) & r["value"].notna()]
    keys = ["group_id", "length_knob", "pair_id"] + (["label"] if by_label else [])
    return r.groupby(keys, as_index=False)["value"].mean()


def replacement_accuracy(out: Path, model: str, task: str, condition: str = "zero"):
    """(answer accuracy, Wilson low, high) with the carried state replaced (`state-replacement`),
    pooled over lengths; None where not run."""
    s = _summary(out, model, "state-replacement")
    if s is None:
        return None
    g = s[(s["task"] == task) & (s["condition"] == condition) & (s["metric"] == "accuracy") & (s["length_knob"] == -1)]
    if g.empty:
        return None
    r = g.iloc[0]
    return float(r["mean"]), float(r["ci_low"]), float(r["ci_high"])


def depth_mean(out: Path, model: str, task: str, mode: str, depths) -> float:
    """Probe accuracy averaged over `depths` (each depth pooled over lengths and folds)."""
    vals = [tested_mean(c) for c in (probe_cells(out, model, task, mode, depth=d) for d in depths) if len(c)]
    return float(sum(vals) / len(vals)) if vals else float("nan")


def carried_state_accuracy(out: Path, model: str, task: str) -> float:
    """Probe accuracy on the carried state h(T-1) itself (pseudo-mode `carried-state`, its one depth)."""
    return tested_mean(probe_cells(out, model, task, "carried-state", depth=None))


PAIRED_TABLE = "table *Feedback − baseline, paired*"


def paired_clause(out: Path, task: str, quantities) -> str:
    """'at depth 0: feedback − baseline **+0.12** [0.08, 0.16] (paired, n = 64 groups); ...' for each
    (what, words) the `paired` table has on `task` (rule `paired`), '' where it has none."""
    said = [rules.paired(words, paired_diff(out, what, task)) for what, words in quantities]
    return "; ".join(v.sentence for v in said if v.verdict != "not-paired")


def swap_sentences(out: Path, task: str, seeds, learned: bool = True) -> list[str]:
    """The feedback swap on `task`: the normalized effect per length and how it changes with length
    (rule `trend`), the answer per swap direction (rule `directions`), zero replacement beside it
    (rule `redundancy`)."""
    by_length = swap_by_length(out, "feedback", task)
    if not by_length:
        return []
    norm = swap_pairs(out, "feedback", task, "normalized")
    t = rules.trend(norm, "the effect") if len(norm) else None
    # the seeds table holds the pooled effect, so its spread follows the pooled number, named as such
    eff = swap_effect(out, "feedback", task)
    pooled = "" if eff is None else f"; pooled over lengths {fmt(*eff)}"
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
    if zero is not None and learned:  # redundancy means something only where the model answers the task
        mean = replacement_accuracy(out, "feedback", task, "mean")
        v = rules.redundancy(zero, None if eff is None else eff[0], task, mean)
        lines.append(v.sentence[0].upper() + v.sentence[1:] + " (table *Causal experiments*).")
    return lines


def variant_range(out: Path, model: str, task: str) -> tuple[float, float] | None:
    """(lowest, highest) pooled depth-0 `recurrent:1` accuracy over the robustness panel's probe variants."""
    p = out / "results" / "probes" / model / "robustness.parquet"
    if not p.is_file():
        return None
    t = pd.read_parquet(p)
    t = t[t["task"] == task]
    if t.empty:
        return None
    acc = pooled_by_variant(t)["accuracy"]
    return float(acc.min()), float(acc.max())


def depth0_modes(cfg, out: Path, model: str, task: str) -> list[str]:
    """The modes probed at depth 0 on `task`, in the study's order (the register suffixes as mapped;
    `carried-state` has no depth 0)."""
    t = probe_table(out, model)
    have = set(t[(t["task"] == task) & (t["depth"] == 0) & (t["metric"] == "accuracy")]["mode"])
    order = list(cfg.modes.get(task, []))
    return [m for m in order if m in have] + sorted(have - set(order))


def register_findings(cfg, out: Path, task: str, seeds) -> list[str]:
    """Fig. 7b in words for a register task the feedback model answers: depth-0 decodability of the
    answer under each mode, the baseline's `recurrent:1` beside it, and the state swap's effect."""
    modes = depth0_modes(cfg, out, "feedback", task)
    if not modes:
        return []
    parts = [
        f"{fmt(*depth0(out, 'feedback', task, mode))} under `{mode}`"
        f"{spread(seeds, 'feedback', 'depth0-decodability', task, mode)}"
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
                f" The baseline, whose fusion was never trained, reads {fmt(*b)}"
                f"{spread(seeds, 'baseline', 'depth0-decodability', task, RECURRENT_1)} under `recurrent:1`."
            )
            gap = paired_clause(out, task, (("depth0-recurrent:1", "The gap to the feedback model"),))
            line += f" {gap} ({PAIRED_TABLE})." if gap else ""
    lines = [line]
    depths = sorted(
        {int(d) for d in _probe_depths(out, "feedback", task)} - {0}
    )  # Fig. 7b's claim is about depth: the layers above the input
    if depths:
        by_mode = {m: depth_mean(out, "feedback", task, m, depths) for m in modes}
        has_eval = (out / "eval" / "accuracy.parquet").is_file()
        full = answer_accuracy(out, "feedback", task, "full") if has_eval else (0, 0, 0, 0)
        v = rules.fig7b(task, by_mode, None if full[3] == 0 else full[:3])
        lines.append(v.sentence + ".")
    return lines + swap_sentences(out, task, seeds)


def _probe_depths(out: Path, model: str, task: str) -> list[int]:
    t = probe_table(out, model)
    return sorted(set(t[(t["task"] == task) & (t["mode"] != "carried-state")]["depth"]))


def feedback_contraction(out: Path) -> pd.DataFrame | None:
    """The feedback model's contraction table indexed by pass, if diagnosed."""
    c = out / "diagnostics" / "contraction.parquet"
    if not c.is_file():
        return None
    t = pd.read_parquet(c)
    t = t[t["run"] == "feedback"].set_index("pass")
    return None if t.empty else t


CONTRACTION = (
    "feedback",
    "state-change-last/pass-2",
    "validation",
    "full",
)  # its headline row: model, quantity, task, mode


def contraction_interval(out: Path) -> tuple[tuple[float, float] | None, int | None]:
    """The feedback model's contraction ratio interval (documents resampled) and its document count."""
    p = out / "diagnostics" / "contraction-ratio.parquet"
    if not p.is_file():
        return None, None
    t = pd.read_parquet(p)
    t = t[t["run"] == "feedback"]
    if t.empty:
        return None, None
    r = t.iloc[0]
    return (float(r["ci_low"]), float(r["ci_high"])), int(r["documents"])


def contraction_row(t: pd.DataFrame | None) -> tuple[float, float, int] | None:
    """(state change at pass 2, at the last pass, the last pass) of `feedback_contraction`'s table."""
    if t is None:
        return None
    last = int(t.index.max())
    return float(t.loc[2, "state_change"]), float(t.loc[last, "state_change"]), last


def _variants_sentence(out: Path, task: str) -> str:
    b, f = variant_range(out, "baseline", task), variant_range(out, "feedback", task)
    if b is None or f is None:
        return ""
    return (
        f" Across probe variants (standardised or raw features, C from 0.01 to 10) the baseline reads "
        f"{b[0]:.2f}–{b[1]:.2f} and the feedback model {f[0]:.2f}–{f[1]:.2f}"
        + (
            ": the control's reading depends on the probe more than the feedback model's"
            if b[1] - b[0] > max(0.02, 2 * (f[1] - f[0]))
            else ""
        )
        + " (table *Robustness of depth-0 decodability*)."
    )


def study_kind(cfg) -> str:
    return "quick" if cfg.quick else "demo" if cfg.demo else "full"


def same_kind(seeds: pd.DataFrame | None, kind: str) -> pd.DataFrame | None:
    """The seeds table's rows from studies of this kind (a demo's numbers are not a full study's)."""
    if seeds is None or "study" not in seeds.columns:
        return seeds
    return seeds[seeds["study"] == kind]


def headline(cfg, out: Path) -> pd.DataFrame:
    """The numbers the findings quote, one row each (model, quantity, task, mode, value, ci_low,
    ci_high) with the study's seed and kind: what `seeds.csv` stacks over training seeds."""
    out = Path(out)
    rows = []
    tasks = list(cfg.modes)
    for m in cfg.models():
        for task in tasks:
            rows.append((m, "answer-accuracy", task, STANDARD, *answer_accuracy(out, m, task)[:3]))
        if m == "feedback" and tasks:
            rows.append((m, "answer-accuracy", tasks[0], "full", *answer_accuracy(out, m, tasks[0], "full")[:3]))
        # completion and memory: Fig. 7a's two modes; the register tasks: every mode of Fig. 7b
        for task in [t for t in tasks if t in ("completion", "memory") or t.startswith("registers")]:
            modes = depth0_modes(cfg, out, m, task) if task.startswith("registers") else (STANDARD, RECURRENT_1)
            for mode in modes:
                rows.append((m, "depth0-decodability", task, mode, *depth0(out, m, task, mode)))
            eff = swap_effect(out, m, task)
            if eff is not None:
                rows.append((m, "swap-effect", task, RECURRENT_1, *eff))
                for r in per_length(_summary(out, m, "feedback-swap"), task, "state").itertuples():
                    rows.append(
                        (
                            m,
                            f"swap-effect-length-{int(r.length_knob)}",
                            task,
                            RECURRENT_1,
                            r.mean,
                            r.ci_low,
                            r.ci_high,
                        )
                    )
    c = contraction_row(feedback_contraction(out))
    if c is not None and "feedback" in cfg.models():
        rows.append((*CONTRACTION, c[1] / c[0], float("nan"), float("nan")))
    t = pd.DataFrame(rows, columns=["model", "quantity", "task", "mode", "value", "ci_low", "ci_high"])
    sha = {m: checkpoint_hash(model_path(cfg, out, m)) for m in cfg.models()}
    t = t.assign(checkpoint_sha256=t["model"].map(sha))
    if not cfg.model:  # the serial-depth part, with its own models' hashes
        t = pd.concat([t, depth_headline(out)], ignore_index=True)
    return t.assign(seed=cfg.seed, study=study_kind(cfg), commit=git_commit())


def findings(cfg, out: Path, seeds: pd.DataFrame | None = None) -> list[str]:
    """One sentence per finding (markdown), in reading order; with `seeds` (a stacked headline table,
    `seeds.spread_table`) each quotes its mean and range over training seeds too."""
    out = Path(out)
    models = cfg.models()
    tasks = list(cfg.modes)
    lines = []
    learned = {}
    other_seeds = seeds
    other_kind = seeds is not None and len(seeds) > 0 and len(same_kind(seeds, study_kind(cfg))) == 0
    seeds = same_kind(seeds, study_kind(cfg))
    for m in models:
        parts = []
        for task in tasks:
            p, lo, hi, n = answer_accuracy(out, m, task)
            learned[(m, task)] = lo > CHANCE
            parts.append(f"{task} {fmt(p, lo, hi)}" + spread(seeds, m, "answer-accuracy", task, STANDARD))
        what = "The feedback model" if m == "feedback" else "The no-feedback baseline"
        lines.append(
            f"{what} answers held-out samples under standard prefill with accuracy "
            + ", ".join(parts)
            + " (chance 0.50; Wilson 95 % CI with n = groups, the pairs of one group sharing a context; table *Answer accuracy*)."
        )
        accs = {task: answer_accuracy(out, m, task)[:3] for task in tasks}
        lines.append(rules.recomputable(what, accs).sentence + ".")
    for task in [t for t in ("completion", "memory") if t in tasks]:
        rec, std = depth0(out, "feedback", task, RECURRENT_1), depth0(out, "feedback", task, STANDARD)
        if rec[0] == rec[0]:
            paper = PAPER_DEPTH0.get(task)
            lines.append(
                f"At depth 0, {task}'s label is linearly decodable at {fmt(*rec)} after one recurrent prefill "
                f"step (`recurrent:1`){spread(seeds, 'feedback', 'depth0-decodability', task, RECURRENT_1)} "
                f"against {fmt(*std)} under standard prefill{spread(seeds, 'feedback', 'depth0-decodability', task, STANDARD)}"
                + (f" (paper: {paper:.3f} and chance, on its 1B general language model)" if paper else "")
                + f"; {depth0_scope(out, 'feedback', task)}; {DEPTH0_CI} (Fig. 7a). "
                + (CHECKPOINT_SETTING if cfg.model else SETTING)
                + (
                    f" By the criterion below, Fig. 7a's pattern {rules.fig7a(task, rec, std, paper).verdict}."
                    if paper
                    else ""
                )
            )
            carried = {m: carried_state_accuracy(out, m, task) for m in models}
            pairs = {m: (depth0(out, m, task, RECURRENT_1)[0], c) for m, c in carried.items() if c == c}
            if pairs:
                gaps = paired_clause(
                    out, task, (("depth0-recurrent:1", "at depth 0"), ("carried-state", "on h(T-1) itself"))
                )
                lines.append(
                    rules.readout(task, pairs).sentence
                    + " (Fig. 7a's carried-state line)."
                    + (f" Over the samples both models share, {gaps} ({PAIRED_TABLE})." if gaps else "")
                )
        if "baseline" in models:
            b = depth0(out, "baseline", task, RECURRENT_1)
            gap = paired_clause(out, task, (("depth0-recurrent:1", "The gap to the feedback model"),))
            if b[0] == b[0]:
                lines.append(
                    f"The baseline, whose fusion weights were never trained, reads {fmt(*b)}"
                    f"{spread(seeds, 'baseline', 'depth0-decodability', task, RECURRENT_1)} at depth 0 under "
                    f"`recurrent:1` on {task}: a random map of a state that already encodes the label, so "
                    "decodability alone does not show that the feedback was learned (Fig. 7a, dashed)."
                    + (f" {gap} ({PAIRED_TABLE})." if gap else "")
                    + _variants_sentence(out, task)
                )
        lines += swap_sentences(out, task, seeds, learned.get(("feedback", task), False))
    regs = [t for t in tasks if t.startswith("registers")]
    if regs:
        dead = [t for t in regs if not learned.get(("feedback", t), False)]
        if dead:
            lines.append(
                f"{' and '.join(dead).capitalize()}: the feedback model's answer accuracy is not above chance "
                "(first finding), so Fig. 7b's panels probe a model that has not learned the task; a flat line "
                "there says nothing about what latent feedback can carry."
            )
        for task in [t for t in regs if t not in dead]:
            lines += register_findings(cfg, out, task, seeds)
    t = feedback_contraction(out)
    c = contraction_row(t)
    if c is not None and "feedback" in models:
        d2, dl, last = c
        ratios = list(seed_rows(seeds, *CONTRACTION)["value"]) if seeds is not None else None
        ci, docs = contraction_interval(out)
        v = rules.contraction(d2, dl, last, ratios, ci, docs)
        fulls = [(task, answer_accuracy(out, "feedback", task, "full")) for task in tasks]
        fulls = [(task, a) for task, a in fulls if a[3] > 0]
        lines.append(
            f"Over {last} feedback passes on the validation batch, {v.sentence} (Fig. 3). {rules.fig3(t['val_loss']).sentence}."
            + (
                " Under `full` recurrence the feedback model answers "
                + ", ".join(
                    f"{task} at {fmt(*a[:3])}{spread(seeds, 'feedback', 'answer-accuracy', task, 'full')}"
                    for task, a in fulls
                )
                + " (table *Answer accuracy*)."
                if fulls
                else ""
            )
        )
    lines += depth_sentences(cfg, out, seeds)
    lines.append("How the findings are worded: " + "; ".join(rules.CRITERIA.values()) + ".")
    if seeds is None or seeds["seed"].nunique() < 2:
        lines.append(
            f"Every number is one training seed ({cfg.seed}); the CIs are within the run (samples or groups), "
            "not over training seeds"
            + (
                f" (the seeds table holds {'/'.join(sorted(set(other_seeds['study'])))} studies only, whose numbers "
                f"are not a {study_kind(cfg)} study's)"
                if other_kind
                else ""
            )
            + "."
        )
    else:
        lines.append(
            f"Each number is this study's seed ({cfg.seed}) with its within-run CI (samples or groups); "
            f'"seeds" gives the mean and range of the same number over {seeds["seed"].nunique()} models trained '
            "with different seeds (data, initialisation and probes; "
            f"{' / '.join(sorted(set(seeds['study'])))} study of each), so the range shows how much of a number is "
            "the seed (table *Over training seeds*)."
        )
    return lines


def shipped_comparison(cfg, out: Path) -> list[str]:
    """For a study that trained its own models (--train): how they compare with the shipped ones of
    the same preset -- identical bytes, or held-out standard accuracy side by side."""
    if cfg.shipped or cfg.model:
        return []
    lines = []
    for m in cfg.models():
        name = shipped_name(cfg, m)
        if name not in names():
            continue
        rec = record(name)
        mine = checkpoint_hash(out / "models" / m)
        if mine == rec["checkpoint_sha256"]:
            lines.append(
                f"The retrained {m} model is byte-identical to the shipped `ref:{name}` (sha256 {mine[:12]}...)."
            )
            continue
        ship = pd.DataFrame(rec["accuracy"]["rows"])
        ship = ship[ship["mode"] == STANDARD].groupby("task")[["correct", "n"]].sum()
        parts = []
        for task in [t for t in cfg.modes if t in ship.index]:
            p, lo, hi, _ = answer_accuracy(out, m, task)
            s = ship.loc[task, "correct"] / ship.loc[task, "n"]
            parts.append(
                f"{task} {p:.2f} [{lo:.2f}, {hi:.2f}] vs {s:.2f}"
                + ("" if lo - 1e-9 <= s <= hi + 1e-9 else " (outside)")
            )
        same = (
            "seed and steps"
            if (rec["seed"], rec["steps"]) == (cfg.seed, cfg.steps)
            else f"seed {rec['seed']} and {rec['steps']} steps (here {cfg.seed} and {cfg.steps})"
        )
        lines.append(
            f"The retrained {m} model differs from the shipped `ref:{name}` (trained with {same} on "
            f"{rec.get('cpu', 'another machine')}); held-out standard accuracy here vs shipped: "
            + "; ".join(parts)
            + "."
        )
    return lines
