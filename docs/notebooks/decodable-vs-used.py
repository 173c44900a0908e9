# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Decodable versus used, in miniature
#
# **Needs**: `pip install torch fbt-probe` and Jupyter. Nothing is downloaded: the two models are
# `ref:tiny-feedback` and its no-feedback baseline `ref:tiny-baseline`, shipped inside the package.
# **Takes**: about 25 s on 2 CPU cores (AMD EPYC; measured as the kernel's CPU time, 23 s).
#
# The study asks two questions of the carried state: is the answer *decodable* from it (a linear probe
# at each depth, the paper's Fig. 7a), and does the model *use* it (swap it, replace it, bypass the
# fusion and see whether the answer moves). This notebook asks both on one task, `completion` at 8
# distractor lines, on both shipped models, with the intervals the study reports
# ([statistics](../statistics.md)): a Wilson interval with n = the number of groups for every accuracy,
# a group bootstrap for every mean effect. Each number is checked against an independent computation:
# the probe against a scikit-learn refit, the swap against two forwards by hand, the intervals against
# their formulas written out here.

# %%
import json
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in the page
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's note when ipywidgets is absent

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import fbt_probe as fp
from fbt_probe.activations import extract
from fbt_probe.interventions import PatchConfig, load_pairs
from fbt_probe.interventions.combined import run_several
from fbt_probe.interventions.edits import set_at
from fbt_probe.probes import ProbeConfig, probe_sweep
from fbt_probe.stats import group_proportion, paired_difference
from fbt_probe.tasks import generate, heldout_groups, load_spec, write_dataset

numbers = {"fbt_probe_file": fp.__file__}  # what this run computed, recorded at the end
work = Path(tempfile.mkdtemp(prefix="decodable-vs-used-"))  # datasets and activations go here

# %% [markdown]
# ## Two models and one dataset
#
# The baseline was trained on the same data for the same steps, one pass only: its fusion weights were
# never trained, so whatever its carried state shows is what an untrained map of the state gives. Every
# number below is read beside it. The dataset holds 32 groups of `completion` pairs drawn from contexts
# held out of both models' training (the split their training record names: 20 % of the contexts,
# seed 0); a group is one context family, the unit every interval counts.

# %%
models = {name: fp.load_model(f"ref:tiny-{name}").eval() for name in ("feedback", "baseline")}
tok = models["feedback"].tokenizer
HELD_OUT = heldout_groups(["completion", "memory", "registers", "registers-count"], 0.2, 0)
spec = load_spec("completion").replace(length_grid=[8])
df = generate(spec, groups=32, seed=101, tokenizer=tok, contexts=HELD_OUT)
write_dataset(df, work / "data", tok)
pairs = load_pairs(work / "data")  # the loader every command uses: label token ids, hashes
G = pairs["group_id"].nunique()
print(f"{len(pairs)} samples, {len(pairs) // 2} pairs, {G} groups; e.g.")
print(pairs["text"].iloc[0])

# %% [markdown]
# ## Decodable: a probe at every depth (Fig. 7a)
#
# `extract` keeps the last position's residual stream at every depth d = 0..L under each mode (d = 0 is
# the model's input: a plain embedding under `standard`, the fused input under `recurrent:1`);
# `probe_sweep` fits a standardised logistic regression at each depth with grouped 4-fold
# cross-validation (no group on both sides of a fold). The accuracy shown is the held-out accuracy
# pooled over the folds, with its Wilson interval at n = the 32 groups.

# %%
sweeps = {}
for name, model in models.items():
    store = extract(model, pairs, ["standard", "recurrent:1"], work / "acts" / name, reference=False)
    sweeps[name] = (store, probe_sweep(store, ProbeConfig(n_jobs=1, control=False)))

rows = []
for name, (_, sweep) in sweeps.items():
    for (mode, depth), cell in sweep.samples.groupby(["mode", "depth"]):
        p, lo, hi, n = group_proportion(cell["correct"], cell["group_id"])
        rows.append(
            {"model": name, "mode": mode, "depth": depth, "accuracy": p, "ci_low": lo, "ci_high": hi, "n_groups": n}
        )
fig7a = pd.DataFrame(rows)
print(fig7a.pivot_table(index="depth", columns=["model", "mode"], values="accuracy").round(3).to_string())

fig, axes = plt.subplots(1, 2, figsize=(8, 2.8), sharey=True)
for ax, mode in zip(axes, ["standard", "recurrent:1"]):
    for name, marker in (("feedback", "o"), ("baseline", "s")):
        t = fig7a[(fig7a["model"] == name) & (fig7a["mode"] == mode)]
        err = [t["accuracy"] - t["ci_low"], t["ci_high"] - t["accuracy"]]
        ax.errorbar(t["depth"], t["accuracy"], yerr=err, marker=marker, capsize=3, label=name)
    ax.axhline(0.5, color="gray", ls=":", lw=1)
    ax.set_title(mode)
    ax.set_xlabel("depth (0 = input)")
axes[0].set_ylabel("held-out probe accuracy")
axes[1].legend()
plt.show()

# %% [markdown]
# Two checks. Under `standard` every sample ends in the same token, so depth 0 holds one vector for
# all of them and no probe can beat chance: it must read exactly 0.5. And the sweep's accuracy must
# agree with a plain scikit-learn refit on the same grouped folds (`GroupKFold`, the sweep's default),
# written here from the activations `extract` saved.

# %%
at = fig7a.set_index(["model", "mode", "depth"])
for name in models:
    assert abs(at.loc[(name, "standard", 0), "accuracy"] - 0.5) < 1e-12, name

refits = {}
for name, (store, _) in sweeps.items():
    X, cell_rows, targets = store.load("recurrent:1", "completion", 8)  # [depths, samples, d_model]
    y, groups = cell_rows["label"].to_numpy(), cell_rows["group_id"].to_numpy()
    for d in (0, 2):
        correct = np.zeros(len(y))
        for train, test in GroupKFold(n_splits=4).split(X[d], y, groups):
            clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))
            correct[test] = clf.fit(X[d][train], y[train]).predict(X[d][test]) == y[test]
        refit, ours = correct.mean(), at.loc[(name, "recurrent:1", d)]
        refits[f"{name}/recurrent:1/depth{d}"] = float(refit)
        print(
            f"{name}, recurrent:1, depth {d}: sweep {ours['accuracy']:.3f} [{ours['ci_low']:.3f}, {ours['ci_high']:.3f}], sklearn refit {refit:.3f}"
        )
        assert ours["ci_low"] <= refit <= ours["ci_high"] and abs(refit - ours["accuracy"]) <= 0.03
for name in models:  # what the next paragraph says: both models read the label at depth 0 under recurrent:1
    assert at.loc[(name, "recurrent:1", 0), "ci_low"] > 0.5, name
numbers["fig7a"] = fig7a.to_dict(orient="records")
numbers["sklearn_refit"] = refits

# %% [markdown]
# **Reading it.** Under `recurrent:1` the label is readable at depth 0 in the feedback model: what
# reaches the input there came through the carried state. But the baseline, whose fusion was never
# trained, reads it at depth 0 too: a random map of a state that already encodes the label is still
# linearly decodable. Decodability alone does not show that the model learned to use the feedback.

# %% [markdown]
# ## Used: swap, replace, bypass
#
# Each experiment edits the last position under `recurrent:1` and measures the logit difference LD
# between the two answer words, oriented to the sample's own answer:
#
# - **feedback swap** (`state`): the partner of a pair runs with this sample's carried state. The
#   normalized effect (patched − corrupt) / (clean − corrupt) is 1 when the answer follows the
#   swapped-in state, 0 when it ignores it;
# - **mean-state replacement** (`mean`): the sample runs with the task's mean carried state. Here
#   normalized 1 means no effect, 0 that it behaves like its partner;
# - **bypass** (gate ablation `bypass`): the fusion is skipped at the last position, which then gets
#   its plain embedding. Normalized as the replacement.
#
# `run(model, pairs, PatchConfig(experiment))` runs one experiment and returns its per-sample rows
# and a summary with the study's intervals; `run_several`, what `fbt-probe patch --experiment a,b,c`
# runs, gives the same tables for several at once, computing each batch's prefix once for all of them.

# %%
EXPERIMENTS = {"feedback-swap": "state", "state-replacement": "mean", "gate-ablation": "bypass"}
results = {}
for name, model in models.items():
    configs = [PatchConfig(experiment, modes=("recurrent:1",)) for experiment in EXPERIMENTS]
    for experiment, res in zip(EXPERIMENTS, run_several(model, pairs, configs, figures=False)):
        results[name, experiment] = res


def pick(frame, experiment, metric):
    keep = (frame["condition"] == EXPERIMENTS[experiment]) & (frame["metric"] == metric)
    if "decoding" in frame:
        keep &= frame["decoding"] == "prefill"
    if "length_knob" in frame and (frame["length_knob"] == -1).any():
        keep &= frame["length_knob"] == -1  # the row pooled over lengths (one length here)
    return frame[keep]


effects = pd.DataFrame(
    [
        {
            "model": name,
            "experiment": e,
            **pick(results[name, e].summary, e, m)[["metric", "mean", "ci_low", "ci_high", "n_groups"]].iloc[0],
        }
        for name in models
        for e in EXPERIMENTS
        for m in ("normalized", "accuracy")
    ]
)
print(effects.round(3).to_string(index=False))

fig, ax = plt.subplots(figsize=(7, 2.8))
norm = effects[effects["metric"] == "normalized"]
x = np.arange(len(EXPERIMENTS))
for i, (name, color) in enumerate((("feedback", "C0"), ("baseline", "C1"))):
    t = norm[norm["model"] == name].set_index("experiment").loc[list(EXPERIMENTS)]
    ax.bar(
        x + (i - 0.5) * 0.38,
        t["mean"],
        0.38,
        color=color,
        label=name,
        yerr=[t["mean"] - t["ci_low"], t["ci_high"] - t["mean"]],
        capsize=3,
    )
ax.set_xticks(x, [f"{e}\n({c})" for e, c in EXPERIMENTS.items()])
ax.axhline(0, color="black", lw=0.8)
ax.set_ylabel("normalized effect")
ax.legend()
plt.show()

# %% [markdown]
# ### The swap, recomputed from two forwards
#
# For every pair (a, b) and each side of it: run b with a's carried state written into
# `fusion.hook_feedback` at the last position, read LD toward a's answer, and normalize with the clean
# and corrupt runs. These must be the rows the experiment returned.

# %%
by_hand = {}
for name, model in models.items():
    ids = pairs.attrs["label_token_ids"]["completion"]
    tokens = torch.tensor(np.stack(pairs["token_ids"].to_numpy()))
    labels = pairs["label"].to_numpy()
    partner = np.arange(len(pairs)) ^ 1  # the two samples of a pair are adjacent
    T = tokens.shape[1]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, mode="recurrent:1", names_filter="fusion.hook_feedback")
        state = cache["fusion.hook_feedback"][:, -1]
        plain = model(tokens, mode="recurrent:1")[:, -1]
        swapped = model.run_with_hooks(  # an edit at the last position reaches nothing later: one pass is exact
            tokens[partner],
            mode="recurrent:1",
            serial=False,
            fwd_hooks=[("fusion.hook_feedback", set_at(state, T - 1, model))],
        )[:, -1]

    def ld(logits, label):  # LD toward `label`'s word, per row
        sign = np.where(label == 1, 1.0, -1.0)
        return (logits[:, ids[1]] - logits[:, ids[0]]).numpy() * sign

    clean, corrupt, patched = ld(plain, labels), ld(plain[partner], labels), ld(swapped, labels)
    hand = (patched - corrupt) / (clean - corrupt)
    got = pick(results[name, "feedback-swap"].rows, "feedback-swap", "normalized").sort_values("row")
    err = float(np.abs(hand[got["row"].to_numpy()] - got["value"].to_numpy()).max())
    by_hand[name] = hand
    print(f"{name}: normalized swap per sample, max |run − by hand| = {err:.2e} over {len(got)} rows")
    assert err < 1e-3

    # the bypass gives the last position its plain embedding: the whole run is then `standard`
    with torch.no_grad():
        standard = ld(model(tokens, mode="standard")[:, -1], labels)
    bypass = pick(results[name, "gate-ablation"].rows, "gate-ablation", "logit_diff").sort_values("row")
    assert float(np.abs(standard[bypass["row"].to_numpy()] - bypass["value"].to_numpy()).max()) < 1e-3

# %% [markdown]
# ### The intervals, written out
#
# The normalized effect is a **ratio of means over pairs**, mean(patched − corrupt) / mean(clean −
# corrupt), so that no pair with a near-zero gap can drive it; a pair contributes the mean of its two
# rows to the numerator and to the denominator. The **group bootstrap** draws the 32 groups with
# replacement, 1000 times (`numpy.random.default_rng(0)`), a pair counted as often as its group was
# drawn; the ratio's interval is the estimate ± 1.96 standard deviations of the resampled ratios, and
# it is reported only where the 2.5 % quantile of the resampled mean gap clears 0.1. The **Wilson**
# interval of an accuracy p uses n = the groups, never the samples: the samples of a group share a
# context and count as one draw.


# %%
def ratio_of_means(num, den, groups, n_boot=1000, seed=0, min_gap=0.1, z=1.959963984540054):
    names, codes = np.unique(groups, return_inverse=True)  # the groups in sorted order, each pair's group
    draws = np.random.default_rng(seed).integers(0, len(names), size=(n_boot, len(names)))
    counts = np.stack([np.bincount(d, minlength=len(names)) for d in draws])[:, codes]  # [n_boot, pairs]
    theta = num.sum() / den.sum()
    gap_low = np.quantile((counts * den).sum(1) / counts.sum(1), 0.025)
    if not gap_low > min_gap:  # the pairs' mean gap does not clear the minimum: no ratio is reported
        return np.nan, np.nan, np.nan
    half = z * np.std((counts * num).sum(1) / (counts * den).sum(1), ddof=1)
    return theta, theta - half, theta + half


def wilson(p, n, z=1.959963984540054):
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


for name in models:
    for experiment in EXPERIMENTS:
        res = results[name, experiment]
        rows = pick(res.rows, experiment, "normalized")
        kept = rows[~rows["tiny_gap"]]
        gap = kept["clean_logit_diff"] - kept["corrupt_logit_diff"]
        per_pair = kept.assign(num=kept["value"] * gap, den=gap).groupby("pair_id")
        per_pair = per_pair.agg(num=("num", "mean"), den=("den", "mean"), group=("group_id", "first"))
        mean, lo, hi = ratio_of_means(*(per_pair[c].to_numpy() for c in ("num", "den", "group")))
        s = pick(res.summary, experiment, "normalized").iloc[0]
        assert np.allclose([mean, lo, hi], [s["mean"], s["ci_low"], s["ci_high"]], atol=1e-9, equal_nan=True), (
            name,
            experiment,
        )
        acc = pick(res.summary, experiment, "accuracy").iloc[0]
        assert np.allclose(wilson(acc["mean"], acc["n_groups"]), [acc["ci_low"], acc["ci_high"]], atol=1e-9)
print("every interval above equals its formula")

# %% [markdown]
# ### Feedback minus baseline, paired
#
# The two models ran on the same pairs, so their difference is a paired one: `stats.paired_difference`
# draws the groups once per resample and applies the draw to both models, so whatever a group shifts
# in both cancels.

# %%
swap_rows = {name: pick(results[name, "feedback-swap"].rows, "feedback-swap", "normalized") for name in models}
per_pair = {
    name: r[~r["tiny_gap"]].groupby("pair_id").agg(value=("value", "mean"), group=("group_id", "first"))
    for name, r in swap_rows.items()
}
diff = paired_difference(
    per_pair["feedback"]["value"],
    per_pair["feedback"]["group"],
    per_pair["baseline"]["value"],
    per_pair["baseline"]["group"],
)
print(f"normalized swap, feedback − baseline: {diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}], n = {diff[3]} groups")
shared = per_pair["feedback"].index.intersection(per_pair["baseline"].index)
assert (
    abs(diff[0] - (per_pair["feedback"]["value"][shared].mean() - per_pair["baseline"]["value"][shared].mean())) < 1e-9
)
numbers["effects"] = effects.to_dict(orient="records")
numbers["swap_by_hand"] = {name: [float(v) for v in h] for name, h in by_hand.items()}
numbers["swap_paired_difference"] = [float(v) for v in diff]

# %% [markdown]
# **Reading it.** The swap asks whether the answer follows the carried state when it is exchanged
# with the partner's: a normalized effect well above 0, with an interval that excludes 0, says the
# model reads the state. Compare it with the baseline's, through the paired difference: a baseline can
# move too (its untrained map still passes some of the state on). Replacement and bypass ask the
# converse: normalized near 1 means the model answers as well without its own state, that is, it can
# recompute the answer from the prompt. The full study asks the same questions at every length, on
# four tasks, over three training seeds (`fbt-probe reproduce`; [the study](../reproduce.md)).

# %% [markdown]
# ## What this run recorded
#
# The numbers above, written as JSON where the environment variable `FBT_NOTEBOOK_RECORDS` points (a
# folder; unset, nothing is written). The test suite reads them.

# %%
out = os.environ.get("FBT_NOTEBOOK_RECORDS")
if out:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "decodable-vs-used.json").write_text(json.dumps(numbers, indent=1, default=float))
print(sorted(numbers))
