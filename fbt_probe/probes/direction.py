"""A fitted probe as a frozen, function-like object in the raw activation space.

The probe is fitted on standardized features, `z = ((x - mean) / scale) · w + b`. The same
function in the raw space is `z = x · (w / scale) + (b - mean · (w / scale))`; `direction` is that
raw-space weight vector normalized to unit length (what erasure / steering experiments use).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path


def _frozen(a) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True).reshape(-1)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class ProbeDirection:
    weights: np.ndarray
    """[D] logistic-regression weights on standardized features."""
    bias: float
    mean: np.ndarray
    """[D] the scaler's per-feature mean (fitted on the training rows)."""
    scale: np.ndarray
    """[D] the scaler's per-feature scale (1 where a feature was constant)."""
    classes: tuple = (0, 1)
    """Label of a negative / positive score."""
    hook: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Where it was fitted: task, mode, length, depth, accuracy, ..."""

    def __post_init__(self) -> None:
        for name in ("weights", "mean", "scale"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "bias", float(self.bias))
        object.__setattr__(self, "classes", tuple(self.classes))
        object.__setattr__(self, "meta", dict(self.meta))
        d = self.weights.shape[0]
        if self.mean.shape[0] != d or self.scale.shape[0] != d:
            raise FbtError(
                f"probe direction: weights, mean and scale must have the same length, got {d}, "
                f"{self.mean.shape[0]}, {self.scale.shape[0]}"
            )
        if len(self.classes) != 2:
            raise FbtError(f"probe direction: needs exactly two classes, got {self.classes}")

    @property
    def d_model(self) -> int:
        return int(self.weights.shape[0])

    @property
    def raw_weights(self) -> np.ndarray:
        """[D] weights acting on raw (unstandardized) activations."""
        return self.weights / self.scale

    @property
    def raw_bias(self) -> float:
        return float(self.bias - self.mean @ self.raw_weights)

    @property
    def direction(self) -> np.ndarray:
        """[D] unit vector along which the raw-space score increases."""
        w = self.raw_weights
        return w / max(float(np.linalg.norm(w)), 1e-300)

    def score(self, X):
        """Decision score (positive = classes[1]) of raw activations `X` [..., D]: numpy or torch."""
        if hasattr(X, "detach"):  # a torch tensor: stay on its device and dtype
            import torch

            w = torch.as_tensor(self.raw_weights, dtype=X.dtype, device=X.device)
            return X @ w + self.raw_bias
        return np.asarray(X, dtype=np.float64) @ self.raw_weights + self.raw_bias

    def predict(self, X) -> np.ndarray:
        s = self.score(X)
        s = s.detach().cpu().numpy() if hasattr(s, "detach") else s
        return np.where(s > 0, self.classes[1], self.classes[0])

    def save(self, path: str | Path) -> Path:
        """Write a safetensors file (arrays) whose metadata holds bias, classes, hook and meta."""
        from safetensors.numpy import save_file

        path = Path(path)
        header = json.dumps(
            {"bias": repr(self.bias), "classes": list(self.classes), "hook": self.hook, "meta": self.meta},
            default=str,
            sort_keys=True,
        )
        with atomic_path(path) as tmp:  # one metadata key, so the file is byte-stable
            save_file(
                {"weights": self.weights, "mean": self.mean, "scale": self.scale},
                str(tmp),
                metadata={"fbt_probe_direction": header},
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ProbeDirection":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FbtError(f"{path}: probe direction file not found")
        try:
            with safe_open(str(path), framework="numpy") as f:
                header = json.loads((f.metadata() or {})["fbt_probe_direction"])
                arrays = {k: f.get_tensor(k) for k in ("weights", "mean", "scale")}
            return cls(
                bias=float(header["bias"]),
                classes=tuple(header["classes"]),
                hook=header.get("hook"),
                meta=header.get("meta") or {},
                **arrays,
            )
        except (KeyError, ValueError, OSError) as exc:
            raise FbtError(f"{path}: not a probe direction file ({exc})") from None
        except Exception as exc:  # safetensors raises its own error type for a damaged file
            raise FbtError(f"{path}: unreadable probe direction file ({type(exc).__name__}: {exc})") from None
