"""Logit lens and tuned lens per depth, per prefill mode and per Jacobi pass.

from fbt_probe.lens import LensConfig, run_lens, logit_lens
res = run_lens(model, load_pairs("data/tasks"), LensConfig(modes=("standard", "recurrent:1", "jacobi:3")))
res.summary.query("metric == 'p_correct' and length_knob == -1")
"""

from fbt_probe.lens.lenses import TunedLens, fit_tuned_lens, kl_to, logit_lens
from fbt_probe.lens.sweep import LENS_METRICS, LensConfig, LensResult, pass_activations, run_lens, summarize_lens

__all__ = [
    "LENS_METRICS",
    "LensConfig",
    "LensResult",
    "TunedLens",
    "fit_tuned_lens",
    "kl_to",
    "logit_lens",
    "pass_activations",
    "run_lens",
    "summarize_lens",
]
