"""The contraction diagnostic of the task models (stage `contraction`, Fig. 3): validation loss and
the carried state's change after k = 1..N feedback passes on held-out task documents, the ratio of
the last pass's change to pass 2's with its interval over documents, and what `full` recurrence
answers. (A general language model's Fig. 3 and Fig. 4 are the `general_lm` part's.)"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.io import atomic_path
from fbt_probe.loading import checkpoint_hash
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import NOT_RECORDED, ReproConfig, is_lm, model_path, schedule_label, study_training
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.part import Part, Section, headline_frame, md_table, study_model, trained_stages
from fbt_probe.reproduce.seeds import rows as seed_rows
from fbt_probe.reproduce.seeds import spread
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import answer_accuracy
from fbt_probe.training.config import parse_schedule
from fbt_probe.training.data import validation_batch
from fbt_probe.training.evaluate import contraction_by_document, ratio_interval

CONTRACTION = (
    "feedback",
    "state-change-last/pass-2",
    "validation",
    "full",
)  # its headline row: model, quantity, task, mode


def stage_contraction(cfg: ReproConfig, out: Path) -> None:
    tok, frames = study_tokenizer(cfg), []
    batch = validation_batch(study_training(cfg), tok, per_task=cfg.contraction_docs)
    ratios = []
    for name in cfg.models():
        t, by_doc = contraction_by_document(study_model(cfg, out, name), *batch, n_passes=cfg.passes)
        frames.append(t.assign(run=name, schedule=schedule_label(cfg, name), documents=by_doc.shape[1]))
        if cfg.passes >= 2:
            r, lo, hi = ratio_interval(by_doc, seed=cfg.seed)
            ratios.append({"run": name, "ratio": r, "ci_low": lo, "ci_high": hi, "documents": by_doc.shape[1]})
    with atomic_path(out / "diagnostics" / "contraction.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)
    with atomic_path(out / "diagnostics" / "contraction-ratio.parquet") as tmp:
        pd.DataFrame(ratios, columns=["run", "ratio", "ci_low", "ci_high", "documents"]).to_parquet(tmp, index=False)


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if is_lm(cfg):  # a general LM's Fig. 3 is on its corpus (the `passes` part), not on task documents
        return []
    key = {**ck, "passes": cfg.passes, "documents_per_task": cfg.contraction_docs}
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
    # an imported checkpoint's schedule is not recorded: no trained depth to mark
    return {run: parse_schedule(str(s).split(" ")[0]).max_passes for run, s in first.items() if s != NOT_RECORDED}


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


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    t = feedback_contraction(out)
    c = contraction_row(t)
    if c is None or "feedback" not in cfg.models():
        return []
    d2, dl, last = c
    ratios = list(seed_rows(seeds, *CONTRACTION)["value"]) if seeds is not None else None
    ci, docs = contraction_interval(out)
    v = rules.contraction(d2, dl, last, ratios, ci, docs)
    fulls = [(task, answer_accuracy(out, "feedback", task, "full")) for task in cfg.modes]
    fulls = [(task, a) for task, a in fulls if a[3] > 0]
    return [
        f"Over {last} feedback passes on the validation batch, {v.sentence} (Fig. 3). {rules.fig3(t['val_loss']).sentence}."
        + (
            " Under `full` recurrence the feedback model answers "
            + ", ".join(
                f"{task} at {rules.fmt(*a[:3])}{spread(seeds, 'feedback', 'answer-accuracy', task, 'full')}"
                for task, a in fulls
            )
            + " (table *Answer accuracy*)."
            if fulls
            else ""
        )
    ]


def contraction_documents(out: Path) -> str:
    p = out / "diagnostics" / "contraction.parquet"
    if not p.is_file():
        return "the"
    t = pd.read_parquet(p)
    return str(int(t["documents"].iloc[0])) if "documents" in t.columns and len(t) else "the"


def ratio_table_md(out: Path) -> str:
    p = out / "diagnostics" / "contraction-ratio.parquet"
    if not p.is_file():
        return ""
    return "\n\n" + md_table(pd.read_parquet(p).round(4))


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
            f"{contraction_documents(out)} held-out validation documents (the schedule each model was trained with "
            "is in the `schedule` column of the table behind it); then the ratio of the last pass's change to "
            "pass 2's, with its bootstrap 95 % CI over documents.\n\n"
            + md_table(contraction_table(out))
            + ratio_table_md(out),
            [f for f in figs if f.startswith("fig3")],
        )
    ]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    c = contraction_row(feedback_contraction(out))
    rows = (
        [] if c is None or "feedback" not in cfg.models() else [(*CONTRACTION, c[1] / c[0], float("nan"), float("nan"))]
    )
    return headline_frame(rows, {m: checkpoint_hash(model_path(cfg, out, m)) for m in cfg.models()})


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
