"""SAEs on the carried state: dictionary recovery, the on-disk format, and exact identities of the
feature-level tests (an SAE that reconstructs exactly must make the all-latent swap the full-state
swap; the full-state swap must equal the feedback swap of `fbt_probe.interventions`)."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.interventions import feedback_swap
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.modes import parse_mode
from fbt_probe.sae import SAEConfig, SAETrainConfig, SparseAutoencoder, train_sae
from fbt_probe.sae.analyze import fractions
from fbt_probe.sae.data import collect
from fbt_probe.sae.features import feature_tests
from fbt_probe.sae.metrics import loss_recovered, loss_recovered_rows, reconstruction
from tests.helpers import make_model, task_pairs

HOOK = "fusion.hook_feedback"


def planted(n_atoms=48, d=32, n=8000, active=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n_atoms, d, generator=g)
    D /= D.norm(dim=1, keepdim=True)
    codes = torch.zeros(n, n_atoms)
    for i in range(n):
        codes[i, torch.randperm(n_atoms, generator=g)[:active]] = 0.5 + torch.rand(active, generator=g)
    return D, codes @ D + 0.3


@pytest.mark.parametrize(
    "cfg",
    [
        SAETrainConfig(architecture="topk", expansion=2, k=3, steps=2500, lr=3e-3),
        SAETrainConfig(architecture="jumprelu", expansion=2, steps=2500, lr=3e-3, l0_coeff=0.03),
    ],
    ids=["topk", "jumprelu"],
)
def test_sae_recovers_a_planted_dictionary(one_thread, cfg):
    D, x = planted()
    sae, record = train_sae(x, cfg)
    W = sae.W_dec.detach()
    best = (D @ (W / W.norm(dim=1, keepdim=True)).T).max(1).values  # each atom's closest decoder row
    assert (best >= 0.95).float().mean() >= 0.85, best
    r = reconstruction(sae, x)
    assert r["fvu"] < 0.1 and r["l0"] < 6  # sparse and faithful; a dense or broken SAE fails one of them
    # random decoders match a planted atom at cosine ~0.5 in 32 dimensions: recovery is not chance
    rand = torch.randn(96, 32, generator=torch.Generator().manual_seed(5))
    assert ((D @ (rand / rand.norm(dim=1, keepdim=True)).T).max(1).values >= 0.95).float().mean() < 0.2
    assert record["history"][-1]["fvu_batch"] < record["history"][0]["fvu_batch"]


def test_training_is_deterministic(one_thread):
    _, x = planted(n=500)
    cfg = SAETrainConfig(expansion=2, k=3, steps=50)
    a, ra = train_sae(x, cfg)
    b, rb = train_sae(x, cfg)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict()) and ra == rb


def test_topk_and_jumprelu_encode_against_numpy():
    torch.manual_seed(0)
    for arch in ("topk", "jumprelu"):
        sae = SparseAutoencoder(SAEConfig(6, 10, arch, k=3, dtype="float64"))
        with torch.no_grad():
            for p in sae.parameters():
                p.copy_(torch.randn_like(p))
        x = torch.randn(7, 6, dtype=torch.float64)
        X, We, be, bd = (t.detach().numpy() for t in (x, sae.W_enc, sae.b_enc, sae.b_dec))
        pre = (X - bd) @ We + be
        if arch == "topk":
            want = np.zeros_like(pre)
            for i, row in enumerate(pre):
                top = np.argsort(-row)[:3]
                want[i, top] = np.maximum(row[top], 0)
        else:
            th = sae.threshold.detach().numpy()
            want = np.where(pre > th, np.maximum(pre, 0), 0.0)
        np.testing.assert_allclose(sae.encode(x).detach().numpy(), want, atol=1e-12)
        np.testing.assert_allclose(sae(x).detach().numpy(), want @ sae.W_dec.detach().numpy() + bd, atol=1e-12)


def test_saelens_format_round_trip(tmp_path):
    torch.manual_seed(0)
    sae = SparseAutoencoder(SAEConfig(8, 16, "jumprelu", metadata={"hook_name": HOOK, "mode": "jacobi:2"}))
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn_like(p))
    sae.save(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu" and cfg["d_in"] == 8 and cfg["d_sae"] == 16
    assert cfg["apply_b_dec_to_input"] is True and cfg["normalize_activations"] == "none"
    assert cfg["metadata"]["hook_name"] == HOOK and cfg["metadata"]["sae_lens_version"].startswith("6")
    from safetensors.torch import load_file

    shapes = {k: tuple(v.shape) for k, v in load_file(str(tmp_path / "s" / "sae_weights.safetensors")).items()}
    assert shapes == {"W_enc": (8, 16), "b_enc": (16,), "W_dec": (16, 8), "b_dec": (8,), "threshold": (16,)}
    back = SparseAutoencoder.load(tmp_path / "s")
    x = torch.randn(5, 8)
    assert torch.equal(back.encode(x), sae.encode(x)) and back.hook_name == HOOK
    with pytest.raises(FbtError, match="already exists"):
        sae.save(tmp_path / "s")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FbtError, match="not an SAE folder"):
        sae.save(tmp_path / "other", force=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    cfg.pop("d_sae")
    (tmp_path / "s" / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(FbtError, match="field 'd_sae' missing"):
        SparseAutoencoder.load(tmp_path / "s")


def exact_sae(d: int) -> SparseAutoencoder:
    """d_sae = 2d, latents x⁺ and x⁻ of every coordinate, k = d: reconstructs every x exactly
    (with no zero coordinate) in float64."""
    sae = SparseAutoencoder(SAEConfig(d, 2 * d, "topk", k=d, dtype="float64", metadata={"hook_name": HOOK}))
    eye = torch.eye(d, dtype=torch.float64)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
    return sae


@pytest.fixture(scope="module")
def setup():
    df, tok = task_pairs(groups=4)
    df.attrs["label_token_ids"] = label_token_ids(df, tok)
    return make_model(), df


def test_feature_tests_exact_identities(one_thread, setup):
    model, df = setup
    d = model.cfg.d_model
    sae = exact_sae(d)
    wide = feature_tests(model, sae, df, HOOK, parse_mode("recurrent:1"), ks=(1, 2 * d), max_pairs=4, min_gap=0.0)
    key = ["task", "pair_id", "label"]
    sw = wide[wide["experiment"] == "sae-feature-swap"]
    state = sw[sw["condition"] == "state"].set_index(key)["logit_diff"]
    for cond, k in (("all", 2 * d), ("features", 2 * d)):
        got = sw[(sw["condition"] == cond) & (sw["subspace_dim"] == k)].set_index(key)["logit_diff"]
        np.testing.assert_allclose(got.loc[state.index], state, atol=1e-9, err_msg=cond)
    # the full-state swap is the interventions' feedback swap, computed by its own code
    ref = feedback_swap(model, list(pair_batches(df, df.attrs["label_token_ids"], 64, 4)), parse_mode("recurrent:1"))
    ref = ref[ref["condition"] == "state"].set_index(key)["logit_diff"]
    np.testing.assert_allclose(state.loc[ref.index], ref, atol=1e-9)
    # one latent moves the partner's answer less than the whole state does
    moved = lambda g: (g["logit_diff"] - g["corrupt_logit_diff"]).abs().mean()  # noqa: E731
    assert moved(sw[(sw["condition"] == "features") & (sw["subspace_dim"] == 1)]) < moved(
        sw[sw["condition"] == "state"]
    )
    fr = fractions(wide, n_boot=200)
    allrow = fr[(fr["condition"] == "features") & (fr["k"] == 2 * d)]
    assert len(allrow) == 2  # both tasks
    np.testing.assert_allclose(allrow["fraction"], 1.0, atol=1e-9)
    assert ((fr["ci_low"] <= fr["fraction"] + 1e-12) & (fr["fraction"] <= fr["ci_high"] + 1e-12)).all()


def test_loss_recovered_of_an_exact_sae_is_one(one_thread, setup):
    model, df = setup
    sae = exact_sae(model.cfg.d_model)
    x, idx = collect(model, df, HOOK, "jacobi:2")
    assert len(x) == sum(len(t) - 1 for t in df["token_ids"]) and reconstruction(sae, x)["fvu"] < 1e-20
    rows = loss_recovered_rows(model, sae, df, HOOK, [parse_mode("recurrent:1")], x.mean(0))
    np.testing.assert_allclose(rows["ce_sae"], rows["ce_clean"], atol=1e-10)
    assert (rows["ld_mean"] - rows["ld_clean"]).abs().max() > 1e-3  # the mean ablation does change the answer
    lr = loss_recovered(rows, n_boot=100)
    # on this random model the mean ablation costs the answer less than the stated gap: no fraction is given,
    # and the cost it would divide by is reported instead
    cost = (rows["ld_clean"] - rows["ld_mean"]).groupby(rows["task"]).mean().sort_index()
    np.testing.assert_allclose(lr.sort_values("task")["ld_gap"], cost, rtol=1e-12)
    assert lr["recovered_ld"].isna().all() and (lr["ld_gap_low"] < 0.1).all()
    # the ratio does not depend on the logits' scale: scaled until the cost clears the gap, it is exactly 1
    # (a task whose cost has an interval reaching 0 at any scale stays without a fraction)
    scaled = loss_recovered(rows.assign(**{f"ld_{c}": rows[f"ld_{c}"] * 1e4 for c in ("clean", "sae", "mean")}), 100)
    clear = scaled["ld_gap_low"] > 0.1
    assert clear.any() and scaled.loc[~clear, "recovered_ld"].isna().all()
    np.testing.assert_allclose(scaled.loc[clear, "recovered_ld"], 1.0, atol=1e-9)


def test_sae_cli_refuses_bad_input(tmp_path):
    runner = CliRunner()
    (tmp_path / "notsae").mkdir()
    res = runner.invoke(
        app,
        ["sae", "analyze", "ref:tiny-feedback", str(tmp_path / "notsae"), str(tmp_path), "--out", str(tmp_path / "o")],
    )
    assert res.exit_code != 0 and "not an SAE folder" in res.output and not (tmp_path / "o").exists()
    res = runner.invoke(
        app,
        ["sae", "train", "ref:tiny-feedback", str(tmp_path), "--out", str(tmp_path / "o"), "--architecture", "gated"],
    )
    assert res.exit_code != 0 and "--architecture gated" in res.output and not (tmp_path / "o").exists()


def test_sae_swap_figure(setup):
    import matplotlib.pyplot as plt
    import pandas as pd

    from fbt_probe.figures import draw

    fr = pd.DataFrame(
        {
            "task": ["completion"] * 3 + ["memory"] * 3,
            "condition": ["features", "random", "all"] * 2,
            "k": [1, 1, 64] * 2,
            "fraction": [0.4, 0.1, 0.95, 0.3, 0.05, 0.9],
            "ci_low": [0.3, 0.0, 0.9, 0.2, 0.0, 0.85],
            "ci_high": [0.5, 0.2, 1.0, 0.4, 0.1, 0.95],
        }
    )
    fig = draw("sae-swap", fr)
    assert [a.get_title() for a in fig.axes] == ["completion", "memory"]
    assert len(fig.axes[0].lines) >= 3  # two curves and the every-latent line
    plt.close(fig)
    with pytest.raises(FbtError, match="not an SAE fractions table"):
        draw("sae-swap", fr.drop(columns="k"))


def test_feature_table_reads_the_final_carried_state_and_lists_distinct_examples(one_thread, setup):
    """The browser's activations are the SAE codes of the state recurrent:1 carries into the final
    position (captured there by the interventions' own hook, an independent path from the jacobi:2
    collection the table reads); its examples are the largest activations, one per distinct text."""
    from fbt_probe.interventions.edits import capture
    from fbt_probe.sae.analyze import EXAMPLES, feature_table

    model, df = setup
    sae = exact_sae(model.cfg.d_model)
    order = {t: np.arange(6) for t in sorted(df["task"].unique())}
    feats, ex, acts = feature_table(model, sae, df, HOOK, "jacobi:2", order)
    assert set(acts["rank"]) == set(range(1, 5)) and len(feats) == 4 * len(order)
    key = ["task", "pair_id", "label"]
    for (task, T), g in df.assign(T=[len(t) for t in df["token_ids"]]).groupby(["task", "T"]):
        tokens = torch.tensor(np.stack([np.asarray(t) for t in g["token_ids"]]))
        store: dict = {}
        with torch.no_grad():
            model.run_with_hooks(tokens, mode="recurrent:1", fwd_hooks=[(HOOK, capture(store, HOOK, model, T - 1))])
            z = sae.encode(store[HOOK]).double().numpy()
        for rank in range(1, 5):
            a = acts[(acts["task"] == task) & (acts["rank"] == rank)].set_index(key)["activation"]
            got = a.loc[list(zip(g["task"], g["pair_id"], g["label"]))].to_numpy()
            np.testing.assert_allclose(got, z[:, rank - 1], atol=1e-9)
    for task in order:
        for r in feats[feats["task"] == task].itertuples():
            a = acts[(acts["task"] == task) & (acts["latent"] == r.latent)]
            np.testing.assert_allclose(r.final_mean_label1, a[a["label"] == 1]["activation"].mean(), atol=1e-12)
            e = ex[(ex["task"] == task) & (ex["latent"] == r.latent)]
            assert 0 < len(e) <= EXAMPLES and e["text"].is_unique
            assert (np.diff(e["activation"].to_numpy()) <= 0).all() and all("[[" in t and "]]" in t for t in e["text"])


def test_report_text_escapes_markup_and_bolds_the_carried_token():
    from fbt_probe.reproduce.parts.sae import _md_text

    assert _md_text("a | b *c* [[x_1]] :") == r"a \| b \*c\* **x\_1** :"
    assert _md_text("<b> [[⏎]]") == r"\<b\> **⏎**"


def test_sae_features_and_sae_vs_das_figures():
    import matplotlib.pyplot as plt
    import pandas as pd

    from fbt_probe.figures import draw

    acts = pd.DataFrame(
        {
            "task": ["memory"] * 8,
            "rank": [1, 1, 1, 1, 2, 2, 2, 2],
            "latent": [7] * 4 + [3] * 4,
            "label": [0, 0, 1, 1] * 2,
            "activation": [0.0, 0.1, 4.0, 5.0, 3.0, 2.0, 0.0, 0.0],
        }
    )
    fig = draw("sae-features", acts)
    assert [a.get_title() for a in fig.axes] == ["memory: latent 7 (#1)", "memory: latent 3 (#2)"]
    assert len(fig.axes[0].patches) == 2 * 20  # one histogram per label
    plt.close(fig)
    with pytest.raises(FbtError, match="not an SAE activations table"):
        draw("sae-features", acts.drop(columns="label"))
    fr = pd.DataFrame(
        {
            "task": ["memory"] * 3,
            "condition": ["features", "random", "all"],
            "k": [1, 1, 64],
            "fraction": [0.4, 0.1, 0.95],
            "ci_low": [0.3, 0.0, 0.9],
            "ci_high": [0.5, 0.2, 1.0],
        }
    )
    das = pd.DataFrame(
        {
            "task": "memory",
            "mode": "recurrent:1",
            "condition": [HOOK, HOOK, HOOK, "blocks.0.hook_resid_pre"],
            "method": ["das", "random-rotation", "full-interchange", "das"],
            "subspace_dim": [1, 1, 32, 1],
            "metric": "iia",
            "length_knob": -1,
            "mean": [0.9, 0.05, 1.0, 0.2],
            "ci_low": [0.8, 0.0, 1.0, 0.1],
            "ci_high": [1.0, 0.1, 1.0, 0.3],
        }
    )
    fig = draw("sae-vs-das", fr, das=das, probe=pd.DataFrame({"task": ["memory"], "accuracy": [0.97]}))
    top, bottom = fig.axes[:2]
    assert top.get_title() == "memory" and "IIA" in bottom.get_ylabel()
    ys = sorted(float(line.get_ydata()[0]) for line in bottom.lines if len(line.get_ydata()) == 2)
    assert 0.97 in ys and 1.0 in ys and 0.2 not in ys  # the probe and the full swap; the other hook's DAS is not drawn
    # the IIA null is the random rotation's (0.05 here), read from the table, not a 0.5 "chance"
    null = [line for line in bottom.lines if "null" in line.get_label()]
    assert len(null) == 1 and null[0].get_ydata()[0] == pytest.approx(0.05) and 0.5 not in ys
    assert "random-rotation" in null[0].get_label()
    plt.close(fig)
    with pytest.raises(FbtError, match="das is not a DAS summary"):
        draw("sae-vs-das", fr, das=das.drop(columns="method"))


def test_ratio_interval_is_the_normal_bootstrap_centred_on_its_estimate():
    """A skewed ratio (one group carries most of the numerator): the interval is θ ± z·sd of the
    group-resampled ratios, computed here independently, so it contains θ by construction, not by
    widening (an implementation that clamps a BCa interval to θ would not equal this)."""
    from fbt_probe.sae.metrics import Z_95, ratio_ci
    from fbt_probe.stats import group_weights

    groups = np.repeat(np.arange(6), 2)
    num = np.array([9.0, 8.0, 0.1, 0.2, 0.1, 0.0, 0.2, 0.1, 0.3, 0.1, 0.0, 0.2])
    den = np.array([1.0, 1.0, 0.5, 0.5, 0.4, 0.6, 0.5, 0.5, 0.6, 0.4, 0.5, 0.5])
    theta, lo, hi = ratio_ci(num, den, groups, n_boot=400, seed=3)
    W = group_weights(groups, 400, 3)
    boots = (W @ num) / (W @ den)
    half = Z_95 * boots.std(ddof=1)
    assert theta == pytest.approx(num.sum() / den.sum())
    assert (lo, hi) == pytest.approx((theta - half, theta + half))
    assert lo < theta < hi
    assert np.isnan(ratio_ci(num[:2], den[:2], groups[:2])[1])  # one group: no interval
