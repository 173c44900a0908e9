"""The serial-depth part of the study (stage `depth`, after `train-depth-*` under --train): the
compose-s3 models (docs/research/serial-depth.md) on contexts held out of their training, answer
accuracy per k × mode and the carried-state swap per k, on the feedback model and its no-feedback
baseline; its figure, findings sentences (`rules.depth_separation`) and report section.

k is the number of dependent steps the answer needs (the task's length knob). The pairs are those
`fbt-probe eval RUN --pairs N` draws (one per held-out group and k, `eval_samples`), so the full
study's accuracy table is that command's on each model; the swap (`feedback-swap` of the
interventions registry under `recurrent:1`, as the study's exact stage runs it) runs on the same
pairs. A user checkpoint's study has no compose-s3 models: the part is skipped and the report says
so."""

from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.pairs import label_token_ids
from fbt_probe.interventions.registry import PatchConfig
from fbt_probe.io import atomic_dir, write_json
from fbt_probe.loading import checkpoint_hash, load_model
from fbt_probe.provenance import provenance
from fbt_probe.reference import record
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import (
    DEPTH_MODES,
    DEPTH_TASK,
    FULL_DEPTH,
    LM_PRESETS,
    RATIO_OF_MEANS,
    RECURRENT_1,
    ReproConfig,
    depth_name,
    depth_path,
    depth_train_config,
)
from fbt_probe.reproduce.part import HEADLINE, MODEL_WORDS, Part, Section, md_table
from fbt_probe.reproduce.parts.training import log_pairs, train_run
from fbt_probe.reproduce.seeds import quote, seed_numbers
from fbt_probe.reproduce.stages import Stage
from fbt_probe.stats import MIN_GROUPS, group_wilson
from fbt_probe.tasks import build_tokenizer
from fbt_probe.training.evaluate import answer_accuracy, eval_samples

TITLE = "Serial depth: answer accuracy against the steps the answer needs"
SWAP_MODE = RECURRENT_1  # the study's feedback-swap mode (registry `study_modes`)


def folder(out: Path) -> Path:
    return Path(out) / "results" / "depth"


def depth_settings(cfg: ReproConfig) -> dict:
    """What the stage measures (part of its key)."""
    return {
        "task": DEPTH_TASK,
        "knobs": [int(k) for k in cfg.depth_knobs],
        "pairs": cfg.depth_pairs,
        "modes": list(DEPTH_MODES),
        "swap_mode": SWAP_MODE,
        "n_boot": 300 if cfg.quick else 1000,
        "steps": cfg.depth_steps(),
        "normalized": RATIO_OF_MEANS,
    }


def depth_samples(cfg: ReproConfig, tok) -> pd.DataFrame:
    """The held-out pairs: `depth_pairs` per k, one per group, from contexts held out of the depth
    models' training (both models share it: same task, seed and split)."""
    with warnings.catch_warnings():  # k = 2 and 4 have few held-out words: the tables' groups column says so
        warnings.filterwarnings("ignore", message=r".*distinct group\(s\)")
        return eval_samples(
            depth_train_config(cfg, False), tok, pairs=cfg.depth_pairs, knobs={DEPTH_TASK: list(cfg.depth_knobs)}
        )


def with_intervals(acc: pd.DataFrame) -> pd.DataFrame:
    """`answer_accuracy` rows with the Wilson 95 % interval at n = the cell's groups."""
    ci = [group_wilson(r.accuracy, int(r.groups)) for r in acc.itertuples()]
    return acc.assign(ci_low=[c[1] for c in ci], ci_high=[c[2] for c in ci])


def swap_rows(summary: pd.DataFrame, model: str) -> pd.DataFrame:
    """The swap's summary (condition `state`) as one row per k: the normalized effect with its
    group-bootstrap interval, the pairs kept and left out (tiny gap), the groups, and the swap
    accuracy (the answer is the swapped-in state's label) with its Wilson interval at n = groups."""
    s = summary[(summary["condition"] == "state") & (summary["length_knob"] != -1)]
    rows = []
    for k, g in s.groupby("length_knob", sort=True):
        m = g.set_index("metric")
        norm, acc = m.loc["normalized"], m.loc["accuracy"]
        rows.append(
            {
                "model": model,
                "task": DEPTH_TASK,
                "k": int(k),
                "mode": SWAP_MODE,
                "normalized": float(norm["mean"]),
                "ci_low": float(norm["ci_low"]),
                "ci_high": float(norm["ci_high"]),
                "pairs": int(norm["n_pairs"]),
                "excluded": int(norm["n_excluded"]),
                "groups": int(acc.get("n_groups", acc["n_pairs"])),
                "swap_accuracy": float(acc["mean"]),
                "swap_accuracy_low": float(acc["ci_low"]),
                "swap_accuracy_high": float(acc["ci_high"]),
            }
        )
    return pd.DataFrame(rows)


def stage_depth(cfg: ReproConfig, out: Path) -> None:
    """OUT/results/depth/: accuracy.parquet (model × k × mode), swap.parquet (model × k),
    interventions/MODEL/feedback-swap/ (the experiment's own tables) and manifest.json (provenance)."""
    s = depth_settings(cfg)
    tok = build_tokenizer()
    samples = depth_samples(cfg, tok)
    labels = label_token_ids(samples, tok)
    acc, swaps, info = [], [], {}
    with atomic_dir(folder(out), force=True) as tmp:
        for name in cfg.depth_models():
            path = depth_path(cfg, out, name)
            sha = checkpoint_hash(path)
            info[name] = {"model": str(path), "checkpoint_sha256": sha}
            model = load_model(str(path), device=cfg.device)
            a = answer_accuracy(model, samples, tok, modes=DEPTH_MODES)
            acc.append(with_intervals(a).rename(columns={"length_knob": "k"}).assign(model=name, checkpoint_sha256=sha))
            pc = PatchConfig(
                "feedback-swap", modes=(SWAP_MODE,), max_pairs=cfg.depth_pairs, seed=cfg.seed, n_boot=s["n_boot"]
            )
            (res,) = run_several(
                model,
                samples,
                [pc],
                out=tmp / "interventions" / name,
                model_info=info[name],
                label_ids=labels,
                figures=False,
            )
            swaps.append(swap_rows(res.summary, name).assign(checkpoint_sha256=sha))
        cols = ["model", "task", "k", "mode", "decoding", "correct", "n", "groups", "accuracy", "ci_low", "ci_high"]
        accuracy = pd.concat(acc, ignore_index=True)
        accuracy[cols + ["checkpoint_sha256"]].to_parquet(tmp / "accuracy.parquet", index=False)
        pd.concat(swaps, ignore_index=True).to_parquet(tmp / "swap.parquet", index=False)
        write_json(
            tmp / "manifest.json",
            {
                "files": ["accuracy.parquet", "swap.parquet"],
                "accuracy": "answer accuracy (the label word is the top-1 token at the final colon) per model x k x "
                "mode; Wilson 95 % interval with n = the cell's groups (one pair per held-out group)",
                "swap": f"feedback swap under {SWAP_MODE} (condition state): normalized effect with its group-bootstrap "
                "95 % interval, and the swap accuracy (the answer is the swapped-in state's label) with its Wilson "
                "interval at n = groups",
                "provenance": provenance(
                    config=s,
                    seed=cfg.seed,
                    models={n: (f"ref:{depth_name(cfg, n)}" if cfg.shipped else f"models/depth-{n}") for n in info},
                    checkpoints={n: i["checkpoint_sha256"] for n, i in info.items()},
                    training={n: depth_train_config(cfg, n == "baseline").to_dict() for n in info},
                    samples=len(samples),
                ),
            },
        )


# ----------------------------------------------------------------------------- what the report reads
def accuracy_table(out: Path) -> pd.DataFrame | None:
    p = folder(out) / "accuracy.parquet"
    return pd.read_parquet(p) if p.is_file() else None


def swap_table(out: Path) -> pd.DataFrame | None:
    p = folder(out) / "swap.parquet"
    return pd.read_parquet(p) if p.is_file() else None


DEPTH_Q = "depth-"  # every headline quantity of the part starts so (its rows carry the depth models' hashes)
# headline quantities (k appended): answer accuracy, the swap's normalized effect (a ratio of means over pairs,
# named for that definition so that no seeds table averages it with another) and the swap accuracy
ACCURACY_Q, SWAP_Q, SWAP_ACC_Q = "depth-accuracy-k", "depth-swap-normalized-k", "depth-swap-accuracy-k"


def headline_rows(out: Path) -> pd.DataFrame:
    """The depth tables as headline rows (model, quantity, task, mode, value, ci_low, ci_high,
    checkpoint_sha256, n_groups): what `seeds.csv` stacks, so that the rule can be applied seed by seed."""
    cols = HEADLINE
    frames = []
    acc, sw = accuracy_table(out), swap_table(out)
    if acc is not None:
        frames.append(
            acc.assign(quantity=[f"{ACCURACY_Q}{int(k)}" for k in acc["k"]], n_groups=acc["groups"]).rename(
                columns={"accuracy": "value"}
            )
        )
    if sw is not None and len(sw):
        frames.append(
            sw.assign(quantity=[f"{SWAP_Q}{int(k)}" for k in sw["k"]], n_groups=sw["groups"]).rename(
                columns={"normalized": "value"}
            )
        )
        frames.append(
            sw.assign(
                quantity=[f"{SWAP_ACC_Q}{int(k)}" for k in sw["k"]],
                n_groups=sw["groups"],
                value=sw["swap_accuracy"],
                ci_low=sw["swap_accuracy_low"],
                ci_high=sw["swap_accuracy_high"],
            )
        )
    return pd.concat([f[cols] for f in frames], ignore_index=True) if frames else pd.DataFrame(columns=cols)


def seed_tables(seeds: pd.DataFrame | None, groups: pd.DataFrame | None = None) -> dict[int, pd.DataFrame]:
    """Each training seed's depth accuracy table (model, k, mode, value, ci_low, ci_high, groups), read
    back from a stacked headline table; seeds without depth rows are left out. A table written before
    the `n_groups` column takes each cell's groups from `groups` (this study's accuracy table: the
    held-out groups of a cell are the task's design, not the seed's)."""
    if seeds is None or not len(seeds):
        return {}
    t = seeds[seeds["quantity"].astype(str).str.startswith(ACCURACY_Q)]
    t = t.assign(k=[int(q[len(ACCURACY_Q) :]) for q in t["quantity"]])
    n = t["n_groups"] if "n_groups" in t.columns else pd.Series(float("nan"), index=t.index)
    t = t.assign(groups=n)
    if groups is not None and t["groups"].isna().any():
        own = groups.set_index(["model", "k", "mode"])["groups"]
        fill = [own.get((m, int(k), mode), float("nan")) for m, k, mode in zip(t["model"], t["k"], t["mode"])]
        t = t.assign(groups=t["groups"].fillna(pd.Series(fill, index=t.index)))
    cols = ["model", "k", "mode", "value", "ci_low", "ci_high", "groups"]
    return {int(s): g[cols].reset_index(drop=True) for s, g in t.groupby("seed", sort=True)}


def seeds_verdict(seeds: pd.DataFrame | None, groups: pd.DataFrame | None = None) -> rules.Verdict | None:
    """`rules.depth_over_seeds` over the seeds table's seeds (None with fewer than two)."""
    tables = seed_tables(seeds, groups)
    if len(tables) < 2:
        return None
    return rules.depth_over_seeds({s: rules.depth_separation(t) for s, t in tables.items()})


def verdict(out: Path) -> rules.Verdict | None:
    acc = accuracy_table(out)
    return None if acc is None else rules.depth_separation(acc)


def too_few(acc: pd.DataFrame) -> list[int]:
    """The k whose cells have fewer than MIN_GROUPS held-out groups (listed, read for nothing)."""
    return sorted(int(k) for k in acc.loc[acc["groups"] < MIN_GROUPS, "k"].unique())


def cells_sentence(cfg: ReproConfig, out: Path, seeds) -> str:
    """Per k with enough groups, each model's `standard` and its best mode, every number the mean over
    the training seeds (`seeds.quote`); the k with too few groups named."""
    acc = accuracy_table(out)
    few = too_few(acc)
    parts = []
    for k in sorted(int(k) for k in acc["k"].unique() if int(k) not in few):
        cells = []
        for model in ("feedback", "baseline"):
            g = acc[(acc["model"] == model) & (acc["k"] == k)]
            if g.empty:
                continue
            means = {}
            for r in g.itertuples():
                got = seed_numbers(seeds, model, f"{ACCURACY_Q}{k}", DEPTH_TASK, r.mode)
                means[r.mode] = np.mean([v[0] for v in got.values()]) if got else r.accuracy
            shown = ["standard"] + [max((m for m in means if m != "standard"), key=means.get, default=None)]
            said = [
                f"`{m}` {quote(seeds, model, f'{ACCURACY_Q}{k}', DEPTH_TASK, m, cfg.seed, tuple(g[g['mode'] == m][['accuracy', 'ci_low', 'ci_high']].iloc[0]))}"
                for m in shown
                if m in means
            ]
            cells.append(f"the {MODEL_WORDS.get(model, model)} " + ", ".join(said))
        parts.append(f"at k = {k} ({int(acc[acc['k'] == k]['groups'].max())} groups): " + "; ".join(cells))
    if few:
        parts.append(
            f"k = {', '.join(map(str, few))}: too few groups ("
            + ", ".join(str(int(acc[acc["k"] == k]["groups"].max())) for k in few)
            + f" held-out groups; at least {MIN_GROUPS}), read for nothing"
        )
    return "; ".join(parts)


def swap_sentence(cfg: ReproConfig, out: Path, seeds=None) -> str:
    """The swap's normalized effect and swap accuracy per k on both models, each the mean over the
    training seeds; the k with too few groups named, not quoted."""
    sw = swap_table(out)
    if sw is None or sw.empty:
        return ""
    parts = []
    for model, g in sw.groupby("model", sort=False):
        few = sorted(int(k) for k in g.loc[g["groups"] < MIN_GROUPS, "k"])
        cells = []
        for r in g[g["groups"] >= MIN_GROUPS].itertuples():
            acc = quote(
                seeds, model, f"{SWAP_ACC_Q}{r.k}", DEPTH_TASK, SWAP_MODE, cfg.seed,
                (r.swap_accuracy, r.swap_accuracy_low, r.swap_accuracy_high),
            )  # fmt: skip
            norm = (
                quote(
                    seeds, model, f"{SWAP_Q}{r.k}", DEPTH_TASK, SWAP_MODE, cfg.seed, (r.normalized, r.ci_low, r.ci_high)
                )
                if r.normalized == r.normalized
                else "no normalized effect (the pairs' mean gap does not clear 0.1)"
            )
            cells.append(
                f"{norm} at k = {r.k} (swap accuracy {acc}; {r.pairs} pair{'s' if r.pairs != 1 else ''}"
                + (f", {r.excluded} more with a tiny gap)" if r.excluded else ")")
            )
        text = (
            f"the {MODEL_WORDS.get(model, model)}'s by {', '.join(cells)}"
            if cells
            else f"the {MODEL_WORDS.get(model, model)}'s at no k with enough groups"
        )
        if few:
            text += f" (k = {', '.join(map(str, few))}: too few groups)"
        parts.append(text)
    return (
        f"Swapping the carried state at the final position with the partner sample's (`{SWAP_MODE}`) moves the "
        f"{DEPTH_TASK} logit difference between the two label words: " + "; ".join(parts) + " (normalized, a ratio "
        "of means over pairs: 1 = the logit difference follows the swapped-in state, 0 = ignores it; group-bootstrap "
        "95 % CI; figure *depth*, right; the swap accuracy beside it is how often the answer becomes the swapped-in "
        "state's label, Wilson 95 % CI with n = groups: an effect without a swap accuracy above chance moves the "
        "logits but not the answer)"
    )


def sentences(cfg: ReproConfig, out: Path, seeds: pd.DataFrame | None = None) -> list[str]:
    """The findings' depth sentences: the rule's verdict on each seed's table (over seeds, or this
    seed's alone, said so), the cells per k as means over seeds, then the swap per k."""
    if cfg.model:
        return []
    acc = accuracy_table(out)
    if acc is None:
        return []
    scope = (
        f" (the demo runs a reduced range, k = {', '.join(map(str, cfg.depth_knobs))}, at {cfg.depth_pairs} pairs "
        "per k; the full study runs k = 2, 4, 8, 16, 32)"
        if cfg.demo
        else ""
    )
    head = f"Serial depth ({DEPTH_TASK}, k dependent steps; held-out contexts, Wilson 95 % CI with n = groups; figure *depth*){scope}"
    over = seeds_verdict(seeds, acc)
    if over is None:
        v = rules.depth_separation(acc)
        lines = [f"{head}: {v.sentence} (one training seed's numbers: seed {cfg.seed})."]
    else:
        lines = [
            f"{head}, the criterion on each training seed's own table: {over.sentence}; {cells_sentence(cfg, out, seeds)}."
        ]
    swap = swap_sentence(cfg, out, seeds)
    if swap:
        lines.append(swap + ".")
    return lines


def figure_jobs(cfg: ReproConfig, out: Path) -> list[tuple[str, str, pd.DataFrame, dict]]:
    acc = accuracy_table(out)
    if cfg.model or acc is None:
        return []
    return [("depth", "depth", acc, {"swap": swap_table(out), "task": DEPTH_TASK, "min_groups": MIN_GROUPS})]


def _cell(p, lo, hi) -> str:
    return "n/a" if p != p else f"{p:.2f} [{lo:.2f}, {hi:.2f}]"


def accuracy_wide(acc: pd.DataFrame) -> pd.DataFrame:
    """One row per model × k: groups, then each mode's accuracy [Wilson 95 % CI]."""
    rows = []
    for (model, k), g in acc.groupby(["model", "k"], sort=False):
        row = {"model": model, "k": int(k), "groups": int(g["groups"].max())}
        for r in g.itertuples():
            row[f"`{r.mode}`"] = _cell(r.accuracy, r.ci_low, r.ci_high)
        rows.append(row)
    t = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(("feedback", "baseline"))}
    t = t.sort_values(["model", "k"], key=lambda c: c.map(order) if c.name == "model" else c, kind="stable")
    mode_cols = [f"`{m}`" for m in DEPTH_MODES if f"`{m}`" in t.columns]
    return t[["model", "k", "groups", *mode_cols]].reset_index(drop=True)


def swap_wide(sw: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": sw["model"],
            "k": sw["k"],
            "normalized [95% CI]": [_cell(r.normalized, r.ci_low, r.ci_high) for r in sw.itertuples()],
            "swap accuracy [95% CI]": [
                _cell(r.swap_accuracy, r.swap_accuracy_low, r.swap_accuracy_high) for r in sw.itertuples()
            ],
            "pairs (tiny gap)": [f"{r.pairs} ({r.excluded})" for r in sw.itertuples()],
            "groups": sw["groups"],
        }
    )


def sections(cfg: ReproConfig, out: Path, figures: list[str]) -> list[Section]:
    """The report section (it says why where the part did not run; a general LM's study has no such part)."""
    if cfg.preset in LM_PRESETS and not cfg.model:
        return []
    if cfg.model:
        return [
            Section(
                TITLE,
                "_(not run: a user checkpoint's study skips the serial-depth part, which measures the compose-s3 models "
                "— the shipped `ref:tiny-depth-feedback` and `ref:tiny-depth-baseline`, or with `--train` the two trained "
                "here; `fbt-probe reproduce` without --model runs it)_\n",
            )
        ]
    acc, sw = accuracy_table(out), swap_table(out)
    if acc is None:
        return [Section(TITLE, "_(not run)_\n")]
    models = (
        "the shipped `ref:tiny-depth-feedback` and `ref:tiny-depth-baseline`"
        if cfg.shipped
        else "`models/depth-feedback` and `models/depth-baseline`, trained here"
    )
    train = depth_train_config(cfg, False)
    reduced = list(cfg.depth_knobs) != list(FULL_DEPTH.knobs) or cfg.depth_pairs != FULL_DEPTH.pairs
    kind = "demo" if cfg.demo else "quick study" if cfg.quick else "study"
    scope = (
        f"**The {kind} runs a reduced range**: k = {', '.join(map(str, cfg.depth_knobs))} at {cfg.depth_pairs} "
        f"pairs per k; the full study runs k = {', '.join(map(str, FULL_DEPTH.knobs))} at {FULL_DEPTH.pairs}.\n\n"
        if reduced
        else ""
    )
    few = too_few(acc)
    few_note = (
        f" (the `groups` column: k = {', '.join(map(str, few))} ha{'s' if len(few) == 1 else 've'} fewer than "
        f"{MIN_GROUPS} held-out groups, too few groups: listed, drawn as hollow unconnected markers and read for nothing)"
        if few
        else " (the `groups` column)"
    )
    v = rules.depth_separation(acc)
    text = (
        f"A task whose answer needs k dependent steps ({DEPTH_TASK}: a point moved by k generators of the "
        "symmetric group S3; docs/research/serial-depth.md): without feedback a position's layer ℓ reads earlier "
        "positions only below ℓ, so one pass gives the final position a bounded number of serial steps, and the "
        "feedback modes should answer k that standard prefill cannot. Models: "
        f"{models} (`fbt-probe train --tasks {DEPTH_TASK} --steps {train.steps} --seed {cfg.seed}`, `--baseline` for "
        "the no-feedback one). Answer accuracy (the label word is the top-1 token) on contexts held out of their "
        f"training, one pair per held-out group, at most {cfg.depth_pairs} per k; Wilson 95 % CI with n = groups"
        + few_note
        + ". Chance is 0.50.\n\n"
        + scope
        + f"- {v.sentence}.\n- Criterion: {rules.CRITERIA['depth']}.\n\n"
        + md_table(accuracy_wide(acc))
        + "\n**Carried-state swap per k** (`feedback-swap`, condition `state`, under `recurrent:1`, on the same pairs): "
        "normalized = `(patched − corrupt)/(clean − corrupt)` of the logit difference between the two label words, "
        "1 = the logit difference follows the swapped-in state, 0 = ignores it (group-bootstrap 95 % CI; pairs whose "
        "clean–corrupt gap is below 0.1 are left out and counted); swap accuracy = the answer is the swapped-in "
        "state's label (Wilson 95 % CI, n = groups).\n\n"
        + (md_table(swap_wide(sw)) if sw is not None else "_(no swap table)_\n")
    )
    return [Section(TITLE, text, [f for f in figures if f == "depth"])]


def stage_train_depth(cfg: ReproConfig, out: Path, name: str) -> None:
    """A depth model as `fbt-probe train --tasks compose-s3 --steps 800 --seed S [--baseline]` trains it."""
    folder, stage = out / "models" / f"depth-{name}", f"train-depth-{name}"
    train_run(depth_train_config(cfg, name == "baseline"), folder, stage, eval_pairs=log_pairs(cfg))


def stages(cfg: ReproConfig, out: Path, ck: dict) -> list[Stage]:
    if (
        not cfg.depth_models()
    ):  # a user checkpoint's study has no compose-s3 models: the report says the part is skipped
        return []
    st, trained = [], []
    if not cfg.shipped:
        for name in cfg.depth_models():
            st.append(
                Stage(
                    f"train-depth-{name}",
                    {**ck, "task": DEPTH_TASK, "steps": cfg.depth_steps()},
                    [out / "models" / f"depth-{name}"],
                    partial(stage_train_depth, cfg, out, name),
                    resumable=True,
                    rank=2,
                )
            )
            trained.append(f"train-depth-{name}")
    key = {**ck, **depth_settings(cfg)}
    if cfg.shipped:
        key["shipped_depth"] = {n: record(depth_name(cfg, n))["checkpoint_sha256"] for n in cfg.depth_models()}
    return st + [Stage("depth", key, [folder(out)], partial(stage_depth, cfg, out), after=trained, rank=15)]


def headline(cfg: ReproConfig, out: Path) -> pd.DataFrame:
    return headline_rows(out) if not cfg.model else pd.DataFrame(columns=HEADLINE)


def findings(cfg: ReproConfig, out: Path, seeds) -> list[str]:
    return sentences(cfg, out, seeds)


CAPTIONS = {
    "depth": (
        "Serial depth (compose-s3): held-out answer accuracy against the number of dependent steps k the answer "
        "needs (log scale), one line per prefill mode with Wilson 95 % bars (n = groups, written under each k; modes "
        "are offset a little so that equal values stay visible), the feedback model (left) and the no-feedback "
        "baseline (middle); dashed = chance. A separation shows as standard prefill falling to chance at some k while a "
        "feedback mode stays near 1 on the feedback model and every mode stays near chance or below on the "
        "baseline. Right: the carried-state swap's normalized effect against k (1 = the answer follows the "
        "swapped-in state, 0 = ignores it), group-bootstrap 95 % CIs."
    ),
}

PART = Part(
    "depth",
    stages=stages,
    figures=figure_jobs,
    findings=findings,
    sections=sections,
    headline=headline,
    captions=CAPTIONS,
    criteria=("depth", "depth-seeds"),
)
