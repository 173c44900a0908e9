"""The planted model as the toolkit's positive control, its cut twin as the negative one.

Every expected number comes from an independent float64 closed form written here in numpy (the
state carried into the final position, then LD = 2β v[2] / rms(v) with v = W_U s), never from
the model. Each experiment runs on both models with the same assertions: on the planted model the
closed form gives the known effect (swap 1, zero state (0 − corrupt)/(clean − corrupt), residual
patching 1 exactly at the carried-state cells, ...); on the twin (W_U = 0, the planted mechanism
removed) the closed form gives LD = 0 for every sample and every edit, so the planted values
cannot be met there: the twin rows are the check that each test fails without the mechanism.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fbt_probe.interventions.attribution import traced_attribution
from fbt_probe.interventions.das_experiment import das
from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.pairs import pair_batches
from fbt_probe.lens.sweep import LensConfig, run_lens
from fbt_probe.modes import parse_mode
from fbt_probe.reference.planted import planted_model, planted_pairs

BETA, TAU, KAPPA, D = 8.0, 0.5, 8.0, 8  # the planted weights (module doc of fbt_probe.reference.planted)
FEEDING = ("recurrent:1", "jacobi:2", "jacobi:3", "full")
N_PAIRS, N_FILL = 8, 6  # T = 8: fillers, cue, colon; T-3 is a filler at a fused position under `full`
ATOL = 1e-9


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def w_u(cut: bool) -> np.ndarray:
    W = np.zeros((D, D))
    if not cut:
        W[0, 0] = W[1, 0] = 1.0
        W[2, 0], W[2, 1] = -TAU, 1.0
    return W


def unit_rms(x: np.ndarray) -> np.ndarray:
    return x / math.sqrt(np.mean(x**2)) if np.any(x) else np.zeros_like(x)


def carried(label: int, mode: str, cut: bool) -> np.ndarray:
    """The post-norm state carried into the final position (from the cue's position T-2)."""
    sign = 1.0 if label else -1.0
    if mode in ("recurrent:1", "jacobi:2"):  # T-2 is a plain position: the state is the cue's embedding, normed
        return unit_rms(np.array([1.0, sign, 0, 0, 0, 0, 0, 0]))
    # T-2 fused: value W_U s_{T-3} (s_{T-3}: a fused filler under full, r = 1; a plain filler in pass 1
    # of jacobi:3, r = 0), gate 0.5 except σ(±κ) on the cue coordinate
    prev = np.array([1.0, 1.0 if mode == "full" else 0.0, 0, 0, 0, 0, 0, 0])
    gate = np.full(D, 0.5)
    gate[1] = sigmoid(sign * KAPPA)
    return unit_rms(unit_rms((w_u(cut) @ unit_rms(prev)) * gate))


def ld_of_state(s: np.ndarray, cut: bool) -> float:
    """LD = logit(one) − logit(zero) at the final position fed state s (gate 0.5 at the colon)."""
    v = w_u(cut) @ s
    return 0.0 if not np.any(v) else 2 * BETA * v[2] / math.sqrt(np.mean(v**2))


def oriented(ld: float, label: int) -> float:
    return ld if label else -ld


def expected_pair(mode: str, cut: bool) -> tuple[float, float]:
    """(LD of the label-1 sample, LD of the label-0 sample), unoriented."""
    return tuple(ld_of_state(carried(label, mode, cut), cut) for label in (1, 0))


@pytest.fixture(scope="module")
def data():
    return planted_pairs(N_PAIRS, N_FILL, seed=0)


@pytest.fixture(scope="module", params=[False, True], ids=["planted", "twin"])
def model(request):
    return planted_model(cut=request.param), request.param


def batches(df):
    return list(pair_batches(df, df.attrs["label_token_ids"], batch_size=64))


def expected_rows(rows: pd.DataFrame, mode: str, cut: bool) -> tuple[np.ndarray, np.ndarray]:
    """(clean, corrupt) oriented LD per row from the closed form."""
    ld1, ld0 = expected_pair(mode, cut)
    own = np.where(rows["label"] == 1, ld1, -ld0)
    partner = np.where(rows["label"] == 1, ld0, -ld1)
    return own, partner


def test_closed_form_is_the_models_answer_in_every_mode(model, data):
    m, cut = model
    import torch

    tokens = torch.tensor(list(data["token_ids"]))
    with torch.no_grad():
        std = m(tokens, mode="standard")[:, -1]
    assert np.abs((std[:, 4] - std[:, 3]).numpy()).max() < 1e-12  # standard sees only the colon
    for mode in (*FEEDING, "recurrent:3", "jacobi:5"):
        ref_mode = {"recurrent:3": "full", "jacobi:5": "full"}.get(mode, mode)  # T-2 fused, after a fused filler
        with torch.no_grad():
            logits = m(tokens, mode=mode)[:, -1]
        ld = (logits[:, 4] - logits[:, 3]).numpy()
        ld1, ld0 = expected_pair(ref_mode, cut)
        np.testing.assert_allclose(ld, np.where(data["label"] == 1, ld1, ld0), atol=ATOL, err_msg=mode)
        if not cut:  # the answer word is the top-1 token: the model answers the task in every feeding mode
            assert (logits.argmax(-1).numpy() == np.where(data["label"] == 1, 4, 3)).all()
    assert (expected_pair("full", cut) == (0.0, 0.0)) == cut


@pytest.mark.parametrize("mode", FEEDING)
def test_feedback_swap_moves_the_answer_fully_and_the_gate_not_at_all(model, data, mode):
    m, cut = model
    rows = feedback_swap(m, batches(data), parse_mode(mode))
    clean, corrupt = expected_rows(rows, mode, cut)
    np.testing.assert_allclose(rows["clean_logit_diff"], clean, atol=ATOL)
    np.testing.assert_allclose(rows["corrupt_logit_diff"], corrupt, atol=ATOL)
    for condition, planted_effect in (("state", 1.0), ("value", 1.0), ("gate", 0.0)):
        r = rows[rows["condition"] == condition]
        if cut:  # nothing to move: clean = corrupt = patched = 0, every pair a tiny gap
            assert r["tiny_gap"].all() and np.abs(r["logit_diff"]).max() < 1e-12
        else:
            assert not r["tiny_gap"].any()
            np.testing.assert_allclose(r["normalized"], planted_effect, atol=ATOL, err_msg=condition)


@pytest.mark.parametrize("mode", FEEDING)
def test_state_replacement_gives_the_closed_form_of_each_replacement(model, data, mode):
    m, cut = model
    rows = state_replacement(m, batches(data), parse_mode(mode))
    clean, corrupt = expected_rows(rows, mode, cut)
    states = {label: carried(label, mode, cut) for label in (0, 1)}
    mean_state = (states[0] + states[1]) / 2  # equal numbers of each label
    expected = {
        "none": clean,
        "zero": np.zeros(len(rows)),  # W_U 0 = 0: the fused input collapses to 0
        "mean": np.array([oriented(ld_of_state(mean_state, cut), lab) for lab in rows["label"]]),
        "nonpartner": corrupt,  # another pair's opposite-label state is the partner's state
    }
    for condition, want in expected.items():
        sel = (rows["condition"] == condition).to_numpy()
        np.testing.assert_allclose(rows["logit_diff"][sel], want[sel], atol=ATOL, err_msg=condition)
        if not cut:
            norm = (want[sel] - corrupt[sel]) / (clean[sel] - corrupt[sel])
            np.testing.assert_allclose(rows["normalized"][sel], norm, atol=ATOL, err_msg=condition)
    assert cut == bool(rows["tiny_gap"].all())
    if not cut:  # the planted effects are far from "no effect" (normalized 1)
        r = rows.groupby("condition")["normalized"].mean()
        assert r["nonpartner"] < 1e-9 and r["zero"] < 0.7 and abs(r["none"] - 1) < 1e-12


def test_gate_ablation_moves_only_what_removes_the_value(model, data):
    m, cut = model
    rows = gate_ablation(m, batches(data), parse_mode("recurrent:1"))
    clean, corrupt = expected_rows(rows, "recurrent:1", cut)
    # the mean gate over every position is 0.5 (σ(κ) + σ(-κ) = 1 over a pair's cues, 0.5 elsewhere):
    # the colon's own gate, so no effect; ones rescales the value (the norm removes it); zero and
    # bypass (the colon's plain embedding, readout 0) give LD 0
    want = {"none": clean, "mean": clean, "ones": clean, "zero": 0 * clean, "bypass": 0 * clean}
    for decoding in ("prefill", "soft"):
        for condition, w in want.items():
            sel = ((rows["condition"] == condition) & (rows["decoding"] == decoding)).to_numpy()
            assert sel.sum() == 2 * N_PAIRS
            np.testing.assert_allclose(rows["logit_diff"][sel], w[sel], atol=ATOL, err_msg=f"{decoding} {condition}")
    std = rows[rows["decoding"] == "std"]
    assert std["tiny_gap"].all() and np.abs(std["logit_diff"]).max() < 1e-12  # no feedback, no answer


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "full"])
def test_residual_patching_finds_exactly_the_carried_state_cells(model, data, mode):
    m, cut = model
    rows = residual_patching(m, batches(data), parse_mode(mode))
    T = N_FILL + 2
    assert set(rows["position"]) == set(range(T)) and set(rows["depth"]) == {0, 1, 2}
    if cut or mode == "standard":  # no path from the cue to the answer: nothing moves anywhere
        assert rows["tiny_gap"].all() and np.abs(rows["logit_diff"]).max() < 1e-12
        return
    clean, corrupt = expected_rows(rows, mode, cut)
    carried_cells = rows["position"] >= T - 2  # the cue's position (its state is carried) and the final one
    den = rows["direction"] == "denoising"
    want = np.where(carried_cells == den, 1.0, 0.0)  # denoising: 1 there, 0 elsewhere; noising the reverse
    np.testing.assert_allclose(rows["normalized"], want, atol=ATOL)
    np.testing.assert_allclose(rows["logit_diff"][den & carried_cells], clean[den & carried_cells], atol=ATOL)


def _grad_ld(v: np.ndarray) -> np.ndarray:
    """∂/∂v of 2β v[2] / rms(v)."""
    r = math.sqrt(np.mean(v**2))
    g = -2 * BETA * v[2] * v / (D * r**3)
    g[2] += 2 * BETA / r
    return g


def test_attribution_is_the_first_order_closed_form_at_the_value_and_zero_elsewhere(model, data):
    m, cut = model
    mode = parse_mode("recurrent:1")
    rows, _ = traced_attribution(m, batches(data), mode, 0.1, None, None, ("denoising",), None, keep=False)
    T = N_FILL + 2
    early = rows["position"] < T - 2
    # cells before the cue: both samples hold the same activation there, so the estimate is the corrupt LD
    np.testing.assert_allclose(rows["logit_diff"][early], rows["corrupt_logit_diff"][early], atol=ATOL)
    cell = rows[(rows["hook"] == "fusion.hook_value") & (rows["position"] == T - 1)]
    assert len(cell) == 2 * N_PAIRS
    if cut:
        assert np.abs(rows["logit_diff"]).max() < 1e-12
        return
    vs = {label: w_u(False) @ carried(label, "recurrent:1", False) for label in (0, 1)}
    for label, est in zip(cell["label"], cell["logit_diff"]):
        sign = 1.0 if label else -1.0  # LD oriented to the row's label; the partner runs with the row's value
        base, src = vs[1 - label], vs[label]
        f = sign * 2 * BETA * base[2] / math.sqrt(np.mean(base**2))
        assert abs(est - (f + sign * (src - base) @ _grad_ld(base))) < ATOL
    gate = rows[rows["hook"] == "fusion.hook_gate"]
    np.testing.assert_allclose(gate["logit_diff"], gate["corrupt_logit_diff"], atol=ATOL)  # same final token


def test_das_on_the_fusion_output_finds_the_readout_in_one_dimension(model, data):
    m, cut = model
    df = planted_pairs(16, N_FILL, seed=1)
    rows = das(m, batches(df), parse_mode("recurrent:1"), hooks=("fusion.hook_out",), ks=(1,), steps=150, n_folds=4)
    got = rows.groupby("method")["iia_choice"].mean()
    if cut:  # the interchange cannot move an answer that is LD 0 for every sample
        assert np.abs(rows["logit_diff"]).max() < 1e-12 and got.max() == 0.0
    else:
        assert got["das"] == 1.0 and got["full-interchange"] == 1.0


def test_logit_lens_reads_the_answer_at_every_depth_only_under_feedback(model, data):
    m, cut = model
    res = run_lens(m, data, LensConfig(modes=("standard", "recurrent:1", "full"), steps=0, n_boot=10))
    ld = res.rows[(res.rows["metric"] == "logit_diff") & (res.rows["lens"] == "logit")]
    assert set(ld["depth"]) == {0, 1, 2}
    for mode in ("standard", "recurrent:1", "full"):
        r = ld[ld["mode"] == mode]
        want = 0.0 if mode == "standard" else None
        if want is None:  # no block writes: every depth of the final position holds the fused input
            ld1, ld0 = expected_pair(mode, cut)
            want = np.where(r["label"] == 1, ld1, -ld0)
        np.testing.assert_allclose(r["value"], np.broadcast_to(want, r["value"].shape), atol=ATOL, err_msg=mode)


def hand_sae():
    """A top-k SAE (k = d_sae = 3) on the carried state, set by hand: a bias latent and one latent per
    cue sign (`yes` reads +s[1], `no` reads -s[1]); it reconstructs every plain carried state exactly."""
    import torch

    from fbt_probe.sae.model import SAEConfig, SparseAutoencoder

    sae = SparseAutoencoder(SAEConfig(d_in=D, d_sae=3, architecture="topk", k=3, dtype="float64"))
    directions = torch.zeros(3, D, dtype=torch.float64)
    directions[0, 0], directions[1, 1], directions[2, 1] = 1.0, 1.0, -1.0
    with torch.no_grad():
        sae.W_enc.copy_(directions.T)
        sae.W_dec.copy_(directions)
    return sae


@pytest.mark.parametrize("mode", ["recurrent:1", "jacobi:2"])
def test_sae_feature_swap_gives_the_closed_form_per_number_of_latents(model, data, mode):
    from fbt_probe.sae.features import feature_tests

    m, cut = model
    rows = feature_tests(m, hand_sae(), data, "fusion.hook_feedback", parse_mode(mode), ks=(1, 2))
    rows = rows[rows["experiment"] == "sae-feature-swap"]
    clean, corrupt = expected_rows(rows, mode, cut)
    # one cue latent swapped (either, by symmetry) leaves the state at (2, 0, ...): r = 0
    half = np.array([oriented(ld_of_state(np.array([2.0, 0, 0, 0, 0, 0, 0, 0]), cut), lab) for lab in rows["label"]])
    expected = {("state", -1): clean, ("all", 3): clean, ("features", 2): clean, ("features", 1): half}
    for (condition, k), want in expected.items():
        sel = ((rows["condition"] == condition) & (rows["subspace_dim"] == k)).to_numpy()
        assert sel.sum() == 2 * N_PAIRS
        np.testing.assert_allclose(rows["logit_diff"][sel], want[sel], atol=ATOL, err_msg=f"{condition} k={k}")
    if cut:
        assert rows["tiny_gap"].all() and np.abs(rows["logit_diff"]).max() < 1e-12
    else:
        two = rows[(rows["condition"] == "features") & (rows["subspace_dim"] == 2)]
        np.testing.assert_allclose(two["normalized"], 1.0, atol=ATOL)  # the two cue latents are the mechanism
