"""The experiments `fbt-probe patch` runs: one table from name to function, options and hook rule.

`PatchConfig` holds what every experiment shares (modes, pair cells, batch size, bootstrap, seed,
prefix reuse) and `options`, the experiment's own small frozen dataclass (`ResidualOptions(depths,
last_k)`, `DasOptions(hooks, ks, steps, lr, n_folds)`, ...): the CLI builds the one its experiment
reads, and each validates its own fields. `EXPERIMENTS[name](fw, batches, cfg, mode)` returns the
wide rows of one prefill mode. The runner, the CLI's validation and `fbt-probe reproduce` (the
experiments with `study_modes`) all read this table, so a new experiment is one entry here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.interventions.atp_parity import attribution, parity_table
from fbt_probe.interventions.das_experiment import das
from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.forwards import forwards
from fbt_probe.interventions.probe_edits import erase_methods, probe_direction
from fbt_probe.modes import Mode, check_distinct, parse_mode


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_int(flag: str, value, low: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise FbtError(f"--{flag} {value}: expected an integer >= {low}")


def _check_depths(depths) -> None:
    if depths is not None and (not depths or min(depths) < 0):
        raise FbtError(f"--depths {','.join(map(str, depths))}: expected probe depths >= 0 (0 = the model's input)")


def _check_hooks(hooks) -> None:
    if hooks is not None and len(set(hooks)) != len(hooks):
        raise FbtError(f"--hooks {','.join(hooks)}: expected distinct hook names")


# ----------------------------------------------------------------------------- per-experiment options
@dataclass(frozen=True)
class FeedbackSwapOptions:
    """feedback-swap reads only the shared `PatchConfig` fields."""


@dataclass(frozen=True)
class StateReplacementOptions:
    """state-replacement reads only the shared fields (`seed` draws its donors and random states)."""


@dataclass(frozen=True)
class GateAblationOptions:
    decoding: bool = True
    """Also Std / Soft decoding answer accuracy."""


@dataclass(frozen=True)
class ResidualOptions:
    depths: tuple[int, ...] | None = None
    """Probe depths to patch (None = 0..L)."""
    last_k: int | None = None
    """Patch only the last k positions (None = all)."""
    differing: int = 1
    """With `last_k`, also patch the last this many positions where a pair's two samples differ
    (the token that decides the label lies there, usually before the last k; 0 = none)."""

    def __post_init__(self) -> None:
        _check_depths(self.depths)
        _check_int("last-k", self.last_k, 1, optional=True)
        _check_int("differing", self.differing, 0)


@dataclass(frozen=True)
class ProbeDirectionOptions:
    depths: tuple[int, ...] | None = None
    """Probe depths to edit (None = 0..L)."""
    scales: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """Steering scales, in class-mean gaps."""
    n_folds: int = 4
    """Grouped folds for cross-fitting."""
    erase: str = "auto"
    """Erasure: auto (LEACE and orth), leace, orth or leace,orth."""
    feedback: bool = False
    """Also edit the carried state fed to the final position (fusion.hook_feedback; rows at depth -1)."""

    def __post_init__(self) -> None:
        _check_depths(self.depths)
        if not all(_number(s) for s in self.scales):
            raise FbtError(f"--scales {self.scales}: expected finite numbers")
        _check_int("folds", self.n_folds, 2)
        erase_methods(self.erase)


@dataclass(frozen=True)
class AttributionOptions:
    hooks: tuple[str, ...] | None = None
    """Hook names (None = the residual stream and the fusion hooks)."""
    last_k: int | None = None
    """Attribute only the last k positions (None = all)."""
    check: int = 0
    """Exact patching on the K cells AtP ranks highest plus K random cells (0 = no check)."""

    def __post_init__(self) -> None:
        _check_hooks(self.hooks)
        _check_int("last-k", self.last_k, 1, optional=True)
        _check_int("check", self.check, 0)


@dataclass(frozen=True)
class DasOptions:
    hooks: tuple[str, ...] | None = None
    """Hook names (None = fusion.hook_feedback and depths 0, L/2, L)."""
    ks: tuple[int, ...] = (1, 2, 4, 8)
    """Subspace dimensions."""
    steps: int = 200
    """Optimizer steps per rotation."""
    lr: float = 1e-2
    """Adam learning rate of the rotation."""
    n_folds: int = 4
    """Grouped folds."""

    def __post_init__(self) -> None:
        _check_hooks(self.hooks)
        if not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise FbtError(f"--ks {','.join(map(str, self.ks))}: expected distinct subspace dimensions >= 1")
        _check_int("steps", self.steps, 1)
        if not (_number(self.lr) and self.lr > 0):
            raise FbtError(f"--lr {self.lr}: expected a finite number > 0")
        _check_int("folds", self.n_folds, 2)


@dataclass(frozen=True)
class PatchConfig:
    """What `run` does: one experiment of the registry, its modes, cells and options (validated here,
    so a bad value is a one-line error before any model runs). Every field, `options` included, is
    recorded in the manifest's provenance.

    Parameters
    ----------
    experiment : str
        A key of `registry.EXPERIMENTS`: feedback-swap, state-replacement, gate-ablation, residual,
        probe-direction, attribution or das.
    modes : tuple of str, default ("recurrent:1",)
        Prefill modes, each run separately (docs/modes.md).
    options : the experiment's options dataclass, default its defaults
        `ResidualOptions`, `DasOptions`, ... (`EXPERIMENTS[experiment].options`).
    batch_size, min_gap, n_boot, ci, seed, max_pairs, lengths, prefix_reuse
        As documented on each field below.

    Examples
    --------
    >>> cfg = PatchConfig("residual", modes=("standard", "recurrent:1"), options=ResidualOptions(depths=(0, 2), last_k=4))
    >>> cfg.options.depths, cfg.n_boot
    ((0, 2), 1000)
    >>> PatchConfig("swap")
    Traceback (most recent call last):
    ...
    fbt_probe.errors.FbtError: experiment 'swap': expected one of feedback-swap, state-replacement, gate-ablation, residual, probe-direction, attribution, das
    """

    experiment: str
    """A key of `registry.EXPERIMENTS`."""
    modes: tuple[Mode, ...] = ("recurrent:1",)
    """Prefill modes, each run separately: standard, recurrent:k, full, jacobi:K (K passes; K >= the
    input's length T is the exact recurrence, jacobi:T = full, and runs as full).

    Names are parsed into `Mode`s here."""
    options: object = None
    """The experiment's options dataclass (None: its defaults)."""
    batch_size: int = 32
    """Samples per forward (both samples of a pair always share a batch)."""
    min_gap: float = 0.1
    """|clean - corrupt| logit difference below which a pair is left out of `normalized`."""
    n_boot: int = 1000
    """Group-bootstrap resamples (pair groups) of the continuous means."""
    ci: float = 0.95
    """Confidence level of the bootstrap intervals."""
    seed: int = 0
    """Seed of the bootstrap, donors, random states and folds."""
    max_pairs: int | None = None
    """Pairs per task × length cell (None = all; residual and attribution default to 16)."""
    lengths: tuple[int, ...] | None = None
    """Length knobs to keep (None = all; residual and attribution default to the shortest of each task)."""
    prefix_reuse: bool = True
    """Compute the positions before the first edited one once per batch (hooks off) and run only the
    rest per condition; off re-runs the whole sequence each time (the reference path: same tables up
    to float rounding, slower).

    `fbt_probe.interventions.forwards` holds both paths."""

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise FbtError(f"experiment '{self.experiment}': expected one of {', '.join(EXPERIMENTS)}")
        kind = EXPERIMENTS[self.experiment].options
        if self.options is None:
            object.__setattr__(self, "options", kind())
        elif type(self.options) is not kind:
            raise FbtError(f"{self.experiment}: options {type(self.options).__name__}: expected {kind.__name__}")
        object.__setattr__(self, "modes", tuple(parse_mode(m) for m in self.modes))  # parsed once, here
        check_distinct(list(self.modes), list(self.modes))
        if not (_number(self.min_gap) and self.min_gap >= 0):  # NaN would disable the filter
            raise FbtError(f"--min-gap {self.min_gap}: expected a finite number >= 0")
        if not (_number(self.ci) and 0 < self.ci < 1):
            raise FbtError(f"ci {self.ci}: expected a number in (0, 1)")
        for name, low in (("n_boot", 1), ("batch_size", 2)):
            _check_int(name.replace("_", "-"), getattr(self, name), low)
        _check_int("max-pairs", self.max_pairs, 1, optional=True)

    @property
    def depths(self) -> tuple[int, ...] | None:
        """The probe depths the experiment reads (None: every depth, or none read)."""
        return getattr(self.options, "depths", None)


def options_for(experiment: str, **knobs) -> object:
    """The options dataclass of `experiment` from a bag of knobs (the CLI's flags): the fields it
    declares are taken, the rest left to the experiments that read them."""
    kind = EXPERIMENTS[experiment].options
    return kind(**{f.name: knobs[f.name] for f in fields(kind) if f.name in knobs})


def reads(experiment: str) -> tuple[str, ...]:
    """The options fields `experiment` reads."""
    return tuple(f.name for f in fields(EXPERIMENTS[experiment].options))


@dataclass(frozen=True)
class Experiment:
    run: Callable[..., pd.DataFrame]
    """(fw, batches, *, mode, min_gap, **shared, **options) -> wide rows of one mode."""
    options: type
    """The options dataclass (`PatchConfig.options`)."""
    hook_rule: str
    """How the edit meets the feedback (recorded in every manifest)."""
    shared: tuple[str, ...] = ()
    """The shared `PatchConfig` fields it reads besides mode and min_gap (seed, batch_size)."""
    default_cells: bool = False
    """Without --lengths / --max-pairs: the shortest length of each task and 16 pairs per cell."""
    tables: Callable[[pd.DataFrame, object], dict] | None = None
    """(wide rows, PatchConfig) -> extra tables written beside the rows."""
    study_modes: tuple[str, ...] | None = None
    """The modes `fbt-probe reproduce` runs it under in its exact stage (None: not there)."""
    per_batch: bool = False
    """A batch's rows depend on that batch alone: under torchrun its batches are shared out over the
    ranks (the others need statistics over every pair: donors, mean gates, probes, rotations)."""

    def __call__(self, fw, batches, cfg, mode: Mode, **extra) -> pd.DataFrame:
        """One mode's wide rows; `fw`: a `Forwards` (shared by experiments run together) or a model."""
        fw = forwards(fw, reuse=cfg.prefix_reuse)
        shared = {k: getattr(cfg, k) for k in self.shared}
        w = self.run(fw, batches, mode=mode, min_gap=cfg.min_gap, **shared, **asdict(cfg.options), **extra)
        if self.tables is not None:
            w.attrs["tables"] = self.tables(w, cfg)
        return w


def _parity(w: pd.DataFrame, cfg) -> dict:
    return {"parity": parity_table(w, cfg.n_boot, cfg.ci, cfg.seed)}


# insertion order: the CLI's help, `reproduce`'s exact stage and the report read them in this order
EXPERIMENTS: dict[str, Experiment] = {
    "feedback-swap": Experiment(
        feedback_swap,
        FeedbackSwapOptions,
        "one-pass: fusion.* replaced at the final position in the one hooked pass (exact)",
        study_modes=("recurrent:1",),
        per_batch=True,
    ),
    "state-replacement": Experiment(
        state_replacement,
        StateReplacementOptions,
        "one-pass: fusion.hook_feedback replaced at the final position (exact)",
        shared=("seed",),
        study_modes=("recurrent:1",),
    ),
    "gate-ablation": Experiment(
        gate_ablation,
        GateAblationOptions,
        "one-pass for the prefill mode; kv-step (model.step with hooks) for Soft decoding",
        study_modes=("recurrent:1",),
    ),
    "residual": Experiment(
        residual_patching,
        ResidualOptions,
        "serial (serial=True) when the mode carries a state, so patches ripple through the feedback; one-pass under standard",
        shared=("batch_size",),
        default_cells=True,
        study_modes=("standard", "recurrent:1"),
        per_batch=True,
    ),
    "probe-direction": Experiment(
        probe_direction,
        ProbeDirectionOptions,
        "one-pass: the final position of each probe depth edited in the one hooked pass (exact)",
        shared=("seed",),
        study_modes=("standard", "recurrent:1"),
    ),
    "attribution": Experiment(
        attribution,
        AttributionOptions,
        "as residual: serial (serial=True) when the mode carries a state, so gradients flow through the carried "
        "states (and Jacobi passes); one-pass under standard",
        shared=("seed", "batch_size"),
        default_cells=True,
        tables=_parity,
    ),
    "das": Experiment(
        das,
        DasOptions,
        "one-pass: the final position's activation interchanged in the mode's final pass (exact)",
        shared=("seed",),
    ),
}
HOOK_RULES = {name: e.hook_rule for name, e in EXPERIMENTS.items()}
