"""Answer accuracy on held-out contexts (stage `eval`): the greedy answer at the final colon per
task x length x prefill mode, both models; the first findings (does each model answer, and can it
without the carried state) and the table *Answer accuracy*."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.io import atomic_path
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import (
    RECURRENT_1,
    STANDARD,
    ReproConfig,
    is_lm,
    study_contexts,
    study_training,
)
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.part import Part, Section, headline_frame, md_table, model_hashes, study_model, trained_stages
from fbt_probe.reproduce.seeds import per_seed, quote
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import answer_accuracy, choice_accuracy
from fbt_probe.training.config import TRAIN_KNOBS
from fbt_probe.training.data import heldout
from fbt_probe.training.evaluate import answer_accuracy as measure_accuracy
from fbt_probe.training.evaluate import eval_samples


def _train_knobs(cfg: ReproConfig) -> dict:
    return {
        t: [k for k in TRAIN_KNOBS[t] if not cfg.quick or k in cfg.knobs[t]] or TRAIN_KNOBS[t][:1] for t in cfg.knobs
    }


def stage_eval(cfg: ReproConfig, out: Path) -> None:
    tok, frames = study_tokenizer(cfg), []
    tcfg = study_training(cfg)
    # a checkpoint's own training lengths (from its run), but the quick study's at its probe lengths
    knobs = _train_knobs(cfg) if (cfg.quick or not cfg.model) else None
    samples = eval_samples(tcfg, tok, pairs=cfg.eval_pairs, knobs=knobs, contexts=study_contexts(cfg, heldout))
    for name in cfg.models():
        acc = measure_accuracy(study_model(cfg, out, name), samples, tok)
        frames.append(acc.assign(model=name))
    with atomic_path(out / "eval" / "accuracy.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    # every kind of pair a group holds is evaluated; "pairs" in the key keeps a study that evaluated only
    # each group's first pair from being reused
    key = {**ck, "eval_pairs": cfg.eval_pairs, "quick": cfg.quick, "pairs": "every-kind"}
    after = [s for n in cfg.models() for s in trained_stages(cfg, n)]
    return [Stage("eval", key, [out / "eval"], partial(stage_eval, cfg, out), after=after, rank=13)]


def learned(out: Path, model: str, task: str) -> bool:
    """The model answers `task` under standard prefill above chance (its Wilson interval's lower end)."""
    return answer_accuracy(out, model, task)[1] > rules.CHANCE


MEANING = {
    "recomputable": (
        "the answer can always be recomputed without the carried state, so an effect of the state shows that the "
        "model reads it when it is there, not that the task needs it"
    ),
    "not-answered": "there the probes and causal tests read a model that has not learned the task",
}


def recomputable_verdict(cfg: ReproConfig, out: Path, seeds, m: str) -> rules.Verdict:
    """Rule `recomputable` on each seed's standard answer accuracy of every task (`rules.stated`)."""
    what = "The feedback model" if m == "feedback" else "The no-feedback baseline"
    keys = {task: (m, "answer-accuracy", task, STANDARD) for task in cfg.modes}
    own = {task: answer_accuracy(out, m, task) for task in cfg.modes}
    own = {t: (*a[:3], a[4]) for t, a in own.items() if a[3]}
    by_seed = per_seed(seeds, keys, cfg.seed, own)
    verdicts = {s: None if nums is None else rules.recomputable(what, nums) for s, nums in by_seed.items()}
    return rules.stated(verdicts, cfg.seed, f"{what}, whether it answers every task under standard prefill", MEANING)


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    lines = []
    for m in cfg.models():
        parts = []
        for task in cfg.modes:
            p, lo, hi, _, g = answer_accuracy(out, m, task)
            parts.append(f"{task} {quote(seeds, m, 'answer-accuracy', task, STANDARD, cfg.seed, (p, lo, hi, g))}")
        what = "The feedback model" if m == "feedback" else "The no-feedback baseline"
        lines.append(
            f"{what} answers held-out samples under standard prefill with accuracy "
            + ", ".join(parts)
            + " (chance 0.50; Wilson 95 % CI with n = groups, the pairs of one group sharing a context; table *Answer accuracy*)."
        )
        lines.append(recomputable_verdict(cfg, out, seeds, m).sentence + ".")
        if is_lm(cfg):  # a general LM may answer with other words: the choice between the label words
            choice = [(task, choice_accuracy(out, m, task)) for task in cfg.modes]
            parts = [
                f"{task} {quote(seeds, m, 'answer-choice', task, STANDARD, cfg.seed, (c[0], c[1], c[2], c[4]))}"
                for task, c in choice
                if c is not None and c[3]
            ]
            if parts:
                lines.append(
                    f"Read in context, {what[0].lower() + what[1:]}'s logit for the right label word is above the "
                    "other's (a two-way choice, chance 0.50; Wilson 95 % CI with n = groups) on "
                    + ", ".join(parts)
                    + " (table *Answer accuracy*)."
                )
    return lines


def accuracy_table(out: Path) -> pd.DataFrame:
    acc = pd.read_parquet(out / "eval" / "accuracy.parquet")
    t = acc.pivot_table(index=["model", "task", "length_knob"], columns="decoding", values="accuracy").round(3)
    order = [c for c in ("Std/Soft", "Fused", RECURRENT_1, "jacobi:3", "full") if c in t.columns]
    t = t[order + [c for c in t.columns if c not in order]]
    if "choice_accuracy" in acc.columns:  # the two-way choice between the label words, under standard prefill
        std = acc[acc["mode"] == STANDARD].set_index(["model", "task", "length_knob"])["choice_accuracy"].round(3)
        t = t.assign(**{"choice (standard)": std})
    return t.reset_index()


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    return [
        Section(
            "Answer accuracy (held-out contexts)",
            "Greedy answer at the final colon (the top-1 token is the answer word). `Std/Soft` are identical for "
            "the first generated token; `Fused` is `jacobi:2` prefill. `choice (standard)`: the answer word's logit "
            "above the other label word's under standard prefill (chance 0.5).\n\n" + md_table(accuracy_table(out)),
        )
    ]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    tasks = list(cfg.modes)
    rows = []
    for m in cfg.models():
        for task in tasks:
            p, lo, hi, _, g = answer_accuracy(out, m, task)
            rows.append((m, "answer-accuracy", task, STANDARD, p, lo, hi, g))
    if "feedback" in cfg.models():  # what `full` recurrence answers, every task (the contraction finding)
        for task in tasks:
            p, lo, hi, n, g = answer_accuracy(out, "feedback", task, "full")
            if n:
                rows.append(("feedback", "answer-accuracy", task, "full", p, lo, hi, g))
    if is_lm(cfg):
        for m in cfg.models():
            for t in tasks:
                c = choice_accuracy(out, m, t)
                if c is not None and c[3]:
                    rows.append((m, "answer-choice", t, STANDARD, c[0], c[1], c[2], c[4]))
    return headline_frame(rows, model_hashes(cfg, out))


PART = Part(
    "evaluation",
    stages=stages,
    findings=findings,
    sections=sections,
    headline=headline,
    criteria=("seeds", "recomputable"),
)
