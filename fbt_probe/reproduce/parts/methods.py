"""Attribution patching, DAS and the lens in the reproduce study (stages `methods-*`, `lens-*`), their
figures, and the report section that sets them beside exact patching and the probes, per task.

Everything here tolerates a model that does not solve a task: a pair whose clean and corrupt logit
differences are closer than `min_gap` has no normalized value, so the AtP parity falls back to
logit-difference units, and cells without data read "n/a".
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.figures.methods import short_hook
from fbt_probe.interventions.pairs import round_robin
from fbt_probe.interventions.registry import AttributionOptions, DasOptions, PatchConfig
from fbt_probe.interventions.runner import run
from fbt_probe.io import atomic_dir, read_json
from fbt_probe.lens.sweep import LensConfig, run_lens, write_lens
from fbt_probe.loading import checkpoint_hash, load_pairs
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import JACOBI_2, RATIO_OF_MEANS, RECURRENT_1, STANDARD, model_path
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
from fbt_probe.reproduce.seeds import per_seed, spread_table, with_own
from fbt_probe.reproduce.stages import Stage
from fbt_probe.reproduce.tables import same_kind, study_kind
from fbt_probe.tasks.generators import suffix_modes

ATP_MODES = (STANDARD, RECURRENT_1, JACOBI_2)
LENS_MODES = (STANDARD, RECURRENT_1, "full", "jacobi:3")
FEEDBACK = "fusion.hook_feedback"


def _model(cfg, out: Path, name: str):
    path = model_path(cfg, out, name)
    return study_model(cfg, out, name), {"model": str(path), "checkpoint_sha256": checkpoint_hash(path)}


def methods_knobs(cfg) -> dict:
    """Task -> lengths: every task of the study, at its causal-experiment lengths (`patch_knobs`) or,
    for a task the exact experiments leave out, its shortest probe length."""
    return {t: list(cfg.patch_knobs.get(t, [min(knobs)])) for t, knobs in cfg.knobs.items()}


def methods_settings(cfg) -> dict:
    """What the stages run (part of their keys): the full study's settings, lighter under --demo
    (fewer DAS subspace sizes, steps and folds, a shorter lens fit, no `full` lens) and lightest
    under --quick (a pipeline check: AtP and the lens under standard and recurrent:1 only, one DAS
    subspace size)."""
    tier = "quick" if cfg.quick else "demo" if cfg.demo else "full"
    pick = lambda quick, demo, full: {"quick": quick, "demo": demo, "full": full}[tier]  # noqa: E731
    return {
        "atp_modes": pick([STANDARD, RECURRENT_1], list(ATP_MODES), list(ATP_MODES)),
        "check": pick(3, 3, 10),
        "das_ks": pick([1], [1, 4], [1, 2, 4, 8]),
        "das_hooks": [FEEDBACK, "blocks.0.hook_resid_pre"],  # the feedback channel and the fused input it makes
        "das_steps": pick(10, 30, 60),
        "das_lr": 0.02,
        "das_folds": pick(2, 2, 3),
        "lens_modes": pick([STANDARD, RECURRENT_1], [STANDARD, RECURRENT_1, "jacobi:3"], list(LENS_MODES)),
        "lens_steps": pick(15, 60, 300),
        "knobs": methods_knobs(cfg),
    }


def _task_pairs(cfg, out: Path):
    """task -> (its pairs at its lengths; the paper-mode -> dataset-mode map of its suffixes). The
    runner's `max_pairs` takes the pairs round-robin over groups (`pairs.round_robin`)."""
    knobs = methods_knobs(cfg)
    df = load_pairs(out / "data", tasks=set(knobs))
    for task in sorted(knobs):
        sel = df[(df["task"] == task) & df["length_knob"].isin(knobs[task])]
        sel = sel.reset_index(drop=True).__finalize__(df)
        if len(sel):
            yield task, sel, suffix_modes(read_json(out / "data" / f"{task}.manifest.json"))


def pairs_over_groups(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """At most `n` pairs per length knob, taken round-robin over groups (each group's first pair, then
    each group's second, ...), rows in their original order: a register group holds several pairs, and
    the first `n` pair ids (what `max_pairs` keeps) would all come from one group, where DAS's grouped
    folds need several."""
    first = df[~df["pair_id"].duplicated()].sort_values("pair_id", kind="stable")
    table = first.assign(group=df.groupby("pair_id", sort=False)["group_id"].min().reindex(first["pair_id"]).to_numpy())
    keep = round_robin(table.reset_index(drop=True), n, ("length_knob",))["pair_id"]
    return df[df["pair_id"].isin(set(keep))]


def _mapped(modes, mapping: dict) -> tuple[str, ...]:
    return tuple(mapping.get(m, m) for m in modes)


def stage_methods(cfg, out: Path, name: str) -> None:
    """Per task: AtP with its parity check (`check` top + random cells) and DAS, at the task's lengths,
    the paper's recurrent:k mapped to the dataset's suffix (OUT/results/methods/NAME/TASK/)."""
    model, info = _model(cfg, out, name)
    s = methods_settings(cfg)
    with atomic_dir(out / "results" / "methods" / name, force=True) as tmp:
        for task, df, mapping in _task_pairs(cfg, out):
            common = dict(
                max_pairs=cfg.patch_pairs,
                lengths=tuple(s["knobs"][task]),
                seed=cfg.seed,
                n_boot=300 if cfg.quick else 1000,
            )
            run(
                model,
                df,
                PatchConfig(
                    "attribution",
                    modes=_mapped(s["atp_modes"], mapping),
                    options=AttributionOptions(check=s["check"]),
                    batch_size=160,
                    **common,
                ),
                out=tmp / task,
                model_info=info,
                figures=False,
            )  # batch 160: 4 cells a forward
            run(
                model,
                df,
                PatchConfig(
                    "das",
                    modes=_mapped((RECURRENT_1,), mapping),
                    options=DasOptions(
                        ks=tuple(s["das_ks"]),
                        steps=s["das_steps"],
                        lr=s["das_lr"],
                        hooks=tuple(s["das_hooks"]),
                        n_folds=s["das_folds"],
                    ),
                    **common,
                ),
                out=tmp / task,
                model_info=info,
                figures=False,
            )


def stage_lens(cfg, out: Path, name: str) -> None:
    model, info = _model(cfg, out, name)
    s = methods_settings(cfg)
    with atomic_dir(out / "results" / "lens" / name, force=True) as tmp:
        for task, df, mapping in _task_pairs(cfg, out):
            lc = LensConfig(
                modes=_mapped(s["lens_modes"], mapping),
                steps=s["lens_steps"],
                lengths=tuple(s["knobs"][task]),
                seed=cfg.seed,
                n_boot=300 if cfg.quick else 1000,
            )
            write_lens(run_lens(model, df, lc), tmp / task, df, info, figures=False)


# ----------------------------------------------------------------------------- figures and report
def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def _per_task(folder: Path, rel: str, out: Path) -> pd.DataFrame | None:
    """FOLDER/<task>/REL of every task, concatenated, with each dataset mode renamed to the paper's
    recurrent:k it stands for (identity under the built-in tokenizer)."""
    frames = []
    for path in sorted(folder.glob(f"*/{rel}")):
        t = pd.read_parquet(path)
        task = path.relative_to(folder).parts[0]
        if "task" not in t:  # a per-task table without its own task column (an SAE analysis's reconstruction)
            t = t.assign(task=task)
        manifest = out / "data" / f"{task}.manifest.json"
        if "mode" in t and manifest.is_file():
            back = {v: k for k, v in suffix_modes(read_json(manifest)).items() if v != k}
            t["mode"] = t["mode"].replace(back)
        frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else None


def tables(out: Path, name: str) -> dict:
    m = out / "results" / "methods" / name
    return {
        "atp": _per_task(m, "attribution/summary.parquet", out),
        "parity": _per_task(m, "attribution/parity.parquet", out),
        "das": _per_task(m, "das/summary.parquet", out),
        "das_folds": _per_task(m, "das/das_folds.parquet", out),
        "lens": _per_task(out / "results" / "lens" / name, "lens_summary.parquet", out),
    }


def figure_jobs(cfg, out: Path) -> list[tuple[str, str, pd.DataFrame, dict]]:
    jobs = []
    for n in cfg.methods_models():
        t = tables(out, n)
        words = {"model_label": MODEL_WORDS.get(n, n)}
        if t["atp"] is not None:
            jobs.append(
                (
                    f"atp-heatmap-{n}",
                    "atp-heatmap",
                    t["atp"],
                    {"direction": "denoising", "mode": "recurrent:1,jacobi:2", **words},
                )
            )
            if (t["atp"]["method"] == "exact").any():
                jobs.append((f"atp-parity-{n}", "atp-parity", t["atp"], words))
        if t["das"] is not None and len(t["das"]):
            jobs.append((f"das-iia-{n}", "das-iia", t["das"], words))
        if t["lens"] is not None:
            jobs.append((f"lens-{n}", "lens", t["lens"], words))
    return jobs


def _fmt(mean, lo=None, hi=None, digits: int = 2) -> str:
    if mean is None or pd.isna(mean):
        return "n/a"
    if lo is None or pd.isna(lo):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def parity_rows(out: Path, models: list[str]) -> pd.DataFrame:
    """Per model × task × mode (denoising): AtP against exact patching on the checked cells."""
    rows = []
    for n in models:
        par = tables(out, n)["parity"]
        if par is None or par.empty:
            continue
        keys = ["task", "length_knob", "mode"] if "length_knob" in par.columns else ["task", "mode"]
        for key, g in par[par["direction"] == "denoising"].groupby(keys, sort=True):
            task, mode = key[0], key[-1]
            length = int(key[1]) if len(key) == 3 else -1
            r = g.set_index("metric")
            metric = (
                "normalized"
                if "normalized" in r.index and not pd.isna(r.loc["normalized", "spearman"])
                else "logit_diff"
            )
            r = r.loc[metric]
            rows.append(
                {
                    "model": n,
                    "task": task,
                    "length": length,
                    "mode": mode,
                    "units": metric,
                    "cells (top + random)": f"{int(r['n_cells'])} ({int(r['n_top'])} top)",
                    "Spearman [95% CI]": _fmt(r["spearman"], r.get("spearman_ci_low"), r.get("spearman_ci_high")),
                    "worst abs error [95% CI]": _fmt(
                        r["worst_abs_error"], r.get("worst_ci_low"), r.get("worst_ci_high")
                    ),
                    "top-cell sign agreement": _fmt(r.get("sign_agreement_top")),
                    "worst cell": r.get("worst_cell", ""),
                    "pairs": int(r["n_pairs"]),
                }
            )
    return pd.DataFrame(rows)


def _summary_value(s: pd.DataFrame | None, **where) -> tuple:
    if s is None:
        return (None, None, None)
    sel = s
    for k, v in where.items():
        sel = sel[sel[k] == v]
    if sel.empty:
        return (None, None, None)
    r = sel.iloc[0]
    return (r["mean"], r["ci_low"], r["ci_high"])


def side_by_side(out: Path, models: list[str], knobs: dict) -> pd.DataFrame:
    """Per model × task under recurrent:1: decodable (probe at depth 0), used (exact feedback swap, DAS IIA on
    fusion.hook_feedback), and where AtP and exact residual patching put the largest effect."""
    rows = []
    for n in models:
        t = tables(out, n)
        probes = _read(out / "results" / "probes" / n / "probes.parquet")
        swap = _read(out / "results" / "interventions" / n / "feedback-swap" / "summary.parquet")
        resid = _read(out / "results" / "interventions" / n / "residual" / "summary.parquet")
        acc = _read(out / "eval" / "accuracy.parquet")
        for task, task_knobs in knobs.items():
            knob = int(task_knobs[0])
            row = {"model": n, "task": task}
            if acc is not None:
                a = acc[
                    (acc["model"] == n)
                    & (acc["task"] == task)
                    & (acc["length_knob"] == knob)
                    & (acc["mode"] == RECURRENT_1)
                ]
                row["answer acc."] = _fmt(a["accuracy"].mean()) if len(a) else "n/a"
            if probes is not None:
                p = probes[
                    (probes["task"] == task)
                    & (probes["mode"] == RECURRENT_1)
                    & (probes["depth"] == 0)
                    & (probes["length"] == knob)
                    & (probes["metric"] == "accuracy")
                ]["value"]
                row["probe depth 0"] = _fmt(p.mean()) if len(p) else "n/a"
            row["feedback swap (exact)"] = _fmt(
                *_summary_value(swap, task=task, condition="state", metric="normalized", length_knob=knob)
            )
            das = t["das"]
            for k in (1, 8):
                row[f"DAS IIA k={k}"] = _fmt(
                    *_summary_value(
                        das, task=task, condition=FEEDBACK, method="das", subspace_dim=k, metric="iia", length_knob=-1
                    )
                )
            row["random k=1"] = _fmt(
                _summary_value(
                    das,
                    task=task,
                    condition=FEEDBACK,
                    method="random-rotation",
                    subspace_dim=1,
                    metric="iia",
                    length_knob=-1,
                )[0]
            )
            row["full swap IIA"] = _fmt(
                _summary_value(
                    das, task=task, condition=FEEDBACK, method="full-interchange", metric="iia", length_knob=-1
                )[0]
            )
            folds = t["das_folds"]
            if folds is not None and len(folds):
                f = folds[
                    (folds["task"] == task)
                    & (folds["hook"] == FEEDBACK)
                    & (folds["method"] == "das")
                    & (folds["subspace_dim"] == 1)
                ]
                row["cos(probe, DAS k=1)"] = _fmt(f["probe_cosine"].mean()) if len(f) else "n/a"
            row["largest residual effect (exact)"] = _largest(resid, task, "residual", "depth")
            row["largest AtP cell"] = _largest(t["atp"], task, "attribution", "condition")
            rows.append(row)
    return pd.DataFrame(rows)


DAS_Q = {"das": "das-k1-iia", "full": "das-full-iia"}  # headline rows: DAS k = 1 and the full swap's IIA


def das_numbers(out: Path, name: str, task: str) -> dict | None:
    """{"das": (DAS k = 1 IIA, Wilson low, high, groups), "full": (the full-vector swap's IIA, low,
    high, groups)} on `fusion.hook_feedback`, pooled over lengths; None where DAS did not run."""
    das = tables(out, name)["das"]
    if das is None:
        return None
    got = {}
    for key, where in (
        ("das", dict(method="das", subspace_dim=1)),
        ("full", dict(method="full-interchange")),
    ):
        sel = das[(das["task"] == task) & (das["condition"] == FEEDBACK) & (das["metric"] == "iia")]
        sel = sel[sel["length_knob"] == -1]
        for k, v in where.items():
            sel = sel[sel[k] == v]
        if sel.empty:
            return None
        r = sel.iloc[0]
        got[key] = (float(r["mean"]), float(r["ci_low"]), float(r["ci_high"]), int(r.get("n_groups", r["n_pairs"])))
    return got


def das_sentences(cfg, out: Path, models: list[str], tasks, seeds=None) -> list[str]:
    """Per task, DAS k = 1 against the full-vector swap on the feedback model, with the untrained-fusion
    baseline as its control where DAS ran on it (`rules.das_illusion`), seed by seed."""
    lines = []
    for task in tasks:
        mine = das_numbers(out, "feedback", task) if "feedback" in models else None
        if mine is None:
            continue
        control = das_numbers(out, "baseline", task) if "baseline" in models else None
        keys = {f"feedback-{k}": ("feedback", q, task, RECURRENT_1) for k, q in DAS_Q.items()}
        own = {f"feedback-{k}": v for k, v in mine.items()}
        if control is not None:
            keys |= {f"baseline-{k}": ("baseline", q, task, RECURRENT_1) for k, q in DAS_Q.items()}
            own |= {f"baseline-{k}": v for k, v in control.items()}
        verdicts = {
            s: None
            if n is None
            else rules.das_illusion(
                task,
                n["feedback-das"],
                n["feedback-full"][0],
                (n["baseline-das"], n["baseline-full"][0]) if control is not None else None,
            )
            for s, n in per_seed(seeds, keys, cfg.seed, own).items()
        }
        v = rules.stated(verdicts, cfg.seed, f"On {task}, DAS with k = 1 against the full-vector swap")
        lines.append(v.sentence + ".")
    return lines


def headline(cfg, out: Path) -> pd.DataFrame:
    """DAS k = 1 and the full swap's IIA per task and model: the seeds table gives the DAS rule's numbers
    seed by seed."""
    rows = []
    for name in cfg.methods_models() if cfg.methods else []:
        for task in methods_knobs(cfg):
            got = das_numbers(out, name, task)
            if got is not None:
                rows += [(name, DAS_Q[k], task, RECURRENT_1, *v) for k, v in got.items()]
    return headline_frame(rows, model_hashes(cfg, out, cfg.methods_models()))


def _largest(s: pd.DataFrame | None, task: str, exp: str, where: str) -> str:
    """The denoising cell with the largest mean normalized effect under recurrent:1 (LD units if none)."""
    if s is None:
        return "n/a"
    sel = s[
        (s["experiment"] == exp) & (s["task"] == task) & (s["mode"] == RECURRENT_1) & (s["direction"] == "denoising")
    ]
    if exp == "attribution":
        sel = sel[sel["method"] == "atp"]
    for metric in ("normalized", "logit_diff"):
        m = sel[(sel["metric"] == metric) & sel["mean"].notna()]
        if len(m):
            r = m.loc[m["mean"].abs().idxmax()] if metric == "normalized" else m.loc[m["mean"].idxmax()]
            cell = f"depth {int(r['depth'])}" if where == "depth" else short_hook(str(r["condition"]))
            return f"{cell} @ pos {int(r['position'])}: {r['mean']:.2f}" + ("" if metric == "normalized" else " (LD)")
    return "n/a"


def lens_rows(out: Path, models: list[str]) -> pd.DataFrame:
    """P(correct label word) at the final position, depth 0 and the middle depth, per mode (last pass)."""
    rows = []
    for n in models:
        s = tables(out, n)["lens"]
        if s is None:
            continue
        s = s[(s["metric"] == "p_correct") & (s["length_knob"] == -1)]
        last = s.groupby("mode")["pass_index"].transform("max")
        s = s[s["pass_index"] == last]
        top = int(s["depth"].max())
        for (task, mode), g in s.groupby(["task", "mode"], sort=True):
            row = {"model": n, "task": task, "mode": mode}
            for kind in ("logit", "tuned"):
                for d in (0, top // 2):
                    row[f"{kind} lens, depth {d}"] = _fmt(*_summary_value(g, lens=kind, depth=d))
            row[f"depth {top} (the model)"] = _fmt(*_summary_value(g, lens="logit", depth=top))
            rows.append(row)
    return pd.DataFrame(rows)


def sections(cfg, out: Path, figures: list[str]) -> list[Section]:
    """The report section (its title says when the stages did not run)."""
    models = cfg.methods_models()
    if not any(tables(out, n)["atp"] is not None for n in models):
        return [Section("Attribution patching, DAS and the lens", "_(not run)_\n")]
    s = methods_settings(cfg)
    seeds = with_own(same_kind(spread_table(cfg, out), study_kind(cfg)), headline(cfg, out), cfg.seed)
    das = das_sentences(cfg, out, models, methods_knobs(cfg), seeds)
    text = (
        "**Attribution patching** (AtP) estimates residual patching for every hook × position (× Jacobi pass) "
        "from one forward and one backward, with the same metric and sign convention (normalized = "
        "`(patched − corrupt)/(clean − corrupt)`; serial hooks when the mode carries a state, so gradients flow "
        f"through the carried states). The parity check patches the {s['check']} cells AtP ranks highest and "
        f"{s['check']} random others exactly: Spearman rank correlation and worst absolute error of AtP against "
        "exact patching (BCa group bootstrap: the pairs of one group resampled together), per length, in normalized units, or logit-difference units where "
        "no pair separates. Only denoising is shown: with both samples of each pair in the table, noising is "
        "1 − denoising of the partner."
        + (
            " This demo runs AtP, DAS and the lens on the feedback model only; "
            "`fbt-probe reproduce` without --demo also runs them on the baseline "
            "(DAS there is the untrained-fusion control)."
            if cfg.demo
            else ""
        )
        + "\n\n"
        + md_table(parity_rows(out, models))
        + "\n**Decodable versus used, side by side** (`recurrent:1`, the patching length of each task; registers-count, which the "
        "exact experiments leave out, at its shortest probe length, so its exact columns read n/a): the depth-0 "
        "probe says the label is linearly *present* in the fused input; the exact feedback swap says the answer "
        "follows the carried state; **DAS** asks whether a learned k-dimensional subspace of `fusion.hook_feedback` "
        "carries the label the model uses: interchange intervention accuracy (top-1 is the source sample's label "
        f"word) on held-out pair groups ({s['das_folds']}-fold grouped CV, Wilson 95 % CI with n = groups, docs/statistics.md), against a random "
        "rotation and the full-vector swap; `cos(probe, DAS k=1)` is the cosine between the probe's direction and the "
        "learned subspace (a random direction gives about sqrt(1/D)). Run on the no-feedback baseline, DAS is the "
        "untrained-fusion control. The last two columns give where exact residual patching (last positions only) "
        "and AtP (every cell) put the largest denoising effect.\n\n"
        + md_table(side_by_side(out, models, methods_knobs(cfg)))
        + "".join(f"\n- {line}" for line in das)
        + ("\n" if das else "")
        + "\n**Lens**: probability of the correct label word at the final position read through the logit lens "
        "(final norm + tied unembedding) and a tuned lens (one affine translator per depth, identity init, KL to "
        "the final logits on half of the pair groups; shown on the other half), per prefill mode (Jacobi: its last "
        "pass; the figures show every pass).\n\n" + md_table(lens_rows(out, models))
    )
    stems = [f for f in figures if f.startswith(("atp-parity", "atp-heatmap", "das-iia", "lens-"))]
    return [Section("Attribution patching, DAS and the lens beside exact patching and the probes", text, stems)]


def stages(cfg, out: Path, ck: dict) -> list[Stage]:
    """AtP (with its parity check) and DAS, then the lens, on each model they run on."""
    if not cfg.methods:
        return []
    key = {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs, **methods_settings(cfg)}
    st = []
    for name in cfg.methods_models():
        after = ["data"] + trained_stages(cfg, name)
        st.append(
            Stage(
                f"methods-{name}",
                {**key, "normalized": RATIO_OF_MEANS},  # AtP's normalized summaries: a ratio of means
                [out / "results" / "methods" / name],
                partial(stage_methods, cfg, out, name),
                after=after,
                rank=11,
            )
        )
        st.append(
            Stage(
                f"lens-{name}",
                key,
                [out / "results" / "lens" / name],
                partial(stage_lens, cfg, out, name),
                after=after,
                rank=14,
            )
        )
    return st


CAPTIONS = {
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
}

PART = Part(
    "methods",
    stages=stages,
    figures=figure_jobs,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("das",),
)
