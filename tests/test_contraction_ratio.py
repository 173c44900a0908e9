"""The contraction diagnostic per document: the table's state change is the documents' mean, and the
ratio's bootstrap interval holds the ratio of those means."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fbt_probe as fp
from fbt_probe.training.evaluate import contraction, contraction_by_document, ratio_interval


def test_per_document_changes_average_to_the_table_and_the_ratio_interval_holds_the_ratio():
    torch.manual_seed(0)
    model = fp.load_model("tiny", n_layers=2, dtype="float64").eval()
    tokens = torch.randint(1, 100, (12, 10))
    targets = torch.roll(tokens, -1, 1)
    weights = torch.ones(12, 10)
    table, by_doc = contraction_by_document(model, tokens, targets, weights, n_passes=6)
    assert by_doc.shape == (6, 12) and np.isnan(by_doc[0]).all()
    assert np.allclose(table["state_change"].to_numpy()[1:], by_doc[1:].mean(1), rtol=1e-10)
    assert table.equals(contraction(model, tokens, targets, weights, n_passes=6))
    r, lo, hi = ratio_interval(by_doc, n_boot=500)
    assert r == float(by_doc[-1].mean() / by_doc[1].mean()) and lo < r < hi


def test_per_document_losses_weigh_up_to_the_tables_validation_loss():
    """`contraction_documents`: Σ weight · loss / Σ weight over documents is the table's validation loss
    at every pass (documents with different numbers of counted positions)."""
    from fbt_probe.training.evaluate import contraction_documents

    torch.manual_seed(1)
    model = fp.load_model("tiny", n_layers=2, dtype="float64").eval()
    tokens = torch.randint(1, 100, (8, 10))
    targets = torch.roll(tokens, -1, 1)
    weights = (torch.rand(8, 10) > 0.3).float()
    weights[:, -1] = 1.0
    table, change, loss, weight = contraction_documents(model, tokens, targets, weights, n_passes=4)
    assert loss.shape == (4, 8) and np.array_equal(weight, weights.sum(1).numpy())
    assert np.allclose((loss * weight).sum(1) / weight.sum(), table["val_loss"].to_numpy(), rtol=1e-6)
    assert np.array_equal(np.isnan(change), np.isnan(contraction_by_document(model, tokens, targets, weights, 4)[1]))


def curves(change_of_pass, documents: int = 40, passes: int = 32, seed: int = 0):
    """A per-document table (run, pass, document, change, loss, weight) whose state change follows
    `change_of_pass` times a document's own scale, and whose loss rises by 0.5 nats over the passes."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 1.5, documents)
    rows = []
    for p in range(1, passes + 1):
        for d in range(documents):
            c = float("nan") if p == 1 else change_of_pass(p) * scale[d] * (1 + 0.05 * rng.standard_normal())
            rows.append(
                {
                    "run": "feedback",
                    "pass": p,
                    "document": d,
                    "change": c,
                    "loss": 1.0 + 0.5 * (p - 1) / (passes - 1),
                    "weight": 3.0,
                }
            )
    return pd.DataFrame(rows)


def test_the_tail_is_judged_against_the_early_and_the_middle_passes():
    """The committed study's shape (11.6 at pass 2 falling to about 1.7 by pass 15 and staying there) is a
    plateau; a geometric decay is still decaying; the rise is the loss's, weighted; the numbers are ratios
    of window means over documents, recomputed here."""
    from fbt_probe.reproduce import rules
    from fbt_probe.reproduce.parts.contraction import tail_numbers

    plateau = curves(lambda p: max(11.6 * 0.85 ** (p - 2), 1.7))
    t = tail_numbers(plateau)
    w = rules.contraction_windows(32)
    assert w == {"early": (2, 4), "middle": (9, 16), "tail": (25, 32)}
    ch = plateau.pivot(index="pass", columns="document", values="change").to_numpy()
    tail, early = ch[24:32].mean(0), ch[1:4].mean(0)
    assert t["decay"][0] == pytest.approx(tail.mean() / early.mean()) and t["decay"][1] < t["decay"][0] < t["decay"][2]
    assert t["rise"][0] == pytest.approx(0.5) and t["documents"] == 40 and t["passes"] == 32
    v = rules.contraction(t["decay"], t["level"], t["documents"], w)
    assert v.verdict == "falls to a plateau"
    decaying = tail_numbers(curves(lambda p: 11.6 * 0.8 ** (p - 2)))
    assert rules.contraction(decaying["decay"], decaying["level"], 40, w).verdict == "contracts, still decaying"
    growing = tail_numbers(curves(lambda p: 1.0 + 0.1 * p))
    assert rules.contraction(growing["decay"], growing["level"], 40, w).verdict == "does not contract"
