"""Feature-level causal tests on the carried state, through an SAE trained on its hook.

Every test reads the hook at the final position T−1 of each minimal pair (`pair_batches`): for the
feedback channel (`fusion.hook_feedback`) the state h_{T−2} that the mode carries into the answer
position. With codes z = encode(h), reconstruction error e = h − decode(z) and a latent set S:

- **feature swap** (denoising, as the feedback swap): row i's partner p runs with
  h_p + Σ_{j∈S} (z_ij − z_pj) W_dec[j] — only the latents in S take row i's values, the partner's
  error term stays. normalized = 1: the answer follows row i as fully as under the logit-difference
  scale of the pair. S = every latent gives h_i − e_i + e_p: the full-state swap up to the two rows'
  reconstruction errors (`state`, the full swap, is run beside it).
- **feature ablation** (noising, on the row's own run): z_S set to 0 (`zero`) or to its mean over
  the dataset's final positions (`mean`): h_i + Σ_{j∈S} (a_j − z_ij) W_dec[j]. 1 = no effect.
- **label latents**: per task, latents ranked by the mean |z_ij − z_pj| over pairs. The ranking
  used on a pair comes from the other half of the groups (two folds by group, cross-fitted), so
  no latent is chosen on the pairs it is scored on; `random` swaps k latents drawn at random
  (seeded) from those active in either row of some pair, the control at the same k.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fbt_probe.interventions.edits import capture, set_at
from fbt_probe.interventions.metrics import score
from fbt_probe.interventions.pairs import PairBatch, label_token_ids, pair_batches
from fbt_probe.modes import Mode

KS = (1, 2, 4, 8, 16, 32)


def fold_of(group_ids) -> np.ndarray:
    """Two folds by group: the group ids' ranks, alternating (every group wholly in one fold)."""
    g = np.asarray(group_ids)
    uniq = np.unique(g)
    rank = {v: i for i, v in enumerate(uniq)}
    return np.array([rank[v] % 2 for v in g])


@torch.no_grad()
def final_states(model, batches: list[PairBatch], hook: str, mode: Mode):
    """[(batch, clean final logits [N, V], hook value at T−1 [N, d])] of every batch."""
    out = []
    for b in batches:
        store: dict = {}
        logits = model.run_with_hooks(
            b.tokens, mode=mode, serial=False, fwd_hooks=[(hook, capture(store, hook, model, b.T - 1))]
        )
        out.append((b, logits[:, -1], store[hook]))
    return out


@torch.no_grad()
def rankings(sae, runs, fold: bool = True) -> dict:
    """{(task, fold): latent order chosen on the OTHER fold's pairs} (fold=False: {task: order on all})."""
    by_task: dict = {}
    for b, _, h in runs:
        task = str(b.meta["task"].iloc[0])
        z = sae.encode(h.to(sae.W_enc.dtype))
        f = fold_of(b.meta["group_id"].to_numpy())
        by_task.setdefault(task, []).append((z, b.partner.cpu(), f))
    out = {}
    for task, items in by_task.items():
        if not fold:
            diffs = torch.cat([(z - z[p]).abs() for z, p, _ in items])
            out[task] = latent_ranking_from_diff(diffs)
            continue
        for held in (0, 1):
            diffs = [((z - z[p]).abs())[torch.as_tensor(f != held)] for z, p, f in items]
            d = torch.cat(diffs) if diffs else torch.zeros(0)
            out[(task, held)] = latent_ranking_from_diff(d)
    return out


def latent_ranking_from_diff(diffs: torch.Tensor) -> np.ndarray:
    """Latents by mean |z_i − z_partner(i)| over the rows given, largest first (ties: lower index)."""
    mean = diffs.double().mean(0).numpy() if len(diffs) else np.zeros(diffs.shape[-1])
    return np.lexsort((np.arange(mean.size), -mean))


def _edited(sae, h_base, z_base, z_new, S: torch.Tensor) -> torch.Tensor:
    """h_base + Σ_{j∈S} (z_new − z_base)_j W_dec[j]; S: [N, d_sae] 0/1 mask."""
    return h_base + ((z_new - z_base) * S) @ sae.W_dec.double()


def _mask(order_rows: list[np.ndarray], k: int, d_sae: int) -> torch.Tensor:
    M = torch.zeros(len(order_rows), d_sae, dtype=torch.float64)
    for i, order in enumerate(order_rows):
        M[i, torch.as_tensor(order[:k])] = 1.0
    return M


def _edits(sae, h, z, p, orders, rand_orders, ks, mean_code, ablations: bool):
    """(swapped, condition, k, state at T−1) of each run of one batch, in the rows' order: swapped
    into the partner's run, the full state (`state`, k −1), every latent (`all`), then per k the
    top-k label latents (`features`) and k random active ones (`random`); on the row's own run,
    with `ablations`, the top-k set to 0 (`zero`) and to their dataset mean (`mean`)."""
    d_sae = z.shape[-1]
    yield True, "state", -1, h
    yield True, "all", d_sae, _edited(sae, h[p], z[p], z, torch.ones(len(h), d_sae, dtype=torch.float64))
    for k in ks:
        for condition, ords in (("features", orders), ("random", rand_orders)):
            yield True, condition, k, _edited(sae, h[p], z[p], z, _mask(ords, k, d_sae))
        if ablations:
            M = _mask(orders, k, d_sae)
            for condition, target in (("zero", torch.zeros_like(z)), ("mean", mean_code.expand_as(z))):
                yield False, condition, k, _edited(sae, h, z, target, M)


@torch.no_grad()
def feature_tests(
    model,
    sae,
    df: pd.DataFrame,
    hook: str,
    mode: Mode = Mode("recurrent", 1),
    ks=KS,
    max_pairs: int | None = None,
    batch_size: int = 64,
    min_gap: float = 0.1,
    seed: int = 0,
    lengths=None,
    ablations: bool = True,
) -> pd.DataFrame:
    """Wide rows (`metrics.score`) of the feature swap, its random control, the full-state swap and
    the zero / mean feature ablations, per task, length, k (`subspace_dim`; −1 for `state`);
    `ablations=False`: the swaps only (what `analyze.fractions` reads)."""
    device = next(model.parameters()).device
    label_ids = label_token_ids(df)
    batches = [b.to(device) for b in pair_batches(df, label_ids, batch_size, max_pairs, lengths)]
    runs = final_states(model, batches, hook, mode)
    ranks = rankings(sae, runs)
    d_sae = sae.cfg.d_sae
    codes = [sae.encode(h.to(sae.W_enc.dtype)).double() for _, _, h in runs]  # once per batch
    all_z = torch.cat(codes)
    mean_code = all_z.mean(0)
    rng = np.random.default_rng(seed)
    ks = sorted({int(k) for k in ks if 1 <= int(k) <= d_sae})
    rows = []
    swap = dict(experiment="sae-feature-swap", mode=mode, hook_rule="one-pass", direction="denoising")
    ablation = dict(experiment="sae-feature-ablation", mode=mode, hook_rule="one-pass", direction="noising")
    for (b, ref, h), z in zip(runs, codes):
        task = str(b.meta["task"].iloc[0])
        p = b.partner
        folds = fold_of(b.meta["group_id"].to_numpy())
        orders = [ranks[(task, int(f))] for f in folds]
        active = ((z > 0) | (z[p] > 0)).cpu().numpy()
        rand_orders = [rng.permutation(np.flatnonzero(a)) if a.any() else rng.permutation(d_sae) for a in active]
        edits = _edits(sae, h.double(), z, p, orders, rand_orders, ks, mean_code, ablations)
        for swapped, condition, k, state in edits:
            tokens, axes = (b.tokens[p], swap) if swapped else (b.tokens, ablation)
            hooks = [(hook, set_at(state, b.T - 1, model))]
            logits = model.run_with_hooks(tokens, mode=mode, serial=False, fwd_hooks=hooks)[:, -1]
            rows.append(score(b, ref, logits, min_gap, condition=condition, subspace_dim=k, **axes))
    return pd.concat(rows, ignore_index=True)
