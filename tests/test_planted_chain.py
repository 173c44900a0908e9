"""The planted serial chain as a positive control over many positions, the token twin as the control
for an effect invented where the answer does not depend on the state.

Every expected number comes from numpy written here: the closed form LD = 2β r sqrt(8 / (1 + 2r²)),
r = (−1)^(Y+1) ρ^(n−1) (module doc of fbt_probe.reference.planted_chain), checked against a step
by step numpy recurrence of the fusion and against the model, never taken from the model. The chain
runs on general pairs and on pairs whose other cues hold an even number of ``yes``; the twin on the
latter (its answer is c_1, which there is the label, so its gap is +64 logits on every pair). Each
claim is a predicate (`finds_swap`, `swap_finds_none`, ...) asserted true on the model it is about
and false on that model's mutation: the chain with its fusion cut (W_U = 0), the twin given the
chain's state path. So the tests are shown to fail without the mechanism, and to fail when a
state path appears where the twin claims none. Every method has its row on both models: feedback
swap, state replacement, gate ablation, residual patching, the logit lens, attribution patching
(its first-order estimate from a numpy gradient of the chain), DAS, the probe direction and the SAE
feature swap; DAS and the probe are fitted, so their chain claims are thresholds (said where).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe.errors import FbtError
from fbt_probe.interventions.attribution import FUSION_HOOKS, exact_cells, traced_attribution
from fbt_probe.interventions.das_experiment import das
from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.metrics import summarize, to_long
from fbt_probe.interventions.pairs import pair_batches
from fbt_probe.interventions.probe_edits import probe_direction
from fbt_probe.modes import parse_mode
from fbt_probe.reference.planted_chain import chain_model, chain_pairs, token_twin

BETA, KAPPA, D = 8.0, 8.0, 8  # the planted weights (module doc)
M = 6  # cues per sample
T = M + 1
RHO = math.tanh(KAPPA / 2)
YES, NO, COLON = 1, 2, 0
FULL_CHAIN = ("full", f"recurrent:{M}", f"jacobi:{T}", f"jacobi:{T + 5}")  # modes whose chain reaches c_1
SHORT_CHAIN = (f"jacobi:{M}", f"recurrent:{M - 1}")  # one step short: c_1 never reaches the answer
ATOL = 1e-9


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def unit_rms(x: np.ndarray) -> np.ndarray:
    return x / math.sqrt(np.mean(x**2)) if np.any(x) else np.zeros_like(x)


# ----------------------------------------------------------------------------- the chain, in numpy
def embed(tok: int) -> np.ndarray:
    e = np.zeros(D)
    if tok == YES:
        e[[2, 5, 6]] = 1.0, 1.0, 1.0
    elif tok == NO:
        e[[0, 5, 6]] = 1.0, -1.0, 1.0
    return e


def w_u(cut: bool) -> np.ndarray:
    W = np.zeros((D, D))
    if not cut:
        W[0, [0, 1]] = W[3, [0, 1]] = 1.0  # E
        W[1, [2, 3]] = W[2, [2, 3]] = 1.0  # O
        W[4, [2, 3]], W[4, [0, 1]] = 1.0, -1.0  # O - E
    return W


def gate(tok: int) -> np.ndarray:
    c = embed(tok)[5]
    g = np.full(D, 0.5)
    g[[0, 2]] = sigmoid(-KAPPA * c)
    g[[1, 3]] = sigmoid(KAPPA * c)
    return g


def chain_n(mode: str) -> int:
    """How many cues the chain into the colon reaches under `mode` (module doc)."""
    mode = parse_mode(mode)
    if mode.kind == "standard":
        return 0
    if mode.kind == "full":
        return M
    return mode.k if mode.kind == "recurrent" else min(mode.k - 1, M)


def carried(ids, n: int, cut: bool = False) -> np.ndarray:
    """The post-norm state carried into the colon, by the recurrence: the cue n back plain, then fused."""
    s = unit_rms(embed(ids[T - 1 - n]))
    for t in range(T - n, T - 1):
        s = unit_rms(unit_rms((w_u(cut) @ s) * gate(ids[t])))
    return s


def ld_of_state(s: np.ndarray, cut: bool = False, g: np.ndarray | None = None) -> float:
    """LD at the colon fed state s (its gate 1/2 everywhere unless `g`)."""
    y = (w_u(cut) @ s) * (np.full(D, 0.5) if g is None else g)
    return 0.0 if not np.any(y) else 2 * BETA * y[4] / math.sqrt(np.mean(y**2))


def closed_form(ids, n: int) -> float:
    if n == 0:
        return 0.0
    y = sum(t == YES for t in ids[T - 1 - n : T - 1])
    r = (-1) ** (y + 1) * RHO ** (n - 1)
    return 2 * BETA * r * math.sqrt(8 / (1 + 2 * r * r))


def twin_form(ids, mode: str) -> float:
    """The twin's LD: q = the mean cue over the positions plain in `mode` (module doc)."""
    mode = parse_mode(mode)
    if mode.kind == "recurrent":
        n_plain = T - mode.k
    else:  # full and jacobi:K (K >= 2) fuse every position but the first; standard fuses none
        n_plain = 1 if mode.kind == "full" or (mode.kind == "jacobi" and mode.k >= 2) else T - 1
    cues = [1.0 if t == YES else -1.0 for t in ids[:n_plain]]
    q = sum(cues) / len(cues)
    return 2 * BETA * q * math.sqrt(8 / (1 + q * q))


def oriented(ld: float, label: int) -> float:
    return ld if label else -ld


# ----------------------------------------------------------------------------- fixtures, helpers
@pytest.fixture(scope="module")
def general():
    return chain_pairs(16, M, seed=0)


@pytest.fixture(scope="module")
def even():
    return chain_pairs(8, M, seed=1, rest_even=True)


def batches(df):
    return list(pair_batches(df, df.attrs["label_token_ids"], batch_size=64))


def logit_diffs(model, df, mode: str) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor(list(df["token_ids"])), mode=mode)[:, -1]
    return (logits[:, 4] - logits[:, 3]).numpy()


def ids_of(rows: pd.DataFrame, df: pd.DataFrame) -> list:
    """Each row's token ids (its `row` indexes the dataset frame)."""
    return [list(df["token_ids"].iloc[r]) for r in rows["row"]]


def expected_rows(rows: pd.DataFrame, df: pd.DataFrame, form) -> tuple[np.ndarray, np.ndarray]:
    """(clean, corrupt) oriented LD per row, from `form(token ids)` of the row's sample and of its
    partner's (the other sample of its pair)."""
    by_pair = {}
    for ids, label, pair in zip(df["token_ids"], df["label"], df["pair_id"]):
        by_pair.setdefault(pair, {})[label] = form(list(ids))
    clean = np.array([oriented(by_pair[p][lab], lab) for p, lab in zip(rows["pair_id"], rows["label"])])
    corrupt = np.array([oriented(by_pair[p][1 - lab], lab) for p, lab in zip(rows["pair_id"], rows["label"])])
    return clean, corrupt


def close(a, b) -> bool:
    return bool(np.allclose(np.asarray(a, dtype=float), b, atol=ATOL, rtol=0))


# the claims, each a predicate over an experiment's rows
def finds_swap(rows) -> bool:
    """Feedback swap: the state and the value carry the answer fully (1), the gate not at all (0)."""
    want = {"state": 1.0, "value": 1.0, "gate": 0.0}
    return not rows["tiny_gap"].any() and all(
        close(rows[rows["condition"] == c]["normalized"], w) for c, w in want.items()
    )


def swap_finds_none(rows) -> bool:
    """Feedback swap: no pair dropped, and no condition moves the partner's answer (0)."""
    return not rows["tiny_gap"].any() and close(rows["normalized"], 0.0)


def replacement_finds_none(rows) -> bool:
    """State replacement (noising): no pair dropped, and no replacement moves the answer (1)."""
    return not rows["tiny_gap"].any() and close(rows["normalized"], 1.0)


def gates_find_none(rows) -> bool:
    """Gate ablation: no pair dropped, no condition moves the answer, prefill and Soft decoding."""
    fed = rows[rows["decoding"] != "std"]
    return not rows["tiny_gap"].any() and close(fed["normalized"], 1.0)


def residual_cells(rows) -> set:
    """The (position, depth) cells whose denoising patch moves the answer at all."""
    den = rows[rows["direction"] == "denoising"]
    return {(p, d) for (p, d), r in den.groupby(["position", "depth"]) if not close(r["normalized"], 0.0)}


def residual_is_exact(rows, cells: set) -> bool:
    """Denoising 1 exactly at `cells` and 0 elsewhere, noising the reverse, no pair dropped."""
    at = np.array([(p, d) in cells for p, d in zip(rows["position"], rows["depth"])])
    den = (rows["direction"] == "denoising").to_numpy()
    return not rows["tiny_gap"].any() and close(rows["normalized"], np.where(at == den, 1.0, 0.0))


TOKEN_CELLS = {(0, 0), (T - 1, 1), (T - 1, 2)}  # the twin's path: c_1's input, the colon after attention
ALL_CELLS = {(p, d) for p in range(T) for d in range(3)}


# ----------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize(
    "mode", ["standard", "recurrent:1", "recurrent:3", "jacobi:2", "jacobi:4", *SHORT_CHAIN, *FULL_CHAIN]
)
def test_chain_closed_form_is_the_recurrence_and_the_models_answer(general, mode):
    n = chain_n(mode)
    ids = list(general["token_ids"])
    want = np.array([closed_form(i, n) for i in ids])
    if n:  # the closed form is the numpy recurrence of the fusion, sample by sample
        np.testing.assert_allclose([ld_of_state(carried(i, n)) for i in ids], want, atol=ATOL)
    np.testing.assert_allclose(logit_diffs(chain_model(), general, mode), want, atol=ATOL, err_msg=mode)
    pair_gap = np.abs(want[0::2] - want[1::2])
    if n == M:  # the chain reaches c_1: the model answers the parity, the answer word top-1
        assert (np.sign(want) == np.where(general["label"] == 1, 1, -1)).all() and pair_gap.min() > 50
        with torch.no_grad():
            top = chain_model()(torch.tensor(ids), mode=mode)[:, -1].argmax(-1).numpy()
        assert (top == np.where(general["label"] == 1, 4, 3)).all()
    else:  # one step short or less: both samples of every pair give the same LD
        assert pair_gap.max() < 1e-12


@pytest.mark.parametrize("mode", ["standard", "recurrent:1", "recurrent:3", "jacobi:2", *SHORT_CHAIN, *FULL_CHAIN])
def test_twin_answers_from_the_tokens_with_a_gap_on_every_pair(even, mode):
    want = np.array([twin_form(i, mode) for i in even["token_ids"]])
    np.testing.assert_allclose(logit_diffs(token_twin(), even, mode), want, atol=ATOL, err_msg=mode)
    assert (want[0::2] - want[1::2]).min() > 1.0  # label-1 sample first: a positive gap on every pair
    if mode in FULL_CHAIN:  # only c_1 is plain: q = c_1, the label, ±32
        np.testing.assert_allclose(want, np.where(even["label"] == 1, 32.0, -32.0), atol=ATOL)


# ----------------------------------------------------------------------------- feedback swap
@pytest.mark.parametrize("mode", FULL_CHAIN)
def test_feedback_swap_finds_the_chain_and_nothing_in_the_twin(general, even, mode):
    for df in (general, even):
        rows = feedback_swap(chain_model(), batches(df), parse_mode(mode))
        clean, corrupt = expected_rows(rows, df, lambda ids: closed_form(ids, M))
        np.testing.assert_allclose(rows["clean_logit_diff"], clean, atol=ATOL)
        np.testing.assert_allclose(rows["corrupt_logit_diff"], corrupt, atol=ATOL)
        assert finds_swap(rows)
    rows = feedback_swap(token_twin(), batches(even), parse_mode(mode))
    clean, corrupt = expected_rows(rows, even, lambda ids: twin_form(ids, mode))
    np.testing.assert_allclose(rows["clean_logit_diff"], clean, atol=ATOL)
    np.testing.assert_allclose(rows["corrupt_logit_diff"], corrupt, atol=ATOL)
    assert swap_finds_none(rows) and not finds_swap(rows)


@pytest.mark.parametrize("mode", SHORT_CHAIN)
def test_feedback_swap_one_step_short_sees_no_pair_in_the_chain(even, mode):
    rows = feedback_swap(chain_model(), batches(even), parse_mode(mode))
    assert rows["tiny_gap"].all()  # c_1 never reaches the answer: every pair has LD clean = corrupt
    assert swap_finds_none(feedback_swap(token_twin(), batches(even), parse_mode(mode)))


def test_summaries_keep_every_pair_and_report_one_and_zero(even):
    for model, want in ((chain_model(), 1.0), (token_twin(), 0.0)):
        rows = feedback_swap(model, batches(even), parse_mode("full"))
        summ = summarize(to_long(rows), n_boot=50)
        norm = summ[(summ["metric"] == "normalized") & (summ["length_knob"] == -1)].set_index("condition")
        assert (norm["n_excluded"] == 0).all() and (norm["n_pairs"] == len(even) // 2).all()
        assert (norm["gap_low"] > 50).all()  # the mean gap's interval lies far above min_gap: a value, not NaN
        for condition, w in (("state", want), ("value", want), ("gate", 0.0)):
            got = norm.loc[condition, ["mean", "ci_low", "ci_high"]].to_numpy(dtype=float)
            np.testing.assert_allclose(got, w, atol=1e-9, err_msg=condition)


# ----------------------------------------------------------------------------- state replacement
def test_state_replacement_gives_the_closed_form_in_the_chain_and_moves_nothing_in_the_twin(even):
    rows = state_replacement(chain_model(), batches(even), parse_mode("full"))
    clean, corrupt = expected_rows(rows, even, lambda ids: closed_form(ids, M))
    states = np.array([carried(ids, M) for ids in ids_of(rows[rows["condition"] == "none"], even)])
    expected = {
        "none": clean,
        "zero": np.zeros(len(rows)),  # W_U 0 = 0: the colon's input collapses to 0
        "mean": np.array([oriented(ld_of_state(states.mean(0)), lab) for lab in rows["label"]]),
        "nonpartner": corrupt,  # the colon's LD is a function of r, and a donor of the other label has the partner's r
    }
    assert not rows["tiny_gap"].any()
    for condition, want in expected.items():
        sel = (rows["condition"] == condition).to_numpy()
        np.testing.assert_allclose(rows["logit_diff"][sel], want[sel], atol=ATOL, err_msg=condition)
    assert not replacement_finds_none(rows)
    twin = state_replacement(token_twin(), batches(even), parse_mode("full"))
    clean, _ = expected_rows(twin, even, lambda ids: twin_form(ids, "full"))
    np.testing.assert_allclose(twin["logit_diff"], clean, atol=ATOL)  # random included: W_U = 0 reads nothing
    assert replacement_finds_none(twin)


# ----------------------------------------------------------------------------- gate ablation
def test_gate_ablation_takes_the_chains_readout_and_moves_nothing_in_the_twin(even):
    rows = gate_ablation(chain_model(), batches(even), parse_mode("full"))
    prefill = rows[rows["decoding"] == "prefill"]
    assert len(prefill) == 5 * len(even) and not prefill["tiny_gap"].any()
    clean, _ = expected_rows(prefill, even, lambda ids: closed_form(ids, M))
    # the mean gate over every token of the data (yes, no and the colon), independent of the model
    toks = np.concatenate(list(even["token_ids"]))
    mean_gate = np.mean([gate(t) for t in toks], axis=0)
    mean_ld = np.array(
        [
            oriented(ld_of_state(carried(ids, M), g=mean_gate), lab)
            for ids, lab in zip(ids_of(prefill, even), prefill["label"])
        ]
    )
    want = {"none": clean, "ones": clean, "mean": mean_ld, "zero": 0 * clean, "bypass": 0 * clean}
    for condition, w in want.items():
        sel = (prefill["condition"] == condition).to_numpy()
        np.testing.assert_allclose(prefill["logit_diff"][sel], w[sel], atol=ATOL, err_msg=condition)
    soft = rows[rows["decoding"].isin(["soft", "std"])]
    assert soft["tiny_gap"].all()  # Soft decoding is recurrent:1, Std standard: the chain never reaches c_1
    assert not gates_find_none(rows)
    twin = gate_ablation(token_twin(), batches(even), parse_mode("full"))
    assert gates_find_none(twin)  # bypass too: the colon's plain input is the zero embedding, as the cut fused one


# ----------------------------------------------------------------------------- residual patching
def test_residual_patching_finds_every_chain_cell_and_only_the_twins_token_path(even):
    chain = residual_patching(chain_model(), batches(even), parse_mode("full"))
    assert set(chain["position"]) == set(range(T)) and set(chain["depth"]) == {0, 1, 2}
    assert residual_is_exact(chain, ALL_CELLS)  # the pair's difference is carried through every position
    for mode in ("full", "standard"):
        twin = residual_patching(token_twin(), batches(even), parse_mode(mode))
        assert residual_is_exact(twin, TOKEN_CELLS), mode
        assert residual_cells(twin) == TOKEN_CELLS  # positions 1..T-2 (the chain's cells) move nothing


# ----------------------------------------------------------------------------- the mutations
def test_the_chain_claims_fail_with_the_chain_cut(even):
    cut = chain_model(cut=True)
    np.testing.assert_allclose(logit_diffs(cut, even, "full"), 0.0, atol=1e-12)
    swap = feedback_swap(cut, batches(even), parse_mode("full"))
    assert swap["tiny_gap"].all() and not finds_swap(swap)
    res = residual_patching(cut, batches(even), parse_mode("full"))
    assert not residual_is_exact(res, ALL_CELLS) and res["tiny_gap"].all()


def test_the_twin_claims_fail_once_the_twin_has_a_state_path(even):
    leaky = token_twin(state_path=True)
    mode = parse_mode("full")
    swap = feedback_swap(leaky, batches(even), mode)
    assert not swap["tiny_gap"].any() and not swap_finds_none(swap)
    assert swap[swap["condition"] == "state"]["normalized"].min() > 0.1  # the state now carries part of the answer
    assert not replacement_finds_none(state_replacement(leaky, batches(even), mode))
    assert not gates_find_none(gate_ablation(leaky, batches(even), mode))
    res = residual_patching(leaky, batches(even), mode)
    assert not residual_is_exact(res, TOKEN_CELLS) and residual_cells(res) > TOKEN_CELLS  # the chain's cells move


def test_logit_lens_reads_the_chain_at_every_depth_and_the_twin_only_after_attention(even):
    from fbt_probe.lens.sweep import LensConfig, run_lens

    for model, form in ((chain_model(), lambda ids: closed_form(ids, M)), (token_twin(), None)):
        res = run_lens(model, even, LensConfig(modes=("full",), steps=0, n_boot=10))
        ld = res.rows[(res.rows["metric"] == "logit_diff") & (res.rows["lens"] == "logit")]
        assert set(ld["depth"]) == {0, 1, 2}
        for depth in (0, 1, 2):
            r = ld[ld["depth"] == depth]
            if form is not None:  # no block writes: every depth of the colon holds the fused input
                want = [oriented(form(ids), lab) for ids, lab in zip(ids_of(r, even), r["label"])]
            else:  # the twin's colon input is 0; attention writes c_1 (the label here) at depth 1
                want = np.zeros(len(r)) if depth == 0 else np.full(len(r), 32.0)
            np.testing.assert_allclose(r["value"], want, atol=ATOL, err_msg=f"depth {depth}")


# ----------------------------------------------------------------------------- attribution patching
FEEDBACK = "fusion.hook_feedback"


def state_into(ids, t: int) -> np.ndarray:
    """The post-norm state fed into position t (1 <= t <= T-1) under ``full``: c_1 plain, then fused."""
    s = unit_rms(embed(ids[0]))
    for u in range(1, t):
        s = unit_rms(unit_rms((w_u(False) @ s) * gate(ids[u])))
    return s


def ld_from(ids, t: int, s: np.ndarray) -> float:
    """LD at the colon when state s is fed into position t and the chain runs on from there."""
    for u in range(t, T - 1):
        s = unit_rms(unit_rms((w_u(False) @ s) * gate(ids[u])))
    return ld_of_state(s)


def grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences (float64): the gradient AtP takes, computed without the model."""
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(len(x))])


def atp_expected(rows: pd.DataFrame, df: pd.DataFrame) -> np.ndarray:
    """Denoising AtP at the carried state (row i's state into p(i)'s run), LD oriented to row i's label:
    F(a_p) + ∇F(a_p)·(a_i − a_p), F = the chain from position t on (the same tokens in both runs)."""
    partner = {}
    for ids, pair, label in zip(df["token_ids"], df["pair_id"], df["label"]):
        partner[(pair, 1 - label)] = list(ids)
    out = []
    for ids, pair, label, t in zip(ids_of(rows, df), rows["pair_id"], rows["label"], rows["position"]):
        other = partner[(pair, label)]
        a_i, a_p = state_into(ids, t), state_into(other, t)
        f = lambda s: ld_from(other, t, s)  # noqa: E731
        out.append(oriented(f(a_p) + grad(f, a_p) @ (a_i - a_p), label))
    return np.array(out)


def atp_finds_state(rows) -> bool:
    """AtP: no pair dropped; the state, the value and the fusion output attribute at every fused
    position (|normalized| > 0.1), the gate (the same token in both runs) exactly 0."""
    fused = rows[rows["hook"].isin(FUSION_HOOKS)]
    gate_rows = fused["hook"] == "fusion.hook_gate"
    return (
        not rows["tiny_gap"].any()
        and set(fused["position"]) == set(range(1, T))
        and bool((fused[~gate_rows]["normalized"].abs() > 0.1).all())
        and close(fused[gate_rows]["normalized"], 0.0)
    )


def atp_finds_none(rows) -> bool:
    """AtP: no pair dropped, and every fusion cell's estimate is the corrupt LD (normalized 0)."""
    fused = rows[rows["hook"].isin(FUSION_HOOKS)]
    return (
        not rows["tiny_gap"].any()
        and len(fused) > 0
        and close(fused["normalized"], 0.0)
        and close(fused["logit_diff"], fused["corrupt_logit_diff"])
    )


def attribution(model, df):
    """AtP rows at the fusion hooks under ``full`` and exact patching of the carried state's cells."""
    mode = parse_mode("full")
    rows, traces = traced_attribution(model, batches(df), mode, 0.1, FUSION_HOOKS, None, ("denoising",), None)
    cells = [(FEEDBACK, 1, p) for p in range(1, T)]
    exact = pd.concat([exact_cells(model, b, tr, mode, cells, "denoising", s, 0.1) for b, tr, s in traces])
    return rows, exact


def test_attribution_gives_the_chains_first_order_closed_form_and_zero_in_the_twin(even):
    rows, exact = attribution(chain_model(), even)
    state = rows[rows["hook"] == FEEDBACK]
    assert len(state) == (T - 1) * len(even)
    np.testing.assert_allclose(state["logit_diff"], atp_expected(state, even), atol=1e-6)
    assert atp_finds_state(rows) and not atp_finds_none(rows)
    # exact patching of the same cells: the state is all a fused position keeps of c_1, so it moves the
    # answer fully (1); AtP's linearisation of the sign flip of r gets only part of the way
    assert not exact["tiny_gap"].any() and close(exact["normalized"], 1.0)
    assert state["normalized"].max() < 0.9
    twin, twin_exact = attribution(token_twin(), even)
    assert atp_finds_none(twin) and not atp_finds_state(twin)  # W_U = 0: no gradient reaches the state
    assert not twin_exact["tiny_gap"].any() and close(twin_exact["normalized"], 0.0)


# ----------------------------------------------------------------------------- DAS
def das_rows(model, df):
    return das(model, batches(df), parse_mode("full"), hooks=("fusion.hook_out",), ks=(1,), steps=50, n_folds=2)


def das_finds_readout(rows) -> bool:
    """DAS on the colon's fusion output: no pair dropped; the full interchange gives the partner's LD
    exactly (normalized 0: the colon's answer is a function of its fusion output alone); a trained
    one-dimensional subspace flips the answer on >= 90% of held-out pairs. No closed form for a trained
    rotation, but one exists (the readout coordinate 4: swapping it flips the sign of LD), so a
    working DAS reaches it; a broken one (no training, the wrong position or hook) stays at the
    random rotation's level, 0 here."""
    das_k1 = rows[(rows["method"] == "das") & (rows["subspace_dim"] == 1)]
    full = rows[rows["method"] == "full-interchange"]
    return (
        not rows["tiny_gap"].any()
        and close(full["iia_choice"], 1.0)
        and close(full["normalized"], 0.0)
        and das_k1["iia_choice"].mean() >= 0.9
    )


def das_finds_none(rows) -> bool:
    """DAS: no pair dropped, and no interchange (trained, random or full) moves the answer at all."""
    return not rows["tiny_gap"].any() and close(rows["iia_choice"], 0.0) and close(rows["normalized"], 1.0)


def test_das_finds_the_chains_readout_in_one_dimension_and_nothing_in_the_twin(even):
    chain = das_rows(chain_model(), even)
    assert das_finds_readout(chain) and not das_finds_none(chain)
    twin = das_rows(token_twin(), even)
    assert das_finds_none(twin) and not das_finds_readout(twin)


# ----------------------------------------------------------------------------- probe direction
def probe_rows(model, df):
    """Probe edits at depth 0 of the colon under ``full``: its fused input, what the carried state writes."""
    return probe_direction(model, batches(df), parse_mode("full"), depths=(0,), scales=(1.0, 2.0), n_folds=2)


def probe_moves_the_answer(rows) -> bool:
    """No pair dropped; the probe is right on every held-out sample (the chain's colon input takes one
    value per label, r = ±ρ^(M−1)); steering along it moves the answer toward the partner, further at
    the larger scale. No closed form (a fitted probe); a steer that is not applied gives exactly 1."""
    probe = rows[rows["condition"] == "probe"]
    steer = rows[rows["condition"] == "steer"].groupby("scale")["normalized"].max()
    return (
        not rows["tiny_gap"].any()
        and close(probe["probe_accuracy"], 1.0)
        and bool((steer < 0.9).all())
        and steer[2.0] < steer[1.0]
    )


def probe_moves_nothing(rows) -> bool:
    """No pair dropped, and no erasure or steer moves the answer (normalized 1)."""
    return not rows["tiny_gap"].any() and len(rows) > 0 and close(rows["normalized"], 1.0)


def test_probe_direction_moves_the_chains_answer_and_nothing_in_the_twin(even):
    chain = probe_rows(chain_model(), even)
    assert probe_moves_the_answer(chain) and not probe_moves_nothing(chain)
    twin = probe_rows(token_twin(), even)  # its colon input is 0 for every sample: nothing to read or move
    assert probe_moves_nothing(twin) and not probe_moves_the_answer(twin)


def carried_probe_rows(model, df):
    """Probe edits of the carried state fed to the colon (fusion.hook_feedback, depth -1) under ``full``."""
    rows = probe_direction(
        model, batches(df), parse_mode("full"), depths=(), scales=(1.0, 2.0), n_folds=2, feedback=True
    )
    assert set(rows["depth"]) == {-1}
    return rows


def decodable_but_unused(rows) -> bool:
    """The probe reads the label from the carried state on every held-out sample, and no erasure or
    steer of that state moves the answer (normalized 1), no pair dropped."""
    probe = rows[rows["condition"] == "probe"]
    return not rows["tiny_gap"].any() and close(probe["probe_accuracy"], 1.0) and close(rows["normalized"], 1.0)


def test_the_twins_carried_state_is_decodable_and_unused_the_chains_is_used(even):
    """The twin's top state, fed to the colon, holds c_1 (its attention output: position 0 is the
    only plain one under ``full``), which is the label on these pairs, but W_U = 0 reads none of it:
    decodable, not used. The chain's carried state is r, which the colon reads: steering moves it."""
    twin = carried_probe_rows(token_twin(), even)
    assert decodable_but_unused(twin) and not probe_moves_the_answer(twin)
    chain = carried_probe_rows(chain_model(), even)
    assert probe_moves_the_answer(chain) and not decodable_but_unused(chain)
    with pytest.raises(FbtError, match="feeds no state into the final position"):
        probe_direction(chain_model(), batches(even), parse_mode("standard"), depths=(0,), feedback=True)


# ----------------------------------------------------------------------------- SAE feature swap
def signed_sae():
    """A top-k SAE set by hand with one latent per sign of every coordinate (d_sae = 16, k = 16): it
    reconstructs any state exactly, so it fits the chain's carried state and the twin's alike."""
    from fbt_probe.sae.model import SAEConfig, SparseAutoencoder

    sae = SparseAutoencoder(SAEConfig(d_in=D, d_sae=2 * D, architecture="topk", k=2 * D, dtype="float64"))
    directions = torch.cat([torch.eye(D), -torch.eye(D)]).double()
    with torch.no_grad():
        sae.W_enc.copy_(directions.T)
        sae.W_dec.copy_(directions)
    return sae


def sae_rows(model, df, ks):
    from fbt_probe.sae.features import feature_tests

    rows = feature_tests(model, signed_sae(), df, FEEDBACK, parse_mode("full"), ks=ks, ablations=False)
    return rows[rows["experiment"] == "sae-feature-swap"]


def n_differing_latents(df) -> int:
    """The latents active in either state of a pair carried into the colon (numpy, one number for all
    pairs: E and O swap between the two samples, so coordinates 0..3 and both signs of 4 differ)."""

    def active(x):
        return {(j, sign) for j in range(D) for sign in (1, -1) if sign * x[j] > 1e-12}

    ns = {
        len(set.union(*(active(carried(list(ids), M)) for ids in pair["token_ids"])))
        for _, pair in df.groupby("pair_id")
    }
    assert len(ns) == 1
    return ns.pop()


def sae_swap_finds_state(rows, k: int) -> bool:
    """No pair dropped; swapping the whole state, every latent, or the k latents that differ gives
    the clean answer exactly (normalized 1)."""
    full = rows[
        rows["condition"].isin(["state", "all"]) | ((rows["condition"] == "features") & (rows["subspace_dim"] == k))
    ]
    return (
        not rows["tiny_gap"].any()
        and len(full) == 3 * len(rows[rows["condition"] == "state"])
        and close(full["normalized"], 1.0)
    )


def sae_swap_finds_none(rows) -> bool:
    """No pair dropped, and no swap moves the partner's answer (normalized 0)."""
    return not rows["tiny_gap"].any() and len(rows) > 0 and close(rows["normalized"], 0.0)


def test_sae_feature_swap_restores_the_chains_answer_with_the_differing_latents_and_nothing_in_the_twin(even):
    k = n_differing_latents(even)
    assert k == 6
    chain = sae_rows(chain_model(), even, ks=(1, k))
    assert sae_swap_finds_state(chain, k) and not sae_swap_finds_none(chain)
    twin = sae_rows(token_twin(), even, ks=(1, k))
    assert sae_swap_finds_none(twin) and not sae_swap_finds_state(twin, k)


# ----------------------------------------------------------------------------- the mutations, every method
def test_every_methods_chain_claim_fails_with_the_chain_cut(even):
    cut = chain_model(cut=True)
    assert not atp_finds_state(attribution(cut, even)[0])
    assert not das_finds_readout(das_rows(cut, even))
    assert not probe_moves_the_answer(probe_rows(cut, even))
    assert not probe_moves_the_answer(carried_probe_rows(cut, even))
    assert not sae_swap_finds_state(sae_rows(cut, even, ks=(1, 6)), 6)


def test_every_methods_twin_claim_fails_once_the_twin_has_a_state_path(even):
    leaky = token_twin(state_path=True)
    assert not atp_finds_none(attribution(leaky, even)[0])
    assert not das_finds_none(das_rows(leaky, even))
    assert not probe_moves_nothing(probe_rows(leaky, even))
    assert not decodable_but_unused(carried_probe_rows(leaky, even))
    assert not sae_swap_finds_none(sae_rows(leaky, even, ks=(1, 6)))
