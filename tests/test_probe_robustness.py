"""The robustness panel: its standardised C = 1 variant is the main sweep's probe (same folds, same
numbers), every variant is a sklearn logistic regression on the same folds, and the control task
sits near chance."""

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from fbt_probe.probes.robustness import CS, robustness, variants
from fbt_probe.probes.splits import grouped_splits
from fbt_probe.probes.sweep import ProbeConfig, probe_sweep


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from fbt_probe.activations import extract
    from fbt_probe.loading import load_model
    from tests.helpers import task_pairs

    df, tok = task_pairs(6, tasks=("completion",))
    out = tmp_path_factory.mktemp("acts") / "completion"
    folder = tmp_path_factory.mktemp("data")
    df.to_parquet(folder / "completion.parquet")
    model = load_model("tiny", n_layers=2, d_vocab=tok.get_vocab_size())
    extract(model, df, ["standard", "recurrent:1"], out)
    return out


def test_variants_cover_both_preprocessings_and_every_C():
    assert variants() == [(s, c) for s in (True, False) for c in CS] and CS == (0.01, 0.1, 1.0, 10.0)


def test_the_default_variant_is_the_main_sweep_and_each_variant_is_sklearn(store):
    panel = robustness(store, "recurrent:1", 0)
    main = probe_sweep(store, ProbeConfig(), modes=["recurrent:1"]).table
    main = main[(main["depth"] == 0) & (main["metric"] == "accuracy")].sort_values(["length", "fold"])
    mine = panel[panel["standardize"] & (panel["C"] == 1.0)].sort_values(["length", "fold"])
    np.testing.assert_allclose(mine["accuracy"].to_numpy(), main["value"].to_numpy(), rtol=0, atol=1e-12)
    from fbt_probe.activations import ActivationStore

    st = ActivationStore(store)
    length = int(panel["length"].iloc[0])
    X, meta, targets = st.load("recurrent:1", "completion", length)
    x, y = np.asarray(X[[t.depth for t in targets].index(0)], np.float64), meta["label"].to_numpy()
    splits = grouped_splits(y, meta["group_id"].astype(str).to_numpy(), 4, "group", 0)
    for std, C in [(False, 0.01), (True, 10.0)]:
        for f, (train, test) in enumerate(splits):
            a, b = x[train], x[test]
            if std:
                sc = StandardScaler().fit(a)
                a, b = sc.transform(a), sc.transform(b)
            ref = LogisticRegression(C=C, max_iter=1000, tol=1e-4).fit(a, y[train]).score(b, y[test])
            got = panel[
                (panel["length"] == length) & (panel["standardize"] == std) & (panel["C"] == C) & (panel["fold"] == f)
            ]["accuracy"].item()
            assert abs(got - ref) < 1e-12
    assert set(panel.columns) >= {
        "task",
        "length",
        "standardize",
        "C",
        "fold",
        "accuracy",
        "control_accuracy",
        "n_test",
    }
    assert len(panel) == len(variants()) * panel.groupby(["length", "fold"]).ngroups
    assert pd.Series(panel["control_accuracy"]).between(0, 1).all()
