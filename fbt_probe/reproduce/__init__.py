"""The whole study in one command (`fbt-probe reproduce`)."""
from fbt_probe.reproduce.pipeline import ReproConfig, reproduce

__all__ = ["ReproConfig", "reproduce"]
