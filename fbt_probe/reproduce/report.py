"""Figures and the self-contained report (report.md + report.html with embedded PNGs) of a
`reproduce` run. Everything here reads tables written by earlier stages; nothing runs a model."""

from __future__ import annotations

import base64
import functools
import html
import json
from pathlib import Path

import pandas as pd

from fbt_probe.figures import draw_all
from fbt_probe.io import atomic_dir, atomic_path
from fbt_probe.loading import checkpoint_hash
from fbt_probe.probes.robustness import pooled_by_variant
from fbt_probe.provenance import provenance
from fbt_probe.reproduce.config import (
    NOT_RECORDED,
    RECURRENT_1,
    STANDARD,
    depth_name,
    depth_path,
    model_path,
    shipped_name,
    training_note,
)
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.depth import depth_section
from fbt_probe.reproduce.depth import figure_jobs as depth_figure_jobs
from fbt_probe.reproduce.findings import findings, headline, same_kind, shipped_comparison, study_kind
from fbt_probe.reproduce.methods import MODEL_WORDS, figure_jobs, methods_section
from fbt_probe.reproduce.paired import DESCRIPTION as PAIRED_WORDS
from fbt_probe.reproduce.paired import FOLDER as PAIRED_FOLDER
from fbt_probe.reproduce.paired import TABLE as PAIRED_FILE
from fbt_probe.reproduce.rules import bound, signed
from fbt_probe.reproduce.sae import figure_jobs as sae_figure_jobs
from fbt_probe.reproduce.sae import sae_section
from fbt_probe.reproduce.sae import sentences as sae_sentences
from fbt_probe.reproduce.seeds import between_seeds_text, is_proportion, spread_table
from fbt_probe.reproduce.tables import CHECKPOINT_SETTING, PAPER_DEPTH0, SETTING, _summary, pooled_accuracy
from fbt_probe.tasks import tokenizer_sha256
from fbt_probe.training.config import parse_schedule

FIGURE_CAPTIONS = {
    "fig3-contraction": (
        "Validation loss (left) and the mean change of the carried state per feedback pass (right, log scale) "
        "when each model is run for k passes. A model that contracts has a falling right-hand curve; the dotted line "
        "marks the deepest pass the feedback model was trained at (the one-pass baseline has none)."
    ),
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
    "atp-heatmap": (
        "Attribution patching (a first-order estimate of patching each hook at each position), denoising: rows are "
        "hooks in forward order (p1/p2 = Jacobi pass), columns the final position and those with a sizeable effect. "
        "One colour scale for every panel (red = the clean answer restored); ringed cells were also patched exactly."
    ),
    "atp-parity": (
        "AtP's estimate against exact patching on the checked cells (one point per cell, mean over pairs); points "
        "on the dashed diagonal agree. Each title gives Spearman's rank correlation per length, and pooled over "
        "lengths where a panel holds several."
    ),
    "das-iia": (
        "Interchange intervention accuracy (the answer follows the source sample) after swapping a learned "
        "k-dimensional subspace (DAS, filled), a random k-dimensional subspace (open squares) or the full vector "
        "(diamonds), bootstrap 95 % CIs. Dashed: the random-rotation null; DAS far above it means a small subspace "
        "carries the label, and DAS above the full-vector swap is the pattern of a subspace illusion."
    ),
    "lens": (
        "Probability of the correct label word read out at the final position from each depth, by the logit lens "
        "and the tuned lens, one line per prefill mode (Jacobi passes dashed, lighter), bootstrap CIs over pairs. "
        "The depth where a line rises is where the answer becomes predictable."
    ),
    "sae-swap": (
        "Share of the full-state swap's effect carried by swapping only the top-k SAE label latents (solid), "
        "against k random active latents (dashed), one colour per SAE of the grid (SAE seeds × widths and the "
        "demo-data SAE), normal group-bootstrap 95 % intervals. A solid curve near 1 at small k with its dashed "
        "control well below, on every SAE, means a few features carry what the model uses; the dotted line is "
        "the most latents a pair can have active."
    ),
    "sae-vs-das": (
        "Top: the SAE feature swap's share of the full-state effect against k latents; bottom: DAS's held-out "
        "interchange accuracy against k dimensions, with the random subspace, the full-vector swap, the depth-0 "
        "probe accuracy and the random-rotation null (dashed). Compare where each curve reaches its plateau."
    ),
    "depth": (
        "Serial depth (compose-s3): held-out answer accuracy against the number of dependent steps k the answer "
        "needs (log scale), one line per prefill mode with Wilson 95 % bars (n = groups, written under each k; modes "
        "are offset a little so that equal values stay visible), the feedback model (left) and the no-feedback "
        "baseline (middle); dashed = chance. A separation shows as standard prefill falling to chance at some k while a "
        "feedback mode stays near 1 on the feedback model and every mode stays near chance or below on the "
        "baseline. Right: the carried-state swap's normalized effect against k (1 = the answer follows the "
        "swapped-in state, 0 = ignores it), group-bootstrap 95 % CIs."
    ),
    "sae-features": (
        "Each task's top label latents: the latent's activation at the final position, by label. A latent that "
        "tells the labels apart has two clearly separated distributions."
    ),
}
"""What each figure of the study shows and how to read it, by file stem without the model suffix."""


def figure_caption(stem: str) -> str:
    """The report's caption of figure `stem` ("fig7a-feedback" -> the model, then the fig7a caption);
    a stem without an entry in `FIGURE_CAPTIONS` is refused, so that no figure goes out captioned by
    its file name."""
    for key in sorted(FIGURE_CAPTIONS, key=len, reverse=True):
        if stem == key or stem.startswith(key + "-"):
            model = stem[len(key) + 1 :]
            words = MODEL_WORDS.get(model, model)
            lead = f"{words[0].upper()}{words[1:]}. " if words else ""
            return lead + FIGURE_CAPTIONS[key]
    raise ValueError(f"figure {stem}: no caption in FIGURE_CAPTIONS (say what it shows and how to read it)")


def trained_passes(contraction: pd.DataFrame) -> dict:
    """{run: the deepest pass its schedule trains} from the contraction table's `schedule` column
    ("constant:1" for the one-pass baseline, "1:0.75,2:0.22,3:0.03" for the paper's schedule)."""
    if "run" not in contraction or "schedule" not in contraction:
        return {}
    first = contraction.groupby("run", sort=False)["schedule"].first()
    # an imported checkpoint's schedule is not recorded: no trained depth to mark
    return {run: parse_schedule(str(s).split(" ")[0]).max_passes for run, s in first.items() if s != NOT_RECORDED}


def _figure_jobs(cfg, out: Path) -> list[tuple[str, str, pd.DataFrame, dict]]:
    probes = {n: pd.read_parquet(out / "results" / "probes" / n / "probes.parquet") for n in cfg.models()}
    contraction = pd.read_parquet(out / "diagnostics" / "contraction.parquet")
    jobs = [("fig3-contraction", "fig3", contraction, {"trained_passes": trained_passes(contraction)})]
    base = probes.get("baseline")
    for n, t in probes.items():
        words = {"model_label": MODEL_WORDS.get(n, n)}
        opts = {"baseline": base, **words} if (n == "feedback" and base is not None) else words
        if {"completion", "memory"} & set(t["task"]):
            jobs.append((f"fig7a-{n}", "fig7a", t, opts))
        if {"registers", "registers-count"} & set(t["task"]):
            jobs.append((f"fig7b-{n}", "fig7b", t, words))
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
    return jobs + figure_jobs(cfg, out) + sae_figure_jobs(cfg, out) + depth_figure_jobs(cfg, out)


def stage_figures(cfg, out: Path, workers: int = 1) -> None:
    """Every figure of the study into OUT/figures (`workers` processes draw them side by side)."""
    with atomic_dir(out / "figures", force=True) as tmp:
        draw_all(_figure_jobs(cfg, out), tmp, formats=cfg.figure_formats(), dpi=150, workers=workers)


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


def paired_table(out: Path) -> pd.DataFrame | None:
    """The `paired` stage's table as the report shows it (None without one): per quantity x task x
    length, feedback − baseline with its paired group-bootstrap 95 % CI, each model's mean over the
    shared groups, the groups and the values counted."""
    p = out.joinpath(*PAIRED_FOLDER, PAIRED_FILE)
    if not p.is_file():
        return None
    rows = []
    for r in pd.read_parquet(p).itertuples():
        diff = (
            f"{signed(r.difference, 3)} (every group)"
            if r.ci_low == r.ci_high
            else f"{signed(r.difference, 3)} [{bound(r.ci_low, 3)}, {bound(r.ci_high, 3)}]"
        )
        rows.append(
            {
                "quantity": PAIRED_WORDS.get(r.what, r.what),
                "task": r.task,
                "length": "pooled" if r.length_knob == -1 else int(r.length_knob),
                "feedback − baseline [95% CI]": diff,
                "feedback": f"{r.feedback:.3f}",
                "baseline": f"{r.baseline:.3f}",
                "groups": int(r.n_groups),
                "values (feedback / baseline)": f"{int(r.n_feedback)} / {int(r.n_baseline)} {r.unit}",
            }
        )
    return pd.DataFrame(rows)


PAIRED_NOTE = (
    "Each row is the feedback model's mean minus the baseline's over the groups both models share "
    "(held-out probe predictions per sample; the swap and the zero replacement per pair), with a "
    "percentile group-bootstrap 95 % CI that draws the shared groups once and applies the draw to both "
    "models, so what a group shifts in both cancels (docs/statistics.md). `pooled` takes a group's values "
    "at every length together; `(every group)`: every resample gave the same difference, so there is no "
    "interval to show."
)


def accuracy_table(out: Path) -> pd.DataFrame:
    acc = pd.read_parquet(out / "eval" / "accuracy.parquet")
    t = acc.pivot_table(index=["model", "task", "length_knob"], columns="decoding", values="accuracy").round(3)
    order = [c for c in ("Std/Soft", "Fused", RECURRENT_1, "jacobi:3", "full") if c in t.columns]
    return t[order + [c for c in t.columns if c not in order]].reset_index()


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
    return "\n\n" + _md_table(pd.read_parquet(p).round(4))


def contraction_table(out: Path) -> pd.DataFrame:
    t = pd.read_parquet(out / "diagnostics" / "contraction.parquet")
    keep = t[t["pass"].isin([1, 2, 3, 4, 8, 16, 32])]
    return keep[["run", "pass", "val_loss", "answer_accuracy", "state_change"]].round(4)


def _model_reference(cfg, name: str) -> str:
    """How the study names model `name`: its shipped reference, the user's checkpoint, or the folder
    it was trained in, with the preset."""
    if cfg.model:
        return f"checkpoint {cfg.baseline if name == 'baseline' else cfg.model}"
    if cfg.shipped:
        return f"ref:{shipped_name(cfg, name)} (preset {cfg.preset})"
    return f"trained here: models/{name} (preset {cfg.preset})"


def _provenance(cfg, out: Path, times: dict) -> dict:
    ran = (Path(out) / "results" / "depth").is_dir()  # the serial-depth part's models, where it ran
    depth = {f"depth-{n}": depth_path(cfg, out, n) for n in cfg.depth_models()} if ran else {}
    return provenance(
        config=cfg.to_dict(),
        seed=cfg.seed,
        models={
            **{n: _model_reference(cfg, n) for n in cfg.models()},
            **{n: f"ref:{p.name}" if cfg.shipped else f"trained here: models/{n}" for n, p in depth.items()},
        },
        checkpoints={
            **{n: checkpoint_hash(model_path(cfg, out, n)) for n in cfg.models()},
            **{n: checkpoint_hash(p) for n, p in depth.items()},
        },
        stage_seconds={k: round(v, 1) for k, v in times.items()},
        **({"tokenizer": _tokenizer_record(cfg)} if cfg.model else {}),
    )


def _checkpoint_source(cfg) -> str:
    """The intro's account of a user checkpoint: it, its tokenizer, and its baseline or the lack of one."""
    tok = _tokenizer_record(cfg)
    text = (
        f"the checkpoint `{cfg.model}`, in its own tokenizer (`{tok['file']}`, {tok['vocab_size']:,} tokens, "
        f"sha256 {tok['sha256'][:12]}...)"
    )
    trained = f" (training: {training_note(cfg)})"
    if cfg.baseline:
        return text + f", beside its no-feedback baseline `{cfg.baseline}`" + trained
    return (
        text
        + trained
        + (
            "; no baseline was given (`--baseline PATH`), so no number here is read beside a model without trained feedback"
        )
    )


def _tokenizer_record(cfg) -> dict:
    """The user checkpoint's tokenizer: its file, sha256 (as dataset manifests record it) and size."""
    tok = study_tokenizer(cfg)
    return {
        "file": str(Path(cfg.model) / "tokenizer.json"),
        "sha256": tokenizer_sha256(tok),
        "vocab_size": tok.get_vocab_size(),
    }


def provenance_rows(record: dict) -> list[tuple[str, str]]:
    """The provenance record's key facts, (what, value), for the report's short table: each model's
    reference and checkpoint sha256, fbt-probe's commit and version, the working directory's commit
    (where recorded), the torch and transformer-lens versions, the seed, the config's settings (its
    scalar fields; the lists and tables of the config are in the full record)."""
    rows = []
    models, sums = record.get("models") or {}, record.get("checkpoints") or {}
    for n in dict.fromkeys([*models, *sums]):
        if n in models:
            rows.append((f"model ({n})", str(models[n])))
        if n in sums:
            rows.append((f"checkpoint sha256 ({n})", str(sums[n])))
    rows.append(("fbt-probe commit", str(record.get("git_commit", "unknown"))))
    pkg = record.get("package") or {}
    if pkg:
        rows.append(("fbt-probe version", f"{pkg.get('version', 'unknown')} ({pkg.get('kind', 'unknown')})"))
    if "working_directory_commit" in record:
        rows.append(("working-directory commit", str(record["working_directory_commit"])))
    versions = record.get("versions") or {}
    for lib in ("torch", "transformer-lens", "python"):
        if lib in versions:
            rows.append((lib, str(versions[lib])))
    if "seed" in record:
        rows.append(("seed", str(record["seed"])))
    cfg = record.get("config") or {}
    scalars = [f"{k}={v}" for k, v in cfg.items() if v is None or isinstance(v, (str, int, float, bool))]
    if scalars:
        rows.append(("config", ", ".join(scalars)))
    return rows


def provenance_markdown(record: dict) -> str:
    """The short provenance table, then the full record as JSON in a collapsed <details> block
    (rendered by GitHub in the Markdown, and by `_md_to_html(..., trusted=True)` in the HTML).
    Cell values are HTML-escaped and their pipes escaped, so a path or a version cannot break the
    table or inject markup."""

    def cell(v: str) -> str:
        return html.escape(v, quote=False).replace("|", "\\|")

    table = ["| what | value |", "|---|---|"] + [f"| {cell(k)} | {cell(v)} |" for k, v in provenance_rows(record)]
    body = json.dumps(record, indent=1, default=str)
    return (
        "\n".join(table) + "\n\n<details>\n<summary>Full provenance record (JSON)</summary>\n\n"
        "```json\n" + body + "\n```\n\n</details>\n"
    )


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(no rows)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def seeds_table_text(seeds: pd.DataFrame) -> str:
    """One row per headline number: its value in each seed's study, their mean and range."""
    wide = seeds.pivot_table(index=["model", "quantity", "task", "mode", "study"], columns="seed", values="value")
    wide.columns = [f"seed {c}" for c in wide.columns]
    mean, rng = wide.mean(axis=1), wide.max(axis=1) - wide.min(axis=1)  # over the seeds that have the number
    ci = wide.apply(lambda r: between_seeds_text(r.to_numpy(dtype=float), is_proportion(r.name[1])), axis=1)
    wide = wide.round(3).assign(mean=mean.round(3), range=rng.round(3), **{"between-seed 95 % CI": ci})
    return (
        "Each headline number of the findings in the study of each training seed (the same recipe and study, "
        "seed of data, initialisation and probes changed): how much of a number is the seed. The between-seed "
        "CI is the t interval of the mean over the seeds (n - 1 degrees of freedom; cut to [0, 1] for an accuracy, "
        "not for a normalized effect or a ratio, which can leave it), left empty where the seeds agree (no "
        "zero-width interval).\n\n" + _md_table(wide.reset_index())
    )


def _sections(cfg, out: Path, times: dict) -> list[tuple[str, str, list[str]]]:
    """(title, markdown body, figure stems) in reading order."""
    models = cfg.models()
    figs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    pick = lambda prefix: [f for f in figs if f.startswith(prefix)]  # noqa: E731
    base_note = (
        "The **no-feedback baseline** has the same data and steps but trains one pass only, so its fusion "
        "weights are random: whatever it shows at depth 0 under `recurrent:1` is a random, nearly linear "
        "map of a state that already encodes the label (docs/probes.md). Read every feedback number beside it."
    )
    return [
        (
            "Answer accuracy (held-out contexts)",
            "Greedy answer at the final colon. `Std/Soft` are identical for the first "
            "generated token; `Fused` is `jacobi:2` prefill.\n\n" + _md_table(accuracy_table(out)),
            [],
        ),
        (
            "Contraction diagnostic (Fig. 3)",
            "Validation loss after k feedback passes and the mean change of the carried state per pass, over "
            f"{contraction_documents(out)} held-out validation documents (the schedule each model was trained with "
            "is in the `schedule` column of the table behind it); then the ratio of the last pass's change to "
            "pass 2's, with its bootstrap 95 % CI over documents.\n\n"
            + _md_table(contraction_table(out))
            + ratio_table_md(out),
            pick("fig3"),
        ),
        (
            "Depth-0 decodability (Fig. 7a / 7b)",
            base_note + " `carried-state` probes the state `recurrent:1` feeds in "
            "(top layer, previous position, `standard`).\n\n" + _md_table(depth0_table(out, models)),
            pick("fig7a") + pick("fig7b"),
        ),
        (
            "Robustness of depth-0 decodability",
            "Depth-0 accuracy under `recurrent:1`, pooled over lengths, refitted on "
            "the same folds with standardised or raw features and C from 0.01 to 10 (the main table's probe is "
            "standardised, C = 1); in brackets the control task (labels permuted across groups). A reading that moves "
            "with the probe is the probe's, not the model's.\n\n" + _md_table(robustness_table(out, models)),
            [],
        ),
        (
            "Causal tests: is the carried state used?",
            "Metric: logit difference between the two label words at the final "
            "position; normalized = `(patched − corrupt)/(clean − corrupt)`. **Feedback swap** (run a sample with its "
            "partner's carried state, value or gate at the final position): 1 = the answer fully follows the swapped-in "
            "state, 0 = it ignores it (`gate` is an exact no-op control: both samples end in the same token). **State "
            "replacement / gate ablation** (noising): 1 = no effect, 0 = behaves like the partner; `accuracy` is the answer "
            "accuracy with the replacement (under `soft` decoding for the gate rows). Pairs whose clean–corrupt gap is "
            "below 0.1 are left out of `normalized` (counted). One row per length; `normalized` has a group-bootstrap "
            "95 % CI (the pairs of one group resampled together), `accuracy` a Wilson 95 % CI with n = groups "
            "(docs/statistics.md).\n\n" + _md_table(causal_table(out, models)),
            pick("ablation-bars") + pick("patching") + pick("decodable-vs-used"),
        ),
        *paired_section(out),
        methods_section(cfg, out, _md_table, figs),
        *sae_section(cfg, out, _md_table, figs),
        depth_section(cfg, out, _md_table, figs),
        ("What was run", provenance_markdown(_provenance(cfg, out, times)), []),
    ]


def paired_section(out: Path) -> list[tuple[str, str, list[str]]]:
    """The section *Feedback − baseline, paired* where the study has the `paired` table."""
    t = paired_table(out)
    if t is None:
        return []
    return [("Feedback − baseline, paired", PAIRED_NOTE + "\n\n" + _md_table(t), [])]


def _sae_finding(out: Path) -> list[str]:
    said = sae_sentences(out)
    if not said:
        return []
    return [
        "How many features carry what the model uses (TopK SAEs on the carried state, label latents chosen on "
        "the other half of the groups; share of the full-state swap's effect, normal group-bootstrap 95 % CI; "
        "figure *sae-vs-das-feedback*): " + "; ".join(said) + "."
    ]


def stage_report(cfg, out: Path, times: dict) -> None:
    """Findings first (one sentence each, number, CI, figure), then every figure, then the full tables
    (collapsed in the HTML), then what was run."""
    with atomic_path(out / "headline.csv") as tmp:  # what a multi-seed run stacks (seeds.csv)
        headline(cfg, out).to_csv(tmp, index=False, float_format="%.6g")

    subject = f"checkpoint {Path(cfg.model).name}" if cfg.model else f"preset {cfg.preset}"
    title = f"fbt-probe reproduction — {subject}{' (quick)' if cfg.quick else ' (demo)' if cfg.demo else ''}"
    sections = _sections(cfg, out, times)
    tables, (prov_head, prov_text, _) = sections[:-1], sections[-1]
    source = (
        (
            "the reference models shipped with the package ("
            + ", ".join(f"`ref:{shipped_name(cfg, n)}`" for n in cfg.models())
            + ", and for the serial-depth part "
            + ", ".join(f"`ref:{depth_name(cfg, n)}`" for n in cfg.depth_models())
            + "); `fbt-probe reproduce --train` retrains them"
        )
        if cfg.shipped
        else (_checkpoint_source(cfg) if cfg.model else "models trained from scratch in this study")
    )
    scope = (
        " The demo study: fewer probe groups, no `full` recurrence on the register tasks, the causal experiments at "
        "one length per task ("
        + ", ".join(f"{t} {','.join(map(str, k))}" for t, k in cfg.patch_knobs.items())
        + "), lighter AtP/DAS/lens, the serial-depth part on a reduced range (k = "
        + ", ".join(map(str, cfg.depth_knobs))
        + f", {cfg.depth_pairs} pairs per k);"
        " `fbt-probe reproduce` without --demo runs the full one."
        if cfg.demo
        else ""
    )
    intro = (
        f"Models: {source}.{scope} {CHECKPOINT_SETTING if cfg.model else SETTING} Stage times: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
        + "."
    )
    seeds = spread_table(cfg, out)
    found = findings(cfg, out, seeds) + _sae_finding(out) + shipped_comparison(cfg, out)
    kind = same_kind(seeds, study_kind(cfg))
    if kind is not None and len(kind):
        tables.append(("Over training seeds", seeds_table_text(kind), []))
    md = [f"# {title}\n", intro + "\n", "## Findings\n", "\n".join(f"- {f}" for f in found) + "\n", "## Figures\n"]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{_inline(intro)}</p>",
        "<h2>Findings</h2>",
        "<ul>" + "".join(f"<li>{_inline(f)}</li>" for f in found) + "</ul>",
        "<h2>Figures</h2>",
    ]
    for head, _, figs in tables:
        for f in figs:
            caption = figure_caption(f)
            md.append(f"![{f}](figures/{f}.png)\n\n*{f}* ({head}): {caption}\n")
            data = base64.b64encode((out / "figures" / f"{f}.png").read_bytes()).decode()
            body.append(
                f'<figure><img alt="{f}" src="data:image/png;base64,{data}"><figcaption><i>{html.escape(f)}</i> '
                f"({html.escape(head)}): {html.escape(caption)}</figcaption></figure>"
            )
    md.append("## Tables\n")
    body.append("<h2>Tables</h2>")
    for head, text, _ in tables:
        md.append(f"### {head}\n\n{text}")
        body.append(f"<details><summary>{html.escape(head)}</summary>{_md_to_html(text)}</details>")
    md.append(f"## {prov_head}\n\n{prov_text}")
    body.append(f"<h2>{html.escape(prov_head)}</h2>" + _md_to_html(prov_text, trusted=True))
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(md))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>"
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:11px}"
        "li{margin:.4em 0}details{margin:.6em 0}summary{cursor:pointer;font-weight:bold}"
        "</style></head><body>" + "\n".join(body) + "</body></html>"
    )
    with atomic_path(out / "report.html") as tmp:
        tmp.write_text(page)


@functools.lru_cache(maxsize=2)
def _markdown(trusted: bool = False):
    from markdown_it import MarkdownIt

    # raw HTML in a table cell stays text, except in text this module wrote and escaped itself (`trusted`)
    return MarkdownIt("commonmark", {"html": trusted}).enable("table")


def _inline(text: str) -> str:
    """One finding's Markdown (bold, code, emphasis, links) as inline HTML, everything else escaped."""
    return _markdown().renderInline(text)


def _md_to_html(text: str, trusted: bool = False) -> str:
    """A section's Markdown (pipe tables, fenced code, paragraphs, inline markup) as HTML, by
    markdown-it-py (CommonMark with GFM tables). `trusted`: the text's own HTML blocks (the
    provenance section's <details>) are kept; elsewhere they are shown as text."""
    return _markdown(trusted).render(text)
