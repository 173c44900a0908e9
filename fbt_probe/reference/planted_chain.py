"""A planted serial chain: an answer the carried state composes over many positions, and a twin that
answers from the tokens alone.

`fbt_probe.reference.planted` plants a one-step mechanism (the cue sits one position before the
answer). Here every sample is ``c_1 ... c_m :`` (m cue words, each ``yes`` or ``no``, then the
colon); the answer is the parity of the number of ``yes``: ``one`` when it is odd, ``zero`` when it
is even. A minimal pair differs only in the FIRST cue, m positions before the answer, so its label
differs and the difference must travel through m - 1 fusions to reach the answer. The weights
(float64, d_model 8; attention and MLP zero in the chain model, so h^L_t = x_t):

- **Coordinates.** A state's evidence for an even count is E(s) = s[0] + s[1], for an odd count
  O(s) = s[2] + s[3]. A fused position writes the evidence kept in 0 and 2 (E and O, through the
  "stay" gates) and the evidence swapped in 1 and 3 (O and E, through the "flip" gates); 4 is the
  readout, 5 the cue (±1), 6 a bias every cue word has, 7 spare (the twin's attention writes there).
- **Embedding** (tied): ``yes`` = e_2 + e_5 + e_6 (odd, cue +1), ``no`` = e_0 - e_5 + e_6 (even,
  cue -1), the colon is the zero vector, the answer words are ±β e_4 (LD = 2β · normed top[4]).
- **Fusion**, u = RMSNorm((W_U s) ⊙ σ(W_G e)): the value is (E, O, O, E, O − E, 0, 0, 0)
  (rows W_U[0] = W_U[3] = e_0 + e_1, W_U[1] = W_U[2] = e_2 + e_3, W_U[4] = e_2 + e_3 − e_0 − e_1); the
  gate reads the cue only, W_G[0, 5] = W_G[2, 5] = −κ and W_G[1, 5] = W_G[3, 5] = +κ, so a ``no``
  opens the stay coordinates (σ(κ)) and closes the flip ones (σ(−κ)), a ``yes`` does the reverse,
  and at the colon (cue 0) every gate is 1/2.

So a fused cue c (±1) maps the carried (E, O) to E' = σ(−κc)E + σ(κc)O, O' = σ(−κc)O + σ(κc)E: the sum
E + O is kept exactly (σ(x) + σ(−x) = 1) and the difference is multiplied by +ρ after ``no`` and
−ρ after ``yes``, ρ = σ(κ) − σ(−κ) = tanh(κ/2). Every norm only rescales the whole vector, so
r = (O − E)/(O + E) of the state is the carried variable, and a plain cue (its own embedding,
normed) starts it at +1 (``yes``) or −1 (``no``). A chain over the last n cues, the first plain and
the other n − 1 fused, gives

    r_n = (−1)^(Y_n + 1) ρ^(n − 1),     Y_n = the number of ``yes`` among the last n cues,

and the colon, fed that state (gate 1/2 on every coordinate), answers

    LD = logit(one) − logit(zero) = 2β r_n sqrt(8 / (1 + 2 r_n²))

up to the norms' eps (1e-30). n is what the mode lets the chain reach: position 0 is always plain,
``recurrent:k`` fuses the last k positions (n = k), ``jacobi:K`` reaches K − 1 positions back
(n = min(K − 1, m)), ``full`` all of them (n = m), and ``standard`` none: its colon is the zero
vector and LD = 0 for every sample. A pair's two samples differ only in c_1, so they have
different answers exactly when n = m: under ``full``, ``recurrent:m`` and ``jacobi:K`` with
K ≥ m + 1 = T. With one step fewer (``jacobi:m``, ``recurrent:m-1``) the chain misses c_1 and the
pair's two LDs are equal. The magnitude ρ^(m−1) is about 0.997 for κ = 8, m = 6.

Why parity through a split code and not a sign carried in one coordinate: the gate is positive
(σ > 0), so no gate can flip a coordinate's sign; the flip is made by routing, the value writing
each evidence to the other's flip copy, and the gate choosing which copy passes. The sum E + O is
a conserved normaliser, so the chain neither grows nor decays except by ρ per step, and the
closed form stays exact for any m.

**The token twin** (`token_twin()`) answers from the tokens by attention and has no state path:
W_U = 0 (every fused input is exactly 0, the fusion norm of a zero vector), the gate as above, and
layer 0's attention uniform (W_Q = W_K = 0) over the causal prefix, its values reading the cue and
the bias of the normed input, its output writing Σ c_t to the readout and the count of cue words
to coordinate 7. The colon's input is 0 in every mode (fused and cut, or plain and the zero
embedding), so its top state is the attention output alone: LD = 2β q sqrt(8 / (1 + q²)), with
q = the mean cue (±1) over the positions that are plain in the mode. Under ``full`` and
``jacobi:K`` (K ≥ 2) only position 0 is plain: q = c_1, the token the pair differs in, LD = ±32,
so every pair's two LDs are 64 logits apart. The twin cannot answer the parity: with the fusion cut
the tokens at fused positions are never seen. On pairs whose other cues hold an even number of
``yes`` (`chain_pairs(rest_even=True)`) c_1 is the label, so the twin answers every sample right and
every pair's gap, oriented to the label, is +64 in those modes (and positive in every mode, LD
rising with q); on other pairs it answers wrong, a gap of −64, which a summary's mean gap would
average away. It is the control for the opposite error: its answer
differs between the samples of every pair, yet no edit of the carried state, the value, the gate
or the fusion's output can move it (the colon's plain input is the fused one, 0, so even
bypassing the fusion moves nothing). Residual patching finds the token path only (position 0 at
depth 0 and the colon after layer 0), never the positions in between.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from fbt_probe.config import ModelConfig
from fbt_probe.model.transformer import FeedbackTransformer
from fbt_probe.reference.planted import BETA, COLON, KAPPA, NO, ONE, YES, ZERO, pair_frame, planted_config

TASK = "planted-chain"
WORDS = (":", "yes", "no", "zero", "one")
READOUT, CUE, BIAS, COUNT = 4, 5, 6, 7
N_CUES = 6


def chain_config(n_layers: int = 2) -> ModelConfig:
    """The planted model's shape (`planted_config`) with this vocabulary (five words)."""
    return dataclasses.replace(planted_config(n_layers), d_vocab=len(WORDS))


def chain_embedding() -> torch.Tensor:
    """[d_vocab, d_model] the tied embedding (module doc)."""
    E = torch.zeros(len(WORDS), 8, dtype=torch.float64)
    E[YES, 2], E[NO, 0] = 1.0, 1.0
    E[YES, CUE], E[NO, CUE] = 1.0, -1.0
    E[YES, BIAS] = E[NO, BIAS] = 1.0
    E[ONE, READOUT], E[ZERO, READOUT] = BETA, -BETA
    return E


def _bare(n_layers: int) -> FeedbackTransformer:
    """Every weight 0 but the norms' gains (1), the embedding and the gate (module doc)."""
    model = FeedbackTransformer(chain_config(n_layers)).eval()
    for p in model.parameters():
        p.zero_()
    for module in model.modules():
        if hasattr(module, "eps") and getattr(module, "weight", None) is not None:
            module.weight.fill_(1.0)
    model.embed.weight.copy_(chain_embedding())
    G = model.fusion.W_G.weight  # [out, in]: gate = σ(W_G e)
    G[0, CUE] = G[2, CUE] = -KAPPA  # stay: open after `no` (cue -1)
    G[1, CUE] = G[3, CUE] = KAPPA  # flip: open after `yes` (cue +1)
    return model


def set_chain_fusion(model: FeedbackTransformer) -> None:
    """W_U of the chain (module doc): value (E, O, O, E, O − E, 0, 0, 0) with E = s[0] + s[1], O = s[2] + s[3]."""
    W = model.fusion.W_U.weight  # [out, in]: value = W_U @ s
    W.zero_()
    W[0, 0] = W[0, 1] = W[3, 0] = W[3, 1] = 1.0  # E
    W[1, 2] = W[1, 3] = W[2, 2] = W[2, 3] = 1.0  # O
    W[READOUT, 2] = W[READOUT, 3] = 1.0
    W[READOUT, 0] = W[READOUT, 1] = -1.0


@torch.no_grad()
def chain_model(cut: bool = False, n_layers: int = 2) -> FeedbackTransformer:
    """The planted chain (module doc), or with `cut` the same with W_U = 0 (the chain removed)."""
    model = _bare(n_layers)
    if not cut:
        set_chain_fusion(model)
    return model


@torch.no_grad()
def token_twin(state_path: bool = False, n_layers: int = 2) -> FeedbackTransformer:
    """The token twin (module doc): the answer by attention from the tokens, W_U = 0. With
    `state_path` the chain's W_U is put back (a twin that is no longer one: the control's mutation)."""
    model = _bare(n_layers)
    attn = model.blocks[0].attn
    attn.v_proj.weight[0, CUE] = 1.0  # the one KV head: dim 0 the cue, dim 1 the bias
    attn.v_proj.weight[1, BIAS] = 1.0
    attn.o_proj.weight[READOUT, 0] = 1.0  # head 0 (z dims 0..3) writes Σ cue / T and the count / T
    attn.o_proj.weight[COUNT, 1] = 1.0
    if state_path:
        set_chain_fusion(model)
    return model


def chain_pairs(n_pairs: int = 16, n_cues: int = N_CUES, seed: int = 0, rest_even: bool = False) -> pd.DataFrame:
    """Minimal pairs ``c_1 ... c_m :`` differing only in c_1 (the other cues random, shared), in
    the dataset schema (docs/tasks.md), each pair its own group; `attrs['label_token_ids']` names
    the answer words. label = the parity of the number of ``yes`` (1: odd). `rest_even`: the other
    cues hold an even number of ``yes``, so the label is c_1 itself, the twin's answer (module doc):
    on such pairs the twin answers every sample right and every pair's gap is positive."""
    if n_cues < 2:
        raise ValueError(f"n_cues: a chain needs at least 2 cues, got {n_cues}")
    rng = np.random.default_rng(seed)
    samples = []
    for p in range(n_pairs):
        bits = rng.integers(0, 2, size=n_cues - 1)
        if rest_even:
            bits[-1] = bits[:-1].sum() % 2
        rest = [YES if b else NO for b in bits]
        for first in (YES, NO):
            ids = [first, *rest, COLON]
            samples.append((p, ids, sum(i == YES for i in ids) % 2))
    return pair_frame(TASK, WORDS, samples, n_cues, seed)
