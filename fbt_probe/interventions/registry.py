"""The experiments `fbt-probe patch` runs: one table from name to function, options and hook rule.

`EXPERIMENTS[name].run(model, batches, mode=..., min_gap=..., **options)` returns the wide rows of
one prefill mode; its options are a frozen dataclass of the `PatchConfig` fields it reads. The runner, the CLI's validation and `fbt-probe reproduce` (the
experiments with `study_modes`) all read this table, so a new experiment is one entry here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Callable

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.interventions.atp_parity import attribution, parity_table
from fbt_probe.interventions.das_experiment import das
from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.probe_edits import erase_methods, probe_direction
from fbt_probe.modes import Mode, check_distinct, parse_mode


@dataclass(frozen=True)
class PatchConfig:
    """What `run` does: one experiment of the registry, its modes, cells and options (validated here,
    so a bad value is a one-line error before any model runs).

    Each experiment reads the fields named by its options dataclass
    (`fbt_probe.interventions.registry`); the others are ignored. Every field is recorded in the
    manifest's provenance.

    Parameters
    ----------
    experiment : str
        A key of `registry.EXPERIMENTS`: feedback-swap, state-replacement, gate-ablation, residual,
        probe-direction, attribution or das.
    modes : tuple of str, default ("recurrent:1",)
        Prefill modes, each run separately (docs/modes.md).
    batch_size, min_gap, n_boot, ci, seed, max_pairs, lengths, depths, last_k, scales, n_folds, erase,
    decoding, check, hooks, ks, steps, lr, prefix_reuse
        As documented on each field below.

    Examples
    --------
    >>> cfg = PatchConfig("residual", modes=("standard", "recurrent:1"), depths=(0, 2), last_k=4)
    >>> cfg.experiment, cfg.depths, cfg.n_boot
    ('residual', (0, 2), 1000)
    >>> PatchConfig("swap")
    Traceback (most recent call last):
    ...
    fbt_probe.errors.FbtError: experiment 'swap': expected one of feedback-swap, state-replacement, gate-ablation, residual, probe-direction, attribution, das
    """

    experiment: str
    """A key of `registry.EXPERIMENTS`."""
    modes: tuple[Mode, ...] = ("recurrent:1",)
    """Prefill modes, each run separately (names are parsed into `Mode`s here)."""
    batch_size: int = 32
    """Samples per forward (both samples of a pair always share a batch)."""
    min_gap: float = 0.1
    """|clean - corrupt| logit difference below which a pair is left out of `normalized`."""
    n_boot: int = 1000
    """Bootstrap resamples over pairs."""
    ci: float = 0.95
    """Confidence level of the bootstrap intervals."""
    seed: int = 0
    """Seed of the bootstrap, donors, random states and folds."""
    max_pairs: int | None = None
    """Pairs per task × length cell (None = all; residual defaults to 16)."""
    lengths: tuple[int, ...] | None = None
    """Length knobs to keep (None = all; residual defaults to the shortest of each task)."""
    depths: tuple[int, ...] | None = None
    """Probe depths for residual / probe-direction (None = 0..L)."""
    last_k: int | None = None
    """Residual: patch only the last k positions (None = all)."""
    scales: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """Probe-direction: steering scales, in class-mean gaps."""
    n_folds: int = 4
    """Probe-direction and DAS: grouped folds."""
    erase: str = "auto"
    """Probe-direction erasure: auto (LEACE and orth), leace, orth or leace,orth."""
    decoding: bool = True
    """Gate ablation: also Std / Soft decoding answer accuracy."""
    check: int = 0
    """Attribution: exact patching on the K cells AtP ranks highest plus K random cells (0 = no check)."""
    hooks: tuple[str, ...] | None = None
    """Attribution / DAS: hook names (None = each experiment's default set)."""
    ks: tuple[int, ...] = (1, 2, 4, 8)
    """DAS: subspace dimensions."""
    steps: int = 200
    """DAS: optimizer steps per rotation."""
    lr: float = 1e-2
    """DAS: Adam learning rate of the rotation."""
    prefix_reuse: bool = True
    """Compute the positions before the first edited one once per batch (hooks off) and run only the
    rest per condition (`fbt_probe.engine.prefix`); False re-runs the whole sequence each time (the
    reference path: same tables up to float rounding)."""

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise FbtError(f"experiment '{self.experiment}': expected one of {', '.join(EXPERIMENTS)}")
        object.__setattr__(self, "modes", tuple(parse_mode(m) for m in self.modes))  # parsed once, here
        check_distinct(list(self.modes), list(self.modes))
        if not (_number(self.min_gap) and self.min_gap >= 0):  # NaN would disable the filter
            raise FbtError(f"--min-gap {self.min_gap}: expected a finite number >= 0")
        if not (_number(self.ci) and 0 < self.ci < 1):
            raise FbtError(f"ci {self.ci}: expected a number in (0, 1)")
        for name, low in (
            ("n_boot", 1),
            ("batch_size", 2),
            ("n_folds", 2),
            ("max_pairs", 1),
            ("last_k", 1),
            ("check", 0),
            ("steps", 1),
        ):
            value = getattr(self, name)
            if value is None and name in ("max_pairs", "last_k"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FbtError(
                    f"--{name.replace('_', '-').replace('n-folds', 'folds')} {value}: expected an integer >= {low}"
                )
        if self.depths is not None and (not self.depths or min(self.depths) < 0):
            raise FbtError(
                f"--depths {','.join(map(str, self.depths))}: expected probe depths >= 0 (0 = the model's input)"
            )
        if not all(_number(s) for s in self.scales):
            raise FbtError(f"--scales {self.scales}: expected finite numbers")
        if self.experiment == "probe-direction":
            erase_methods(self.erase)
        if not (_number(self.lr) and self.lr > 0):
            raise FbtError(f"--lr {self.lr}: expected a finite number > 0")
        if not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise FbtError(f"--ks {','.join(map(str, self.ks))}: expected distinct subspace dimensions >= 1")
        if self.hooks is not None and len(set(self.hooks)) != len(self.hooks):
            raise FbtError(f"--hooks {','.join(self.hooks)}: expected distinct hook names")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _options(name: str, *knobs: str) -> type:
    """A frozen dataclass of the `PatchConfig` fields `knobs`: same types and defaults, documented
    there (each knob is declared once)."""
    src = {f.name: f for f in fields(PatchConfig)}
    return make_dataclass(name, [(k, src[k].type, field(default=src[k].default)) for k in knobs], frozen=True)


FeedbackSwapOptions = _options("FeedbackSwapOptions")
StateReplacementOptions = _options("StateReplacementOptions", "seed")
GateAblationOptions = _options("GateAblationOptions", "decoding")
ResidualOptions = _options("ResidualOptions", "depths", "last_k", "batch_size")
AttributionOptions = _options("AttributionOptions", "hooks", "last_k", "check", "seed", "batch_size")
DasOptions = _options("DasOptions", "hooks", "ks", "steps", "lr", "n_folds", "seed")
ProbeDirectionOptions = _options("ProbeDirectionOptions", "depths", "scales", "n_folds", "erase", "seed")


@dataclass(frozen=True)
class Experiment:
    run: Callable[..., pd.DataFrame]
    """(model, batches, *, mode, min_gap, [reuse], **options) -> wide rows of one mode."""
    options: type
    """The options dataclass; its fields are read from the PatchConfig fields of the same names."""
    hook_rule: str
    """How the edit meets the feedback (recorded in every manifest)."""
    reuse: bool = True
    """Takes `reuse` (prefix reuse); attribution and DAS need the whole forward (gradients, interchange)."""
    default_cells: bool = False
    """Without --lengths / --max-pairs: the shortest length of each task and 16 pairs per cell."""
    tables: Callable[[pd.DataFrame, object], dict] | None = None
    """(wide rows, PatchConfig) -> extra tables written beside the rows."""
    study_modes: tuple[str, ...] | None = None
    """The modes `fbt-probe reproduce` runs it under in its exact stage (None: not there)."""
    per_batch: bool = False
    """A batch's rows depend on that batch alone: under torchrun its batches are shared out over the
    ranks (the others need statistics over every pair: donors, mean gates, probes, rotations)."""

    def options_of(self, cfg) -> object:
        return self.options(**{f.name: getattr(cfg, f.name) for f in fields(self.options)})

    def __call__(self, model, batches, cfg, mode: Mode) -> pd.DataFrame:
        reuse = {"reuse": cfg.prefix_reuse} if self.reuse else {}
        w = self.run(model, batches, mode=mode, min_gap=cfg.min_gap, **reuse, **asdict(self.options_of(cfg)))
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
        default_cells=True,
        study_modes=("standard", "recurrent:1"),
        per_batch=True,
    ),
    "probe-direction": Experiment(
        probe_direction,
        ProbeDirectionOptions,
        "one-pass: the final position of each probe depth edited in the one hooked pass (exact)",
        study_modes=("standard", "recurrent:1"),
    ),
    "attribution": Experiment(
        attribution,
        AttributionOptions,
        "as residual: serial (serial=True) when the mode carries a state, so gradients flow through the carried "
        "states (and Jacobi passes); one-pass under standard",
        reuse=False,
        default_cells=True,
        tables=_parity,
    ),
    "das": Experiment(
        das,
        DasOptions,
        "one-pass: the final position's activation interchanged in the mode's final pass (exact)",
        reuse=False,
    ),
}
HOOK_RULES = {name: e.hook_rule for name, e in EXPERIMENTS.items()}
