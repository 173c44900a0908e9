"""Sparse autoencoders in the study (stage `sae-feedback`) and their report section.

The stage trains a TopK and a JumpReLU SAE on the feedback model's carried state
(`fusion.hook_feedback`) at every fed position of every probe sample under `jacobi:2` (which
carries the standard pass's top state into every position: what `recurrent:1` carries into the
last), then, per task at the methods' lengths (the pairs DAS reads), runs `sae analyze` with the
TopK SAE (reconstruction, loss recovered, the feature swap and ablations, the feature table and
browser) and the reconstruction and loss recovered of the JumpReLU SAE beside it.

The sparsity claim rests on a grid of TopK SAEs, not on one: SAE seeds × widths (the first of them
is the TopK SAE above) and one trained on the study's data cut to the demo's groups per task, each
with its own label latents and its own random-active control on the same pairs, in one table
(`sparsity.parquet`) that `rules.sae_sparsity_grid` reads. The demo skips the stage and its report
says so; the quick study runs one small SAE (a pipeline check)."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fbt_probe.io import atomic_dir, read_json, write_json
from fbt_probe.loading import load_data
from fbt_probe.modes import parse_modes
from fbt_probe.provenance import git_commit, provenance
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import DEMO_PLAN, JACOBI_2, RATIO_OF_MEANS, RECURRENT_1
from fbt_probe.reproduce.part import Part, Section, headline_frame, md_table, trained_stages
from fbt_probe.reproduce.parts.methods import (
    FEEDBACK,
    _fmt,
    _mapped,
    _model,
    _per_task,
    _task_pairs,
    methods_knobs,
    tables,
)
from fbt_probe.reproduce.stages import Stage
from fbt_probe.sae.analyze import TOP, analyze, fractions, quality
from fbt_probe.sae.data import collect, saelens_metadata
from fbt_probe.sae.features import feature_tests
from fbt_probe.sae.metrics import RECOVERED_GAP, reconstruction
from fbt_probe.sae.model import SparseAutoencoder
from fbt_probe.sae.train import SAETrainConfig, train_sae

NAME = "feedback"  # the model the stage studies (the baseline's fusion is untrained: no state to decompose)
TITLE = "Sparse autoencoders on the carried state"


def sae_settings(cfg) -> dict | None:
    """What the stage runs (its key); None: not run (the demo). `grid_expansions` × `grid_seeds`: the
    TopK SAEs of the sparsity table (the first pair is the analysed TopK SAE's own); `demo_groups`:
    task -> groups per length of the demo-data SAE's training rows (None: no such SAE)."""
    if cfg.demo:
        return None
    quick = cfg.quick
    expansion = 2 if quick else 4
    return {
        "hook": FEEDBACK,
        "train_mode": JACOBI_2,
        "positions": "fed",
        "architectures": ["topk", "jumprelu"],
        "expansion": expansion,
        "k": 4 if quick else 8,
        "l0_coeff": 0.03,
        "steps": 50 if quick else 2000,
        "batch_size": 256,
        "lr": 2e-3,
        "mode": RECURRENT_1,
        "modes": [RECURRENT_1] if quick else [RECURRENT_1, "jacobi:3"],
        "ks": [1, 2] if quick else [1, 2, 4, 8, 16, 32],
        "max_pairs": 3 if quick else cfg.patch_pairs,
        "n_boot": 200 if quick else 1000,
        "knobs": methods_knobs(cfg),
        "grid_expansions": [expansion] if quick else [expansion, 2 * expansion],
        "grid_seeds": [cfg.seed] if quick else [cfg.seed, cfg.seed + 1],
        "demo_groups": None if quick else {t: DEMO_PLAN[t].groups for t in cfg.groups if t in DEMO_PLAN},
    }


def fractions_ready(fr: pd.DataFrame | None) -> bool:
    return fr is not None and bool((fr["condition"] == "features").any())


def folder(out: Path) -> Path:
    return Path(out) / "results" / "sae" / NAME


def sae_id(expansion: int, seed: int, demo: bool = False) -> str:
    """The grid's name of a TopK SAE: topk-x4-s0 (expansion 4, SAE seed 0), topk-x4-s0-demo (trained on
    the demo-sized data)."""
    return f"topk-x{expansion}-s{seed}" + ("-demo" if demo else "")


def demo_rows(data: pd.DataFrame, groups: dict) -> np.ndarray:
    """Boolean mask of `data`'s rows in the demo-sized subset: per task and length, the first
    `groups[task]` group ids (in sorted order; completion's and memory's groups span the lengths, so
    the same groups at every length; a register task's are per cell). A task not in `groups` is kept
    whole."""
    keep = np.ones(len(data), dtype=bool)
    for (task, _), g in data.groupby(["task", "length_knob"], sort=False):
        if task not in groups:
            continue
        first = set(sorted(g["group_id"].unique())[: groups[task]])
        keep[data.index.get_indexer(g.index)] = g["group_id"].isin(first).to_numpy()
    return keep


def grid_plan(s: dict, seed: int) -> list[dict]:
    """The sparsity table's TopK SAEs in order (the first is the analysed TopK SAE): id, expansion,
    sae_seed, data ("study" or "demo-sized"), folder (relative to the stage's)."""
    plan = []
    for e in s["grid_expansions"]:
        for sd in s["grid_seeds"]:
            first = not plan
            plan.append(
                {
                    "sae": sae_id(e, sd),
                    "expansion": e,
                    "sae_seed": sd,
                    "data": "study",
                    "folder": "topk" if first else f"grid/{sae_id(e, sd)}",
                }
            )
    if not plan or (plan[0]["expansion"], plan[0]["sae_seed"]) != (s["expansion"], seed):
        raise ValueError("sae settings: the grid's first SAE must be the analysed TopK SAE")
    if s.get("demo_groups"):
        i = sae_id(s["expansion"], seed, demo=True)
        plan.append(
            {"sae": i, "expansion": s["expansion"], "sae_seed": seed, "data": "demo-sized", "folder": f"grid/{i}"}
        )
    return plan


def _train(x, index, s: dict, arch: str, expansion: int, seed: int, meta: dict, dataset_path: str):
    tc = SAETrainConfig(
        architecture=arch,
        expansion=expansion,
        k=s["k"],
        steps=s["steps"],
        batch_size=s["batch_size"],
        lr=s["lr"],
        seed=seed,
        l0_coeff=s["l0_coeff"],
    )
    sae, record = train_sae(x, tc, {**meta, **saelens_metadata(index, dataset_path)})
    sae.cfg.metadata["training"] = record
    sae.cfg.metadata["reconstruction"] = reconstruction(sae, x)
    return sae


def stage_sae(cfg, out: Path, settings: dict | None = None) -> None:
    """OUT/results/sae/feedback/: topk/ and jumprelu/ (SAELens's format), analysis/TASK/ (`sae analyze`
    of the TopK SAE), jumprelu-quality/TASK/ (reconstruction and loss recovered of the JumpReLU SAE),
    grid/ID/ (the grid's other TopK SAEs), sparsity.parquet (every grid SAE's feature swap and random
    control per task and k) and sparsity.provenance.json. `settings`: `sae_settings(cfg)` unless given."""
    s = settings or sae_settings(cfg)
    model, info = _model(cfg, out, NAME)
    data = load_data(out / "data", pairs=False, command="reproduce")
    x, index = collect(model, data, s["hook"], s["train_mode"], s["positions"])
    meta = {
        "hook_name": s["hook"],
        "model_name": info["model"],
        "checkpoint_sha256": info["checkpoint_sha256"],
        "dataset_hash": data.attrs.get("dataset_hash"),
        "mode": s["train_mode"],
        "positions": s["positions"],
        "dataset": "data (every task, every probe length)",
    }
    path = str(out / "data")
    plan = grid_plan(s, cfg.seed)
    with atomic_dir(folder(out), force=True) as tmp:
        saes = {arch: _train(x, index, s, arch, s["expansion"], cfg.seed, meta, path) for arch in s["architectures"]}
        for arch, sae in saes.items():
            sae.save(tmp / arch)
        grid = {plan[0]["sae"]: saes["topk"]}
        for g in plan[1:]:
            if g["data"] == "study":
                grid[g["sae"]] = _train(x, index, s, "topk", g["expansion"], g["sae_seed"], meta, path)
            else:
                keep = demo_rows(data.reset_index(drop=True), s["demo_groups"])[index["row"].to_numpy()]
                cut = ", ".join(f"{t} {n}" for t, n in s["demo_groups"].items())
                sub = {**meta, "dataset": f"data cut to the demo's groups per task and length ({cut})"}
                grid[g["sae"]] = _train(
                    x[torch.as_tensor(keep)], index[keep], s, "topk", g["expansion"], g["sae_seed"], sub, path
                )
            grid[g["sae"]].cfg.metadata["grid_id"] = g["sae"]
            grid[g["sae"]].save(tmp / g["folder"])
        rows = []
        for task, df, mapping in _task_pairs(cfg, out):
            modes = parse_modes(list(_mapped(s["modes"], mapping)))  # the stage settings name them
            res = analyze(
                model,
                saes["topk"],
                df,
                tmp / "analysis" / task,
                modes[0],
                modes[1:],
                tuple(s["ks"]),
                s["max_pairs"],
                seed=cfg.seed,
                n_boot=s["n_boot"],
                info=info,
                figures=False,
                empty_ok=True,
            )
            recon, lr = quality(model, saes["jumprelu"], df, modes, n_boot=s["n_boot"], seed=cfg.seed)
            (tmp / "jumprelu-quality" / task).mkdir(parents=True)
            recon.assign(task=task).to_parquet(tmp / "jumprelu-quality" / task / "reconstruction.parquet", index=False)
            lr.to_parquet(tmp / "jumprelu-quality" / task / "loss_recovered.parquet", index=False)
            for g in plan:
                if g["sae"] == plan[0]["sae"]:
                    fr = res["fractions"]  # the analysed SAE's own feature swap: the same pairs, seed and ks
                else:
                    wide = feature_tests(
                        model,
                        grid[g["sae"]],
                        df,
                        s["hook"],
                        modes[0],
                        tuple(s["ks"]),
                        s["max_pairs"],
                        seed=cfg.seed,
                        ablations=False,
                    )
                    fr = fractions(wide, s["n_boot"], cfg.seed)
                rows.append(fr.assign(task=task, **_grid_columns(g, grid[g["sae"]])))
        table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=SPARSITY_COLUMNS)
        table = table.assign(
            study_seed=cfg.seed,
            checkpoint_sha256=info["checkpoint_sha256"],
            dataset_hash=data.attrs.get("dataset_hash"),
            commit=git_commit(),
        )
        table[[c for c in SPARSITY_COLUMNS if c in table] + [c for c in table if c not in SPARSITY_COLUMNS]].to_parquet(
            tmp / "sparsity.parquet", index=False
        )
        write_json(
            tmp / "sparsity.provenance.json",
            {"settings": s, "saes": plan, **info, "provenance": provenance()},
        )


SPARSITY_COLUMNS = [
    "sae",
    "expansion",
    "sae_seed",
    "data",
    "task",
    "k",
    "condition",
    "fraction",
    "ci_low",
    "ci_high",
    "pairs",
    "groups",
    "max_active",
    "d_sae",
    "k_topk",
    "training_rows",
    "fvu",
    "dead_latents",
    "folder",
]


def _grid_columns(g: dict, sae) -> dict:
    """One grid SAE's columns of the sparsity table: its id, width, seed, data, the most latents a pair
    can have active (2·k: two samples' top-k), its size and reconstruction on its training rows."""
    rec = sae.cfg.metadata.get("reconstruction", {})
    return {
        "sae": g["sae"],
        "expansion": g["expansion"],
        "sae_seed": g["sae_seed"],
        "data": g["data"],
        "max_active": 2 * int(sae.cfg.k),
        "d_sae": int(sae.cfg.d_sae),
        "k_topk": int(sae.cfg.k),
        "training_rows": int(sae.cfg.metadata["training"]["rows"]),
        "fvu": float(rec.get("fvu", float("nan"))),
        "dead_latents": int(rec.get("dead_latents", -1)),
        "folder": g["folder"],
    }


# ----------------------------------------------------------------------------- figures and report
def sae_tables(out: Path) -> dict:
    """The stage's tables across tasks (each dataset mode renamed to the paper's recurrent:k), or {} if not run."""
    f = folder(out)
    if not (f / "analysis").is_dir():
        return {}
    t = {
        key: _per_task(f / "analysis", f"{key}.parquet", out)
        for key in ("reconstruction", "loss_recovered", "fractions", "features", "examples", "activations")
    }
    t["jumprelu_reconstruction"] = _per_task(f / "jumprelu-quality", "reconstruction.parquet", out)
    t["jumprelu_loss_recovered"] = _per_task(f / "jumprelu-quality", "loss_recovered.parquet", out)
    t["saes"] = {a: SparseAutoencoder.load(f / a).cfg for a in ("topk", "jumprelu") if (f / a).is_dir()}
    t["sparsity"] = pd.read_parquet(f / "sparsity.parquet") if (f / "sparsity.parquet").is_file() else None
    return t


def grid_ready(sp: pd.DataFrame | None) -> bool:
    return sp is not None and "sae" in sp and bool((sp["condition"] == "features").any())


def probe_depth0(out: Path) -> pd.DataFrame | None:
    """task -> depth-0 probe accuracy under recurrent:1 (mean over lengths and folds) of the feedback model."""
    p = out / "results" / "probes" / NAME / "probes.parquet"
    if not p.is_file():
        return None
    t = pd.read_parquet(p)
    t = t[(t["mode"] == RECURRENT_1) & (t["depth"] == 0) & (t["metric"] == "accuracy")]
    return t.groupby("task", as_index=False)["value"].mean().rename(columns={"value": "accuracy"})


def figure_jobs(cfg, out: Path) -> list[tuple[str, str, pd.DataFrame, dict]]:
    t = sae_tables(out)
    if not t or not fractions_ready(t["fractions"]):
        return []
    words = {"model_label": "feedback model"}
    swap = t["sparsity"] if grid_ready(t.get("sparsity")) else t["fractions"]  # every SAE of the grid
    jobs = [(f"sae-swap-{NAME}", "sae-swap", swap, words)]
    das = tables(out, NAME)["das"]
    jobs.append((f"sae-vs-das-{NAME}", "sae-vs-das", t["fractions"], {"das": das, "probe": probe_depth0(out), **words}))
    if t["activations"] is not None and len(t["activations"]):
        jobs.append((f"sae-features-{NAME}", "sae-features", t["activations"], words))
    return jobs


def _md_text(text: str) -> str:
    """An example's text for a Markdown table: markup characters escaped, the marked token [[x]] in bold."""
    esc = re.sub(r"([\\`*_{}\[\]<>|#])", r"\\\1", str(text))
    return re.sub(r"\\\[\\\[(.*?)\\\]\\\]", lambda m: f"**{m.group(1) or ' '}**", esc)


def _grid_words(sp: pd.DataFrame) -> str:
    """'5 TopK SAEs (SAE seeds 0 and 1 × expansion 4 and 8 on the study's data; topk-x4-s0-demo on the
    study's data cut to the demo's groups), each with its own label latents and random control'."""
    saes = sp.drop_duplicates("sae")
    if len(saes) == 1:
        r = saes.iloc[0]
        return (
            f"one TopK SAE ({r['sae']}: expansion {int(r['expansion'])}, SAE seed {int(r['sae_seed'])}, on the "
            f"{r['data']} data) with its label latents and random control"
        )
    study, demo = saes[saes["data"] == "study"], saes[saes["data"] != "study"]
    seeds = " and ".join(str(int(x)) for x in sorted(study["sae_seed"].unique()))
    widths = " and ".join(str(int(x)) for x in sorted(study["expansion"].unique()))
    parts = [
        f"SAE seed{'s' if study['sae_seed'].nunique() > 1 else ''} {seeds} × expansion {widths} on the study's data"
    ]
    if len(demo):
        parts.append(", ".join(demo["sae"]) + " on the study's data cut to the demo's groups")
    return f"{len(saes)} TopK SAEs ({'; '.join(parts)}), each with its own label latents and random control"


def sentences(out: Path) -> list[str]:
    """Per task: on how many of the grid's SAEs a few label latents carry most of the full-state swap's
    effect (`rules.sae_sparsity_grid`), after a line naming the grid; a stage run before the grid: the
    TopK SAE's own sentence (`rules.sae_sparsity`)."""
    t = sae_tables(out)
    sp = t.get("sparsity") if t else None
    if grid_ready(sp):
        return [_grid_words(sp)] + sentences_from(sp)
    fr = t.get("fractions") if t else None
    if not fractions_ready(fr):
        return []
    topk = t["saes"].get("topk")
    most = None if topk is None or getattr(topk, "k", None) is None else 2 * int(topk.k)  # a pair: two samples' top-k
    return [rules.sae_sparsity(task, fr[fr["task"] == task], most).sentence for task in sorted(fr["task"].unique())]


def _settings_text(cfg, t: dict) -> str:
    s = sae_settings(cfg)
    c = t["saes"].get("topk")
    width = f"{c.d_sae} latents on d_model {c.d_in}" if c is not None else ""
    return (
        f"A TopK SAE (k = {s['k']}, {width}; AuxK for dead latents) and a JumpReLU SAE (L0 penalty "
        f"{s['l0_coeff']}, straight-through threshold) trained {s['steps']} Adam steps on `{s['hook']}`, the "
        f"state h_(t−1) carried into position t, at every fed position of every probe sample under "
        f"`{s['train_mode']}` (which carries the standard pass's top state into every position; `recurrent:1` "
        "carries the same state into the last), saved in SAELens's format. The feature tests read the final "
        f"position under `{s['mode']}` on each task's pairs at its methods lengths (the pairs DAS reads; at most "
        f"{s['max_pairs']} per task × length cell, round-robin over groups). **Label latents** are ranked by the "
        "mean |z_i − z_partner| on the other half of the groups (cross-fitted); the **feature swap** runs the "
        "partner with only the top-k label latents set to the sample's values (the partner's reconstruction "
        "error kept) and is reported as a share of the full-state swap's effect on the same pairs (a ratio of "
        "pair means, normal group-bootstrap 95 % CI, docs/statistics.md); `random` swaps k latents drawn from those active in the "
        "pairs, the control at the same k; `all` swaps every latent (the full swap up to the two rows' "
        "reconstruction errors). **Loss recovered**: 1 − (loss with the SAE reconstruction in place of the "
        "carried state − clean) / (loss with the mean state − clean), for the answer's cross-entropy and its "
        f"logit difference, a ratio of means over samples given only where the mean state's cost (its interval) "
        f"is above {RECOVERED_GAP} nats or logits: where the mean ablation costs the answer nothing there is "
        "nothing to recover."
    )


def _per_sae(t: dict, key: str, cells) -> pd.DataFrame:
    """One row per (SAE, task, mode) of table `key` (the TopK SAE's) and `jumprelu_<key>` where
    present: the SAE, task and mode, then `cells(row)`."""
    rows = [
        {"SAE": arch, "task": x.task, "mode": x.mode, **cells(x)}
        for arch, name in (("topk", key), ("jumprelu", f"jumprelu_{key}"))
        if t.get(name) is not None
        for x in t[name].itertuples()
    ]
    return pd.DataFrame(rows)


def _recon_rows(t: dict) -> pd.DataFrame:
    return _per_sae(
        t,
        "reconstruction",
        lambda x: {
            "FVU": f"{x.fvu:.4f}",
            "L0": f"{x.l0:.2f}",
            "dead latents": f"{int(x.dead_latents)} / {int(x.d_sae)}",
            "rows": int(x.rows),
        },
    )


def _loss_rows(t: dict) -> pd.DataFrame:
    return _per_sae(
        t,
        "loss_recovered",
        lambda x: {
            "CE recovered [95% CI]": _recovered(x, "ce", "nats"),
            "logit diff. recovered [95% CI]": _recovered(x, "ld", "logits"),
            "CE clean / SAE / mean": f"{x.ce_clean:.4f} / {x.ce_sae:.4f} / {x.ce_mean:.4f}",
            "samples (groups)": f"{int(x.samples)} ({int(x.groups)})",
        },
    )


def _recovered(x, what: str, unit: str) -> str:
    """A recovered fraction [CI], or, where the mean ablation's cost does not clear the stated gap
    (`sae.metrics.RECOVERED_GAP`), that cost with its interval and no fraction."""
    v = getattr(x, f"recovered_{what}")
    gap = getattr(x, f"{what}_gap", float("nan"))
    if v == v or gap != gap:
        return _fmt(v, getattr(x, f"recovered_{what}_low"), getattr(x, f"recovered_{what}_high"), 3)
    lo, hi = getattr(x, f"{what}_gap_low"), getattr(x, f"{what}_gap_high")
    return f"no gap: the mean ablation costs {_fmt(gap, lo, hi, 3)} {unit}, below {RECOVERED_GAP}"


def _fraction_rows(fr: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (task, k), g in fr[fr["condition"] != "all"].groupby(["task", "k"], sort=True):
        row = {"task": task, "k": int(k)}
        for cond, col in (("features", "top-k label latents"), ("random", "k random latents")):
            r = g[g["condition"] == cond]
            row[col] = _fmt(r["fraction"].iloc[0], r["ci_low"].iloc[0], r["ci_high"].iloc[0]) if len(r) else "n/a"
        row["pairs (groups)"] = f"{int(g['pairs'].iloc[0])} ({int(g['groups'].iloc[0])})"
        rows.append(row)
    for r in fr[fr["condition"] == "all"].itertuples():
        rows.append(
            {
                "task": r.task,
                "k": f"all {int(r.k)}",
                "top-k label latents": _fmt(r.fraction, r.ci_low, r.ci_high),
                "k random latents": "",
                "pairs (groups)": f"{int(r.pairs)} ({int(r.groups)})",
            }
        )
    return pd.DataFrame(rows)


def _grid_rows(sp: pd.DataFrame) -> pd.DataFrame:
    """Per task and k: each SAE's label-latent share / random-active share, with their intervals."""
    saes = list(dict.fromkeys(sp["sae"]))
    rows = []
    for (task, k), g in sp[sp["condition"].isin(["features", "random"])].groupby(["task", "k"], sort=True):
        row = {"task": task, "k": int(k)}
        for sae in saes:
            cell = []
            for cond in ("features", "random"):
                r = g[(g["sae"] == sae) & (g["condition"] == cond)]
                cell.append(_fmt(r["fraction"].iloc[0], r["ci_low"].iloc[0], r["ci_high"].iloc[0]) if len(r) else "n/a")
            row[sae] = " / ".join(cell)
        row["pairs (groups)"] = f"{int(g['pairs'].iloc[0])} ({int(g['groups'].iloc[0])})"
        rows.append(row)
    return pd.DataFrame(rows)


def _grid_saes(sp: pd.DataFrame) -> pd.DataFrame:
    """One row per SAE of the grid: width, seed, training rows, reconstruction on them, active bound."""
    rows = []
    for r in sp.drop_duplicates("sae").itertuples():
        rows.append(
            {
                "SAE": r.sae,
                "expansion (latents)": f"{int(r.expansion)} ({int(r.d_sae)})",
                "SAE seed": int(r.sae_seed),
                "training data (rows)": f"{r.data} ({int(r.training_rows):,})",
                "FVU": f"{r.fvu:.4f}",
                "dead latents": f"{int(r.dead_latents)} / {int(r.d_sae)}",
                "most active in a pair": int(r.max_active),
                "folder": f"`{r.folder}`",
            }
        )
    return pd.DataFrame(rows)


def grid_text(t: dict) -> str:
    """The section's grid part: what the grid is, the sentence per task, the SAEs and their shares."""
    sp = t.get("sparsity")
    if not grid_ready(sp):
        return ""
    said = sentences_from(sp)
    return (
        f"**Over SAEs**: the feature swap on {_grid_words(sp)}, on the same pairs (the first is the TopK SAE "
        "above; the demo-sized data keeps, per task and length, as many groups as the demo's plan has, the "
        "first by group id). A pair has at most 2·k active latents (two samples' top-k). "
        f"Criterion: {rules.CRITERIA['sae']}; {rules.CRITERIA['sae-grid']}.\n\n"
        + "".join(f"- {x}\n" for x in said)
        + "\n"
        + md_table(_grid_saes(sp))
        + "\nShare of the full-state swap's effect, top-k label latents / k random active latents (normal "
        "group-bootstrap 95 % CI):\n\n" + md_table(_grid_rows(sp))
    )


def sentences_from(sp: pd.DataFrame) -> list[str]:
    return [rules.sae_sparsity_grid(task, sp[sp["task"] == task]).sentence for task in sorted(sp["task"].unique())]


def browser_text(t: dict) -> str:
    """Per task, each top label latent: how often it is active, its mean at the final position by label,
    and its max-activating fed positions as text (the token whose top state is carried in bold)."""
    feats, ex = t.get("features"), t.get("examples")
    if feats is None or ex is None or feats.empty:
        return "_(no latents)_\n"
    parts = []
    for task, g in feats.groupby("task", sort=True):
        parts.append(f"**{task}**\n")
        for r in g.sort_values("rank").itertuples():
            head = (
                f"latent {int(r.latent)} (#{int(r.rank)}): active at {r.active_share:.0%} of fed positions; mean at "
                f"the final position {r.final_mean_label0:.2f} (label 0) / {r.final_mean_label1:.2f} (label 1)"
            )
            e = ex[(ex["task"] == task) & (ex["latent"] == r.latent)].sort_values("example")
            rows = pd.DataFrame(
                {
                    "activation": [f"{a:.2f}" for a in e["activation"]],
                    "label": e["label"].astype(int).to_list(),
                    "position": [f"{int(p)}{' (final)' if f else ''}" for p, f in zip(e["position"], e["final"])],
                    "text (carried token in bold)": [_md_text(x) for x in e["text"]],
                }
            )
            parts.append(head + "\n\n" + md_table(rows))
    return "\n".join(parts)


def sections(cfg, out: Path, figures: list[str]) -> list[Section]:
    """The report's SAE sections."""
    if sae_settings(cfg) is None:
        return [
            Section(
                TITLE,
                "_(not run in the demo: `fbt-probe reproduce` without --demo runs the `sae-feedback` stage; "
                "`fbt-probe sae train` and `fbt-probe sae analyze` run it by hand on this study's data, docs/sae.md)_\n",
            )
        ]
    t = sae_tables(out)
    if not t:
        return [Section(TITLE, "_(not run)_\n")]
    grid = grid_text(t)
    said = [] if grid else sentences(out)
    text = (
        _settings_text(cfg, t)
        + "\n\n"
        + ("".join(f"- {x}\n" for x in said) + "\n" if said else "")
        + (grid + "\n" if grid else "")
        + "**Reconstruction** (fed positions of each task's pairs; FVU = unexplained share of the variance):\n\n"
        + md_table(_recon_rows(t))
        + "\n**Loss recovered** (the SAE reconstruction in place of the carried state; the answer position):\n\n"
        + md_table(_loss_rows(t))
        + "\n**Feature swap**: share of the full-state swap's effect carried by k latents (beside it in the "
        "figure: DAS's held-out IIA in a k-dimensional subspace of the same hook, and the depth-0 probe).\n\n"
        + (md_table(_fraction_rows(t["fractions"])) if t["fractions"] is not None else "_(no pairs)_\n")
    )
    stems = [f for f in figures if f.startswith(("sae-vs-das", "sae-swap"))]
    browser = (
        f"The top {TOP} label latents of each task (ranked on every pair), their activation histograms by "
        "label (figure *sae-features-feedback*) and their max-activating fed positions under "
        f"`{sae_settings(cfg)['train_mode']}`, the text up to the token whose top-layer state is carried into "
        "the position.\n\n" + browser_text(t)
    )
    return [
        Section(TITLE, text, stems),
        Section("Feature browser", browser, [f for f in figures if f.startswith("sae-features")]),
    ]


def stages(cfg, out: Path, ck: dict) -> list[Stage]:
    if not cfg.methods or sae_settings(cfg) is None or NAME not in cfg.methods_models():
        return []
    return [
        Stage(
            f"sae-{NAME}",
            # "normalized" / "recovered": ratios of means, the recovered fractions only where the ablation costs
            {**ck, "sae": sae_settings(cfg), "normalized": RATIO_OF_MEANS, "recovered": "gap"},
            [folder(out)],
            partial(stage_sae, cfg, out),
            after=["data"] + trained_stages(cfg, NAME),
            rank=12,
        )
    ]


SHARE_Q = {"features": "sae-label-share-k", "random": "sae-random-share-k"}  # + k: the analysed TopK SAE's shares


def headline(cfg, out: Path) -> pd.DataFrame:
    """The analysed TopK SAE's feature-swap shares per task and k (label latents and random active ones,
    with their groups): the seeds table then judges its sparsity seed by seed."""
    t = sae_tables(out)
    fr = t.get("fractions") if t else None
    if not fractions_ready(fr):
        return headline_frame([], {})
    rows = [
        (NAME, f"{SHARE_Q[r.condition]}{int(r.k)}", r.task, RECURRENT_1, r.fraction, r.ci_low, r.ci_high, int(r.groups))
        for r in fr[fr["condition"].isin(list(SHARE_Q))].itertuples()
    ]
    info = (
        read_json(folder(out) / "sparsity.provenance.json")
        if (folder(out) / "sparsity.provenance.json").is_file()
        else {}
    )
    return headline_frame(rows, {NAME: info.get("checkpoint_sha256", "")})


def seed_sparsity(cfg, out: Path, seeds, task: str) -> rules.Verdict | None:
    """Rule `sae` on each training seed's analysed TopK SAE (its headline rows), stated over seeds."""
    if seeds is None or not len(seeds):
        return None
    rows = seeds[(seeds["model"] == NAME) & (seeds["task"] == task) & seeds["quantity"].str.startswith("sae-")]
    if rows["seed"].nunique() < 2:
        return None
    verdicts = {}
    for s, g in rows.groupby("seed"):
        cond = ["features" if q.startswith(SHARE_Q["features"]) else "random" for q in g["quantity"]]
        k = [int(q.rsplit("k", 1)[1]) for q in g["quantity"]]
        table = pd.DataFrame(
            {"condition": cond, "k": k, "fraction": g["value"], "ci_low": g["ci_low"], "ci_high": g["ci_high"]}
        )
        if "n_groups" in g.columns:
            table["groups"] = g["n_groups"].to_numpy()
        verdicts[int(s)] = rules.sae_sparsity(task, table, None)
    return rules.stated(verdicts, cfg.seed, f"{task}, the analysed TopK SAE of each training seed")


def findings(cfg, out: Path, seeds) -> list[str]:
    said = sentences(out)
    if not said:
        return []
    fr = sae_tables(out).get("fractions")
    tasks = sorted({str(t) for t in fr["task"]}) if fr is not None else []
    over = [v.sentence for task in tasks if (v := seed_sparsity(cfg, out, seeds, task)) is not None]
    return [
        "How many features carry what the model uses (TopK SAEs on the carried state, label latents chosen on "
        "the other half of the groups; share of the full-state swap's effect, normal group-bootstrap 95 % CI; "
        f"figure *sae-vs-das-feedback*; the SAEs of seed {cfg.seed}'s feedback model): "
        + "; ".join(said)
        + "."
        + (
            " Over training seeds: " + "; ".join(over) + "."
            if over
            else f" (one training seed's numbers: seed {cfg.seed}; the seeds table has no SAE rows)"
        )
    ]


CAPTIONS = {
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
    "sae-features": (
        "Each task's top label latents: the latent's activation at the final position, by label. A latent that "
        "tells the labels apart has two clearly separated distributions."
    ),
}

PART = Part(
    "sae",
    stages=stages,
    figures=figure_jobs,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("sae", "sae-grid"),
)
