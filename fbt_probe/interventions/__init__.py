"""Causal interventions over minimal pairs (docs/interventions.md): pure hook functions + experiments -> tidy tables.

    from fbt_probe.interventions import PatchConfig, run, load_pairs
    df = load_pairs("data/tasks")                                  # dataset file or folder
    res = run(model, df, PatchConfig("feedback-swap", modes=("recurrent:1",)), out="results")
    res.summary.query("metric == 'normalized' and length_knob == -1")

Hook rules (docs/modes.md): feedback-swap, state-replacement, gate-ablation and probe-direction edit
the final position in the one hooked pass (exact); residual patching uses `serial=True` when the
mode carries a state; Soft decoding uses the KV-cache step path with hooks on. Every forward of an
experiment goes through the runner (`Forwards`, `fbt_probe.interventions.forwards`), which computes
the positions before the first edit once per batch (off with `PatchConfig(prefix_reuse=False)`, the
full re-run: same tables up to float rounding). Each experiment's knobs are its options dataclass
(`registry.ResidualOptions`, ...), `PatchConfig(..., options=...)`.
"""

from fbt_probe.interventions.edits import (
    capture,
    edit_at,
    patch_all,
    patch_rows_at,
    rank_one_edit,
    set_at,
    span,
    stitch,
)
from fbt_probe.interventions.experiments import (
    GATE_CONDITIONS,
    feedback_swap,
    gate_ablation,
    mean_gates,
    residual_patching,
    state_replacement,
)
from fbt_probe.interventions.forwards import Forwards, final_logits, soft_answer_logits
from fbt_probe.interventions.metrics import bootstrap_ci, kl_div, logit_diff, score, summarize, to_long
from fbt_probe.interventions.pairs import PairBatch, label_token_ids, pair_batches
from fbt_probe.interventions.probe_edits import erase_methods, probe_direction
from fbt_probe.interventions.registry import EXPERIMENTS, HOOK_RULES, PatchConfig
from fbt_probe.interventions.runner import Results, run, run_experiment
from fbt_probe.loading import check_compatible, load_pairs, open_model, open_pairs  # re-exported: where to start

__all__ = [
    "EXPERIMENTS",
    "Forwards",
    "GATE_CONDITIONS",
    "HOOK_RULES",
    "PairBatch",
    "PatchConfig",
    "Results",
    "bootstrap_ci",
    "capture",
    "check_compatible",
    "edit_at",
    "erase_methods",
    "feedback_swap",
    "final_logits",
    "gate_ablation",
    "kl_div",
    "label_token_ids",
    "load_pairs",
    "open_model",
    "open_pairs",
    "logit_diff",
    "mean_gates",
    "pair_batches",
    "patch_all",
    "patch_rows_at",
    "probe_direction",
    "rank_one_edit",
    "residual_patching",
    "run",
    "run_experiment",
    "score",
    "set_at",
    "soft_answer_logits",
    "span",
    "state_replacement",
    "stitch",
    "summarize",
    "to_long",
]
