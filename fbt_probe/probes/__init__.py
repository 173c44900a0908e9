"""Linear probes at every depth (docs/probes.md).

from fbt_probe.probes import LinearProbe, ProbeConfig, probe_sweep, write_results
probe = LinearProbe(C=1.0).fit(X, y)          # scikit-learn estimator (cross_val_score, clone, ...)
direction = probe.export(hook="blocks.0.hook_resid_pre")   # frozen ProbeDirection, raw space
result = probe_sweep("acts/", ProbeConfig(n_splits=5))      # tidy table + flags + provenance
direction = fit_direction("acts/", "recurrent:1", "completion", 8, depth=0)   # all samples of a cell
"""

from fbt_probe.probes.direction import ProbeDirection
from fbt_probe.probes.estimator import LinearProbe, fit_binary
from fbt_probe.probes.splits import (
    GroupLeakError,
    check_group_disjoint,
    control_labels,
    grouped_folds,
    grouped_splits,
    majority_baseline,
)
from fbt_probe.probes.sweep import (
    METRICS,
    ProbeConfig,
    SweepResult,
    fit_cells,
    fit_direction,
    probe_condition,
    probe_sweep,
    summarize,
    write_results,
)

__all__ = [
    "METRICS",
    "GroupLeakError",
    "LinearProbe",
    "ProbeConfig",
    "ProbeDirection",
    "SweepResult",
    "check_group_disjoint",
    "control_labels",
    "fit_binary",
    "fit_cells",
    "fit_direction",
    "grouped_folds",
    "grouped_splits",
    "majority_baseline",
    "probe_condition",
    "probe_sweep",
    "summarize",
    "write_results",
]
