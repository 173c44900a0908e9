"""The contraction diagnostic of the task models (stage `contraction`, Fig. 3): validation loss and
the carried state's change after k = 1..N feedback passes on held-out task documents, each
document's curve (`contraction-documents.parquet`), from which the findings judge the curve's tail
(the last quarter of the passes against the early and the middle ones, `rules.contraction`) and the
loss's rise (`rules.fig3`) with intervals over documents, seed by seed; and what `full` recurrence
answers. (A general language model's Fig. 3 and Fig. 4 are the `passes` part's.)"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from fbt_probe.io import atomic_path
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import NOT_RECORDED, ReproConfig, is_lm, schedule_label, study_training
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.part import Part, Section, headline_frame, md_table, model_hashes, study_model, trained_stages
from fbt_probe.reproduce.passes_rules import ratio_of_means, window
from fbt_probe.reproduce.rules import contraction_windows
from fbt_probe.reproduce.seeds import per_seed, quote
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import answer_accuracy
from fbt_probe.training.config import parse_schedule
from fbt_probe.training.data import validation_batch
from fbt_probe.training.evaluate import contraction_documents, ratio_interval

DOCUMENTS = "contraction-documents.parquet"  # each document's curve: run, pass, document, change, loss, weight
CONTRACTION = (
    "feedback",
    "state-change-last/pass-2",
    "validation",
    "full",
)  # its headline row: model, quantity, task, mode


def stage_contraction(cfg: ReproConfig, out: Path) -> None:
    tok, frames, docs = study_tokenizer(cfg), [], []
    batch = validation_batch(study_training(cfg), tok, per_task=cfg.contraction_docs)
    ratios = []
    for name in cfg.models():
        t, by_doc, loss, weight = contraction_documents(study_model(cfg, out, name), *batch, n_passes=cfg.passes)
        frames.append(t.assign(run=name, schedule=schedule_label(cfg, name), documents=by_doc.shape[1]))
        P, D = by_doc.shape
        docs.append(
            pd.DataFrame(
                {
                    "run": name,
                    "pass": np.repeat(np.arange(1, P + 1), D),
                    "document": np.tile(np.arange(D), P),
                    "change": by_doc.reshape(-1),
                    "loss": loss.reshape(-1),
                    "weight": np.tile(weight, P),
                }
            )
        )
        if cfg.passes >= 2:
            r, lo, hi = ratio_interval(by_doc, seed=cfg.seed)
            ratios.append({"run": name, "ratio": r, "ci_low": lo, "ci_high": hi, "documents": by_doc.shape[1]})
    with atomic_path(out / "diagnostics" / "contraction.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)
    with atomic_path(out / "diagnostics" / "contraction-ratio.parquet") as tmp:
        pd.DataFrame(ratios, columns=["run", "ratio", "ci_low", "ci_high", "documents"]).to_parquet(tmp, index=False)
    with atomic_path(out / "diagnostics" / DOCUMENTS) as tmp:
        pd.concat(docs, ignore_index=True).to_parquet(tmp, index=False)


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if is_lm(cfg):  # a general LM's Fig. 3 is on its corpus (the `passes` part), not on task documents
        return []
    # "outputs": the stage writes each document's curve (contraction-documents.parquet) for the tail's intervals
    key = {**ck, "passes": cfg.passes, "documents_per_task": cfg.contraction_docs, "outputs": "per-document"}
    after = [s for n in cfg.models() for s in trained_stages(cfg, n)]
    return [
        Stage("contraction", key, [out / "diagnostics"], partial(stage_contraction, cfg, out), after=after, rank=17)
    ]


def trained_passes(contraction: pd.DataFrame) -> dict:
    """{run: the deepest pass its schedule trains} from the contraction table's `schedule` column
    ("constant:1" for the one-pass baseline, "1:0.75,2:0.22,3:0.03" for the paper's schedule)."""
    if "run" not in contraction or "schedule" not in contraction:
        return {}
    first = contraction.groupby("run", sort=False)["schedule"].first()
    # an imported checkpoint's schedule is not recorded, and `full` trains every depth: no line to mark
    mixes = {run: parse_schedule(str(s).split(" ")[0]) for run, s in first.items() if s != NOT_RECORDED}
    return {run: mix.max_passes for run, mix in mixes.items() if not mix.serial}


def figures(cfg: ReproConfig, out: Path) -> list:
    if not (out / "diagnostics" / "contraction.parquet").is_file():
        return []
    contraction = pd.read_parquet(out / "diagnostics" / "contraction.parquet")
    return [("fig3-contraction", "fig3", contraction, {"trained_passes": trained_passes(contraction)})]


def feedback_contraction(out: Path) -> pd.DataFrame | None:
    """The feedback model's contraction table indexed by pass, if diagnosed."""
    c = out / "diagnostics" / "contraction.parquet"
    if not c.is_file():
        return None
    t = pd.read_parquet(c)
    t = t[t["run"] == "feedback"].set_index("pass")
    return None if t.empty else t


def document_table(out: Path, run: str = "feedback") -> pd.DataFrame | None:
    """One run's per-document curves (pass, document, change, loss, weight), None where not written."""
    p = out / "diagnostics" / DOCUMENTS
    if not p.is_file():
        return None
    t = pd.read_parquet(p)
    t = t[t["run"] == run]
    return None if t.empty else t


def tail_numbers(docs: pd.DataFrame, seed: int = 0) -> dict:
    """A run's contraction numbers from its per-document curves, each (value, low, high) over documents
    (percentile bootstrap, `passes_rules`): `decay`, the tail's mean state change over the early passes';
    `level`, the tail's over the middle passes' (`rules.contraction_windows`); `rise`, the validation loss
    after the last pass minus after pass 1 (Σ weight · Δloss / Σ weight, the table's loss difference);
    `documents`; `passes`."""
    change = docs.pivot(index="pass", columns="document", values="change").sort_index().to_numpy()
    loss = docs.pivot(index="pass", columns="document", values="loss").sort_index().to_numpy()
    weight = docs.drop_duplicates("document").set_index("document").sort_index()["weight"].to_numpy()
    w = contraction_windows(change.shape[0])
    return {
        "decay": ratio_of_means(window(change, w["tail"]), window(change, w["early"]), seed=seed),
        "level": ratio_of_means(window(change, w["tail"]), window(change, w["middle"]), seed=seed),
        "rise": ratio_of_means(weight * (loss[-1] - loss[0]), weight, seed=seed),
        "documents": int(change.shape[1]),
        "passes": int(change.shape[0]),
    }


TAIL_Q = {"decay": "state-change-tail/early", "level": "state-change-tail/middle", "rise": "val-loss-rise"}


def contraction_row(t: pd.DataFrame | None) -> tuple[float, float, int] | None:
    """(state change at pass 2, at the last pass, the last pass) of `feedback_contraction`'s table."""
    if t is None:
        return None
    last = int(t.index.max())
    return float(t.loc[2, "state_change"]), float(t.loc[last, "state_change"]), last


def seed_tails(cfg: ReproConfig, out: Path, seeds) -> dict[int, dict | None]:
    """{seed: its tail numbers (`tail_numbers`' keys), None where the seeds table lacks them}: this study's
    seed from its own curves, the others from their headline rows."""
    keys = {q: ("feedback", name, "validation", "full") for q, name in TAIL_Q.items()}
    keys["documents"] = ("feedback", "contraction-documents", "validation", "full")
    docs = document_table(out)
    own = None
    if docs is not None:
        t = tail_numbers(docs, cfg.seed)
        own = {q: t[q] for q in TAIL_Q} | {"documents": (t["documents"], float("nan"), float("nan"))}
    found = {}
    for s, nums in per_seed(seeds, keys, cfg.seed, own).items():
        found[s] = None if nums is None else {**nums, "documents": int(nums["documents"][0])}
    return found


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    t = feedback_contraction(out)
    c = contraction_row(t)
    if c is None or "feedback" not in cfg.models():
        return []
    d2, dl, last = c
    w = contraction_windows(last)
    move = "falls" if dl < d2 else "grows"
    shown = f"{move} from {d2:.3g} at pass 2 to {dl:.3g} at pass {last}"
    tails = seed_tails(cfg, out, seeds)
    if not any(v is not None for v in tails.values()):  # a study folder written before the per-document curves
        return []
    contract = {
        s: None
        if n is None
        else rules.contraction(n["decay"], n["level"], n["documents"], w, shown if s == cfg.seed else "")
        for s, n in tails.items()
    }
    losses = ", ".join(f"{t.loc[p, 'val_loss']:.3g} at pass {p}" for p in (1, 2, 4, 8, 16, 32) if p in t.index)
    flat = {
        s: None if n is None else rules.fig3(n["rise"], n["documents"], losses if s == cfg.seed else "")
        for s, n in tails.items()
    }
    lead = (
        f"Over {last} feedback passes on the validation batch (Fig. 3; seed {cfg.seed}'s curve: the carried "
        f"state's change {shown}), the iteration's contraction"
    )
    v = rules.stated(contract, cfg.seed, lead, lead_one=f"Over {last} feedback passes on the validation batch, ")
    f3 = rules.stated(flat, cfg.seed, f"Fig. 3 (seed {cfg.seed}'s validation loss: {losses}; paper: flat to 30 passes)")
    fulls = [(task, answer_accuracy(out, "feedback", task, "full")) for task in cfg.modes]
    fulls = [(task, a) for task, a in fulls if a[3] > 0]
    return [
        f"{v.sentence}. {f3.sentence}."
        + (
            " Under `full` recurrence the feedback model answers "
            + ", ".join(
                f"{task} at {quote(seeds, 'feedback', 'answer-accuracy', task, 'full', cfg.seed, (*a[:3], a[4]))}"
                for task, a in fulls
            )
            + " (table *Answer accuracy*)."
            if fulls
            else ""
        )
    ]


def document_count(out: Path) -> str:
    p = out / "diagnostics" / "contraction.parquet"
    if not p.is_file():
        return "the"
    t = pd.read_parquet(p)
    return str(int(t["documents"].iloc[0])) if "documents" in t.columns and len(t) else "the"


def ratio_table_md(cfg: ReproConfig, out: Path) -> str:
    """The tail's numbers of each run (the rules' inputs), then the last-over-pass-2 ratio."""
    text, rows = "", []
    for run in cfg.models():
        docs = document_table(out, run)
        if docs is None:
            continue
        t = tail_numbers(docs, cfg.seed)
        w = contraction_windows(t["passes"])
        rows.append(
            {
                "run": run,
                f"tail / early (passes {w['tail'][0]}-{w['tail'][1]} / {w['early'][0]}-{w['early'][1]})": rules.plain(
                    t["decay"], 3
                ),
                f"tail / middle (/ {w['middle'][0]}-{w['middle'][1]})": rules.plain(t["level"], 3),
                "loss rise, last − pass 1 (nats)": rules.plain(t["rise"], 3),
                "documents": t["documents"],
            }
        )
    if rows:
        text += "\n\n" + md_table(pd.DataFrame(rows))
    p = out / "diagnostics" / "contraction-ratio.parquet"
    if p.is_file():
        text += "\n\n" + md_table(pd.read_parquet(p).round(4))
    return text


def contraction_table(out: Path) -> pd.DataFrame:
    t = pd.read_parquet(out / "diagnostics" / "contraction.parquet")
    keep = t[t["pass"].isin([1, 2, 3, 4, 8, 16, 32])]
    return keep[["run", "pass", "val_loss", "answer_accuracy", "state_change"]].round(4)


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    if not (out / "diagnostics" / "contraction.parquet").is_file():
        return []
    return [
        Section(
            "Contraction diagnostic (Fig. 3)",
            "Validation loss after k feedback passes and the mean change of the carried state per pass, over "
            f"{document_count(out)} held-out validation documents (the schedule each model was trained with "
            "is in the `schedule` column of the table behind it); then the tail's state change against the early "
            "and the middle passes' and the loss's rise, each a ratio of means with its bootstrap 95 % CI over "
            "documents (what the findings judge), and the ratio of the last pass's change to pass 2's.\n\n"
            + md_table(contraction_table(out))
            + ratio_table_md(cfg, out),
            [f for f in figs if f.startswith("fig3")],
        )
    ]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    c = contraction_row(feedback_contraction(out))
    rows = (
        [] if c is None or "feedback" not in cfg.models() else [(*CONTRACTION, c[1] / c[0], float("nan"), float("nan"))]
    )
    docs = document_table(out) if rows else None
    if docs is not None:  # the tail's ratios and the loss's rise, each over documents: the rules' numbers
        t = tail_numbers(docs, cfg.seed)
        rows += [("feedback", name, "validation", "full", *t[q], t["documents"]) for q, name in TAIL_Q.items()]
        rows.append(
            ("feedback", "contraction-documents", "validation", "full", t["documents"], float("nan"), float("nan"))
        )
    return headline_frame(rows, model_hashes(cfg, out))


CAPTIONS = {
    "fig3-contraction": (
        "Validation loss (left) and the mean change of the carried state per feedback pass (right, log scale) "
        "when each model is run for k passes. A model that contracts has a falling right-hand curve; the dotted line "
        "marks the deepest pass the feedback model was trained at (the one-pass baseline has none)."
    ),
}

PART = Part(
    "contraction",
    stages=stages,
    figures=figures,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("contraction", "fig3"),
)
