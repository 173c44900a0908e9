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
state path appears where the twin claims none.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from fbt_probe.interventions.experiments import feedback_swap, gate_ablation, residual_patching, state_replacement
from fbt_probe.interventions.metrics import summarize, to_long
from fbt_probe.interventions.pairs import pair_batches
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
