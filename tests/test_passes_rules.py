"""The general LM's rules (Fig. 3 per run, the 3 % claim over seeds, Fig. 4), each fed the table that
gives its verdict, the opposite table, and noise around its threshold or too few documents."""

from __future__ import annotations

import numpy as np
import pytest

from fbt_probe.reproduce import passes_rules as R

P, D = 40, 60


def curves(loss_fn, change_fn, noise=0.01, docs=D, seed=0):
    rng = np.random.default_rng(seed)
    k = np.arange(1, P + 1)[:, None]
    loss = loss_fn(k) + noise * rng.standard_normal((P, docs))
    change = np.abs(change_fn(k) * (1 + 0.1 * rng.standard_normal((P, docs))))
    change[0] = np.nan
    return loss, change


def contracting(seed=0):
    return curves(lambda k: 2.5 + 0 * k, lambda k: 0.5**k + 0.001, seed=seed)


def decaying(seed=0):  # still decaying at pass 32: no plateau yet
    return curves(lambda k: 2.5 + 0 * k, lambda k: 0.9**k, seed=seed)


def diverging(seed=0):
    return curves(lambda k: 2.5 + 0.2 * np.maximum(k - 3, 0), lambda k: 0.1 * 1.1**k, seed=seed)


def settling(seed=0):  # the state converges (its change decays) to a point where the loss is 1 nat higher
    return curves(lambda k: 2.5 + 1.0 * (1 - 0.8 ** (k - 1)), lambda k: 0.5**k + 0.001, seed=seed)


def test_fig3_run_names_a_contraction_a_plateau_and_its_opposite():
    assert R.fig3_run("a", R.fig3_numbers(*contracting())).verdict == "contracts to a plateau"
    assert R.fig3_run("a", R.fig3_numbers(*decaying())).verdict == "contracts, still decaying"
    v = R.fig3_run("a", R.fig3_numbers(*diverging()))
    assert v.verdict == "diverges" and "nats" in v.sentence and f"{D} held-out documents" in v.sentence
    # a fixed point with a worse loss is neither: the map converges, the paper's flat loss is not reached
    assert R.fig3_run("a", R.fig3_numbers(*settling())).verdict == R.SETTLES
    growing = curves(lambda k: 2.5 + 1.0 * (1 - 0.8 ** (k - 1)), lambda k: 0.1 * 1.1**k)  # the same loss, state grows
    assert R.fig3_run("a", R.fig3_numbers(*growing)).verdict == "diverges"


def test_fig3_run_cannot_say_on_noise_at_its_threshold_or_on_few_documents():
    rng = np.random.default_rng(1)
    loss = 2.5 + R.FLAT_LOSS * (np.arange(1, P + 1)[:, None] > 1) + 0.5 * rng.standard_normal((P, D))
    change = np.abs(0.5 + 0.4 * rng.standard_normal((P, D)))  # no decay: the ratio's interval holds DECAYED..1
    change[0] = np.nan
    change[R.TAIL[0] - 1 : R.TAIL[1]] *= 0.75
    assert R.fig3_run("noise", R.fig3_numbers(loss, change)).verdict == "cannot say"
    few = R.fig3_run("few", R.fig3_numbers(*curves(lambda k: 2.5 + 0 * k, lambda k: 0.5**k, docs=3)))
    assert few.verdict == "cannot say" and "too few" in few.sentence


def test_a_mutated_threshold_flips_fig3_run(monkeypatch):
    """The loss rise of a run that rises by 0.15 nats: a worse fixed point at FLAT_LOSS 0.1, stable at 0.3."""
    loss, change = curves(lambda k: 2.5 + 0.15 * (k > 1), lambda k: 0.5**k + 0.001, noise=0.005)
    assert R.fig3_run("r", R.fig3_numbers(loss, change)).verdict == R.SETTLES
    monkeypatch.setattr(R, "FLAT_LOSS", 0.3)
    assert R.fig3_run("r", R.fig3_numbers(loss, change)).verdict == "contracts to a plateau"


def _pair(a, b, seed):
    return R.fig3_run("75/22/3", R.fig3_numbers(*a(seed))), R.fig3_run("75/25", R.fig3_numbers(*b(seed)))


def test_three_pass_holds_only_on_every_seed():
    every = R.three_pass({s: _pair(contracting, diverging, s) for s in range(3)})
    assert every.verdict == "replicates on every seed"
    opposite = R.three_pass({s: _pair(diverging, contracting, s) for s in range(3)})
    assert opposite.verdict == "does not replicate on any seed"
    both = R.three_pass({s: _pair(contracting, contracting, s) for s in range(3)})  # no divergence to turn
    assert both.verdict == "does not replicate on any seed"
    mixed = R.three_pass({0: _pair(contracting, diverging, 0), 1: _pair(contracting, contracting, 1)})
    assert mixed.verdict == "replicates on 1 of 2 seeds" and "seed 1: 75/22/3 contracts" in mixed.sentence


def fig4_loss(drops, noise=0.01, docs=D, seed=0):
    rng = np.random.default_rng(seed)
    base = 3.0 - np.concatenate([[0.0], np.cumsum(drops)])
    return base[:, None] + noise * rng.standard_normal((len(base), docs))


def test_fig4_falls_front_loaded_and_the_opposites():
    front = {s: R.fig4_seed(fig4_loss([0.2, 0.02, 0.01, 0.01], seed=s)) for s in range(3)}
    assert R.fig4(front).verdict == "falls with passes, front-loaded on every seed"
    late = {s: R.fig4_seed(fig4_loss([0.02, 0.1, 0.1, 0.1], seed=s)) for s in range(3)}
    assert R.fig4(late).verdict == "falls with passes, not front-loaded on any seed"
    rises = {s: R.fig4_seed(fig4_loss([-0.1, -0.1, -0.1, -0.1], seed=s)) for s in range(3)}
    assert R.fig4(rises).verdict == "rises with passes on every seed"
    mixed = {0: front[0], 1: rises[1]}
    assert R.fig4(mixed).verdict == "falls with passes on 1 of 2 seeds and rises on 1"
    one = R.fig4({0: rises[0]})  # a verdict on one seed says so
    assert (
        one.verdict == "rises with passes on the one seed studied"
        and "loss at 0 passes minus at 4 -0.398 " in one.sentence
    )


def test_fig4_cannot_say_on_noise_or_few_documents():
    noise = {s: R.fig4_seed(fig4_loss([0.0, 0.0, 0.0, 0.0], noise=0.5, seed=s)) for s in range(3)}
    assert R.fig4(noise).verdict.startswith("cannot say")
    few = {0: R.fig4_seed(fig4_loss([0.2, 0.0, 0.0, 0.0], docs=4))}
    assert R.fig4(few).verdict == "cannot say"


def test_the_baseline_contrast_is_paired_per_document():
    loss = fig4_loss([0.1, 0, 0, 0], noise=0.0)
    out = R.fig4_seed(loss, base_loss=loss[0] - 0.05)
    assert out["vs_baseline"] == pytest.approx((0.05, 0.05, 0.05))
