"""The contraction diagnostic per document: the table's state change is the documents' mean, and the
ratio's bootstrap interval holds the ratio of those means."""

from __future__ import annotations

import numpy as np
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
