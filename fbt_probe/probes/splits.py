"""Grouped cross-validation splits and the controls computed on them.

Every split keeps each group entirely on one side (asserted). Controls:
- majority baseline: predict the training fold's majority label on the test fold. When the label is
  a function of the group (completion: the (R, C) digit pair), GroupKFold folds are label-imbalanced
  and this sits below 0.5 (0.367 was measured); `StratifiedGroupKFold` brings it back near 0.5.
- control task (Hewitt & Liang): labels permuted across groups, whole groups at a time, and each
  group's labels flipped with probability 1/2, so the control keeps each group's label structure
  but breaks its link to the activations (`control_labels`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from fbt_probe.errors import FbtError

CV_KINDS = ("group", "stratified-group")
Split = tuple[np.ndarray, np.ndarray]


class TooFewGroupsError(FbtError):
    """Fewer distinct groups than folds: grouped CV is impossible for this cell."""


class GroupLeakError(AssertionError):
    """A group appeared on both sides of a split: the held-out accuracy would be meaningless."""


def check_group_disjoint(splits: list[Split], groups) -> None:
    """Raise `GroupLeakError` if any split has a group on both its train and its test side."""
    groups = np.asarray(groups)
    for k, (train, test) in enumerate(splits):
        shared = np.intersect1d(groups[train], groups[test])
        if shared.size:
            raise GroupLeakError(f"fold {k}: groups on both sides of the split: {shared[:5].tolist()}")
        if np.intersect1d(train, test).size:
            raise GroupLeakError(f"fold {k}: samples on both sides of the split")


def grouped_splits(y, groups, n_splits: int = 5, cv: str = "group", seed: int = 0, where: str = "") -> list[Split]:
    """K-fold splits with no group on both sides. `cv`: "group" (GroupKFold) or "stratified-group"
    (StratifiedGroupKFold, shuffled with `seed`). `where` names the cell in error messages."""
    y, groups = np.asarray(y), np.asarray(groups)
    where = f"{where}: " if where else ""
    if cv not in CV_KINDS:
        raise FbtError(f"{where}cv '{cv}': expected one of {CV_KINDS}")
    if len(y) != len(groups):
        raise FbtError(f"{where}{len(y)} labels but {len(groups)} group ids")
    classes = np.unique(y)
    if classes.size < 2:
        raise FbtError(f"{where}single-class cell (every label is {classes.tolist()}); a probe needs both labels")
    if n_splits < 2:
        raise FbtError(f"{where}{n_splits} folds: cross-validation needs at least 2")
    n_groups = np.unique(groups).size
    if n_groups < n_splits:
        raise TooFewGroupsError(
            f"{where}{n_groups} groups, fewer than the {n_splits} folds asked for "
            f"(use fewer folds or a dataset with more groups)"
        )
    if cv == "group":
        splitter = GroupKFold(n_splits=n_splits)
    else:
        splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    splits = [(np.sort(tr), np.sort(te)) for tr, te in splitter.split(np.zeros(len(y)), y, groups)]
    check_group_disjoint(splits, groups)
    for k, (train, test) in enumerate(splits):
        if np.unique(y[train]).size < 2:
            raise FbtError(
                f"{where}fold {k}: its training side holds a single class; try --cv stratified-group or fewer folds"
            )
        if test.size == 0:
            raise FbtError(f"{where}fold {k}: empty test side")
    return splits


def majority_baseline(y, splits: list[Split]) -> np.ndarray:
    """[n_splits] held-out accuracy of predicting the training fold's majority label
    (ties go to the smaller label, as `DummyClassifier(strategy="most_frequent")`)."""
    y = np.asarray(y)
    out = []
    for train, test in splits:
        labels, counts = np.unique(y[train], return_counts=True)
        out.append(float(np.mean(y[test] == labels[np.argmax(counts)])))
    return np.array(out)


def control_labels(y, groups, seed: int = 0) -> np.ndarray:
    """Control-task labels (Hewitt & Liang), assigned per group: groups of equal size swap their label
    sequences under a seeded permutation, then each group's labels are flipped with probability 1/2.

    The flip matters: pairs often share one label pattern in row order (label 0 then 1), and a
    permutation alone would hand every group its own labels back. After the flip a control label is
    independent of the sample's activations, but each group keeps its internal label structure (the
    two samples of a pair still differ). Groups whose size no other group shares keep their own
    sequence before the flip. Binary labels (two classes) only.
    """
    y, groups = np.asarray(y), np.asarray(groups)
    classes = np.unique(y)
    if classes.size != 2:
        raise FbtError(f"control labels need exactly two classes, got {classes.tolist()}")
    rng = np.random.default_rng(seed)
    members: dict = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    by_size: dict = defaultdict(list)
    for g in sorted(members, key=str):
        by_size[len(members[g])].append(g)
    out = y.copy()
    for size, gs in sorted(by_size.items()):
        perm = rng.permutation(len(gs))
        for g, src in zip(gs, perm):
            out[members[g]] = y[members[gs[src]]]
    for g in sorted(members, key=str):
        if rng.random() < 0.5:
            idx = members[g]
            out[idx] = np.where(out[idx] == classes[0], classes[1], classes[0])
    return out


def grouped_folds(y, groups, n_folds: int, seed: int = 0) -> list[Split]:
    """Grouped K-fold splits for cross-fitting, at most as many folds as groups: stratified
    (StratifiedGroupKFold) so training folds stay label-balanced where the label is a function of
    the group (completion), plain GroupKFold where stratification fails."""
    k = min(n_folds, len(np.unique(groups)))
    try:
        return grouped_splits(y, groups, n_splits=k, cv="stratified-group", seed=seed)
    except (FbtError, ValueError):  # scikit-learn's ValueError: a class has fewer members than folds
        return grouped_splits(y, groups, n_splits=k, cv="group", seed=seed)
