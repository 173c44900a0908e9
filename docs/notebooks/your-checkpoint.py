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
# # Your own checkpoint
#
# **Needs**: `pip install torch fbt-probe tiktoken rustbpe` and Jupyter. tiktoken and rustbpe only
# make the stand-in tokenizer below the way nanochat makes its own; with your checkpoint you already
# have its `tokenizer.pkl`. Nothing is downloaded.
# **Takes**: about 30 s on 2 CPU cores (AMD EPYC; measured as the kernel's CPU time, 30 s, half of it
# the quick study).
#
# A nanochat latent-feedback checkpoint (the reproduction's `model_<step>.pt` + `meta_<step>.json`,
# its tokenizer in nanochat's base folder) goes through the same study as the shipped models, in its
# own tokenizer: import it, generate the tasks in its tokens, run the quick study from Python, and put
# a sparse autoencoder on its carried state. The checkpoint here is a stand-in with random weights, so
# its numbers say nothing about a trained model; replace `CHECKPOINT` with yours
# ([checkpoints](../checkpoints.md) says what the import reads and refuses).

# %%
import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in the page
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's note when ipywidgets is absent

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import rustbpe
import tiktoken
import torch
from IPython.display import Image, display

import fbt_probe as fp
from fbt_probe.formats.nanochat.checkpoint import config_from_meta, read_model_config, to_theirs, write_import
from fbt_probe.formats.nanochat.model import NanochatTransformer
from fbt_probe.formats.nanochat.tokenizer import find_tokenizer
from fbt_probe.loading import load_pairs
from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.pipeline import reproduce
from fbt_probe.sae import SAETrainConfig, train_sae
from fbt_probe.sae.data import collect
from fbt_probe.sae.hooked import with_sae_methods
from fbt_probe.tasks import (
    generate,
    heldout_groups,
    load_spec,
    load_tokenizer,
    tokenizer_sha256,
    training_documents,
    write_dataset,
)

numbers = {"fbt_probe_file": fp.__file__}  # what this run computed, recorded at the end
base = Path(tempfile.mkdtemp(prefix="nanochat-"))  # stands in for ~/.cache/nanochat

# %% [markdown]
# ## A stand-in nanochat checkpoint
#
# nanochat trains a byte-level BPE with rustbpe (its split pattern, its special tokens numbered after
# the ranks) and saves it as a pickled `tiktoken.Encoding` in `<base>/tokenizer/tokenizer.pkl`. A small
# one is trained here the same way, on task text with its answers, so that the answer words (` done`,
# ` more`, ...) are single tokens, as they are in a web-text tokenizer.

# %%
SPLIT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
SPECIAL += ["<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]
texts = [d["text"] + " " + d["label_word"] for d in training_documents(["completion", "memory"], n=400, seed=0)]
bpe = rustbpe.Tokenizer()
bpe.train_from_iterator(iter(texts), 1024 - len(SPECIAL), pattern=SPLIT)
ranks = {bytes(k): v for k, v in bpe.get_mergeable_ranks()}
enc = tiktoken.Encoding(
    name="rustbpe",
    pat_str=bpe.get_pattern(),
    mergeable_ranks=ranks,
    special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIAL)},
)
(base / "tokenizer").mkdir()
(base / "tokenizer" / "tokenizer.pkl").write_bytes(pickle.dumps(enc))
print(f"{enc.n_vocab} token ids; ' done' -> {enc.encode_ordinary(' done')}, ' more' -> {enc.encode_ordinary(' more')}")

# %% [markdown]
# The checkpoint: nanochat's `GPTConfig` as `meta_<step>.json` and the state dict as `model_<step>.pt`,
# here 4 layers of width 64 with its gated (`gate_product`) latent feedback, every matrix drawn at its
# 1/√fan-in scale (random weights: a stand-in for a trained run). `to_theirs` gives the tensor names
# and shapes nanochat's `GPT` has.

# %%
meta = {
    "sequence_len": 512,
    "vocab_size": enc.n_vocab,
    "n_layer": 4,
    "n_head": 4,
    "n_kv_head": 2,
    "n_embd": 64,
    "window_pattern": "SSSL",
    "latent_feedback": True,
    "latent_feedback_mode": "gate_product",
    "weight_tying": False,
}
shapes = to_theirs(NanochatTransformer(config_from_meta(read_model_config({"model_config": meta}, "meta"), "meta")))
g = torch.Generator().manual_seed(0)


def scale(name: str, t: torch.Tensor) -> float:
    if "wte" in name or "value_embeds" in name:
        return 0.8  # embedding rows
    return t.shape[-1] ** -0.5 if t.dim() == 2 else 0.3  # a matrix at 1/sqrt(fan-in); the scalar mixes


state = {name: torch.randn(t.shape, generator=g) * scale(name, t) for name, t in shapes.items()}
state["resid_lambdas"] = 1 + 0.2 * torch.randn(meta["n_layer"], generator=g)
CHECKPOINT = base / "base_checkpoints" / "d4"
CHECKPOINT.mkdir(parents=True)
torch.save(state, CHECKPOINT / "model_000100.pt")
(CHECKPOINT / "meta_000100.json").write_text(json.dumps({"step": 100, "model_config": meta}))
print(sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()))

# %% [markdown]
# ## Import it, with its tokenizer
#
# `write_import` is what `fbt-probe model import-nanochat CHECKPOINT OUT` runs: it finds the tokenizer
# in nanochat's layout (two folders up, then `tokenizer/`), reads the pickle without running pickled
# code, converts it to a `tokenizer.json` that encodes as tiktoken does, checks that it fits the
# checkpoint's vocabulary, and writes a checkpoint folder of ours. Two checks: the weights survive the
# import bit for bit (nanochat pads the embedding to a multiple of 64 rows and keeps the matrices of
# the fusion variants it does not use; the import leaves both out), and the folder and nanochat's own
# folder (which `load_model` also reads) give the same logits.

# %%
model_dir = base / "runs" / "d4"
model_dir.mkdir(parents=True)
record, notes = write_import(CHECKPOINT, model_dir, tokenizer=find_tokenizer(CHECKPOINT))
model = fp.load_model(str(model_dir)).eval()
print(f"imported step {record['step']}, {record['tokenizer']['n_ids']} token ids, BOS {record['tokenizer']['bos_id']}")
print(f"{type(model).__name__}, default mode {model.default_mode}; notes: {notes or 'none'}")

back, V = to_theirs(model), meta["vocab_size"]
for name, t in state.items():  # the dormant fusion variants are left out; embedding rows past V are padding
    if name not in record["dormant_fusion_tensors"]:
        rows = slice(0, V) if t.shape[0] > V else slice(None)
        assert torch.equal(back[name][rows], t[rows]), name
print(f"every active tensor kept exactly; left out: {record['dormant_fusion_tensors']}")
text = "required = 4\ncompleted = 9\nscratch = 57\nStatus:"
ids = model.to_tokens(text)  # the imported folder's tokenizer, with nanochat's BOS first
with torch.no_grad():
    direct = fp.load_model(str(CHECKPOINT))(ids, mode="recurrent:1")  # their folder holds no tokenizer.json
    imported = model(ids, mode="recurrent:1")
load_gap = float((direct - imported).abs().max())
print(model.to_str_tokens(text))
print(f"logits, imported folder vs nanochat's folder: max |diff| {load_gap:.1e}")
assert load_gap < 1e-5
numbers["load_gap"] = load_gap

# %% [markdown]
# ## The tasks in its tokens
#
# `generate(..., tokenizer=...)` encodes each sample with the model's own tokenizer, with its BOS, and
# refuses a label word that is not one token after the query. Every sample's ids are checked against
# tiktoken, the encoding nanochat itself uses.

# %%
tok = load_tokenizer(model_dir)
HELD_OUT = heldout_groups(["completion", "memory", "registers", "registers-count"], 0.2, 0)
df = generate(load_spec("completion").replace(length_grid=[8]), groups=12, seed=101, tokenizer=tok, contexts=HELD_OUT)
write_dataset(df, base / "data", tok)
pairs = load_pairs(base / "data")
bos = enc.encode_single_token("<|bos|>")
assert all(list(ids) == [bos, *enc.encode_ordinary(t)] for t, ids in zip(pairs["text"], pairs["token_ids"]))
label_ids = pairs.attrs["label_token_ids"]["completion"]
assert list(label_ids) == [enc.encode_single_token(" " + w) for w in load_spec("completion").label_words]
n_tokens = pairs["token_ids"].map(len)
print(
    f"{len(pairs)} samples of {n_tokens.min()}-{n_tokens.max()} tokens; answers {[enc.decode([i]) for i in label_ids]}"
)

# %% [markdown]
# ## The quick study, from Python
#
# `reproduce(ReproConfig(model=...))` is `fbt-probe reproduce --model PATH`; the quick form runs every
# stage in minutes (probe datasets in the model's tokenizer, activations, probes, the causal
# experiments, figures and the report). It is restricted here to `completion` at 8 distractor lines,
# under `standard` and `recurrent:1`, and without attribution patching, DAS, the lens and SAEs
# (`methods=False`). A checkpoint imported without a training record is studied on contexts it never
# saw, and the report says it was not trained on these tasks by this toolkit. With no `--baseline` the
# report also says that no number is read beside a model without trained feedback.

# %%
modes = ["standard", "recurrent:1"]
study_cfg = ReproConfig.quick_config(
    model=str(model_dir),
    methods=False,
    knobs={"completion": [8]},
    modes={"completion": modes},
    patch_knobs={"completion": [8]},
)
study = base / "study"
reproduce(study_cfg, study, echo=print)
report = (study / "report.md").read_text()
print("\n".join(report.splitlines()[:12]))
display(Image(filename=str(study / "figures" / "fig7a-feedback.png"), width=640))

# %% [markdown]
# What to check in a study of your own model: its datasets were made with the model's tokenizer (each
# manifest records the tokenizer's sha256, and every command refuses a dataset made with another), and
# depth 0 under `standard` is at chance (every sample ends in the same token, so a depth-0 probe that
# reads more than 0.5 would mean the samples leak their label some other way).

# %%
sha = tokenizer_sha256(tok)
manifests = [json.loads(p.read_text()) for p in (study / "data").glob("*.manifest.json")]
assert manifests and all(m["tokenizer"]["sha256"] == sha for m in manifests)
assert f"sha256 {sha[:12]}..." in report and "not trained on these tasks by this toolkit" in report
probes = pd.read_parquet(study / "results" / "probes" / "feedback" / "completion" / "probes_samples.parquet")
depth0 = float(probes[(probes["mode"] == "standard") & (probes["depth"] == 0)]["correct"].mean())
print(f"depth 0 under standard: {depth0:.3f} held-out accuracy over {probes['group_id'].nunique()} groups")
assert abs(depth0 - 0.5) < 1e-12
headline = pd.read_csv(study / "headline.csv")
print(headline[["quantity", "task", "mode", "value", "ci_low", "ci_high"]].head(8).to_string(index=False))
numbers["study_depth0_standard"] = depth0
numbers["study_headline"] = headline[["quantity", "task", "mode", "value"]].to_dict(orient="records")

# %% [markdown]
# ## A sparse autoencoder on the carried state
#
# `collect` gathers the carried state (`fusion.hook_feedback`) at every position a mode feeds: under
# `jacobi:2` every position from the second on gets the standard pass's top state, the same map
# `recurrent:1` applies at the last position. `train_sae` fits a TopK SAE on it (k = 8 active latents of
# 256), and `with_sae_methods` gives the model SAELens's calls: `run_with_saes`,
# `run_with_cache_with_saes`. Three checks: with the error term the model's output is unchanged; without
# it the state is replaced by its reconstruction, the same as a hook doing that by hand; the cached
# latents are the SAE's encoding of the state.

# %%
data, index = collect(model, pairs, "fusion.hook_feedback", mode="jacobi:2", positions="fed")
sae, train_record = train_sae(
    data, SAETrainConfig(k=8, expansion=4, steps=300, seed=0), metadata={"hook_name": "fusion.hook_feedback"}
)
with torch.no_grad():
    z = sae.encode(data)
    fvu = float((data - sae.decode(z)).pow(2).sum() / (data - data.mean(0)).pow(2).sum())
    l0 = float((z > 0).sum(-1).float().mean())
print(f"{len(data)} states of width {data.shape[1]}: fraction of variance unexplained {fvu:.3f}, L0 {l0:.1f}")
assert 0 < fvu < 1 and l0 <= 8

model = with_sae_methods(model)
lengths = pairs["token_ids"].map(len)
tokens = torch.tensor(np.stack(pairs["token_ids"][lengths == lengths.iloc[0]].to_numpy()[:8]))  # one length: one batch
with torch.no_grad():
    plain = model(tokens, mode="recurrent:1")
    same = model.run_with_saes(tokens, saes=[sae], mode="recurrent:1", use_error_term=True)
    recon = model.run_with_saes(tokens, saes=[sae], mode="recurrent:1")
    by_hand = model.run_with_hooks(
        tokens, mode="recurrent:1", fwd_hooks=[("fusion.hook_feedback", lambda x, hook: sae.decode(sae.encode(x)))]
    )
    _, cache = model.run_with_cache_with_saes(tokens, saes=[sae], mode="recurrent:1")
    _, plain_cache = model.run_with_cache(tokens, mode="recurrent:1", names_filter="fusion.hook_feedback")
    latents = cache["fusion.hook_feedback.hook_sae_acts_post"][:, -1]
    encoded = sae.encode(plain_cache["fusion.hook_feedback"][:, -1])
checks = {
    "error term: output unchanged": float((same - plain).abs().max()),
    "reconstruction vs by hand": float((recon - by_hand).abs().max()),
    "cached latents vs encode": float((latents - encoded).abs().max()),
}
print(pd.Series(checks).map("{:.1e}".format).to_string())
moved = float((recon - plain)[:, -1].abs().max())
print(f"the reconstruction moves the last position's logits by up to {moved:.3f}")
assert max(checks.values()) < 1e-5 and moved > 1e-4

fig, ax = plt.subplots(figsize=(6, 2.4))
ax.bar(range(latents.shape[1]), (latents > 0).float().mean(0).numpy())
ax.set_xlabel("latent")
ax.set_ylabel("share of samples active")
ax.set_title("TopK SAE latents at the last position, recurrent:1")
plt.show()
numbers["sae_fvu"], numbers["sae_l0"], numbers["sae_checks"] = fvu, l0, checks

# %% [markdown]
# ## With your own checkpoint
#
# Point `CHECKPOINT` at your nanochat folder (its tokenizer beside it in nanochat's layout, or pass
# `tokenizer=` to `write_import`), skip the two stand-in cells, and drop `methods=False` and the task
# restriction for the whole quick study; `ReproConfig.demo_config(model=..., baseline=...)` is
# `reproduce --demo`, with your no-feedback baseline beside the model.
#
# ## What this run recorded
#
# The numbers above, written as JSON where the environment variable `FBT_NOTEBOOK_RECORDS` points (a
# folder; unset, nothing is written). The test suite reads them.

# %%
out = os.environ.get("FBT_NOTEBOOK_RECORDS")
if out:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "your-checkpoint.json").write_text(json.dumps(numbers, indent=1, default=float))
print(sorted(numbers))
