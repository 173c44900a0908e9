"""Probe estimator, grouped splits, controls and the per-condition sweep (CPU / scikit-learn path)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.dummy import DummyClassifier
from sklearn.model_selection import GroupKFold, cross_val_score

from fbt_probe.errors import FbtError
from fbt_probe.probes import (
    GroupLeakError,
    LinearProbe,
    ProbeConfig,
    ProbeDirection,
    check_group_disjoint,
    control_labels,
    grouped_splits,
    majority_baseline,
    probe_condition,
    summarize,
)
from fbt_probe.probes.splits import TooFewGroupsError

CFG = ProbeConfig(backend="sklearn", n_jobs=1)


def planted(n_pairs=120, d=24, depths=3, strength=(0.0, 0.6, 3.0), seed=0, label_by_group=False):
    """Pairs of samples (one per label) sharing a group; depth p carries the label along a random
    unit direction with `strength[p]`."""
    rng = np.random.default_rng(seed)
    n = 2 * n_pairs
    groups = np.repeat([f"g{i}" for i in range(n_pairs)], 2)
    y = np.tile([0, 1], n_pairs)
    if label_by_group:  # label a function of the group (as completion's (R, C) pair)
        groups = np.array([f"g{i // 2}-{y[i]}" for i in range(n)])
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    X = rng.normal(size=(depths, n, d)).astype(np.float32)
    for p in range(depths):
        X[p] += strength[p] * np.outer(2 * y - 1, u).astype(np.float32)
    return X, y, groups


def accuracy(table, depth=None, metric="accuracy"):
    t = table[table.metric == metric]
    if depth is not None:
        t = t[t.depth == depth]
    return t.value.mean()


# ----------------------------------------------------------------------------- splits
@pytest.mark.parametrize("cv", ["group", "stratified-group"])
def test_every_split_keeps_groups_disjoint(cv):
    rng = np.random.default_rng(3)
    groups = rng.integers(0, 23, size=300).astype(str)  # uneven group sizes
    y = rng.integers(0, 2, size=300)
    splits = grouped_splits(y, groups, n_splits=5, cv=cv, seed=1)
    assert len(splits) == 5
    seen = np.concatenate([te for _, te in splits])
    assert sorted(seen) == list(range(300))  # every sample is held out exactly once
    for train, test in splits:
        assert not set(groups[train]) & set(groups[test])
        assert len(train) + len(test) == 300


def test_leaky_split_is_caught():
    groups = np.array(["a", "a", "b", "b", "c", "c"])
    leaky = [(np.array([0, 2, 4]), np.array([1, 3, 5]))]  # a random K-fold would do this
    with pytest.raises(GroupLeakError, match="both sides"):
        check_group_disjoint(leaky, groups)


def test_stratified_group_folds_bring_majority_baseline_to_half():
    X, y, groups = planted(n_pairs=100, label_by_group=True)
    plain = majority_baseline(y, grouped_splits(y, groups, cv="group"))
    strat = majority_baseline(y, grouped_splits(y, groups, cv="stratified-group", seed=0))
    assert abs(strat.mean() - 0.5) < 0.05
    assert plain.shape == (5,) and strat.shape == (5,)


def test_majority_baseline_matches_dummy_classifier():
    rng = np.random.default_rng(1)
    y = (rng.random(200) < 0.3).astype(int)
    groups = rng.integers(0, 40, 200).astype(str)
    splits = grouped_splits(y, groups)
    dummy = [
        DummyClassifier(strategy="most_frequent")
        .fit(np.zeros((len(tr), 1)), y[tr])
        .score(np.zeros((len(te), 1)), y[te])
        for tr, te in splits
    ]
    np.testing.assert_allclose(majority_baseline(y, splits), dummy)


def test_majority_baseline_sits_below_half_when_groups_fix_labels():
    # Label = function of the group and the folds are label-imbalanced: the training majority is the
    # test minority (the 0.367 of completion).
    y = np.array([1] * 20 + [0] * 30)
    groups = np.array([f"p{i}" for i in range(20)] + [f"n{i}" for i in range(30)])
    splits = [(np.r_[0:10, 20:30], np.r_[10:20, 30:50]), (np.r_[10:20, 30:50], np.r_[0:10, 20:30])]
    check_group_disjoint(splits, groups)
    np.testing.assert_allclose(majority_baseline(y, splits), [20 / 30, 10 / 20])
    # training side mostly label 1, held-out side all label 0: the baseline scores 0, far below 0.5
    assert majority_baseline(y, [(np.r_[0:20, 20:25], np.r_[25:50])])[0] == 0.0


def test_control_labels_move_whole_groups():
    X, y, groups = planted(n_pairs=100, label_by_group=True)
    ctrl = control_labels(y, groups, seed=0)
    for g in np.unique(groups):  # each group still has a single label...
        assert np.unique(ctrl[groups == g]).size == 1
    assert abs((ctrl != y).mean() - 0.5) < 0.15  # ...which is unrelated to its own
    assert abs(ctrl.mean() - 0.5) < 0.15
    np.testing.assert_array_equal(ctrl, control_labels(y, groups, seed=0))  # seeded
    assert not np.array_equal(ctrl, control_labels(y, groups, seed=1))


def test_control_labels_break_pairs_that_share_a_label_pattern():
    # Every pair lists label 0 then label 1: a permutation of groups alone would change nothing.
    X, y, groups = planted(n_pairs=100)
    ctrl = control_labels(y, groups, seed=0)
    pairs = ctrl.reshape(-1, 2)
    assert (pairs[:, 0] != pairs[:, 1]).all()  # the two samples of a pair still differ
    assert abs((ctrl != y).mean() - 0.5) < 0.15


def test_control_labels_with_unequal_group_sizes():
    y = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1])
    groups = np.array(["a", "b", "b", "c", "c", "c", "d", "d", "d"])
    ctrl = control_labels(y, groups, seed=2)
    assert ctrl.shape == y.shape and set(ctrl) <= {0, 1}
    for g in "bcd":  # within a group: its own or another same-size group's pattern, maybe flipped
        patterns = {tuple(y[groups == h]) for h in "bcd" if (groups == h).sum() == (groups == g).sum()}
        patterns |= {tuple(1 - np.array(p)) for p in patterns}
        assert tuple(ctrl[groups == g]) in patterns


# ----------------------------------------------------------------------------- estimator
def test_probe_follows_the_estimator_contract():
    X, y, groups = planted()
    probe = LinearProbe(C=0.5)
    assert probe.get_params() == {"C": 0.5, "max_iter": 1000, "tol": 1e-4, "standardize": True}
    assert not hasattr(probe, "coef_")
    assert probe.fit(X[2], y) is probe
    assert probe.coef_.shape == (1, X.shape[2]) and probe.n_features_in_ == X.shape[2]
    scores = cross_val_score(clone(probe), X[2], y, groups=groups, cv=GroupKFold(5))
    assert scores.min() > 0.95
    with pytest.raises(Exception, match="not fitted"):
        LinearProbe().predict(X[2])


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.SkipTestWarning")
def test_probe_passes_sklearn_estimator_checks():
    from sklearn.utils.estimator_checks import check_estimator

    check_estimator(LinearProbe())


def test_direction_reproduces_the_probe_in_raw_space():
    X, y, _ = planted()
    X = X[2].astype(np.float64) * np.linspace(0.5, 3, X.shape[2]) + 7.0  # unscaled, off-centre features
    probe = LinearProbe().fit(X, y)
    direction = probe.export(hook="blocks.0.hook_resid_pre", depth=0)
    np.testing.assert_allclose(direction.score(X), probe.decision_function(X), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(direction.predict(X), probe.predict(X))
    torch_score = direction.score(torch.tensor(X))
    np.testing.assert_allclose(torch_score.numpy(), probe.decision_function(X), rtol=1e-9, atol=1e-9)
    assert np.isclose(np.linalg.norm(direction.direction), 1.0)
    assert direction.meta == {"depth": 0} and direction.hook == "blocks.0.hook_resid_pre"


def test_direction_is_frozen_and_round_trips(tmp_path):
    X, y, _ = planted()
    direction = LinearProbe().fit(X[2], y).export(hook="h", task="memory")
    with pytest.raises(dataclasses.FrozenInstanceError):
        direction.bias = 0.0
    with pytest.raises(ValueError):
        direction.weights[0] = 1.0
    loaded = ProbeDirection.load(direction.save(tmp_path / "dir.safetensors"))
    np.testing.assert_array_equal(loaded.weights, direction.weights)
    np.testing.assert_array_equal(loaded.scale, direction.scale)
    assert loaded.bias == direction.bias and loaded.meta == {"task": "memory"} and loaded.classes == (0, 1)
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(FbtError, match="bad.safetensors"):
        ProbeDirection.load(tmp_path / "bad.safetensors")


# ----------------------------------------------------------------------------- sweep of one condition
def test_sweep_recovers_planted_direction_and_chance_on_shuffled_labels():
    X, y, groups = planted(n_pairs=150)
    table, flags = probe_condition(X, y, groups, CFG, key={"task": "t", "mode": "recurrent:1", "length": 8})
    assert accuracy(table, depth=2) > 0.95
    assert accuracy(table, depth=0) == pytest.approx(0.5, abs=0.08)  # no signal at depth 0
    assert accuracy(table, depth=2, metric="control_accuracy") == pytest.approx(0.5, abs=0.08)
    assert accuracy(table, depth=2, metric="selectivity") > 0.4
    shuffled = np.random.default_rng(5).permutation(y)
    table, _ = probe_condition(X, shuffled, groups, CFG)
    assert accuracy(table, depth=2) == pytest.approx(0.5, abs=0.08)
    assert flags == []


def test_sweep_table_is_tidy():
    X, y, groups = planted(n_pairs=40)
    table, _ = probe_condition(
        X,
        y,
        groups,
        CFG,
        depths=[0, 3, 5],
        hooks=["a", "b", "c"],
        key={"model": "m", "task": "t", "mode": "standard", "length": 8},
    )
    assert list(table.columns) == [
        "model",
        "task",
        "mode",
        "length",
        "depth",
        "hook",
        "fold",
        "metric",
        "value",
        "n_train",
        "n_test",
    ]
    assert len(table) == 3 * 4 * 5  # depths x folds x metrics
    assert not table.duplicated(["depth", "fold", "metric"]).any()
    assert set(table.metric) == {"accuracy", "train_accuracy", "majority_baseline", "control_accuracy", "selectivity"}
    summary = summarize(table)
    row = summary[(summary.depth == 5) & (summary.metric == "accuracy")].iloc[0]
    assert row.n_folds == 4 and row["min"] <= row["mean"] <= row["max"]


def test_depth0_standard_at_chance_is_not_flagged_and_violation_is():
    X, y, groups = planted(n_pairs=60)
    X[0] = X[0, :1]  # by construction: every sample has the same depth-0 vector under standard
    _, flags = probe_condition(X, y, groups, CFG, key={"mode": "standard"})
    assert flags == []
    X[0] = X[2]  # depth 0 carries the label: the construction is broken
    _, flags = probe_condition(X, y, groups, CFG, key={"mode": "standard", "task": "t", "length": 8})
    messages = " ".join(f["message"] for f in flags)
    assert "differ across samples" in messages and "not at chance" in messages
    _, flags = probe_condition(X, y, groups, CFG, key={"mode": "recurrent:1"})  # only standard is checked
    assert flags == []


def test_control_can_be_turned_off():
    X, y, groups = planted(n_pairs=30)
    table, _ = probe_condition(X, y, groups, dataclasses.replace(CFG, control=False))
    assert set(table.metric) == {"accuracy", "train_accuracy", "majority_baseline"}


# ----------------------------------------------------------------------------- bad input
def test_fewer_groups_than_folds_is_refused():
    X, y, groups = planted(n_pairs=3)
    with pytest.raises(TooFewGroupsError, match="3 groups, fewer than the 4 folds"):
        probe_condition(X, y, groups, CFG, key={"task": "memory", "mode": "standard", "length": 0})
    with pytest.raises(FbtError, match="needs at least 2"):
        grouped_splits(y, groups, n_splits=1)


def test_single_class_cell_is_refused():
    X, y, groups = planted(n_pairs=20)
    with pytest.raises(FbtError, match="single-class cell"):
        probe_condition(X, np.zeros_like(y), groups, CFG)


def test_single_class_training_fold_is_refused():
    y = np.array([1] * 6 + [0] * 2)
    groups = np.array(list("aabbccdd"))
    with pytest.raises(FbtError, match="training side holds a single class"):
        grouped_splits(y, groups, n_splits=4)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_activations_are_refused(bad):
    X, y, groups = planted(n_pairs=20)
    X[1, 3, 2] = bad
    with pytest.raises(FbtError, match="NaN/inf activations at depth 1"):
        probe_condition(X, y, groups, CFG, hooks=["h0", "h1", "h2"])


def test_bad_config_is_refused():
    with pytest.raises(FbtError, match="cv"):
        ProbeConfig(cv="kfold")
    with pytest.raises(FbtError, match="backend"):
        ProbeConfig(backend="gpu")
