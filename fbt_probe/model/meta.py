"""Models built on torch's meta device (shapes, no memory) without initialising their parameters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode


class _NoFill(TorchFunctionMode):
    """Parameter initialisation skipped on the meta device: an in-place fill (`normal_`, `uniform_`,
    ... and the `torch.nn.init` functions) of a meta tensor returns it untouched; a real tensor is
    filled as always. A meta tensor holds no values, and torch fills one through its Python
    reference kernels, whose first call imports the compiler stack (torch._dynamo and sympy: about
    1.5 s a process, more where their byte-code is not yet compiled). The mode is thread-local, like
    every torch function mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _FILLS:
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


_FILLS = frozenset(
    "normal_ uniform_ fill_ zero_ zeros_ ones_ constant_ trunc_normal_ kaiming_uniform_ kaiming_normal_ "
    "xavier_uniform_ xavier_normal_ orthogonal_ eye_ dirac_ sparse_ copy_".split()
)


@contextmanager
def on_meta() -> Iterator[None]:
    """Modules built inside have their parameters on the meta device, uninitialised (`_NoFill`)."""
    with torch.device("meta"), _NoFill():
        yield
