"""Sparse autoencoders in the study (stage `sae-feedback`) and their report section.

The stage trains a TopK and a JumpReLU SAE on the feedback model's carried state
(`fusion.hook_feedback`) at every fed position of every probe sample under `jacobi:2` (which
carries the standard pass's top state into every position: what `recurrent:1` carries into the
last), then, per task at the methods' lengths (the pairs DAS reads), runs `sae analyze` with the
TopK SAE (reconstruction, loss recovered, the feature swap and ablations, the feature table and
browser) and the reconstruction and loss recovered of the JumpReLU SAE beside it. The demo skips
the stage and its report says so; the quick study runs a small SAE (a pipeline check)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from fbt_probe.io import atomic_dir
from fbt_probe.loading import load_data
from fbt_probe.modes import parse_modes
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import JACOBI_2, RECURRENT_1
from fbt_probe.reproduce.methods import FEEDBACK, _fmt, _mapped, _model, _per_task, _task_pairs, methods_knobs, tables
from fbt_probe.sae.analyze import TOP, analyze, quality
from fbt_probe.sae.data import collect, saelens_metadata
from fbt_probe.sae.metrics import reconstruction
from fbt_probe.sae.model import SparseAutoencoder
from fbt_probe.sae.train import SAETrainConfig, train_sae

NAME = "feedback"  # the model the stage studies (the baseline's fusion is untrained: no state to decompose)
TITLE = "Sparse autoencoders on the carried state"


def sae_settings(cfg) -> dict | None:
    """What the stage runs (its key); None: not run (the demo)."""
    if cfg.demo:
        return None
    quick = cfg.quick
    return {
        "hook": FEEDBACK,
        "train_mode": JACOBI_2,
        "positions": "fed",
        "architectures": ["topk", "jumprelu"],
        "expansion": 2 if quick else 4,
        "k": 4 if quick else 8,
        "l0_coeff": 0.03,
        "steps": 100 if quick else 2000,
        "batch_size": 256,
        "lr": 2e-3,
        "mode": RECURRENT_1,
        "modes": [RECURRENT_1] if quick else [RECURRENT_1, "jacobi:3"],
        "ks": [1, 2] if quick else [1, 2, 4, 8, 16, 32],
        "max_pairs": 3 if quick else cfg.patch_pairs,
        "n_boot": 200 if quick else 1000,
        "knobs": methods_knobs(cfg),
    }


def fractions_ready(fr: pd.DataFrame | None) -> bool:
    return fr is not None and bool((fr["condition"] == "features").any())


def folder(out: Path) -> Path:
    return Path(out) / "results" / "sae" / NAME


def stage_sae(cfg, out: Path) -> None:
    """OUT/results/sae/feedback/: topk/ and jumprelu/ (SAELens's format), analysis/TASK/ (`sae analyze`
    of the TopK SAE), jumprelu-quality/TASK/ (reconstruction and loss recovered of the JumpReLU SAE)."""
    s = sae_settings(cfg)
    model, info = _model(cfg, out, NAME)
    data = load_data(out / "data", pairs=False, command="reproduce")
    x, index = collect(model, data, s["hook"], s["train_mode"], s["positions"])
    with atomic_dir(folder(out), force=True) as tmp:
        saes = {}
        for arch in s["architectures"]:
            tc = SAETrainConfig(
                architecture=arch,
                expansion=s["expansion"],
                k=s["k"],
                steps=s["steps"],
                batch_size=s["batch_size"],
                lr=s["lr"],
                seed=cfg.seed,
                l0_coeff=s["l0_coeff"],
            )
            meta = {
                "hook_name": s["hook"],
                "model_name": info["model"],
                "checkpoint_sha256": info["checkpoint_sha256"],
                "dataset_hash": data.attrs.get("dataset_hash"),
                "mode": s["train_mode"],
                "positions": s["positions"],
                "dataset": "data (every task, every probe length)",
                **saelens_metadata(index, str(out / "data")),
            }
            sae, record = train_sae(x, tc, meta)
            sae.cfg.metadata["training"] = record
            sae.cfg.metadata["reconstruction"] = reconstruction(sae, x)
            sae.save(tmp / arch)
            saes[arch] = sae
        for task, df, mapping in _task_pairs(cfg, out):
            modes = parse_modes(list(_mapped(s["modes"], mapping)))  # the stage settings name them
            analyze(
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
    return t


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
    jobs = [(f"sae-swap-{NAME}", "sae-swap", t["fractions"], words)]
    das = tables(out, NAME)["das"]
    jobs.append((f"sae-vs-das-{NAME}", "sae-vs-das", t["fractions"], {"das": das, "probe": probe_depth0(out), **words}))
    if t["activations"] is not None and len(t["activations"]):
        jobs.append((f"sae-features-{NAME}", "sae-features", t["activations"], words))
    return jobs


def _md_text(text: str) -> str:
    """An example's text for a Markdown table: markup characters escaped, the marked token [[x]] in bold."""
    esc = re.sub(r"([\\`*_{}\[\]<>|#])", r"\\\1", str(text))
    return re.sub(r"\\\[\\\[(.*?)\\\]\\\]", lambda m: f"**{m.group(1) or ' '}**", esc)


def sentences(out: Path) -> list[str]:
    """Per task: how many label latents carry most of the full-state swap's effect (or that it is not sparse)."""
    t = sae_tables(out)
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
        "logit difference."
    )


def _recon_rows(t: dict) -> pd.DataFrame:
    rows = []
    for arch, key in (("topk", "reconstruction"), ("jumprelu", "jumprelu_reconstruction")):
        r = t.get(key)
        if r is None:
            continue
        for x in r.itertuples():
            rows.append(
                {
                    "SAE": arch,
                    "task": x.task,
                    "mode": x.mode,
                    "FVU": f"{x.fvu:.4f}",
                    "L0": f"{x.l0:.2f}",
                    "dead latents": f"{int(x.dead_latents)} / {int(x.d_sae)}",
                    "rows": int(x.rows),
                }
            )
    return pd.DataFrame(rows)


def _loss_rows(t: dict) -> pd.DataFrame:
    rows = []
    for arch, key in (("topk", "loss_recovered"), ("jumprelu", "jumprelu_loss_recovered")):
        r = t.get(key)
        if r is None:
            continue
        for x in r.itertuples():
            rows.append(
                {
                    "SAE": arch,
                    "task": x.task,
                    "mode": x.mode,
                    "CE recovered [95% CI]": _fmt(x.recovered_ce, x.recovered_ce_low, x.recovered_ce_high, 3),
                    "logit diff. recovered [95% CI]": _fmt(x.recovered_ld, x.recovered_ld_low, x.recovered_ld_high, 3),
                    "CE clean / SAE / mean": f"{x.ce_clean:.4f} / {x.ce_sae:.4f} / {x.ce_mean:.4f}",
                    "samples (groups)": f"{int(x.samples)} ({int(x.groups)})",
                }
            )
    return pd.DataFrame(rows)


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


def browser_text(t: dict, md_table) -> str:
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


def sae_section(cfg, out: Path, md_table, figures: list[str]) -> list[tuple[str, str, list[str]]]:
    """The report's SAE sections: (title, markdown, figure stems)."""
    if sae_settings(cfg) is None:
        return [
            (
                TITLE,
                "_(not run in the demo: `fbt-probe reproduce` without --demo runs the `sae-feedback` stage; "
                "`fbt-probe sae train` and `fbt-probe sae analyze` run it by hand on this study's data, docs/sae.md)_\n",
                [],
            )
        ]
    t = sae_tables(out)
    if not t:
        return [(TITLE, "_(not run)_\n", [])]
    said = sentences(out)
    text = (
        _settings_text(cfg, t)
        + "\n\n"
        + ("".join(f"- {x}\n" for x in said) + "\n" if said else "")
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
        "the position.\n\n" + browser_text(t, md_table)
    )
    return [
        (TITLE, text, stems),
        ("Feature browser", browser, [f for f in figures if f.startswith("sae-features")]),
    ]
