"""The whole study in one command (`fbt-probe reproduce`).

`ReproConfig` and `reproduce` are imported on first use (PEP 562), so that a stage worker process,
which imports `fbt_probe.reproduce.stages` to start, pays only for what its stage reads."""

from __future__ import annotations

__all__ = ["ReproConfig", "reproduce"]


def __getattr__(name: str):
    if name in __all__:
        from fbt_probe.reproduce import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'fbt_probe.reproduce' has no attribute {name!r}")
