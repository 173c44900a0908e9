"""The experiments `fbt-probe patch` runs: one table from name to function, options and hook rule.

`EXPERIMENTS[name].run(model, batches, mode=..., min_gap=..., **options)` returns the wide rows of
one prefill mode; the options are a small frozen dataclass whose fields the runner reads from the
`PatchConfig` of the same names. The runner, the CLI's validation and `fbt-probe reproduce` (the
experiments with `study_modes`) all read this table, so a new experiment is one entry here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Callable

import pandas as pd

from fbt_probe.interventions.atp_parity import attribution, parity_table
from fbt_probe.interventions.das_experiment import das
from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.probe_edits import probe_direction


@dataclass(frozen=True)
class NoOptions:
    """feedback-swap: nothing beyond the mode and the tiny-gap threshold."""


@dataclass(frozen=True)
class SeedOptions:
    seed: int = 0
    """state-replacement: seed of the donor and random states."""


@dataclass(frozen=True)
class GateAblationOptions:
    decoding: bool = True
    """Also Std / Soft decoding answer accuracy."""


@dataclass(frozen=True)
class ResidualOptions:
    depths: tuple[int, ...] | None = None
    """Probe depths patched (None = 0..L)."""
    last_k: int | None = None
    """Patch only the last k positions (None = all)."""
    batch_size: int = 32
    """Samples per patched forward."""


@dataclass(frozen=True)
class AttributionOptions:
    hooks: tuple[str, ...] | None = None
    """Hook names (None = residual stream and fusion hooks)."""
    last_k: int | None = None
    """Attribute only the last k positions (None = all)."""
    check: int = 0
    """Exact patching on the K cells AtP ranks highest plus K random cells (0 = no check)."""
    seed: int = 0
    """Seed of the random check cells."""
    batch_size: int = 32
    """Samples per forward."""


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
    """Grouped folds (train the rotation on some groups, measure on the others)."""
    seed: int = 0
    """Seed of the folds and the rotation's initialisation."""


@dataclass(frozen=True)
class ProbeDirectionOptions:
    depths: tuple[int, ...] | None = None
    """Probe depths edited (None = 0..L)."""
    scales: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """Steering scales, in class-mean gaps."""
    n_folds: int = 4
    """Grouped folds for cross-fitting the probes."""
    erase: str = "auto"
    """auto | leace | orth | leace,orth."""
    seed: int = 0
    """Seed of the folds and the random steering direction."""


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

    def options_of(self, cfg) -> object:
        return self.options(**{f.name: getattr(cfg, f.name) for f in fields(self.options)})

    def __call__(self, model, batches, cfg, mode: str) -> pd.DataFrame:
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
        feedback_swap, NoOptions, "one-pass: fusion.* replaced at the final position in the one hooked pass (exact)",
        study_modes=("recurrent:1",)),
    "state-replacement": Experiment(
        state_replacement, SeedOptions, "one-pass: fusion.hook_feedback replaced at the final position (exact)",
        study_modes=("recurrent:1",)),
    "gate-ablation": Experiment(
        gate_ablation, GateAblationOptions,
        "one-pass for the prefill mode; kv-step (model.step with hooks) for Soft decoding", study_modes=("recurrent:1",)),
    "residual": Experiment(
        residual_patching, ResidualOptions,
        "serial (serial=True) when the mode carries a state, so patches ripple through the feedback; one-pass under standard",
        default_cells=True, study_modes=("standard", "recurrent:1")),
    "probe-direction": Experiment(
        probe_direction, ProbeDirectionOptions,
        "one-pass: the final position of each probe depth edited in the one hooked pass (exact)",
        study_modes=("standard", "recurrent:1")),
    "attribution": Experiment(
        attribution, AttributionOptions,
        "as residual: serial (serial=True) when the mode carries a state, so gradients flow through the carried "
        "states (and Jacobi passes); one-pass under standard", reuse=False, default_cells=True, tables=_parity),
    "das": Experiment(
        das, DasOptions, "one-pass: the final position's activation interchanged in the mode's final pass (exact)",
        reuse=False),
}
HOOK_RULES = {name: e.hook_rule for name, e in EXPERIMENTS.items()}
