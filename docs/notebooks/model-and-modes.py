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
# # The model and its modes
#
# **Needs**: `pip install torch fbt-probe nnsight` (nnsight for the last section only) and Jupyter.
# Nothing is downloaded: the model is `ref:tiny-feedback`, shipped inside the package.
# **Takes**: about 15 s on 2 CPU cores (AMD EPYC; measured as the kernel's CPU time, 13 s, half of it
# importing torch, TransformerLens and nnsight).
#
# This notebook loads the shipped latent-feedback model, runs one minimal pair of the `completion`
# task under each prefill mode, and reads the carried state the way a TransformerLens user would:
# `run_with_cache`, the logit lens, activation patching, gradients and an nnsight trace, each under a
# mode that carries a state. Every number it shows is checked in the cell that shows it against a
# computation that does not share the code path (the manual's pages on
# [modes and the hook rule](../modes.md) and [the model](../model.md) say why each identity holds).

# %%
import json
import os
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in the page
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's note when ipywidgets is absent

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from transformer_lens import patching

import fbt_probe as fp
from fbt_probe.interventions.edits import set_at
from fbt_probe.tasks import generate, heldout_groups, load_spec

torch.manual_seed(0)
numbers = {"fbt_probe_file": fp.__file__}  # what this run computed, recorded at the end

# %% [markdown]
# ## The model
#
# `fp.load_model` takes a shipped model (`ref:...`), a preset, a checkpoint folder of ours, or a Qwen3
# or nanochat folder. A checkpoint trained with feedback loads with `default_mode = "recurrent:1"`, so
# a call without a mode already includes the feedback path.

# %%
model = fp.load_model("ref:tiny-feedback").eval()
cfg = model.cfg
print(f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.d_vocab} tokens; default mode {model.default_mode}")

# %% [markdown]
# ## A minimal pair
#
# The tasks are minimal pairs: two prompts of the same length that end in the same token and differ
# in the answer. `completion` asks whether `completed` has reached `required`; its answer word is
# `done` or `more`. The pair is drawn from contexts held out of the model's training (the split the
# model's training record names: 20 % of the contexts, seed 0), at length knob 0 (no distractor
# lines).

# %%
HELD_OUT = heldout_groups(["completion", "memory", "registers", "registers-count"], 0.2, 0)
spec = load_spec("completion").replace(length_grid=[0])
pair = generate(spec, groups=1, seed=7, tokenizer=model.tokenizer, contexts=HELD_OUT).iloc[:2]
tokens = torch.tensor(np.stack(pair["token_ids"].to_numpy()))
T = tokens.shape[1]
words = list(spec.label_words)  # label 0, label 1
word_ids = [model.to_single_token(w) for w in words]
labels = pair["label"].to_numpy()
print(pd.DataFrame({"text": pair["text"].str.replace("\n", " | "), "answer": pair["label_word"]}).to_string())
print("tokens:", tokens.shape, model.to_str_tokens(tokens[0]))
token_labels = [t.replace("\n", "⏎") for t in model.to_str_tokens(tokens[1])]  # for the plots' axes


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """The final position's logit of each row's own answer minus the other answer's, [batch]."""
    last = logits[:, -1]
    own = last[torch.arange(len(labels)), [word_ids[y] for y in labels]]
    other = last[torch.arange(len(labels)), [word_ids[1 - y] for y in labels]]
    return own - other


# %% [markdown]
# ## One pair, every mode
#
# | mode | what it computes |
# |---|---|
# | `standard` | one pass; every input is a plain embedding |
# | `recurrent:1` | `standard` over all but the last token, then the last token fused with the previous position's top state |
# | `jacobi:K` | K parallel passes: pass 1 is `standard`, pass k fuses pass k-1's top states shifted one position |
# | `full` | every position from the second on fused with the previous position's top state of the same serial run |
#
# A positive logit difference means the model prefers the sample's own answer. Both samples are
# answered right under `standard` and `recurrent:1`; under `full` this model gives both the same
# answer, as the study finds over many pairs: it answers `completion` at chance under the full
# recurrence.

# %%
MODES = ["standard", "recurrent:1", "jacobi:2", "jacobi:3", "full"]
with torch.no_grad():
    logits = {mode: model(tokens, mode=mode) for mode in MODES}
table = pd.DataFrame(
    {mode: logit_diff(lg).numpy() for mode, lg in logits.items()}, index=[f"label {y}" for y in labels]
)
print(table.round(3).to_string())
fig, ax = plt.subplots(figsize=(6.5, 2.6))
table.T.plot.bar(ax=ax, rot=0)
ax.axhline(0, color="black", lw=0.8)
ax.set_ylabel("logit difference (own − other)")
ax.set_title("One completion pair under each prefill mode")
plt.show()
answers = {mode: [words[int(i)] for i in lg[:, -1, word_ids].argmax(-1)] for mode, lg in logits.items()}
assert answers["standard"] == answers["recurrent:1"] == [words[y] for y in labels]  # both right
assert len(set(answers["full"])) == 1  # one answer for both samples
numbers["logit_diff"] = {mode: [float(v) for v in table[mode]] for mode in MODES}
numbers["tokens"], numbers["labels"] = tokens.tolist(), labels.tolist()

# %% [markdown]
# `full` is the exact recurrence. Without hooks it runs as a lean serial scan; `run_with_cache(...,
# serial=True)` runs the same recurrence step by step through the hooked modules, and the two must
# agree. `jacobi:K` computes the recurrence by K parallel passes instead, and pass k makes the first k
# positions exact: on its first K positions `jacobi:K` must equal `full`, for every K below the pair's
# length T (from K = T on, `jacobi:K` runs as `full`'s scan). The curve is the largest difference from
# `full` over all positions at each K: it falls to 0 as K reaches T.

# %%
with torch.no_grad():
    serial_logits, _ = model.run_with_cache(tokens, mode="full", serial=True, names_filter=lambda name: False)
    serial_gap = float((serial_logits - logits["full"]).abs().max())
    gaps, prefix_gap = [], 0.0
    for K in range(1, T + 1):
        jac = model(tokens, mode=f"jacobi:{K}")
        gaps.append(float((jac - logits["full"]).abs().max()))
        if K < T:  # K genuine parallel passes: the first K positions are exact
            prefix_gap = max(prefix_gap, float((jac[:, :K] - logits["full"][:, :K]).abs().max()))
print(
    f"full, lean scan vs hooked serial run: {serial_gap:.1e}; jacobi:K vs full on its first K positions: {prefix_gap:.1e}"
)
assert serial_gap < 1e-4 and prefix_gap < 1e-4
assert gaps[0] > 0.1 and gaps[-2] > 0  # jacobi:1 is standard; jacobi:(T-1) leaves the last position inexact
fig, ax = plt.subplots(figsize=(5.5, 2.6))
ax.semilogy(range(1, T + 1), np.maximum(gaps, 1e-8), "o-")
ax.set_xlabel("Jacobi passes K")
ax.set_ylabel("max |logits − full|")
ax.set_title(f"jacobi:K reaches full at K = T = {T}")
plt.show()
numbers["jacobi_gap"], numbers["jacobi_prefix_gap"], numbers["full_serial_gap"] = gaps, prefix_gap, serial_gap

# %% [markdown]
# ## The carried state in the cache
#
# `run_with_cache` returns TransformerLens's `ActivationCache` in every mode. Under `recurrent:1` the
# fusion's hooks hold the carried state h (`fusion.hook_feedback`), its value path W_U h
# (`fusion.hook_value`), the token's gate σ(W_G e) (`fusion.hook_gate`) and the fused input
# u = RMSNorm((W_U h) ⊙ σ(W_G e)), which enters block 0 as `blocks.0.hook_resid_pre`. This model
# carries the post-norm top state, so h at the last position is the standard pass's
# `ln_final` output at the position before it. Both identities are checked by hand from the weights.

# %%
with torch.no_grad():
    _, cache = model.run_with_cache(tokens, mode="recurrent:1")
    _, std_cache = model.run_with_cache(tokens, mode="standard")
    h = cache["fusion.hook_feedback"][:, -1]
    top = std_cache["ln_final.hook_normalized"][:, -2] * model.ln_final.weight
    state_err = float((h - top).abs().max())
    value = h @ model.fusion.W_U.weight.T
    gate = torch.sigmoid(model.W_E[tokens[:, -1]] @ model.fusion.W_G.weight.T)
    fused = value * gate
    u = model.fusion.norm.weight * fused / torch.sqrt(fused.pow(2).mean(-1, keepdim=True) + model.fusion.norm.eps)
    fused_err = float((u - cache["blocks.0.hook_resid_pre"][:, -1]).abs().max())
print(f"h(T-1) vs the standard pass's top state at T-2: max |diff| {state_err:.2e}")
print(f"u(T-1) by hand vs blocks.0.hook_resid_pre: max |diff| {fused_err:.2e}")
print(
    "positions that carry a state under recurrent:1:",
    cache["fusion.hook_feedback"].abs().sum(-1)[0].nonzero().flatten().tolist(),
)
assert state_err < 1e-4 and fused_err < 1e-4
assert float(cache["fusion.hook_feedback"][:, :-1].abs().max()) == 0.0  # only the last position is fed
numbers["state_err"], numbers["fused_err"] = state_err, fused_err

# %% [markdown]
# ## The logit lens
#
# Each depth's residual stream at the last position, through the final norm and the unembedding
# (`cache.accumulated_resid(apply_ln=True)` then `model.unembed`): what the model would answer if it
# stopped there. Depth 0 is the model's input. Under `standard` the two samples end in the same token,
# so their depth-0 inputs are identical and the lens reads the same difference for both; under
# `recurrent:1` the input already carries the previous position's state, and the two differ from depth
# 0 on. The last depth is the model's output (checked).

# %%
lens = {}
with torch.no_grad():
    for mode, c in (("standard", std_cache), ("recurrent:1", cache)):
        resid = c.accumulated_resid(apply_ln=True, pos_slice=-1)  # [depth, batch, d_model]
        lens[mode] = torch.stack([logit_diff(model.unembed(r)[:, None]) for r in resid])  # [depth, batch]
        assert float((lens[mode][-1] - logit_diff(logits[mode])).abs().max()) < 1e-4
depth0_spread = {mode: float((lens[mode][0, 0] + lens[mode][0, 1]).abs()) for mode in lens}
# the answers are opposite, so identical inputs give opposite own-minus-other differences
assert depth0_spread["standard"] < 1e-5 and depth0_spread["recurrent:1"] > 0.1, depth0_spread
fig, ax = plt.subplots(figsize=(6, 2.8))
for mode, style in (("standard", "--"), ("recurrent:1", "-")):
    for i, y in enumerate(labels):
        ax.plot(lens[mode][:, i].numpy(), style, marker="o", label=f"{mode}, label {y}")
ax.axhline(0, color="black", lw=0.8)
ax.set_xticks(range(cfg.n_layers + 1))
ax.set_xlabel("depth (0 = input)")
ax.set_ylabel("lens logit difference")
ax.legend(fontsize=8)
plt.show()
numbers["lens"] = {mode: lens[mode].tolist() for mode in lens}

# %% [markdown]
# ## Activation patching with TransformerLens, under a mode
#
# `transformer_lens.patching` runs unchanged: inside `model.mode("recurrent:1")` every call it makes
# runs under that mode, and its hooks follow the exact rule, so a patch at an earlier position reaches
# the carried state as it would in the serial run. The clean run is sample 0, the corrupt run sample 1;
# the metric is sample 0's logit difference in the corrupted run. One cell is recomputed by hand with a
# hook in each chunk of the serial computation (`serial=True`, `model.hook_context` naming the
# positions each chunk covers).

# %%
clean, corrupt = tokens[:1], tokens[1:]
y0 = int(labels[0])


def metric(lg):
    return lg[0, -1, word_ids[y0]] - lg[0, -1, word_ids[1 - y0]]


with torch.no_grad(), model.mode("recurrent:1"):
    _, clean_cache = model.run_with_cache(clean)
    effect = patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)  # [layer, pos]


def serial_patch(layer, p):
    name = f"blocks.{layer}.hook_resid_pre"

    def hook(x, hook):
        ctx = model.hook_context  # the chunk of the serial run this call computes
        if p in ctx.positions:
            x = x.clone()
            x[:, p - ctx.positions.start] = clean_cache[name][:, p]
        return x

    with torch.no_grad():
        return metric(model.run_with_hooks(corrupt, mode="recurrent:1", serial=True, fwd_hooks=[(name, hook)]))


for layer, p in [(cfg.n_layers - 1, T - 2), (2, T - 2), (0, 6)]:
    assert abs(float(effect[layer, p] - serial_patch(layer, p))) < 1e-4, (layer, p)
top = cfg.n_layers - 1
with torch.no_grad():  # the top layer's patch at T-2 in the final pass alone (serial=False)
    one_pass = metric(
        model.run_with_hooks(
            corrupt,
            mode="recurrent:1",
            serial=False,
            fwd_hooks=[
                (
                    f"blocks.{top}.hook_resid_pre",
                    set_at(clean_cache[f"blocks.{top}.hook_resid_pre"][:, T - 2], T - 2, model),
                )
            ],
        )
    )
carried_part = float(effect[top, T - 2] - one_pass)
print(
    f"patch at layer {top}, position T-2: exact {float(effect[top, T - 2]):.3f}, final pass only {float(one_pass):.3f}"
)
assert abs(carried_part) > 0.1  # what reaches the answer through the carried state
fig, ax = plt.subplots(figsize=(7, 2.6))
im = ax.imshow(effect.numpy(), cmap="RdBu", vmin=-abs(effect).max(), vmax=abs(effect).max(), aspect="auto")
ax.set_xticks(range(T), token_labels, rotation=90, fontsize=7)
ax.set_ylabel("layer (resid_pre)")
ax.set_title("clean resid_pre patched into the corrupt run, recurrent:1")
fig.colorbar(im, ax=ax, label="metric")
plt.show()
numbers["patch_effect"] = effect.tolist()
numbers["patch_carried_part"] = carried_part

# %% [markdown]
# ## Gradients through the carried state
#
# A backward hook under a mode that carries a state gets the whole gradient, through the carried state
# too (the exact rule). Checked against central finite differences of the serial run, in float64:
# nudge the residual stream at one position along a random direction inside the serial computation,
# and compare the change in the metric with the hook's gradient.

# %%
m64 = fp.load_model("ref:tiny-feedback").double().eval()
name, p = "blocks.0.hook_resid_post", T - 2
grads = []
with m64.hooks(bwd_hooks=[(name, lambda g, hook: grads.append(g.detach()))]):
    metric(m64(corrupt, mode="recurrent:1")).backward()
grad = grads[0][0]  # [pos, d_model]
direction = torch.randn(cfg.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def nudged(eps):
    def add(x, hook):
        ctx = m64.hook_context
        if p in ctx.positions:
            x = x.clone()
            x[:, p - ctx.positions.start] += eps * direction
        return x

    with torch.no_grad():
        return float(metric(m64.run_with_hooks(corrupt, mode="recurrent:1", serial=True, fwd_hooks=[(name, add)])))


fd = (nudged(1e-5) - nudged(-1e-5)) / 2e-5
analytic = float(grad[p] @ direction)
rel = abs(analytic - fd) / abs(fd)
print(f"d metric / d resid at T-2 along a random direction: hook {analytic:.6f}, finite differences {fd:.6f}")
assert abs(fd) > 1e-3 and rel < 1e-6, (analytic, fd)
fig, ax = plt.subplots(figsize=(6.5, 2.4))
ax.bar(range(T), grad.norm(dim=-1).numpy())
ax.set_xticks(range(T), token_labels, rotation=90, fontsize=7)
ax.set_ylabel("|gradient|")
ax.set_title(f"{name} gradient of the metric, recurrent:1")
plt.show()
numbers["grad_fd"], numbers["grad_hook"] = fd, analytic

# %% [markdown]
# ## nnsight, step by step
#
# nnsight traces the model as well. With `serial=True` the blocks run once per serial step, and
# nnsight's `tracer.iter` reaches each call in order: under `full` there are T calls, one per position.
# Reading the top block's output at every step and joining the steps gives the serial cache's entry;
# zeroing block 0's output inside one step changes the last position's answer through the carried
# state, exactly as the same edit made by a `run_with_hooks(..., serial=True)` hook.

# %%
from nnsight import NNsight  # needed for this section only

nn_model = NNsight(model)
top_name = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
with torch.no_grad(), nn_model.trace(tokens, mode="full", serial=True) as tracer:
    steps = list().save()
    for _ in tracer.iter[:T]:
        steps.append(nn_model.blocks[cfg.n_layers - 1].hook_resid_post.output)
with torch.no_grad():
    _, serial_cache = model.run_with_cache(tokens, mode="full", serial=True)
stitched = torch.cat(list(steps), dim=1)
trace_err = float((stitched - serial_cache[top_name]).abs().max())
print(f"{len(steps)} steps of shape {tuple(steps[0].shape)}; joined vs run_with_cache(serial=True): {trace_err:.2e}")
assert len(steps) == T and trace_err < 1e-4

t = T - 3
with torch.no_grad(), nn_model.trace(tokens, mode="full", serial=True) as tracer:
    for _ in tracer.iter[t]:
        nn_model.blocks[0].hook_resid_post.output[:] = 0.0
    traced = nn_model.output.save()


def zero_at_t(x, hook):
    ctx = model.hook_context
    if t in ctx.positions:
        x = x.clone()
        x[:, t - ctx.positions.start] = 0.0
    return x


with torch.no_grad():
    hooked = model.run_with_hooks(tokens, mode="full", serial=True, fwd_hooks=[("blocks.0.hook_resid_post", zero_at_t)])
moved = float((logit_diff(traced) - logit_diff(logits["full"])).abs().max())
print(f"zeroing block 0 at position {t} moves the final logit difference by up to {moved:.3f}")
assert float((traced - hooked).abs().max()) < 1e-4 and moved > 1e-3
numbers["nnsight_trace_err"], numbers["nnsight_moved"] = trace_err, moved

# %% [markdown]
# ## What this run recorded
#
# The numbers above, written as JSON where the environment variable `FBT_NOTEBOOK_RECORDS` points (a
# folder; unset, nothing is written). The test suite runs this notebook in the checkout and from the
# installed wheel in another folder, and compares the two records.

# %%
out = os.environ.get("FBT_NOTEBOOK_RECORDS")
if out:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "model-and-modes.json").write_text(json.dumps(numbers, indent=1))
print(sorted(numbers))
