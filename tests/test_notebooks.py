"""The manual's notebooks (docs/notebooks/*.py): what each says it needs, that none reads the
checkout, that a cell that raises fails the manual's build, and that the checks on their records can
fail. The notebooks themselves run in the manual's strict build (tests/test_docs.py) and, one of
them, from the installed wheel in another folder (tests/test_wheel.py)."""

from __future__ import annotations

import copy
import json
import re

import jupytext
import pytest
import yaml

from tests.notebook_helpers import NOTEBOOK_DIR, ROOT, notebooks, read_record, record_problems
from tests.test_docs import build_docs


def code_and_text(path):
    nb = jupytext.read(path)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    text = [c.source for c in nb.cells if c.cell_type == "markdown"]
    return code, text


def test_each_notebook_says_what_it_needs_and_how_long():
    names = [p.name for p in notebooks()]
    assert names == ["decodable-vs-used.py", "model-and-modes.py", "your-checkpoint.py"]
    imports = {"nnsight": "nnsight", "rustbpe": "rustbpe", "tiktoken": "tiktoken"}
    for path in notebooks():
        code, text = code_and_text(path)
        head = text[0]
        assert head.startswith("# "), path.name
        needs = re.search(r"\*\*Needs\*\*: `pip install ([^`]+)`", head)
        assert needs and "fbt-probe" in needs.group(1).split(), path.name
        assert re.search(r"\*\*Takes\*\*: about \d+ s on 2 CPU cores \(AMD EPYC", head), path.name
        for module, package in imports.items():  # every optional dependency the code imports is named
            if re.search(rf"^(from|import) {module}\b", code, re.MULTILINE):
                assert package in needs.group(1).split(), (path.name, package)


def test_no_notebook_reads_the_checkout():
    """A notebook runs on an installed wheel from any folder: no path into the repository and nothing
    from tests/ in its code."""
    for path in notebooks():
        code, _ = code_and_text(path)
        for bad in ("from tests", "import tests", "__file__)", "docs/", "reports/", "fbt_probe/", "runs/", "../"):
            assert bad not in code, (path.name, bad)


def test_every_record_check_can_fail(tmp_path):
    """Each check of tests/notebook_helpers.py rejects a record where the relation it checks is
    broken (the records are the shapes the notebooks write; here made by hand)."""
    T = 4
    good = {
        "model-and-modes": {
            "tokens": [[1] * T, [2] * T],
            "labels": [0, 1],
            "logit_diff": {m: [1.0, 2.0] for m in ("standard", "recurrent:1", "jacobi:2", "jacobi:3", "full")},
            "jacobi_gap": [0.5, 0.2, 0.01, 1e-6],
            "jacobi_prefix_gap": 1e-6,
            "full_serial_gap": 1e-6,
            "lens": {"standard": [[0.0, 0.0], [1.0, 2.0]]},
            "grad_hook": 0.5,
            "grad_fd": 0.5 + 1e-9,
            "state_err": 1e-6,
            "fused_err": 1e-6,
            "nnsight_trace_err": 1e-6,
            "patch_carried_part": 0.4,
            "nnsight_moved": 0.2,
            "patch_effect": [[0.0] * T] * 3,
        },
        "decodable-vs-used": {
            "fig7a": [
                {
                    "model": m,
                    "mode": "standard",
                    "depth": 0,
                    "accuracy": 0.5,
                    "ci_low": 0.3,
                    "ci_high": 0.7,
                    "n_groups": 32,
                }
                for m in ("feedback", "baseline")
            ]
            + [
                {"model": "feedback", "mode": "recurrent:1", "depth": 0, "accuracy": 0.9}
                | {"ci_low": 0.8, "ci_high": 0.95, "n_groups": 32}
            ],
            "sklearn_refit": {"feedback/recurrent:1/depth0": 0.91},
            "effects": [
                {"model": "feedback", "experiment": "feedback-swap", "metric": "accuracy"}
                | {"mean": 0.4, "ci_low": 0.2, "ci_high": 0.6}
            ],
            "swap_paired_difference": [0.3, 0.2, 0.4, 32],
        },
        "your-checkpoint": {
            "study_depth0_standard": 0.5,
            "study_headline": [
                {"quantity": "depth0-decodability", "task": "completion", "mode": "standard", "value": 0.5}
            ],
            "load_gap": 0.0,
            "sae_fvu": 0.05,
            "sae_l0": 8.0,
            "sae_checks": {"error term": 0.0},
        },
    }
    bad = {
        "model-and-modes": [
            ("jacobi_gap", [0.5, 0.2, 0.01, 0.2]),  # jacobi:T differs from full
            ("jacobi_prefix_gap", 0.1),  # jacobi:K's first K positions differ from full
            ("full_serial_gap", 0.1),  # the lean scan is not the hooked serial run
            ("grad_fd", 0.6),  # the hook's gradient is not the serial run's
            ("lens", {"standard": [[0.0, 0.0], [1.0, 2.5]]}),  # the lens does not end at the output
            ("patch_carried_part", 0.0),  # nothing reaches the answer through the state
        ],
        "decodable-vs-used": [
            ("sklearn_refit", {"feedback/recurrent:1/depth0": 0.7}),  # the refit disagrees with the sweep
            ("swap_paired_difference", [0.3, 0.2, 0.4, 31]),  # not over the 32 groups
        ],
        "your-checkpoint": [
            ("study_depth0_standard", 0.55),  # above chance where the design forbids it
            ("load_gap", 1e-3),  # the import changed the model
            ("sae_checks", {"error term": 1e-3}),  # the error term changed the output
        ],
    }
    for name, record in good.items():
        assert record_problems(name, record) == [], name
        for key, value in bad[name]:
            broken = copy.deepcopy(record)
            broken[key] = value
            assert record_problems(name, broken), (name, key)
        broken = copy.deepcopy(record)
        broken.pop(next(iter(broken)))
        assert record_problems(name, broken), (name, "missing key")
    chance = copy.deepcopy(good["decodable-vs-used"])
    chance["fig7a"][0]["accuracy"] = 0.55
    assert any("depth 0 under standard" in p for p in record_problems("decodable-vs-used", chance))
    (tmp_path / "your-checkpoint.json").write_text(json.dumps(good["your-checkpoint"]))
    assert read_record(tmp_path, NOTEBOOK_DIR / "your-checkpoint.py") == good["your-checkpoint"]


@pytest.mark.slow
def test_a_cell_that_raises_fails_the_manual_build(tmp_path):
    """The manual's own notebook settings (mkdocs.yml) on a one-page manual: a notebook whose check
    fails stops the strict build, and the output names the failed check."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (plugin,) = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p]
    assert plugin["mkdocs-jupyter"]["execute"] is True and plugin["mkdocs-jupyter"]["allow_errors"] is False
    (tmp_path / "docs" / "notebooks").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# t\n\n[the notebook](notebooks/check.py)\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({"site_name": "t", "docs_dir": "docs", "plugins": [plugin]}))
    notebook = tmp_path / "docs" / "notebooks" / "check.py"
    notebook.write_text('# %% [markdown]\n# # Check\n\n# %%\nvalue = 1 + 1\nassert value == 3, f"value {value}"\n')
    r = build_docs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0
    assert "AssertionError" in r.stdout + r.stderr and "value 2" in r.stdout + r.stderr
    assert not (tmp_path / "site" / "notebooks" / "check" / "index.html").exists()
