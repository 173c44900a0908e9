"""A hand-set model whose answer depends on the carried state by construction, and its cut twin.

The toolkit's ground truth: a causal method is trusted when it finds a planted mechanism and finds
nothing where there is none. Every sample is ``f_1 ... f_n CUE :`` (fillers, then a cue word ``yes``
or ``no``, then the colon every sample ends with); a minimal pair differs only in the cue, and the
answer is ``one`` after ``yes`` and ``zero`` after ``no``. The weights (float64, d_model 8):

- **No position reads another.** Every attention output projection and MLP down projection is zero,
  so each position's top state is its own layer-0 input (h^L_t = x_t). Under ``standard`` the final
  position sees only the colon: its two label logits are equal (LD = 0) for every sample.
- **Embedding** (tied): coordinate 0 is 1 for every input word (a bias), coordinate 1 is +1 for
  ``yes``, -1 for ``no`` (the cue), the fillers have ±1 on one of coordinates 3..7; the answer words
  are ±β on coordinate 2 (the readout), so LD = 2β · (normed top state)[2].
- **Fusion**, u = RMSNorm((W_U s) ⊙ σ(W_G e)) with s the carried post-norm state:
  W_U[0,0] = W_U[1,0] = 1 (the bias, so the value is never zero), W_U[2,1] = 1 and W_U[2,0] = -τ
  (the readout is the carried cue minus a threshold); W_G[1,1] = κ, every other gate weight 0, so
  the gate is 0.5 everywhere except coordinate 1 at a cue word, where it is σ(±κ).

So the final position's LD is a function of the ratio r = s[1]/s[0] of the state carried into it
and nothing else (the norms make it scale-free): LD = 2β(r − τ) / sqrt((2 + (r − τ)²) / 8), up to
the norm's eps (1e-30). A cue at a plain position (the standard prefix of ``recurrent:1``, pass 1
of ``jacobi:2``) gives r = ±1; at a fused position (``full``, ``jacobi:K`` with K ≥ 3) the cue
enters through the gate, r = 2σ(±κ). With τ = 0.5 both give the label's sign in every mode.

**The twin** (`planted_model(cut=True)`) is the same model with the fusion cut: W_U = 0, so the
value path carries nothing and every fused input is exactly 0 (the fusion norm of a zero vector).
The carried state itself is unchanged where it comes from a plain position (under ``recurrent:1``
`fusion.hook_feedback` still holds the cue: decodable, unused), but no edit of the state, the
value, the gate or any residual stream can move the answer, which is LD = 0 for every sample in
every mode. A method that reports an effect on the twin reports something that is not there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.config import ModelConfig
from fbt_probe.model.transformer import FeedbackTransformer

TASK = "planted"
COLON, YES, NO, ZERO, ONE = 0, 1, 2, 3, 4
FILLERS = tuple(range(5, 15))
WORDS = (":", "yes", "no", "zero", "one") + tuple(f"w{i}" for i in range(len(FILLERS)))
D_MODEL = 8
BETA = 8.0  # readout gain: the answer word is the top-1 token in every mode
TAU = 0.5  # readout threshold, between the plain cue code (±1) and the fused one (2σ(±κ) ≈ 2 or 0)
KAPPA = 8.0  # gate gain on the cue coordinate
READOUT, CUE, BIAS = 2, 1, 0


def planted_config(n_layers: int = 2) -> ModelConfig:
    """The planted model's shape: d_model 8, global attention, no depth scaling, float64."""
    return ModelConfig(
        d_vocab=len(WORDS),
        d_model=D_MODEL,
        n_layers=n_layers,
        n_heads=2,
        n_key_value_heads=1,
        d_head=4,
        d_mlp=8,
        n_ctx=256,
        window=None,
        rms_eps=1e-30,
        depth_scaling="none",
        feedback_source="post_norm",
        feedback_noise=0.0,
        fusion_norm_init=1.0,
        dtype="float64",
    )


def embedding() -> torch.Tensor:
    """[d_vocab, d_model] the tied embedding (module doc)."""
    E = torch.zeros(len(WORDS), D_MODEL, dtype=torch.float64)
    E[[COLON, YES, NO, *FILLERS], BIAS] = 1.0
    E[YES, CUE], E[NO, CUE] = 1.0, -1.0
    E[ONE, READOUT], E[ZERO, READOUT] = BETA, -BETA
    for i, f in enumerate(FILLERS):
        E[f, 3 + i % 5] = 1.0 if i < 5 else -1.0
    return E


@torch.no_grad()
def planted_model(cut: bool = False, n_layers: int = 2) -> FeedbackTransformer:
    """The planted model (module doc), or with `cut` its twin whose fusion carries nothing (W_U = 0)."""
    model = FeedbackTransformer(planted_config(n_layers)).eval()
    for p in model.parameters():
        p.zero_()
    for module in model.modules():  # every norm's gain 1 (the QK norms' too)
        if hasattr(module, "eps") and getattr(module, "weight", None) is not None:
            module.weight.fill_(1.0)
    model.embed.weight.copy_(embedding())
    W_U = model.fusion.W_U.weight  # [out, in]: value = W_U @ s
    model.fusion.W_G.weight[CUE, CUE] = KAPPA
    if cut:
        return model
    W_U[BIAS, BIAS] = W_U[CUE, BIAS] = 1.0
    W_U[READOUT, BIAS] = -TAU
    W_U[READOUT, CUE] = 1.0
    return model


def planted_pairs(n_pairs: int = 16, n_fillers: int = 6, seed: int = 0) -> pd.DataFrame:
    """Minimal pairs ``fillers CUE :`` (same fillers, cue yes / no) in the dataset schema
    (docs/tasks.md), each pair its own group; `attrs['label_token_ids']` names the answer words."""
    rng = np.random.default_rng(seed)
    samples = []
    for p in range(n_pairs):
        fill = [int(f) for f in rng.choice(FILLERS, size=n_fillers)]
        samples += [(p, [*fill, cue, COLON], label) for label, cue in ((1, YES), (0, NO))]
    return pair_frame(TASK, WORDS, samples, n_fillers, seed)


def pair_frame(task: str, words, samples, knob: int, seed: int) -> pd.DataFrame:
    """Samples `(pair index, token ids, label)` as a dataset frame (docs/tasks.md), each pair its own
    group, the answer words `zero` / `one` named in `attrs['label_token_ids']`."""
    rows = [
        dict(
            task=task,
            text=" ".join(words[i] for i in ids),
            token_ids=ids,
            label=label,
            label_word=words[ONE if label else ZERO],
            pair_id=f"{task}:{p}",
            group_id=f"{task}:g{p}",
            context_id=f"{task}:g{p}",
            length_knob=knob,
            n_tokens=len(ids),
            seed=seed,
        )
        for p, ids, label in samples
    ]
    df = pd.DataFrame(rows)
    df.attrs["label_token_ids"] = {task: (ZERO, ONE)}
    return df
