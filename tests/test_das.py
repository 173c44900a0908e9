"""DAS: the interchange is exact where it must be (identity rotation, k = D = the full-vector swap),
the final-position shortcut equals the mode's output, DAS recovers a planted one-dimensional variable
that a probe does not single out, and the experiment's folds and tables."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from fbt_probe.interventions import feedback_swap, final_logits, label_token_ids, pair_batches, set_at
from fbt_probe.interventions.das import (
    Examples,
    FinalStep,
    Rotation,
    fit_rotation,
    fit_rotations,
    haar,
    iia,
    interchange,
    intervened_logits,
    subspace_cosine,
)
from fbt_probe.interventions.das_experiment import FEEDBACK, das, merge, pair_components
from fbt_probe.modes import parse_mode
from tests.helpers import make_model, task_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def data():
    df, tok = task_pairs(groups=6)
    return df, list(pair_batches(df, label_token_ids(df, tok), batch_size=12))


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "recurrent:3", "jacobi:2", "full"])
def test_final_step_equals_the_modes_last_position(model, data, mode):
    b = data[1][0]
    # the prefix comes from a KV cache and the last position runs alone: float64, not bitwise
    torch.testing.assert_close(
        FinalStep.build(model, b.tokens, parse_mode(mode))(),
        final_logits(model, b.tokens, parse_mode(mode)),
        rtol=0,
        atol=1e-10,
    )


def test_identity_rotation_with_k_equal_d_is_the_full_vector_interchange(model, data):
    b = data[1][0]
    D = model.cfg.d_model
    I = Rotation(D, "identity", dtype=torch.float64).R
    assert torch.equal(I, torch.eye(D, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    base, src = torch.randn(5, D, generator=g, dtype=torch.float64), torch.randn(5, D, generator=g, dtype=torch.float64)
    assert torch.equal(interchange(base, src, I, D), src)  # exact: R = I multiplies by ones and adds zeros
    assert torch.equal(interchange(base, src, I, 3), torch.cat([src[:, :3], base[:, 3:]], -1))
    step = FinalStep.build(model, b.tokens, parse_mode("recurrent:1"))
    acts = step.activation(FEEDBACK)
    ex = Examples(step, acts, b.partner, b.target[b.partner], b.other[b.partner], torch.ones(b.n, dtype=torch.bool))
    das_full = intervened_logits(ex, I, D, FEEDBACK)
    swap = final_logits(
        model, b.tokens, parse_mode("recurrent:1"), [(FEEDBACK, set_at(acts[b.partner], b.T - 1, model))]
    )
    torch.testing.assert_close(das_full, swap, rtol=0, atol=1e-10)  # the feedback swap, computed the long way


def test_interchange_is_a_projection_onto_the_first_k_rotated_coordinates():
    D, k = 7, 3
    R = haar(D, 1, torch.float64)
    torch.testing.assert_close(R @ R.T, torch.eye(D, dtype=torch.float64))
    g = torch.Generator().manual_seed(2)
    b, s = torch.randn(4, D, generator=g, dtype=torch.float64), torch.randn(4, D, generator=g, dtype=torch.float64)
    P = R[:k].T @ R[:k]
    torch.testing.assert_close(interchange(b, s, R, k), b + (s - b) @ P)
    assert subspace_cosine(R[:k], R[1] + 2 * R[2]) == pytest.approx(1.0)
    assert subspace_cosine(R[:k], R[5]) == pytest.approx(0.0, abs=1e-12)


class PlantedStep:
    """A synthetic model at the DAS interface: logits depend on a·v only (the used variable);
    the label is also written, more strongly and more cleanly, along u, which the output ignores."""

    def __init__(self, acts: torch.Tensor, v: torch.Tensor):
        self.acts, self.v = acts, v

    def repeat(self, m: int):
        return PlantedStep(self.acts.repeat(m, 1), self.v)

    def __call__(self, hooks=()):
        x = self.acts[:, None]
        for _, fn in hooks:
            x = fn(x)
        score = 3.0 * (x[:, 0] @ self.v)
        return torch.stack([-score, score, torch.full_like(score, -20.0)], dim=-1)  # words 0, 1 and a filler


def planted(n_pairs: int, seed: int, v, u, D: int = 16):
    """Pairs of opposite labels; a = context (shared by the pair, off v and u) + s·m·v + t·3·u with s = ±1
    the label's sign, m in [1, 1.2] and t = s for 70 % of samples, -s otherwise: the output follows v,
    while u carries the label too (decodable, 70 %) but not in step with it, so that only a subspace
    along v transfers the source's label."""
    g = torch.Generator().manual_seed(seed)
    y = torch.stack([torch.zeros(n_pairs), torch.ones(n_pairs)], 1).reshape(-1).long()
    s = (2 * y - 1).double()[:, None]
    context = torch.randn(n_pairs, D, generator=g, dtype=torch.float64).repeat_interleave(2, 0)
    context = context - (context @ v)[:, None] * v - (context @ u)[:, None] * u
    m = 1.0 + 0.2 * torch.rand(2 * n_pairs, 1, generator=g, dtype=torch.float64)
    t = s * torch.where(torch.rand(2 * n_pairs, 1, generator=g, dtype=torch.float64) < 0.7, 1.0, -1.0)
    acts = context + s * m * v + 3.0 * t * u
    partner = torch.arange(2 * n_pairs) ^ 1
    ex = Examples(
        PlantedStep(acts, v), acts, partner, y[partner], 1 - y[partner], torch.ones(2 * n_pairs, dtype=torch.bool)
    )
    return ex, y


def test_das_recovers_a_planted_one_dimensional_variable():
    D = 16
    basis = haar(D, 7, torch.float64)
    v, u = basis[0], basis[1]
    train, y = planted(24, 0, v, u)
    test, _ = planted(24, 1, v, u)
    rot, loss = fit_rotation(train, "x", 1, steps=300, lr=0.05, seed=3, model=nn.Module())
    R = rot.R.detach()
    assert abs(float(R[0] @ v)) > 0.97, float(R[0] @ v)  # v itself, not a mix with the decodable u
    assert iia([test], R, 1, "x").mean() == 1.0 and loss < 0.01
    start = haar(D, 3, torch.float64)  # the untrained starting point (the random-rotation baseline)
    assert iia([test], start, 1, "x").mean() < 0.5 and abs(float(start[0] @ v)) < 0.5


def test_pair_components_hold_out_whole_groups(data):
    df, batches = data
    batch = merge([b for b in batches if b.meta["task"].iloc[0] == "completion"])
    comp = pair_components(batch.meta)
    for _, sub in batch.meta.groupby("pair_id"):
        assert len(set(comp[sub.index])) == 1  # a pair never straddles two CV units
    by_group = pd.Series(comp).groupby(batch.meta["group_id"].to_numpy()).nunique()
    assert (by_group == 1).all()  # a group never belongs to two units


def test_das_experiment_rows_and_fold_table(model, data):
    _, batches = data
    w = das(
        model,
        batches,
        parse_mode("recurrent:1"),
        min_gap=0.0,
        hooks=[FEEDBACK, "blocks.0.hook_resid_pre"],
        ks=(1, 2),
        steps=3,
        n_folds=2,
    )
    assert set(w["method"]) == {"das", "random-rotation", "full-interchange"}
    assert set(w.loc[w.method == "full-interchange", "subspace_dim"]) == {model.cfg.d_model}
    n_rows = sum(b.n for b in batches)
    per = w[(w.method == "das") & (w.subspace_dim == 1) & (w.condition == FEEDBACK)]
    assert len(per) == n_rows and per["row"].is_unique  # every sample tested once, in its held-out fold
    full = w[(w.method == "full-interchange") & (w.condition == FEEDBACK)].set_index("row")
    swap = feedback_swap(model, batches, min_gap=0.0)
    swap = swap[swap.condition == "state"].set_index("row")
    partner_row = {
        int(r): int(q) for b in batches for r, q in zip(b.meta["row"], b.meta["row"].to_numpy()[b.partner.numpy()])
    }
    # base row j with its partner's state = the swap row of the partner, seen from the other label
    np.testing.assert_allclose(
        full["logit_diff"], [-swap.loc[partner_row[j], "logit_diff"] for j in full.index], atol=1e-10
    )
    folds = w.attrs["tables"]["das_folds"]
    assert {"probe_cosine", "probe_accuracy", "train_iia", "test_iia", "train_loss"} <= set(folds.columns)
    assert folds["probe_cosine"].between(0, 1 + 1e-9).all()
    assert folds.loc[folds.method == "random-rotation", "train_loss"].isna().all()
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    assert all(p.requires_grad for p in model.parameters())  # frozen only while a rotation trains


def test_rotations_trained_side_by_side_train_as_they_would_alone(model, data):
    b = data[1][0]
    step = FinalStep.build(model, b.tokens, parse_mode("recurrent:1"))
    acts = step.activation(FEEDBACK)
    half = torch.arange(b.n) % 3 != 0
    ex = Examples(step, acts, b.partner, b.target[b.partner], b.other[b.partner], torch.ones(b.n, dtype=torch.bool))
    jobs = [(half, 1, 5), (~half, 4, 6)]
    together = fit_rotations(ex, FEEDBACK, jobs, steps=8, lr=0.05)
    for (rows, k, seed), (rot, loss) in zip(jobs, together):
        alone, alone_loss = fit_rotation(dataclasses.replace(ex, rows=rows), FEEDBACK, k, steps=8, lr=0.05, seed=seed)
        # bigger batch, same per-row arithmetic: float64 agreement after 8 Adam steps
        torch.testing.assert_close(rot.R.detach(), alone.R.detach(), rtol=0, atol=1e-9)
        assert loss == pytest.approx(alone_loss, abs=1e-9)
