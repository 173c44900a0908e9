"""Linear probes at every depth (DESIGN.md §5).

    from fbt_probe.probes import LinearProbe, ProbeConfig, probe_sweep, write_results
    probe = LinearProbe(C=1.0).fit(X, y)          # scikit-learn estimator (cross_val_score, clone, ...)
    direction = probe.export(hook="blocks.0.hook_resid_pre")   # frozen ProbeDirection, raw space
    result = probe_sweep("acts/", ProbeConfig(n_splits=5))      # tidy table + flags + provenance
"""
from fbt_probe.probes.direction import ProbeDirection
from fbt_probe.probes.estimator import LinearProbe
from fbt_probe.probes.splits import (GroupLeakError, check_group_disjoint, control_labels, grouped_splits,
                                     majority_baseline)
from fbt_probe.probes.sweep import (METRICS, ProbeConfig, SweepResult, fit_cells, probe_condition, probe_sweep,
                                    summarize, write_results)

__all__ = [
    "METRICS", "GroupLeakError", "LinearProbe", "ProbeConfig", "ProbeDirection", "SweepResult",
    "check_group_disjoint", "control_labels", "fit_cells", "grouped_splits", "majority_baseline",
    "probe_condition", "probe_sweep", "summarize", "write_results",
]
