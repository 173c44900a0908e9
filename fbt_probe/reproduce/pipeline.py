"""`fbt-probe reproduce`: datasets -> training (feedback + no-feedback baseline) -> evaluation and
contraction diagnostic -> activations -> probe sweep -> causal experiments (exact; then attribution
patching, DAS and the lens) -> figures -> report."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import pandas as pd

from fbt_probe.activations import extract
from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.checkpoint import is_nanochat_folder
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.registry import EXPERIMENTS as REGISTRY
from fbt_probe.interventions.registry import PatchConfig, options_for
from fbt_probe.io import atomic_dir, atomic_path, read_json
from fbt_probe.loading import checkpoint_hash, checkpoint_kind, load_pairs
from fbt_probe.probes.robustness import robustness
from fbt_probe.probes.sweep import ProbeConfig, probe_sweep, write_results
from fbt_probe.reference import names, record
from fbt_probe.reproduce.config import (
    DEPTH_TASK,
    EXPERIMENTS,
    EXTRACT_BATCH,
    RECURRENT_1,
    ReproConfig,
    depth_name,
    depth_train_config,
    model_path,
    schedule_label,
    shipped_name,
    study_contexts,
    study_training,
    train_config,
)
from fbt_probe.reproduce.config import tokenizer as _tokenizer
from fbt_probe.reproduce.depth import depth_settings, stage_depth
from fbt_probe.reproduce.methods import methods_settings, stage_lens, stage_methods, study_model
from fbt_probe.reproduce.paired import paired_settings, stage_paired
from fbt_probe.reproduce.report import stage_figures, stage_report
from fbt_probe.reproduce.sae import NAME as SAE_MODEL
from fbt_probe.reproduce.sae import sae_settings, stage_sae
from fbt_probe.reproduce.seeds import combine, seed_folder, source_key
from fbt_probe.reproduce.stages import Runner, Stage
from fbt_probe.tasks import generate, load_spec, write_dataset
from fbt_probe.tasks.generators import suffix_modes
from fbt_probe.training import run_training
from fbt_probe.training.config import TRAIN_KNOBS
from fbt_probe.training.data import heldout, validation_batch
from fbt_probe.training.evaluate import answer_accuracy, contraction_by_document, eval_samples, ratio_interval
from fbt_probe.training.resume import differing, normal, recorded


def stage_data(cfg: ReproConfig, out: Path) -> None:
    """Probe datasets from contexts held out of training (the same hash split the trainer uses)."""
    tok, ho = _tokenizer(cfg), study_contexts(cfg, heldout)
    with atomic_dir(out / "data", force=True) as tmp:
        for task, knobs in cfg.knobs.items():
            spec = dataclasses.replace(load_spec(task), length_grid=tuple(knobs))
            df = generate(spec, groups=cfg.groups[task], seed=cfg.seed + 101, tokenizer=tok, contexts=ho)
            write_dataset(df, tmp, tok, force=True)


def _train(tcfg, folder: Path, stage: str) -> None:
    """Train a study model in `folder`, resuming the run there when it has a training state: only a
    run of this stage's own training config (a run of another recipe, seed or task mix is refused in
    one line, naming the first field that differs)."""
    resume = (folder / "train_state.pt").is_file()
    if resume:
        saved = recorded(folder)[0]
        diff = differing(saved, {f.name: getattr(tcfg, f.name) for f in dataclasses.fields(tcfg)})
        if diff:
            k = diff[0]
            raise FbtError(
                f"{folder / 'config.json'}: field 'train.{k}' is {normal(saved, k)!r}, the stage {stage} trains with "
                f"{normal(tcfg, k)!r}: not this study's run; pass --force {stage} to train it afresh (replaces it)"
            )
    run_training(tcfg, folder, resume=resume, force=not resume, progress=True)


def stage_train(cfg: ReproConfig, out: Path, name: str) -> None:
    _train(train_config(cfg, name == "baseline"), out / "models" / name, f"train-{name}")


def stage_train_depth(cfg: ReproConfig, out: Path, name: str) -> None:
    """A depth model as `fbt-probe train --tasks compose-s3 --steps 800 --seed S [--baseline]` trains it."""
    _train(depth_train_config(cfg, name == "baseline"), out / "models" / f"depth-{name}", f"train-depth-{name}")


def _check_ref(cfg: ReproConfig, shipped: list[str], ref: str, what: str, steps: bool) -> None:
    """One shipped model of the study: present, and trained with the study's seed (and steps)."""
    if ref not in shipped:
        raise FbtError(
            f"--preset {cfg.preset}: no shipped {what} ref:{ref} (shipped: "
            f"{', '.join('ref:' + n for n in shipped) or 'none'}); pass --train to train one"
        )
    rec = record(ref)
    asked, trained = f"--seed {cfg.seed}", f"seed {rec['seed']}"
    if steps:
        asked, trained = f"{asked} --steps {cfg.steps}", f"{trained} and {rec['steps']} steps"
    if rec["seed"] != cfg.seed or (steps and rec["steps"] != cfg.steps):
        named = "" if what == "reference model" else f"{what} "
        raise FbtError(f"{asked}: the shipped {named}ref:{ref} was trained with {trained}; pass --train to train these")


def check_shipped(cfg: ReproConfig) -> None:
    """A shipped study needs shipped models of this preset trained with this seed and step count, and
    shipped depth models trained with this seed."""
    shipped = names()
    for name in cfg.models():
        _check_ref(cfg, shipped, shipped_name(cfg, name), "reference model", steps=True)
    for name in cfg.depth_models():
        _check_ref(cfg, shipped, depth_name(cfg, name), "serial-depth model", steps=False)


def stage_eval(cfg: ReproConfig, out: Path) -> None:
    tok, frames = _tokenizer(cfg), []
    tcfg = study_training(cfg)
    knobs = _train_knobs(cfg) if not cfg.model else None  # a user run's own training lengths
    samples = eval_samples(tcfg, tok, pairs=cfg.eval_pairs, knobs=knobs, contexts=study_contexts(cfg, heldout))
    for name in cfg.models():
        acc = answer_accuracy(study_model(cfg, out, name), samples, tok)
        frames.append(acc.assign(model=name))
    with atomic_path(out / "eval" / "accuracy.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)


def _train_knobs(cfg: ReproConfig) -> dict:
    return {
        t: [k for k in TRAIN_KNOBS[t] if not cfg.quick or k in cfg.knobs[t]] or TRAIN_KNOBS[t][:1] for t in cfg.knobs
    }


def stage_contraction(cfg: ReproConfig, out: Path) -> None:
    tok, frames = _tokenizer(cfg), []
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


def task_modes(cfg: ReproConfig, out: Path, task: str) -> list[str]:
    """The task's modes, the paper's register suffixes mapped to this tokenizer's token counts."""
    mapping = suffix_modes(read_json(out / "data" / f"{task}.manifest.json"))
    return list(dict.fromkeys(mapping.get(m, m) for m in cfg.modes[task]))


def stage_extract(cfg: ReproConfig, out: Path, name: str) -> None:
    for task in cfg.modes:
        extract(
            str(model_path(cfg, out, name)),
            out / "data" / f"{task}.parquet",
            task_modes(cfg, out, task),
            out / "acts" / name / task,
            force=True,
            batch_size=cfg.extract_batch(),
            device=cfg.device,
        )


ROBUSTNESS_TASKS = ("completion", "memory")  # Fig. 7a's tasks: depth 0 under recurrent:1 across probe variants


def stage_probe(cfg: ReproConfig, out: Path, name: str) -> None:
    """Each task's sweep (with its per-sample held-out correctness, `probes_samples.parquet`, what
    the `paired` stage pairs across models) and every task's table in one `probes.parquet`."""
    tables = []
    for task in cfg.modes:
        res = probe_sweep(out / "acts" / name / task, ProbeConfig(seed=cfg.seed))
        write_results(res, out / "results" / "probes" / name / task, force=True)
        tables.append(res.table)
    with atomic_path(out / "results" / "probes" / name / "probes.parquet") as tmp:
        pd.concat(tables, ignore_index=True).to_parquet(tmp, index=False)
    panel = [
        robustness(out / "acts" / name / task, RECURRENT_1, 0, ProbeConfig(seed=cfg.seed))
        for task in ROBUSTNESS_TASKS
        if task in cfg.modes
    ]
    if panel:
        with atomic_path(out / "results" / "probes" / name / "robustness.parquet") as tmp:
            pd.concat(panel, ignore_index=True).assign(model=name).to_parquet(tmp, index=False)


def stage_patch(cfg: ReproConfig, out: Path, name: str) -> None:
    path = model_path(cfg, out, name)
    model = study_model(cfg, out, name)
    df = load_pairs(out / "data", tasks=set(cfg.patch_knobs))
    keep = [int(k) in cfg.patch_knobs[t] for t, k in zip(df["task"], df["length_knob"])]
    df = df[keep].reset_index(drop=True).__finalize__(df)  # each task at its own lengths
    info = {"model": str(path), "checkpoint_sha256": checkpoint_hash(path)}
    lengths = tuple(sorted({k for ks in cfg.patch_knobs.values() for k in ks}))
    study = dict(  # the 15-minute study's budget: last 4 positions, 2 scales
        last_k=3 if cfg.quick else 4, scales=(1.0, 4.0), n_folds=4
    )
    pcs = [
        PatchConfig(
            experiment=exp,
            modes=REGISTRY[exp].study_modes,
            options=options_for(exp, **study),  # each takes the knobs it declares
            max_pairs=cfg.patch_pairs,
            lengths=lengths,
            seed=cfg.seed,
            n_boot=300 if cfg.quick else 1000,
        )
        for exp in EXPERIMENTS
    ]
    # one call: the final-position experiments share each batch's prefill (the same tables as one by one)
    run_several(
        model, df, pcs, out=out / "results" / "interventions" / name, force=True, model_info=info, figures=False
    )


def methods_stages(cfg: ReproConfig, out: Path, name: str, ck: dict, after: list[str]) -> list[Stage]:
    """AtP (with its parity check) and DAS, then the lens (fbt_probe.reproduce.methods)."""
    key = {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs, **methods_settings(cfg)}
    return [
        Stage(
            f"methods-{name}",
            key,
            [out / "results" / "methods" / name],
            partial(stage_methods, cfg, out, name),
            after=after,
        ),
        Stage(f"lens-{name}", key, [out / "results" / "lens" / name], partial(stage_lens, cfg, out, name), after=after),
    ]


def build_stages(cfg: ReproConfig, out: Path) -> list[Stage]:
    c = cfg.to_dict()
    ck = {k: c[k] for k in ("preset", "seed", "model")}
    if cfg.device != "cpu":  # another device's outputs are other bytes
        ck["device"] = cfg.device
    if cfg.shipped:  # a new shipped model (another package version) redoes every stage that reads it
        ck["shipped"] = {n: record(shipped_name(cfg, n))["checkpoint_sha256"] for n in cfg.models()}
    st = [
        Stage(
            "data",
            {**ck, "groups": cfg.groups, "knobs": cfg.knobs, "protocol": "appendix-F"},
            [out / "data"],
            partial(stage_data, cfg, out),
        )
    ]
    trained = []
    for name in cfg.models():
        if not cfg.model and not cfg.shipped:
            st.append(
                Stage(
                    f"train-{name}",
                    {**ck, "steps": cfg.steps},
                    [out / "models" / name],
                    partial(stage_train, cfg, out, name),
                    resumable=True,
                )
            )
            trained.append(f"train-{name}")
    # every kind of pair a group holds is evaluated; "pairs" in the key keeps a study that evaluated only
    # each group's first pair from being reused
    evaluate = Stage(
        "eval",
        {**ck, "eval_pairs": cfg.eval_pairs, "quick": cfg.quick, "pairs": "every-kind"},
        [out / "eval"],
        partial(stage_eval, cfg, out),
        after=trained,
    )
    contract = Stage(
        "contraction",
        {**ck, "passes": cfg.passes, "documents_per_task": cfg.contraction_docs},
        [out / "diagnostics"],
        partial(stage_contraction, cfg, out),
        after=trained,
    )
    depth = []
    if cfg.depth_models():  # a user checkpoint's study has no compose-s3 models: the report says the part is skipped
        dep = []
        if not cfg.shipped:
            for name in cfg.depth_models():
                st.append(
                    Stage(
                        f"train-depth-{name}",
                        {**ck, "task": DEPTH_TASK, "steps": cfg.depth_steps()},
                        [out / "models" / f"depth-{name}"],
                        partial(stage_train_depth, cfg, out, name),
                        resumable=True,
                    )
                )
                dep.append(f"train-depth-{name}")
        key = {**ck, **depth_settings(cfg)}
        if cfg.shipped:
            key["shipped_depth"] = {n: record(depth_name(cfg, n))["checkpoint_sha256"] for n in cfg.depth_models()}
        depth.append(Stage("depth", key, [out / "results" / "depth"], partial(stage_depth, cfg, out), after=dep))
    per = {kind: [] for kind in ("extract", "methods", "lens", "probe", "patch")}
    for name in cfg.models():
        dep = [f"train-{name}"] if not cfg.model and not cfg.shipped else []
        batch = (
            {} if cfg.extract_batch() == EXTRACT_BATCH else {"batch": cfg.extract_batch()}
        )  # the default batch adds nothing to the key, so a study at the default size keeps its stage key
        per["extract"].append(
            Stage(
                f"extract-{name}",
                {**ck, "modes": cfg.modes, **batch},
                [out / "acts" / name],
                partial(stage_extract, cfg, out, name),
                after=["data"] + dep,
            )
        )
        per["probe"].append(
            Stage(
                f"probe-{name}",
                {**ck, "outputs": "per-sample"},  # a study whose probes wrote no per-sample table redoes them
                [out / "results" / "probes" / name],
                partial(stage_probe, cfg, out, name),
                after=[f"extract-{name}"],
            )
        )
        per["patch"].append(
            Stage(
                f"patch-{name}",
                {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs},
                [out / "results" / "interventions" / name],
                partial(stage_patch, cfg, out, name),
                after=["data"] + dep,
            )
        )
        if cfg.methods and name in cfg.methods_models():
            methods, lens = methods_stages(cfg, out, name, ck, ["data"] + dep)
            per["methods"].append(methods)
            per["lens"].append(lens)
    sae = []
    if cfg.methods and sae_settings(cfg) is not None and SAE_MODEL in cfg.methods_models():
        dep = [f"train-{SAE_MODEL}"] if not cfg.model and not cfg.shipped else []
        sae.append(
            Stage(
                f"sae-{SAE_MODEL}",
                {**ck, "sae": sae_settings(cfg)},
                [out / "results" / "sae" / SAE_MODEL],
                partial(stage_sae, cfg, out),
                after=["data"] + dep,
            )
        )
    paired = []
    if "baseline" in cfg.models():  # feedback - baseline over the samples and pairs both models share
        paired.append(
            Stage(
                "paired",
                {**ck, **paired_settings(cfg)},
                [out / "results" / "paired"],
                partial(stage_paired, cfg, out),
                after=[s.name for s in per["probe"] + per["patch"]],
            )
        )
    # the order is the one stages start in when they can run side by side (`--jobs`): the longest chains
    # first (extract -> probe; AtP/DAS; the SAEs), the short stages last, so that no long stage is left to run alone
    st += (
        per["extract"]
        + per["methods"]
        + sae
        + [evaluate]
        + per["lens"]
        + depth
        + per["probe"]
        + [contract]
        + per["patch"]
        + paired
    )
    return st


def check_study_models(cfg: ReproConfig) -> None:
    """Refuse, before anything is written, a user checkpoint the feedback study does not apply to: a
    Hidden Decoding model (no carried state; it has its own probe flow) as either model, and a Qwen3
    folder as --model (its fusion would be fresh weights; as --baseline it is the untrained-fusion
    baseline by construction)."""
    for option, path in (("--model", cfg.model), ("--baseline", cfg.baseline)):
        if path is None:
            continue
        kind = checkpoint_kind(path)
        if kind == HIDDEN_ARCH:
            raise FbtError(
                f"{option} {path}: a Hidden Decoding checkpoint carries no state, so the feedback study does not "
                f"apply; probe its streams with fbt-probe extract {path} DATA --out ACTS, fbt-probe probe ACTS --out "
                "RESULTS and fbt-probe figures hidden RESULTS --out FIGURES (docs/hidden-decoding.md)"
            )
        if option == "--model" and kind is None and not is_nanochat_folder(Path(path)):
            raise FbtError(
                f"--model {path}: a Qwen3-format folder has no trained fusion (loading it adds fresh weights); "
                f"pass it as --baseline beside a feedback checkpoint trained from it (fbt-probe train --init {path} "
                "..., or fbt-probe model import-hf and train)"
            )


def reproduce(cfg: ReproConfig, out: str | Path, force: set[str] = frozenset(), echo=print, jobs: int = 1) -> dict:
    """The study in OUT; `jobs` stages at a time side by side (`Runner.run_all`), figures and report last."""
    out = Path(out)
    if cfg.model and not Path(cfg.model).is_dir():
        raise FbtError(f"--model {cfg.model}: checkpoint folder not found")
    if cfg.baseline and not Path(cfg.baseline).is_dir():
        raise FbtError(f"--baseline {cfg.baseline}: checkpoint folder not found")
    if cfg.model:
        check_study_models(cfg)
        _tokenizer(cfg)  # a checkpoint without its own tokenizer is refused before anything is written
    if cfg.shipped:
        check_shipped(cfg)
    if not cfg.model:  # a checkpoint's study trains nothing (and may study fewer tasks than the recipe's)
        train_config(cfg, False)  # an unusable --steps for the recipe is refused before anything is written
    out.mkdir(parents=True, exist_ok=True)
    stages = build_stages(cfg, out)
    names = {s.name for s in stages} | {"figures", "report"}
    unknown = sorted(set(force) - names)
    if unknown:
        raise FbtError(
            f"--force {unknown[0]}: unknown stage (stages: {', '.join(s.name for s in stages)}, figures, report)"
        )
    runner = Runner(out, force, echo)
    try:
        runner.run_all(stages, jobs)
        all_names = [s.name for s in stages]
        runner.run(
            Stage("figures", {}, [out / "figures"], lambda: stage_figures(cfg, out, workers=jobs), after=all_names)
        )
        runner.run(
            Stage(
                "report",
                {"v": 4, "seeds": source_key(cfg, out)},
                [out / "report.md", out / "report.html", out / "headline.csv"],
                lambda: stage_report(cfg, out, runner.times),
                after=all_names + ["figures"],
            )
        )
    finally:
        runner.close()
    return {"times": runner.times, "ran": runner.ran, "report": out / "report.html"}


def reproduce_seeds(
    cfg: ReproConfig, out: str | Path, seeds: int, force: set[str] = frozenset(), echo=print, jobs: int = 1
) -> dict:
    """Study seeds 0..N-1 (each trained from scratch: `cfg.shipped` must be off) in OUT/seed-S/, write
    OUT/seeds.csv (`seeds.combine`), then redo each seed's report (its key names seeds.csv) so that
    its findings quote the mean and range over the seeds."""
    if cfg.shipped or cfg.model:
        raise FbtError(
            "--seeds: needs --train (the seeds are trained here; the shipped models' seeds table "
            "is already in the package)"
        )
    if seeds < 2:
        raise FbtError(f"--seeds {seeds}: expected at least 2")
    train_config(cfg, False)  # refused before OUT is made
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for s in range(seeds):
        echo(f"== seed {s} ==")
        reproduce(dataclasses.replace(cfg, seed=s), seed_folder(out, s), force, echo=echo, jobs=jobs)
    with atomic_path(out / "seeds.csv") as tmp:
        combine(out, list(range(seeds))).to_csv(tmp, index=False, float_format="%.6g")
    for s in range(seeds):  # every stage is up to date but the report
        reproduce(dataclasses.replace(cfg, seed=s), seed_folder(out, s), echo=lambda _: None)
    return {"seeds": out / "seeds.csv", "reports": [seed_folder(out, s) / "report.html" for s in range(seeds)]}
