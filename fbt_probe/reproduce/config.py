"""The study's configuration and where its models live (read by every stage, the report and the findings)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from fbt_probe.activations import BATCH_SIZE as EXTRACT_BATCH  # the full study extracts at `extract`'s default
from fbt_probe.errors import FbtError
from fbt_probe.interventions.registry import EXPERIMENTS as REGISTRY
from fbt_probe.reference import folder
from fbt_probe.tasks import build_tokenizer, load_tokenizer, tokenizer_sha256
from fbt_probe.training.config import TrainConfig
from fbt_probe.training.recipes import RECIPES, recipe

STANDARD, RECURRENT_1, JACOBI_2, FULL = "standard", "recurrent:1", "jacobi:2", "full"
# in the keys of the stages whose tables hold normalized effects: a summary's normalized effect is the
# ratio of means over pairs, given where the mean gap clears min_gap (`interventions.metrics.summarize`)
RATIO_OF_MEANS = "ratio-of-means"
FEEDBACK_MODES = [STANDARD, RECURRENT_1, JACOBI_2]
# the paper's register conditions; recurrent:k names the paper's k-token suffix, mapped to this
# tokenizer's token count through the dataset manifest (`suffix_modes`; identity for the built-in one)
REGISTER_MODES = [STANDARD, RECURRENT_1, "recurrent:2", "recurrent:4", FULL, JACOBI_2]


@dataclass(frozen=True)
class TaskPlan:
    """What the study does with one task: probe-set groups (completion and memory over the grid,
    register tasks per cell), the lengths it probes, the prefill modes, and the lengths of the causal
    experiments (None: the task is left out of them)."""

    groups: int
    knobs: tuple
    modes: tuple
    patch_knobs: tuple | None = None


def _plan(**tasks: TaskPlan) -> dict:
    return {t.replace("_", "-"): p for t, p in tasks.items()}


# the full study, one line per task: the paper's 80 / 128 groups (register cells: 32 of its 128 keep
# the extraction short), the training lengths, the paper's modes, causal experiments at every length
FULL_PLAN = _plan(
    completion=TaskPlan(80, (0, 8, 32), tuple(FEEDBACK_MODES), (0, 8, 32)),
    memory=TaskPlan(128, (0, 8, 32), tuple(FEEDBACK_MODES), (0, 8, 32)),
    registers=TaskPlan(32, (2, 4, 8), tuple(REGISTER_MODES), (2, 4, 8)),
    registers_count=TaskPlan(32, (1, 2, 4, 8), tuple(REGISTER_MODES)),
)
# `make demo`: fewer groups, the register tasks under standard prefill and the paper's recurrent:k
# suffixes only (no `full` recurrence, no jacobi:2: the two passes over every token are most of
# their extraction), one causal length per task
DEMO_REGISTER_MODES = tuple(m for m in REGISTER_MODES if m not in (FULL, JACOBI_2))
DEMO_PLAN = _plan(
    completion=TaskPlan(40, (0, 8, 32), tuple(FEEDBACK_MODES), (8,)),
    memory=TaskPlan(64, (0, 8, 32), tuple(FEEDBACK_MODES), (8,)),
    registers=TaskPlan(8, (2, 4, 8), DEMO_REGISTER_MODES, (2,)),
    registers_count=TaskPlan(8, (1, 2, 4, 8), DEMO_REGISTER_MODES),
)
# --quick: every stage in minutes
QUICK_PLAN = _plan(
    completion=TaskPlan(12, (8,), (STANDARD, RECURRENT_1), (8,)),
    memory=TaskPlan(12, (8,), (STANDARD, RECURRENT_1), (8,)),
    registers=TaskPlan(6, (2,), (STANDARD, RECURRENT_1, FULL), (2,)),
    registers_count=TaskPlan(6, (2,), (STANDARD, RECURRENT_1)),
)
# the serial-depth part (docs/research/serial-depth.md): the compose-s3 models, answer accuracy per k x mode
# and the carried-state swap per k; k = the dependent steps the answer needs
DEPTH_TASK = "compose-s3"
DEPTH_MODES = (STANDARD, RECURRENT_1, JACOBI_2, "jacobi:3", FULL)
DEPTH_STEPS = 800  # `fbt-probe train --tasks compose-s3 --steps 800 --seed S [--baseline]`, the shipped depth models'
DEPTH_MODELS = ("feedback", "baseline")
# the general language models (docs/training.md, "A general language model"): trained on the corpus by
# next-token prediction, never on the tasks, which they are probed on in context
LM_PRESETS = ("small-lm",)
LM_MODELS = ("feedback", "feedback-75-25", "baseline")  # the paper's schedule, its 75/25 comparison, no feedback
LM_SCHEDULES = {"feedback": "paper", "feedback-75-25": "1:.75,2:.25", "baseline": "constant:1"}
# docs/research/general-lm-size.md; one_pass_steps: every model's first steps, one pass, trained once and forked
LM_RECIPE = dict(tokens_per_step=8192, seq_len=256, steps=1600, lr=3e-3, one_pass_steps=600)


@dataclass(frozen=True)
class DepthPlan:
    """What the depth part measures: the knob values k and the held-out pairs per k (one per group,
    as `fbt-probe eval` draws them; the swap runs on the same pairs)."""

    knobs: tuple
    pairs: int


FULL_DEPTH = DepthPlan((2, 4, 8, 16, 32), 64)  # the task's grid, `fbt-probe eval`'s pairs
DEMO_DEPTH = DepthPlan((8, 16), 16)  # a reduced range: the first k with its 47+ held-out groups, and twice it
QUICK_DEPTH = DepthPlan((8,), 4)
LONG_LENGTHS = {"completion": (0, 8, 32, 128, 256), "memory": (0, 8, 32, 128, 256)}  # --long: the paper's grid


def plan_fields(plan: dict) -> dict:
    """The ReproConfig fields (task -> value dicts) of a per-task plan."""
    return {
        "groups": {t: p.groups for t, p in plan.items()},
        "knobs": {t: list(p.knobs) for t, p in plan.items()},
        "modes": {t: list(p.modes) for t, p in plan.items()},
        "patch_knobs": {t: list(p.patch_knobs) for t, p in plan.items() if p.patch_knobs is not None},
    }


PROBE_KNOBS = plan_fields(FULL_PLAN)["knobs"]  # the training lengths
LONG_KNOBS = {**PROBE_KNOBS, **{t: list(k) for t, k in LONG_LENGTHS.items()}}  # past the training lengths
QUICK_KNOBS = plan_fields(QUICK_PLAN)["knobs"]
# the exact causal experiments of the study, in the registry's order, each under its study modes
EXPERIMENTS = tuple(name for name, e in REGISTRY.items() if e.study_modes)


@dataclass(frozen=True)
class ReproConfig:
    preset: str = "tiny"
    seed: int = 0
    steps: int = RECIPES["reference"]["steps"]  # the default recipe's own
    recipe: str | None = "reference"
    """The training recipe of --train (`fbt_probe.training.recipes`; the shipped models' own); None:
    `TrainConfig`'s defaults (--quick trains that way, 60 steps)."""
    groups: dict = field(default_factory=lambda: plan_fields(FULL_PLAN)["groups"])
    """Probe-set groups per task (held-out contexts only): completion and memory over the grid (the
    paper's 80 and 128), register tasks per cell (the paper's 128; 32 keeps the study's extraction short)."""
    knobs: dict = field(default_factory=lambda: plan_fields(FULL_PLAN)["knobs"])
    modes: dict = field(default_factory=lambda: plan_fields(FULL_PLAN)["modes"])
    eval_pairs: int = 16
    passes: int = 32  # contraction diagnostic
    contraction_docs: int = 100
    """Held-out validation documents per task in the contraction diagnostic (the ratio's interval
    resamples them)."""
    patch_pairs: int = 20  # pairs per cell in the causal experiments
    patch_knobs: dict = field(default_factory=lambda: plan_fields(FULL_PLAN)["patch_knobs"])
    """Task -> lengths of the causal experiments (a task not named is left out): every probe length
    (effects such as the feedback swap change with length, so each length is reported on its own)."""
    device: str = "cpu"
    """Where every stage runs its model (cpu, cuda, cuda:N): a user checkpoint's study on a GPU. Stage
    outputs made on another device are other bytes, so a device other than cpu is part of each key."""
    model: str | None = None  # a user checkpoint (paper-1b path): no training
    baseline: str | None = None  # with `model`: its no-feedback baseline checkpoint (none: the study has none)
    quick: bool = False
    demo: bool = False
    """The lighter study `make demo` runs on the shipped models (`demo_config`)."""
    methods: bool = True
    """Run attribution patching, DAS, the lens and the SAEs (stages methods-*, lens-*, sae-feedback; the
    demo runs no SAE); --no-methods skips them."""
    depth_knobs: list = field(default_factory=lambda: list(FULL_DEPTH.knobs))
    """The serial-depth part's knob values k (compose-s3; the demo runs a reduced range)."""
    depth_pairs: int = FULL_DEPTH.pairs
    """Held-out pairs per k of the depth part (one per group; k = 2 and 4 have fewer held-out words)."""
    corpus: str = "data/corpus"
    """An LM preset's corpus folder (`fbt-probe corpus build`): what --train trains on and the held-out
    files the general-LM part reads (a shipped model's study reads them too, checked against the
    corpus sha256 the model recorded)."""
    lm_passes: int = 100
    """An LM preset's feedback passes in the general-LM part (Fig. 3 reads 1..32 and this many)."""
    lm_recipe: dict = field(default_factory=lambda: dict(LM_RECIPE))
    """An LM preset's training under --train (`LM_RECIPE`; a test trains a small one)."""
    shipped: bool = False
    """Study the reference models shipped with the package (ref:<preset>-feedback, ref:<preset>-baseline)
    instead of training them; `fbt-probe reproduce` does unless --train."""

    def __post_init__(self) -> None:
        if self.preset in LM_PRESETS and not self.model and self.steps != self.lm_recipe["steps"]:
            object.__setattr__(self, "steps", self.lm_recipe["steps"])  # an LM's steps are its recipe's

    @classmethod
    def quick_config(cls, **kw) -> "ReproConfig":
        base = dict(
            steps=60,
            recipe=None,
            **plan_fields(QUICK_PLAN),
            eval_pairs=8,
            passes=6,
            contraction_docs=4,
            patch_pairs=5,
            depth_knobs=list(QUICK_DEPTH.knobs),
            depth_pairs=QUICK_DEPTH.pairs,
            quick=True,
        )
        return cls(**{**base, **kw})

    @classmethod
    def demo_config(cls, **kw) -> "ReproConfig":
        """The shipped models' study in about five minutes on 2 cores (`make demo`): every task, stage
        and figure of the full study on fewer probe groups (completion 40 of the paper's 80, memory
        64 of 128, register cells 8), the register tasks under `standard` and the recurrent:k
        suffixes only (`full`'s serial token-by-token extraction is most of the full study's time,
        `jacobi:2`'s two passes most of the demo's), and lighter AtP/DAS/lens
        settings (`methods.methods_settings`), and the causal experiments at one length per task
        (completion and memory 8, registers 2). The full study: `fbt-probe reproduce` without --demo."""
        base = dict(
            **plan_fields(DEMO_PLAN),
            eval_pairs=8,
            patch_pairs=10,
            contraction_docs=4,  # 16 documents within the demo budget; the full study reads 100 a task
            depth_knobs=list(DEMO_DEPTH.knobs),
            depth_pairs=DEMO_DEPTH.pairs,
            demo=True,
        )
        return cls(**{**base, **kw})

    @classmethod
    def long_config(cls, **kw) -> "ReproConfig":
        """Probe sets on the paper's whole grid, also at 128 and 256 distractors (up to 1,076 tokens),
        four to eight times the training lengths: slower."""
        return cls(**{"knobs": dict(LONG_KNOBS), **kw})

    def models(self) -> list[str]:
        return ["feedback"] if self.model and not self.baseline else ["feedback", "baseline"]

    def methods_models(self) -> list[str]:
        """The models AtP, DAS and the lens run on: every model, or under --demo the feedback model
        only (the baseline's are the full study's untrained-fusion control)."""
        return ["feedback"] if self.demo else self.models()

    def depth_models(self) -> list[str]:
        """The serial-depth part's models (`depth_path`): both, except in a user checkpoint's study,
        which has no compose-s3 models, and a general LM's, which has none either: both skip the part."""
        return [] if self.model or self.preset in LM_PRESETS else list(DEPTH_MODELS)

    def depth_steps(self) -> int:
        """Training steps of the depth models under --train: the shipped ones' 800, or under --quick
        the quick study's own steps (a pipeline check)."""
        return self.steps if self.quick else DEPTH_STEPS

    def extract_batch(self) -> int:
        """Rows a forward of the activation extraction: 64 under --demo (a fifth less time than 16 on
        2 cores; BENCHMARKS.md), else `extract`'s default 16, which the committed full report used."""
        return 64 if self.demo else EXTRACT_BATCH

    def figure_formats(self) -> tuple[str, ...]:
        """PNG (what the report shows) and SVG; the demo and the quick study write PNG only."""
        return ("png",) if (self.demo or self.quick) else ("png", "svg")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def is_lm(cfg: ReproConfig) -> bool:
    """The study of a general language model (an LM preset; a user checkpoint's study is not)."""
    return cfg.preset in LM_PRESETS and not cfg.model


def lm_train_config(cfg: ReproConfig, name: str) -> TrainConfig:
    """How LM `name` (LM_MODELS) is trained: `fbt-probe train --preset small-lm --corpus CORPUS
    --tokens-per-step 8192 --steps 1600 --lr 3e-3 --seed S` with its schedule, the feedback models
    `--one-pass-steps 600` (forked from the baseline's step 600)."""
    r = dict(cfg.lm_recipe)
    one_pass = r.pop("one_pass_steps")
    baseline = name == "baseline"
    return TrainConfig(
        preset=cfg.preset,
        corpus=cfg.corpus,
        seed=cfg.seed,
        baseline=baseline,
        schedule=LM_SCHEDULES[name],
        one_pass_steps=0 if baseline else one_pass,
        eval_every=max(1, min(100, r["steps"])),
        save_every=max(1, min(100, r["steps"])),
        **r,
    )


def train_config(cfg: ReproConfig, baseline: bool) -> TrainConfig:
    fields = {} if cfg.recipe is None else recipe(cfg.recipe)
    warm, reg = fields.get("copy_steps", 0), fields.get("register_steps", 0)
    if cfg.steps <= warm:
        raise FbtError(
            f"--steps {cfg.steps}: the {cfg.recipe} recipe's induction warm-up alone takes {warm} steps; "
            f"pass more (the recipe's own: {fields['steps']})"
        )
    if reg and cfg.steps <= warm + reg:
        raise FbtError(
            f"--steps {cfg.steps}: the {cfg.recipe} recipe trains {warm} warm-up and {reg} register-only "
            f"steps before the other tasks; pass more than {warm + reg} (the recipe's own: {fields['steps']})"
        )
    fields.update(
        preset=cfg.preset,
        steps=cfg.steps,
        seed=cfg.seed,
        baseline=baseline,
        tasks=tuple(cfg.knobs),
        eval_every=max(1, min(100, cfg.steps)),
        save_every=max(1, min(100, cfg.steps)),
    )
    return TrainConfig(**fields)


def depth_train_config(cfg: ReproConfig, baseline: bool) -> TrainConfig:
    """How a depth model is trained: `fbt-probe train --tasks compose-s3 --steps 800 --seed S`
    (`--baseline`), the paper's schedule on the task's whole grid; the shipped depth models' record."""
    steps = cfg.depth_steps()
    return TrainConfig(
        preset=cfg.preset,
        tasks=(DEPTH_TASK,),
        steps=steps,
        seed=cfg.seed,
        baseline=baseline,
        schedule="paper",
        eval_every=max(1, min(100, steps)),
        save_every=max(1, min(100, steps)),
    )


def depth_name(cfg: ReproConfig, name: str) -> str:
    """The shipped reference of a depth model (`ref:` + this): `tiny-depth-feedback`, `tiny-depth-baseline`."""
    return f"{cfg.preset}-depth-{name}"


def depth_path(cfg: ReproConfig, out: Path, name: str) -> Path:
    """The checkpoint folder of depth model `name`: the shipped one's verified folder, or the one
    trained under OUT/models/depth-NAME."""
    return folder(depth_name(cfg, name)) if cfg.shipped else out / "models" / f"depth-{name}"


def trained_as(cfg: ReproConfig, name: str) -> TrainConfig | None:
    if is_lm(cfg):
        return lm_train_config(cfg, name)
    return _trained_as(cfg, name)


def _trained_as(cfg: ReproConfig, name: str) -> TrainConfig | None:
    """How study model `name` was trained: the preset's recipe (a shipped or trained-here model), the
    `train` record of a user checkpoint's config.json (a run of `fbt-probe train`), or None (an
    imported checkpoint, which has no record: it was not trained on the tasks here)."""
    if not cfg.model:
        return train_config(cfg, name == "baseline")
    path = Path(cfg.baseline if name == "baseline" else cfg.model) / "config.json"
    try:
        record = json.loads(path.read_text()).get("train")
    except (OSError, ValueError, AttributeError):
        record = None
    if not isinstance(record, dict):
        return None
    return TrainConfig.from_dict(record, source=f"{path}: field 'train'")


def study_training(cfg: ReproConfig) -> TrainConfig:
    """The training the study's held-out contexts, answer-accuracy cells and contraction batch
    follow: the feedback model's own (its split, tasks, lengths and seed), else the preset's recipe,
    whose held-out split is then a fixed subset of contexts the model never saw. A general language
    model never saw a task: the tasks' default training config draws its samples."""
    if is_lm(cfg):
        return TrainConfig(preset=cfg.preset, tasks=tuple(cfg.knobs), seed=cfg.seed)
    return trained_as(cfg, "feedback") or train_config(cfg, False)


class HeldOutOfAll:
    """Contexts held out of the training of every model in `splits` (one `HeldOut` each); a model
    whose training left a task out restricts nothing on it."""

    def __init__(self, splits):
        self.splits = list(splits)

    def __contains__(self, context_id) -> bool:
        if not isinstance(context_id, str):
            return False
        task = context_id.split(":", 1)[0]
        return all(context_id in h for h in self.splits if h.tasks is None or task in h.tasks)


def study_contexts(cfg: ReproConfig, heldout):
    """The contexts the probe datasets and the answer-accuracy samples are drawn from: held out of
    the training of every study model (`heldout`: `TrainConfig` -> its `HeldOut`)."""
    if is_lm(cfg):
        return heldout(study_training(cfg))  # a fixed subset: the LM was trained on no task context
    splits = {}
    for name in cfg.models():
        t = trained_as(cfg, name) if cfg.model else train_config(cfg, False)
        if t is not None:
            splits[(tuple(t.tasks), t.heldout_fraction, t.seed)] = heldout(t)
    if not splits:
        return heldout(study_training(cfg))
    if len(splits) == 1:
        return next(iter(splits.values()))
    return HeldOutOfAll(splits.values())


NOT_RECORDED = "not recorded"  # the schedule of a checkpoint without a training record


def schedule_label(cfg: ReproConfig, name: str) -> str:
    """The pass schedule study model `name` was trained with ("constant:1" for one pass), or
    "not recorded" for an imported checkpoint."""
    t = trained_as(cfg, name)
    if t is None:
        return NOT_RECORDED
    return "constant:1" if t.baseline else t.schedule


def for_trained_tasks(cfg: ReproConfig) -> tuple[ReproConfig, list[str]]:
    """A user checkpoint's study of the tasks its training record names: (the config without the
    tasks a study model was not trained on, those tasks). A model trained on completion and memory
    alone has no held-out register contexts (every one is unseen, none held out of its split), and
    its answers there would say nothing; a checkpoint without a record (an import) is studied on
    every task. Refused in one line when no study task is left."""
    if not cfg.model:
        return cfg, []
    trained = [t for t in (trained_as(cfg, name) for name in cfg.models()) if t is not None]
    if not trained:
        return cfg, []
    tasks = set.intersection(*(set(t.tasks) for t in trained))
    kept = [t for t in cfg.knobs if t in tasks]
    left = [t for t in cfg.knobs if t not in tasks]
    if not kept:
        raise FbtError(
            f"--model {cfg.model}: trained on {', '.join(sorted(tasks)) or 'no task'}, none of the study's tasks "
            f"({', '.join(cfg.knobs)}); study it with the commands of the tasks it was trained on"
        )
    if not left:
        return cfg, []

    def only(d: dict) -> dict:
        return {t: v for t, v in d.items() if t in tasks}

    fields = {f: only(getattr(cfg, f)) for f in ("groups", "knobs", "modes", "patch_knobs")}
    return dataclasses.replace(cfg, **fields), left


def left_out(cfg: ReproConfig) -> list[str]:
    """The study's tasks a user checkpoint's study leaves out (its models were not trained on them)."""
    return [t for t in FULL_PLAN if t not in cfg.knobs] if cfg.model else []


def training_note(cfg: ReproConfig) -> str:
    """What the study knows of a user checkpoint's training (empty for the preset's models), and the
    tasks left out of the study because it was not trained on them."""
    if not cfg.model:
        return ""
    said = []
    for name in cfg.models():
        t = trained_as(cfg, name)
        said.append(
            f"{name}: not trained on these tasks by this toolkit (no `train` record), so every context is unseen"
            if t is None
            else f"{name}: trained here on {', '.join(t.tasks)} (seed {t.seed}, {t.steps} steps, schedule "
            f"{'constant:1' if t.baseline else t.schedule}); its held-out contexts only"
        )
    left = left_out(cfg)
    if left:
        said.append(f"left out of the study: {', '.join(left)} (not trained on them)")
    return "; ".join(said)


def tokenizer(cfg: ReproConfig):
    """The study's tokenizer: a user checkpoint's own tokenizer.json (refused without one: its
    embedding rows mean its own tokens, never the task tokenizer's; a --baseline must have the same
    one), else the built-in one."""
    if is_lm(cfg):  # the corpus tokenizer the models were trained in
        return load_tokenizer(folder(shipped_name(cfg, "feedback")) if cfg.shipped else Path(cfg.corpus))
    if not cfg.model:
        return build_tokenizer()
    tok = _own_tokenizer("--model", cfg.model)
    if cfg.baseline and tokenizer_sha256(_own_tokenizer("--baseline", cfg.baseline)) != tokenizer_sha256(tok):
        raise FbtError(
            f"--baseline {cfg.baseline}: its tokenizer.json differs from that of --model {cfg.model}; "
            "the two models would read different datasets"
        )
    return tok


def _own_tokenizer(option: str, folder: str):
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FbtError(
            f"{option} {folder}: no tokenizer.json in the checkpoint folder; its token ids mean its own "
            "tokenizer's tokens (import a nanochat checkpoint with `fbt-probe model import-nanochat`, which "
            "brings it; copy a Qwen3 folder's tokenizer.json beside it)"
        )
    return load_tokenizer(path)


def model_path(cfg: ReproConfig, out: Path, name: str) -> Path:
    """The checkpoint folder of study model `name` (feedback, baseline): a user checkpoint, a
    shipped reference model's verified folder, or the one trained under `out`."""
    if cfg.model:
        return Path(cfg.baseline if name == "baseline" else cfg.model)
    if cfg.shipped:
        return folder(shipped_name(cfg, name))
    return out / "models" / name


def shipped_name(cfg: ReproConfig, name: str) -> str:
    """The shipped reference of a study model (`ref:` + this): `tiny-feedback`, `tiny-baseline`."""
    return f"{cfg.preset}-{name}"
