"""`fbt-probe reproduce`: datasets -> training (feedback + no-feedback baseline) -> evaluation and
contraction diagnostic -> activations -> probe sweep -> causal experiments (exact; then attribution
patching, DAS and the lens) -> figures -> report."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.reproduce.stages import Runner, Stage

PROBE_KNOBS = {"completion": [0, 8, 32], "memory": [0, 8, 32], "registers": [2, 4, 8], "registers-count": [1, 2, 4, 8]}  # training lengths
LONG_KNOBS = {"completion": [0, 8, 32, 128, 256], "memory": [0, 8, 32, 128, 256], "registers": [2, 4, 8],
              "registers-count": [1, 2, 4, 8]}  # --long: the paper's whole grid (past the training lengths)
QUICK_KNOBS = {"completion": [8], "memory": [8], "registers": [2], "registers-count": [2]}
FEEDBACK_MODES = ["standard", "recurrent:1", "jacobi:2"]
# the paper's register conditions; recurrent:k names the paper's k-token suffix, mapped to this
# tokenizer's token count through the dataset manifest (`suffix_modes`; identity for the built-in one)
REGISTER_MODES = ["standard", "recurrent:1", "recurrent:2", "recurrent:4", "full", "jacobi:2"]
EXPERIMENTS = ("feedback-swap", "state-replacement", "gate-ablation", "residual", "probe-direction")


@dataclass(frozen=True)
class ReproConfig:
    preset: str = "tiny"
    seed: int = 0
    steps: int = 800
    groups: dict = field(default_factory=lambda: {"completion": 80, "memory": 128, "registers": 32, "registers-count": 32})
    """Probe-set groups per task (held-out contexts only): completion and memory over the grid (the
    paper's 80 and 128), register tasks per cell (the paper's 128; 32 keeps the 15-minute study)."""
    knobs: dict = field(default_factory=lambda: dict(PROBE_KNOBS))
    modes: dict = field(default_factory=lambda: {"completion": FEEDBACK_MODES, "memory": FEEDBACK_MODES,
                                                 "registers": REGISTER_MODES, "registers-count": REGISTER_MODES})
    eval_pairs: int = 16
    passes: int = 32  # contraction diagnostic
    patch_pairs: int = 20  # pairs per cell in the causal experiments
    patch_knobs: dict = field(default_factory=lambda: {"completion": [8], "memory": [8], "registers": [2]})
    """Task -> lengths of the causal experiments (a task not named is left out)."""
    model: str | None = None  # a user checkpoint (paper-1b path): no training, no baseline
    quick: bool = False
    demo: bool = False
    methods: bool = True
    """Run attribution patching, DAS and the lens (stages methods-*, lens-*); --no-methods skips them."""
    """The lighter study `make demo` runs on the shipped models (`demo_config`)."""
    shipped: bool = False
    """Study the reference models shipped with the package (ref:<preset>-feedback, ref:<preset>-baseline)
    instead of training them; `fbt-probe reproduce` does unless --train."""

    @classmethod
    def quick_config(cls, **kw) -> "ReproConfig":
        base = dict(steps=60, groups={"completion": 12, "memory": 12, "registers": 6, "registers-count": 6},
                    knobs=dict(QUICK_KNOBS), eval_pairs=8, passes=6, patch_pairs=5, quick=True,
                    modes={"completion": ["standard", "recurrent:1"], "memory": ["standard", "recurrent:1"],
                           "registers": ["standard", "recurrent:1", "full"], "registers-count": ["standard", "recurrent:1"]})
        return cls(**{**base, **kw})

    @classmethod
    def demo_config(cls, **kw) -> "ReproConfig":
        """The shipped models' study in about five minutes on 2 cores (`make demo`): every task, stage
        and figure of the full study on fewer probe groups (completion 40 of the paper's 80, memory
        64 of 128, register cells 8), the register tasks without `full` recurrence (its serial
        token-by-token extraction is most of the full study's time), and lighter AtP/DAS/lens
        settings (`methods.methods_settings`). The full study: `fbt-probe reproduce` without --demo."""
        base = dict(groups={"completion": 40, "memory": 64, "registers": 8, "registers-count": 8}, eval_pairs=8,
                    patch_pairs=10, demo=True,
                    modes={"completion": FEEDBACK_MODES, "memory": FEEDBACK_MODES,
                           "registers": [m for m in REGISTER_MODES if m != "full"],
                           "registers-count": [m for m in REGISTER_MODES if m != "full"]})
        return cls(**{**base, **kw})

    @classmethod
    def long_config(cls, **kw) -> "ReproConfig":
        """Probe sets on the paper's whole grid, also at 128 and 256 distractors (up to 1,076 tokens),
        four to eight times the training lengths: slower."""
        return cls(**{"knobs": dict(LONG_KNOBS), **kw})

    def models(self) -> list[str]:
        return ["feedback"] if self.model else ["feedback", "baseline"]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def train_config(cfg: ReproConfig, baseline: bool):
    from fbt_probe.training import TrainConfig

    return TrainConfig(preset=cfg.preset, steps=cfg.steps, seed=cfg.seed, baseline=baseline, tasks=tuple(cfg.knobs),
                       eval_every=max(1, min(100, cfg.steps)), save_every=max(1, min(100, cfg.steps)))


def _tokenizer(cfg: ReproConfig):
    from fbt_probe.tasks import build_tokenizer, load_tokenizer

    if cfg.model and (Path(cfg.model) / "tokenizer.json").is_file():
        return load_tokenizer(Path(cfg.model) / "tokenizer.json")
    return build_tokenizer()


def stage_data(cfg: ReproConfig, out: Path) -> None:
    """Probe datasets from contexts held out of training (the same hash split the trainer uses)."""
    from fbt_probe.io import atomic_dir
    from fbt_probe.tasks import generate, load_spec, write_dataset
    from fbt_probe.training.data import heldout

    tok, ho = _tokenizer(cfg), heldout(train_config(cfg, False))
    with atomic_dir(out / "data", force=True) as tmp:
        for task, knobs in cfg.knobs.items():
            spec = dataclasses.replace(load_spec(task), length_grid=tuple(knobs))
            df = generate(spec, groups=cfg.groups[task], seed=cfg.seed + 101, tokenizer=tok, contexts=ho)
            write_dataset(df, tmp, tok, force=True)


def stage_train(cfg: ReproConfig, out: Path, name: str) -> None:
    from fbt_probe.training import run_training

    folder = out / "models" / name
    resume = (folder / "train_state.pt").is_file()
    run_training(train_config(cfg, name == "baseline"), folder, resume=resume, force=not resume, progress=True)


def model_path(cfg: ReproConfig, out: Path, name: str) -> Path:
    if cfg.model:
        return Path(cfg.model)
    if cfg.shipped:
        from fbt_probe.reference import folder

        return folder(shipped_name(cfg, name))
    return out / "models" / name


def shipped_name(cfg: ReproConfig, name: str) -> str:
    """The shipped reference of a study model (`ref:` + this): `tiny-feedback`, `tiny-baseline`."""
    return f"{cfg.preset}-{name}"


def check_shipped(cfg: ReproConfig) -> None:
    """A shipped study needs shipped models of this preset trained with this seed and step count."""
    from fbt_probe.reference import names, record

    shipped = names()
    for name in cfg.models():
        ref = shipped_name(cfg, name)
        if ref not in shipped:
            raise FbtError(f"--preset {cfg.preset}: no shipped reference model ref:{ref} (shipped: "
                           f"{', '.join('ref:' + n for n in shipped) or 'none'}); pass --train to train one")
        rec = record(ref)
        if (rec["seed"], rec["steps"]) != (cfg.seed, cfg.steps):
            raise FbtError(f"--seed {cfg.seed} --steps {cfg.steps}: the shipped ref:{ref} was trained with seed "
                           f"{rec['seed']} and {rec['steps']} steps; pass --train to train these")


def stage_eval(cfg: ReproConfig, out: Path) -> None:
    import fbt_probe as fp
    from fbt_probe.io import atomic_path
    from fbt_probe.training.evaluate import answer_accuracy, eval_samples

    tok, frames = _tokenizer(cfg), []
    tcfg = train_config(cfg, False)
    samples = eval_samples(tcfg, tok, pairs=cfg.eval_pairs, knobs=_train_knobs(cfg))
    for name in cfg.models():
        acc = answer_accuracy(fp.load_model(str(model_path(cfg, out, name))), samples, tok)
        frames.append(acc.assign(model=name))
    with atomic_path(out / "eval" / "accuracy.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)


def _train_knobs(cfg: ReproConfig) -> dict:
    from fbt_probe.training.config import TRAIN_KNOBS

    return {t: [k for k in TRAIN_KNOBS[t] if not cfg.quick or k in cfg.knobs[t]] or TRAIN_KNOBS[t][:1] for t in cfg.knobs}


def stage_contraction(cfg: ReproConfig, out: Path) -> None:
    import fbt_probe as fp
    from fbt_probe.io import atomic_path
    from fbt_probe.training.evaluate import contraction, validation_batch

    tok, frames = _tokenizer(cfg), []
    batch = validation_batch(train_config(cfg, False), tok, rows=8 if cfg.quick else 16)
    for name in cfg.models():
        t = contraction(fp.load_model(str(model_path(cfg, out, name))), *batch, n_passes=cfg.passes)
        schedule = "constant:1" if name == "baseline" else train_config(cfg, False).schedule
        frames.append(t.assign(run=name, schedule=schedule))
    with atomic_path(out / "diagnostics" / "contraction.parquet") as tmp:
        pd.concat(frames, ignore_index=True).to_parquet(tmp, index=False)


def task_modes(cfg: ReproConfig, out: Path, task: str) -> list[str]:
    """The task's modes, the paper's register suffixes mapped to this tokenizer's token counts."""
    from fbt_probe.io import read_json
    from fbt_probe.tasks.generators import suffix_modes

    mapping = suffix_modes(read_json(out / "data" / f"{task}.manifest.json"))
    return list(dict.fromkeys(mapping.get(m, m) for m in cfg.modes[task]))


def stage_extract(cfg: ReproConfig, out: Path, name: str) -> None:
    from fbt_probe.activations import extract

    for task in cfg.modes:
        extract(str(model_path(cfg, out, name)), out / "data" / f"{task}.parquet", task_modes(cfg, out, task),
                out / "acts" / name / task, force=True)


def stage_probe(cfg: ReproConfig, out: Path, name: str) -> None:
    from fbt_probe.io import atomic_path
    from fbt_probe.probes.sweep import ProbeConfig, probe_sweep, write_results

    tables = []
    for task in cfg.modes:
        res = probe_sweep(out / "acts" / name / task, ProbeConfig(seed=cfg.seed))
        write_results(res, out / "results" / "probes" / name / task, force=True)
        tables.append(res.table)
    with atomic_path(out / "results" / "probes" / name / "probes.parquet") as tmp:
        pd.concat(tables, ignore_index=True).to_parquet(tmp, index=False)


def stage_patch(cfg: ReproConfig, out: Path, name: str) -> None:
    import fbt_probe as fp
    from fbt_probe.interventions.inputs import load_pairs
    from fbt_probe.interventions.runner import PatchConfig, run
    from fbt_probe.model.checkpoint import checkpoint_hash

    path = model_path(cfg, out, name)
    model = fp.load_model(str(path))
    df = load_pairs(out / "data", tasks=set(cfg.patch_knobs))
    keep = [int(k) in cfg.patch_knobs[t] for t, k in zip(df["task"], df["length_knob"])]
    df = df[keep].reset_index(drop=True).__finalize__(df)  # each task at its own lengths
    info = {"model": str(path), "checkpoint_sha256": checkpoint_hash(path)}
    lengths = tuple(sorted({k for ks in cfg.patch_knobs.values() for k in ks}))
    for exp in EXPERIMENTS:
        modes = ("standard", "recurrent:1") if exp in ("residual", "probe-direction") else ("recurrent:1",)
        pc = PatchConfig(experiment=exp, modes=modes, max_pairs=cfg.patch_pairs, lengths=lengths, seed=cfg.seed,
                         n_boot=300 if cfg.quick else 1000, last_k=(3 if cfg.quick else 4) if exp == "residual" else None,
                         n_folds=4, scales=(1.0, 4.0))  # the 15-minute study's budget: last 4 positions, 2 scales
        run(model, df, pc, out=out / "results" / "interventions" / name, force=True, model_info=info, figures=False)


def methods_stages(cfg: ReproConfig, out: Path, name: str, ck: dict, after: list[str]) -> list[Stage]:
    """AtP (with its parity check) and DAS, then the lens (fbt_probe.reproduce.methods)."""
    from fbt_probe.reproduce import methods as M

    key = {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs, **M.methods_settings(cfg)}
    return [Stage(f"methods-{name}", key, [out / "results" / "methods" / name], lambda: M.stage_methods(cfg, out, name), after=after),
            Stage(f"lens-{name}", key, [out / "results" / "lens" / name], lambda: M.stage_lens(cfg, out, name), after=after)]


def build_stages(cfg: ReproConfig, out: Path) -> list[Stage]:
    c = cfg.to_dict()
    ck = {k: c[k] for k in ("preset", "seed", "model")}
    if cfg.shipped:  # a new shipped model (another package version) redoes every stage that reads it
        from fbt_probe.reference import record

        ck["shipped"] = {n: record(shipped_name(cfg, n))["checkpoint_sha256"] for n in cfg.models()}
    st = [Stage("data", {**ck, "groups": cfg.groups, "knobs": cfg.knobs, "protocol": "appendix-F"}, [out / "data"],
                lambda: stage_data(cfg, out))]
    trained = []
    for name in cfg.models():
        if not cfg.model and not cfg.shipped:
            st.append(Stage(f"train-{name}", {**ck, "steps": cfg.steps}, [out / "models" / name],
                            lambda n=name: stage_train(cfg, out, n), resumable=True))
            trained.append(f"train-{name}")
    st.append(Stage("eval", {**ck, "eval_pairs": cfg.eval_pairs, "quick": cfg.quick}, [out / "eval"], lambda: stage_eval(cfg, out), after=trained))
    st.append(Stage("contraction", {**ck, "passes": cfg.passes}, [out / "diagnostics"], lambda: stage_contraction(cfg, out), after=trained))
    for name in cfg.models():
        dep = [f"train-{name}"] if not cfg.model and not cfg.shipped else []
        st.append(Stage(f"extract-{name}", {**ck, "modes": cfg.modes}, [out / "acts" / name],
                        lambda n=name: stage_extract(cfg, out, n), after=["data"] + dep))
        st.append(Stage(f"probe-{name}", ck, [out / "results" / "probes" / name], lambda n=name: stage_probe(cfg, out, n),
                        after=[f"extract-{name}"]))
        st.append(Stage(f"patch-{name}", {**ck, "patch_pairs": cfg.patch_pairs, "patch_knobs": cfg.patch_knobs},
                        [out / "results" / "interventions" / name], lambda n=name: stage_patch(cfg, out, n), after=["data"] + dep))
        if cfg.methods:
            st += methods_stages(cfg, out, name, ck, ["data"] + dep)
    return st


def reproduce(cfg: ReproConfig, out: str | Path, force: set[str] = frozenset(), echo=print) -> dict:
    from fbt_probe.reproduce.report import stage_figures, stage_report
    from fbt_probe.reproduce.seeds import source_key

    out = Path(out)
    if cfg.model and not Path(cfg.model).is_dir():
        raise FbtError(f"--model {cfg.model}: checkpoint folder not found")
    if cfg.shipped:
        check_shipped(cfg)
    out.mkdir(parents=True, exist_ok=True)
    stages = build_stages(cfg, out)
    names = {s.name for s in stages} | {"figures", "report"}
    unknown = sorted(set(force) - names)
    if unknown:
        raise FbtError(f"--force {unknown[0]}: unknown stage (stages: {', '.join(s.name for s in stages)}, figures, report)")
    runner = Runner(out, force, echo)
    for s in stages:
        runner.run(s)
    all_names = [s.name for s in stages]
    runner.run(Stage("figures", {}, [out / "figures"], lambda: stage_figures(cfg, out), after=all_names))
    runner.run(Stage("report", {"v": 3, "seeds": source_key(cfg, out)}, [out / "report.md", out / "report.html", out / "headline.csv"],
                     lambda: stage_report(cfg, out, runner.times), after=all_names + ["figures"]))
    return {"times": runner.times, "report": out / "report.html"}
