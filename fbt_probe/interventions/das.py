"""Distributed alignment search (Geiger et al.): is there a k-dimensional subspace of an activation
that carries the label the model *uses*?

A rotation R (orthogonal, `torch.nn.utils.parametrizations.orthogonal`; its rows are the new basis)
defines the interchange of the first k rotated coordinates between a base and a source activation:

    a' = Rᵀ [ (R a_source)[:k] ; (R a_base)[k:] ]

With k = D this is the full-vector swap; with R = I it swaps the first k coordinates. R is trained so
that the base sample run with a' at the final position outputs the *source* sample's label word
(logistic loss on the two label words); the source is the base's pair partner, in both directions.
Interchange intervention accuracy (IIA) is measured on pairs of held-out groups (grouped CV).

Only the final position is intervened on, so everything before it is computed once: the mode's final
pass over positions 0..T-2 fills a KV cache, and each training step runs the final position alone
(`FinalStep`), which equals the mode's last-position output (tested). Hook rule: one-pass.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal

from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.hooks import hooked
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.engine.schedule import answer_step, run_chunk
from fbt_probe.errors import FbtError
from fbt_probe.modes import Mode


# ----------------------------------------------------------------------------- rotation and interchange
class Rotation(nn.Module):
    """An orthogonal D×D matrix R, started at the identity or at a seeded Haar-random rotation."""

    def __init__(self, d: int, init: str = "random", seed: int = 0, dtype=torch.float32):
        super().__init__()
        # Cayley map: a training step took a third of matrix_exp's time at D = 128
        self.lin = orthogonal(nn.Linear(d, d, bias=False, dtype=dtype), orthogonal_map="cayley")
        with torch.no_grad():
            self.lin.weight = torch.eye(d, dtype=dtype) if init == "identity" else haar(d, seed, dtype)

    @property
    def R(self) -> torch.Tensor:
        """[D, D]; rows are the new basis, the first k span the interchanged subspace."""
        return self.lin.weight


def haar(d: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """A Haar-distributed random rotation (QR of a Gaussian, signs fixed), from `seed`."""
    g = torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def interchange(base: torch.Tensor, source: torch.Tensor, R: torch.Tensor, k: int) -> torch.Tensor:
    """[N, D] activations with the first k rotated coordinates taken from `source` (see module doc)."""
    zb, zs = base @ R.T, source @ R.T
    return torch.cat([zs[..., :k], zb[..., k:]], dim=-1) @ R


def subspace_cosine(rows: torch.Tensor, w: torch.Tensor) -> float:
    """|projection of the unit vector w onto the span of orthonormal `rows` [k, D]|: the cosine of the
    angle between w and the subspace (1 = w lies in it; a random k-subspace gives about sqrt(k/D))."""
    w = w.to(rows) / w.norm()
    return float((rows @ w).norm())


# ----------------------------------------------------------------------------- the final position alone
@dataclass
class FinalStep:
    """The mode's computation of the final position with everything before it frozen.

    cache: the final pass's keys/values of positions 0..T-2; token: [N] the final token; state: [N, D]
    carried into the final position (None where the mode feeds none)."""

    model: object
    cache: KVCache
    token: torch.Tensor
    state: torch.Tensor | None
    T: int

    @classmethod
    @torch.no_grad()
    def build(cls, model, tokens: torch.Tensor, mode: Mode) -> "FinalStep":
        """The frozen prefix is prefix reuse's (`build_prefix` under the one-pass rule, positions
        0..T-2); the final step keeps its own copy of the cache, so that gradients of a training
        step never reach buffers that a later step rewrites."""
        prefix = build_prefix(model, tokens, mode)
        cache, T = prefix.caches[0], tokens.shape[1]
        fed = prefix.states is not None and bool(prefix.has[-1])
        last = prefix.states[:, -1] if fed else None
        valid = lambda bufs: [b.narrow(2, 0, n) for b, n in zip(bufs, cache.lengths)]  # noqa: E731 (buffers hold T)
        cache = KVCache.from_tensors(valid(cache.keys), valid(cache.values), cache.tokens)
        return cls(model, cache, tokens[:, -1], last, T)

    def __call__(self, hooks=()) -> torch.Tensor:
        """[N, d_vocab] logits of the final position, with `hooks` (fired once, context `step`)."""
        m = self.model
        cache = KVCache.from_tensors(
            self.cache.keys, self.cache.values, self.cache.tokens
        )  # the first append grows into new buffers
        with m.hooks(fwd_hooks=list(hooks)):
            chunk = answer_step(self.T, self.state is not None)
            return run_chunk(m, chunk, m.step, self.token, cache, self.state, hooked)[0]

    def repeat(self, m: int) -> "FinalStep":
        """The same computation for m stacked copies of the batch (block j = rows j·N .. (j+1)·N - 1)."""
        if m == 1:
            return self
        rep = lambda t: None if t is None else t.repeat((m,) + (1,) * (t.dim() - 1))  # noqa: E731
        return FinalStep(
            self.model,
            KVCache.from_tensors(
                [rep(k) for k in self.cache.keys], [rep(v) for v in self.cache.values], rep(self.cache.tokens)
            ),
            rep(self.token),
            rep(self.state),
            self.T,
        )

    @torch.no_grad()
    def activation(self, name: str) -> torch.Tensor:
        """[N, ...] the unpatched activation of hook `name` at the final position."""
        store = {}

        def grab(x, hook=None):
            store["x"] = x[:, 0].detach().clone()
            return x

        self([(name, grab)])
        if "x" not in store:
            raise FbtError(
                f"das: hook {name} does not fire at the final position under this mode "
                "(fusion hooks need a mode that feeds the final position)"
            )
        return store["x"]


def replace_hook(values_fn):
    """Hook that sets the final position (a [N, 1, ...] step tensor) to values_fn() ([N, ...])."""

    def hook(x, hook=None):
        return values_fn().to(x.dtype)[:, None]

    return hook


@contextlib.contextmanager
def frozen(model):
    """The model's parameters without gradients for the duration (only the rotation trains)."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)


# ----------------------------------------------------------------------------- training
@dataclass
class Examples:
    """Interchange examples of one batch: row i is the base, `src` its source (the partner)."""

    step: FinalStep
    acts: torch.Tensor  # [N, D] unpatched activation at the hook, final position
    src: torch.Tensor  # [N] source row of each base row
    target: torch.Tensor  # [N] the source's label word
    other: torch.Tensor  # [N] the other label word
    rows: torch.Tensor  # [N] bool: rows used (the fold's pairs)


def intervened_logits(ex: Examples, R: torch.Tensor, k: int, name: str) -> torch.Tensor:
    rows = torch.nonzero(ex.rows, as_tuple=True)[0]
    new = ex.acts.clone()
    new[rows] = interchange(ex.acts[rows], ex.acts[ex.src[rows]], R, k).to(new.dtype)
    return ex.step([(name, replace_hook(lambda: new))])


def fit_rotations(
    ex: Examples, name: str, jobs: list[tuple[torch.Tensor, int, int]], steps: int = 200, lr: float = 1e-2, model=None
) -> list[tuple[Rotation, float]]:
    """Train one rotation per job (rows: bool [N], the rows it trains on; k; seed of its random start) so
    that its k-dim interchange gives the source's label: loss = mean over the job's rows of
    −log σ(logit[source label] − logit[other label word]). The jobs share one forward and one
    backward per step (the batch repeated once per job); their losses are independent and Adam is
    elementwise, so each rotation trains as it would alone. Returns [(rotation, final loss)]."""
    M, (N, D) = len(jobs), ex.acts.shape
    rots = [Rotation(D, "random", seed, ex.acts.dtype).to(ex.acts.device) for _, _, seed in jobs]
    opt = torch.optim.Adam([p for r in rots for p in r.parameters()], lr=lr)
    step = ex.step.repeat(M)
    masks = torch.stack([rows for rows, _, _ in jobs]).to(ex.acts.device)  # [M, N]
    weight = (masks / masks.sum(1, keepdim=True).clamp(min=1)).reshape(-1)
    idx = torch.arange(M * N, device=ex.acts.device)
    tgt, oth = ex.target.repeat(M), ex.other.repeat(M)
    losses = torch.full((M,), float("nan"))
    with frozen(model or ex.step.model), torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            new = ex.acts.repeat(M, 1)
            for j, (rows, k, _) in enumerate(jobs):
                r = torch.nonzero(rows, as_tuple=True)[0]
                new[j * N + r] = interchange(ex.acts[r], ex.acts[ex.src[r]], rots[j].R, k).to(new.dtype)
            logits = step([(name, replace_hook(lambda: new))])
            ld = logits[idx, tgt] - logits[idx, oth]
            per_job = (nn.functional.softplus(-ld) * weight).view(M, N).sum(1)
            per_job.sum().backward()
            opt.step()
            losses = per_job.detach()
    return [(rot, float(loss)) for rot, loss in zip(rots, losses)]


def fit_rotation(
    ex: Examples, name: str, k: int, steps: int = 200, lr: float = 1e-2, seed: int = 0, model=None
) -> tuple[Rotation, float]:
    """One rotation on the rows `ex.rows` (see `fit_rotations`)."""
    return fit_rotations(ex, name, [(ex.rows, k, seed)], steps, lr, model)[0]


@torch.no_grad()
def iia(examples: list[Examples], R: torch.Tensor, k: int, name: str) -> np.ndarray:
    """[used rows] 1 where the intervened top-1 over the vocabulary is the source's label word."""
    out = []
    for ex in examples:
        logits = intervened_logits(ex, R, k, name)
        out.append((logits.argmax(-1) == ex.target)[ex.rows].double().cpu().numpy())
    return np.concatenate(out) if out else np.array([])
