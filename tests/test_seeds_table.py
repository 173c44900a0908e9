"""The shipped seeds table (`fbt_probe/reference/seeds-tiny.csv`), which a study of the shipped models
quotes for the spread over training seeds: per study kind, one row per number and seed 0, 1, 2; seed 0
is the shipped models (their checkpoint hashes), and each seed's rows name one model checkpoint."""

from __future__ import annotations

import pandas as pd

from fbt_probe.reference import record
from fbt_probe.reproduce.part import HEADLINE, PAIRED_MODEL
from fbt_probe.reproduce.parts.depth import DEPTH_Q
from fbt_probe.reproduce.seeds import KEY, N_GROUPS, packaged


def _shipped(name: str) -> str:
    return record(name)["checkpoint_sha256"]


def test_the_shipped_seeds_table_has_seeds_0_to_2_per_kind_and_seed_0_is_the_shipped_models():
    t = pd.read_csv(packaged("tiny"))
    assert set(t["study"]) <= {"demo", "full"} and "demo" in set(t["study"])
    for kind, g in t.groupby("study"):
        assert sorted(g["seed"].unique()) == [0, 1, 2], kind
        assert not g.duplicated(["seed", *KEY]).any(), kind
        per_seed = g.groupby("seed").apply(lambda s: frozenset(map(tuple, s[KEY].to_numpy())), include_groups=False)
        assert len(set(per_seed)) == 1, f"{kind}: the seeds quote different numbers"
        depth = g["quantity"].str.startswith(DEPTH_Q)
        for model in ("feedback", "baseline"):
            rows = g[(g["model"] == model) & ~depth]
            for seed, s in rows.groupby("seed"):
                assert s["checkpoint_sha256"].nunique() == 1, (kind, model, seed)
            assert set(rows.loc[rows["seed"] == 0, "checkpoint_sha256"]) == {_shipped(f"tiny-{model}")}, (kind, model)
            d = g[(g["model"] == model) & depth & (g["seed"] == 0)]
            if len(d):
                assert set(d["checkpoint_sha256"]) == {_shipped(f"tiny-depth-{model}")}, (kind, model)
        # three different trainings: no seed repeats another's checkpoint
        fb = g[(g["model"] == "feedback") & ~depth].groupby("seed")["checkpoint_sha256"].first()
        assert fb.nunique() == 3, kind


def test_the_seeds_tables_header_is_the_headline_tables():
    """The headline's columns (`n_groups`, the groups a number rests on, is read where the table has it:
    a table written before that column leaves the floor on evidence to this study's own counts)."""
    t = pd.read_csv(packaged("tiny"))
    want = [*KEY, "value", "ci_low", "ci_high", "seed", "study", "checkpoint_sha256", "commit"]
    assert [c for c in t.columns if c != N_GROUPS] == want
    assert set(HEADLINE) - {N_GROUPS} <= set(t.columns) and N_GROUPS in HEADLINE
    # a paired difference's rows (both models) carry the feedback model's hash: they are no model of their own
    assert not set(t["model"]) - {"feedback", "baseline", PAIRED_MODEL}
