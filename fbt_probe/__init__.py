"""fbt-probe: interpretability toolkit for latent-feedback ("full-bandwidth") transformers.

    import fbt_probe as fp
    model = fp.load_model("ref:tiny-feedback")    # see fbt_probe.loading.load_model

The package root stays import-light: `load_model` (which needs torch and transformer-lens) is
imported on first use, so `fbt_probe.errors`, the CLI's help and `fbt_probe.kernels` start fast.
"""

from __future__ import annotations

from fbt_probe._version import __version__

__all__ = ["__version__", "load_model"]


def __getattr__(name: str):
    if name == "load_model":  # lazy: PEP 562
        from fbt_probe.loading import load_model

        return load_model
    raise AttributeError(f"module 'fbt_probe' has no attribute {name!r}")
