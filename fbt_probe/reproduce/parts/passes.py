"""A general language model's feedback passes (stage `passes`, an LM preset's study): Fig. 3 (held-out
loss and the carried state's change after k = 1..N passes, the paper's 75/22/3 schedule against
75/25) and Fig. 4 (held-out loss against feedback passes at prefill, beside the no-feedback
baseline), on the held-out files of the corpus the models trained on, one window per file.

The verdicts are `passes_rules`'s, and the training seed is their unit: each seed's numbers are
headline rows (the loss rise and state-change ratios of each run, Fig. 4's drops), so the seeds
table gives every seed's verdict and a claim is made only where it holds on every seed."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_dir, write_json
from fbt_probe.provenance import provenance
from fbt_probe.reproduce import passes_rules as R
from fbt_probe.reproduce.config import LM_MODELS, ReproConfig, is_lm, model_path
from fbt_probe.reproduce.part import Part, Section, headline_frame, md_table, model_hashes, study_model
from fbt_probe.reproduce.stages import Stage
from fbt_probe.training.checkpoint import load_trained
from fbt_probe.training.passes import BASELINE_PASSES, pass_table, summarize

FOLDER = ("results", "passes")
SHOWN = (1, 2, 3, 4, 5, 8, 16, 32, 100)  # the passes the report's table shows
TASK = "held-out files"  # the headline rows' task: the corpus's held-out files
RUN_WORDS = {"feedback": "75/22/3", "feedback-75-25": "75/25", "baseline": "no feedback"}


def folder(out: Path) -> Path:
    return Path(out).joinpath(*FOLDER)


def trained_config(cfg: ReproConfig, out: Path, name: str):
    """LM `name`'s training record, read from its checkpoint, with the study's corpus folder (its
    sha256 must be the one the model recorded)."""
    _, tcfg, _ = load_trained(model_path(cfg, out, name))
    if tcfg.corpus is None:
        raise FbtError(
            f"{model_path(cfg, out, name)}: not a corpus run; the general-LM part reads a corpus's held-out files"
        )
    if not (Path(cfg.corpus) / "corpus.json").is_file():
        raise FbtError(
            f"{cfg.corpus}: no corpus folder; the general-LM part reads its held-out files "
            "(fbt-probe corpus fetch && fbt-probe corpus build --out "
            f"{cfg.corpus}, docs/corpus.md)"
        )
    return dataclasses.replace(tcfg, corpus=cfg.corpus)


def stage_passes(cfg: ReproConfig, out: Path) -> None:
    """results/passes/: passes.parquet (per held-out file x pass x model), summary.parquet (per model x
    pass, the interval over files), passes.provenance.json."""
    tables = []
    for name in LM_MODELS:
        tcfg = trained_config(cfg, out, name)
        tables.append(pass_table(name, study_model(cfg, out, name), tcfg, cfg.lm_passes))
    sha = model_hashes(cfg, out, LM_MODELS)
    table = pd.concat(tables, ignore_index=True)
    with atomic_dir(folder(out), force=True) as tmp:
        table.to_parquet(tmp / "passes.parquet", index=False)
        summarize(table).to_parquet(tmp / "summary.parquet", index=False)
        write_json(tmp / "passes.provenance.json", provenance(passes=cfg.lm_passes, checkpoint_sha256=sha))


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if not is_lm(cfg):
        return []
    after = [] if cfg.shipped else [f"train-{n}" for n in LM_MODELS]
    key = {**ck, "passes": cfg.lm_passes, "baseline_passes": BASELINE_PASSES, "models": list(LM_MODELS)}
    return [Stage("passes", key, [folder(out)], partial(stage_passes, cfg, out), after=after, rank=17)]


def tables(out: Path) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    f = folder(out)
    if not (f / "passes.parquet").is_file():
        return None
    return pd.read_parquet(f / "passes.parquet"), pd.read_parquet(f / "summary.parquet")


def figures(cfg: ReproConfig, out: Path) -> list:
    t = tables(out)
    if t is None:
        return []
    return [("fig3-lm", "fig3-lm", t[1], {}), ("fig4-lm", "fig4-lm", t[1], {})]


QUANTITIES = {"rise": "fig3-loss-rise", "decay": "fig3-change-tail/early", "level": "fig3-change-tail/middle"}
FIG4 = {"drop": "fig4-drop-0-4", "front": "fig4-first-minus-2-4", "vs_baseline": "fig4-standard-minus-baseline"}


def numbers(out: Path) -> tuple[dict, dict] | None:
    """This study's ({run: fig3_numbers}, fig4_seed numbers) from its per-file table."""
    t = tables(out)
    if t is None:
        return None
    table = t[0]
    fig3 = {
        n: R.fig3_numbers(R.arrays(table, n, "loss"), R.arrays(table, n, "change"))
        for n in LM_MODELS
        if n != "baseline" and table.loc[table["run"] == n, "pass"].max() >= R.TAIL[1]
    }
    base = R.arrays(table, "baseline", "loss")[0] if (table["run"] == "baseline").any() else None
    return fig3, R.fig4_seed(R.arrays(table, "feedback", "loss"), base)


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    got = numbers(out) if is_lm(cfg) else None
    if got is None:
        return headline_frame([], {})
    fig3, fig4 = got
    rows = [(n, QUANTITIES[q], TASK, "jacobi", *v[q]) for n, v in fig3.items() for q in QUANTITIES]
    rows += [(n, "fig3-documents", TASK, "jacobi", v["documents"], float("nan"), float("nan")) for n, v in fig3.items()]
    rows += [("feedback", FIG4[q], TASK, "jacobi", *fig4[q]) for q in FIG4 if q in fig4]
    rows.append(("feedback", "fig4-documents", TASK, "jacobi", fig4["documents"], float("nan"), float("nan")))
    return headline_frame(rows, model_hashes(cfg, out, LM_MODELS))


def _from_rows(g: pd.DataFrame, model: str, names: dict) -> dict | None:
    """One seed's numbers of `model` from its headline rows (None where it has none)."""
    rows = g[g["model"] == model].set_index("quantity")
    if not set(names.values()) - {FIG4["vs_baseline"]} <= set(rows.index):
        return None
    out = {
        q: tuple(float(x) for x in rows.loc[name, ["value", "ci_low", "ci_high"]])
        for q, name in names.items()
        if name in rows.index
    }
    doc = "fig3-documents" if names is QUANTITIES else "fig4-documents"
    out["documents"] = int(rows.loc[doc, "value"])
    return out


def seed_numbers(cfg: ReproConfig, out: Path, seeds: pd.DataFrame | None) -> dict[int, tuple[dict, dict]]:
    """{seed: ({run: fig3 numbers}, fig4 numbers)}: this study's seed from its own table, the others
    from the seeds table's rows (a seed without both is left out)."""
    found = {}
    if seeds is not None and len(seeds):
        for s, g in seeds[seeds["task"] == TASK].groupby("seed"):
            fig3 = {n: v for n in LM_MODELS if n != "baseline" and (v := _from_rows(g, n, QUANTITIES)) is not None}
            fig4 = _from_rows(g, "feedback", FIG4)
            if fig3 and fig4 is not None:
                found[int(s)] = (fig3, fig4)
    own = numbers(out)
    if own is not None:
        found[cfg.seed] = own
    return dict(sorted(found.items()))


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    if not is_lm(cfg) or tables(out) is None:
        return []
    by_seed = seed_numbers(cfg, out, seeds)
    lines = []
    runs = {n: R.fig3_run(f"{RUN_WORDS[n]}, seed {cfg.seed}", v) for n, v in by_seed[cfg.seed][0].items()}
    for v in runs.values():
        lines.append(v.sentence[0].upper() + v.sentence[1:] + " (Fig. *fig3-lm*).")
    both = {
        s: (R.fig3_run("75/22/3", f3["feedback"]), R.fig3_run("75/25", f3["feedback-75-25"]))
        for s, (f3, _) in by_seed.items()
        if {"feedback", "feedback-75-25"} <= set(f3)
    }
    if both:
        v = R.three_pass(both)
        lines.append(v.sentence[0].upper() + v.sentence[1:] + ".")
    v4 = R.fig4({s: f4 for s, (_, f4) in by_seed.items()})
    base = by_seed[cfg.seed][1].get("vs_baseline")
    lines.append(
        "Fig. 4: "
        + v4.sentence
        + (
            f"; without feedback (standard prefill) the feedback model's held-out loss minus the no-feedback baseline's is "
            f"{R.fmt(base, 3)} nats (seed {cfg.seed}, paired per file)"
            if base is not None
            else ""
        )
        + " (Fig. *fig4-lm*)."
    )
    return lines


def sections(cfg: ReproConfig, out: Path, figs: list[str]) -> list[Section]:
    if not is_lm(cfg):
        return []
    t = tables(out)
    if t is None:
        return [Section("General language model: feedback passes (Fig. 3, Fig. 4)", "_(not run)_\n")]
    s = t[1]
    s = s[s["pass"].isin(SHOWN)].assign(
        model=lambda d: [RUN_WORDS.get(r, r) for r in d["run"]],
        loss_ci=lambda d: [
            f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(d["loss"], d["loss_low"], d["loss_high"])
        ],
        change_ci=lambda d: [
            "" if c != c else f"{c:.3g} [{lo:.3g}, {hi:.3g}]"
            for c, lo, hi in zip(d["change"], d["change_low"], d["change_high"])
        ],
    )
    shown = s[["model", "seed", "pass", "loss_ci", "change_ci", "documents"]].rename(
        columns={"loss_ci": "held-out loss [95% CI]", "change_ci": "state change [95% CI]", "documents": "files"}
    )
    text = (
        "Each model is run for k Jacobi passes (pass 1 = standard prefill; k − 1 feedback passes at prefill) on one "
        "window of each held-out file of the corpus (the first 256 tokens after its `<|bos|>`); the loss is the mean "
        "next-token loss of the window, the state change the mean over positions of ‖s(k) − s(k−1)‖, each with a "
        "percentile bootstrap 95 % CI over files. The baseline's fusion was never trained: only its standard pass is "
        f"a model's loss (its passes 2..{BASELINE_PASSES} run a random fusion).\n\n"
        f"- Criteria: {'; '.join(R.CRITERIA.values())}.\n\n" + md_table(shown)
    )
    return [
        Section(
            "General language model: feedback passes (Fig. 3, Fig. 4)",
            text,
            [f for f in figs if f in ("fig3-lm", "fig4-lm")],
        )
    ]


CAPTIONS = {
    "fig3-lm": (
        "The general language model: held-out loss (left) and the carried state's mean change (right, log scale) "
        "after k passes, the paper's 75/22/3 schedule (purple) against 75/25 (green), one line per training seed, "
        "bands = bootstrap 95 % CIs over held-out files. A contraction keeps the loss flat past the trained depth "
        "(dotted) while the change falls to a plateau; a divergence lets the loss climb."
    ),
    "fig4-lm": (
        "The general language model: held-out loss against the feedback passes applied at prefill (0 = standard), "
        "per schedule and seed, bootstrap 95 % CIs over held-out files; black lines: the no-feedback baseline's "
        "standard loss. A gain with passes shows as a falling line, a front-loaded one as most of the fall at 1."
    ),
}

PART = Part(
    "passes",
    stages=stages,
    figures=figures,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
)
