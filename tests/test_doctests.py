"""The Examples of the public API's docstrings run and print what they say (the same check as
`pytest --doctest-modules` on these modules)."""

from __future__ import annotations

import doctest
import importlib

import pytest

PUBLIC = [
    "fbt_probe.loading",
    "fbt_probe.model.transformer",
    "fbt_probe.probes.estimator",
    "fbt_probe.interventions.registry",
    "fbt_probe.hooks",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name}: no examples"
    assert result.failed == 0, (
        f"{name}: {result.failed} of {result.attempted} examples failed (run pytest --doctest-modules {name.replace('.', '/')}.py)"
    )
