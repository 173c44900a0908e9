"""`fbt-probe reproduce`: datasets -> training (feedback + no-feedback baseline) -> evaluation and
contraction diagnostic -> activations -> probe sweep -> causal experiments (exact; then attribution
patching, DAS and the lens) -> figures -> report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.checkpoint import is_nanochat_folder
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.io import atomic_path
from fbt_probe.loading import checkpoint_kind
from fbt_probe.reference import names, record
from fbt_probe.reproduce.config import LM_MODELS, ReproConfig, depth_name, is_lm, shipped_name, train_config
from fbt_probe.reproduce.config import tokenizer as _tokenizer
from fbt_probe.reproduce.parts import PARTS
from fbt_probe.reproduce.report import stage_figures, stage_report
from fbt_probe.reproduce.seeds import combine, seed_folder, source_key
from fbt_probe.reproduce.stages import Runner, Stage


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
    for name in LM_MODELS if is_lm(cfg) else cfg.models():
        _check_ref(cfg, shipped, shipped_name(cfg, name), "reference model", steps=True)
    for name in cfg.depth_models():
        _check_ref(cfg, shipped, depth_name(cfg, name), "serial-depth model", steps=False)


def common_key(cfg: ReproConfig) -> dict:
    """What every stage's key holds: the preset, seed and user checkpoint, the device where it is not
    the CPU (another device's outputs are other bytes), and the shipped models' hashes (a new
    shipped model, in another package version, redoes every stage that reads it)."""
    c = cfg.to_dict()
    ck = {k: c[k] for k in ("preset", "seed", "model")}
    if cfg.device != "cpu":
        ck["device"] = cfg.device
    if cfg.shipped:
        ck["shipped"] = {n: record(shipped_name(cfg, n))["checkpoint_sha256"] for n in cfg.models()}
    return ck


def build_stages(cfg: ReproConfig, out: Path) -> list[Stage]:
    """Every part's stages (`parts.PARTS`), in the order they start in when several can run side
    by side (`Stage.rank`, then the registry's order)."""
    ck = common_key(cfg)
    st = [s for part in PARTS for s in part.stages(cfg, out, ck)]
    return sorted(st, key=lambda s: s.rank)  # a stable sort: the registry's order within a rank


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
    if not cfg.model and not is_lm(cfg):  # a checkpoint's study trains nothing; an LM's recipe is its own
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
