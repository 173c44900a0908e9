"""Attribution patching (AtP): the first-order estimate of activation patching for every hook ×
position (× Jacobi pass) cell from one forward and one backward per batch of pairs, and the parity
check that says how far to trust it.

Convention: exactly that of `residual_patching` (metrics.py). Row i is the clean sample, its
partner p(i) the corrupt one, LD is oriented to row i's label, a is the activation at the cell:
- denoising (run p(i) with row i's activation): LD ≈ corrupt_i + (a_i − a_p(i)) · ∂LD_i/∂a on p(i)'s run
- noising (run row i with p(i)'s activation):   LD ≈ clean_i + (a_p(i) − a_i) · ∂LD_i/∂a on i's run
and normalized = (LD − corrupt)/(clean − corrupt), tiny-gap pairs excluded, as for exact patching.
Both samples of a pair share the batch, so one forward and one backward of Σ_j LD_j (each row's own
run, own orientation) give g_j = ∂LD_j/∂a_j for every row. On p(i)'s run, LD oriented to i's label
is s·LD_p(i) with s = −1 when the two labels differ (target and other swap), +1 otherwise; so the
denoising gradient is s·g_p(i).

Hook rule: that of residual patching. `serial=True` when the mode carries a state, so gradients flow
through the carried states (recurrent:k / full: the prefix and each serial step; jacobi:K: every
pass, the `pass_index` axis); one-pass under `standard`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.interventions.edits import span
from fbt_probe.interventions.experiments import ONE_PASS, SERIAL, device_of
from fbt_probe.interventions.forwards import forwards
from fbt_probe.interventions.metrics import AXES, logit_diff, score
from fbt_probe.interventions.pairs import PairBatch
from fbt_probe.modes import Mode

FUSION_HOOKS = tuple(act_name(k) for k in ("fusion_feedback", "fusion_value", "fusion_gate", "fusion_out"))
ATTRIBUTION_METRICS = ("logit_diff", "normalized")


def residual_hooks(n_layers: int) -> list[str]:
    """Every residual-stream hook in forward order: resid_pre of block 0, then resid_mid and resid_post
    of each block."""
    names = [depth_name(0)]
    for layer in range(n_layers):
        names += [act_name("resid_mid", layer), act_name("resid_post", layer)]
    return names


def default_hooks(model, mode: Mode, T: int) -> list[str]:
    """Residual stream, plus the fusion hooks when the mode carries a state."""
    names = residual_hooks(model.cfg.n_layers)
    return names + list(FUSION_HOOKS) if mode.first_fed_position(T) < T else names


def check_hooks(model, names) -> list[str]:
    """The names, refused with one line if the model has no such hook."""
    names = list(names)
    unknown = [n for n in names if n not in model.hook_dict]
    if unknown:
        raise FbtError(f"hooks: unknown hook '{unknown[0]}' (`fbt-probe model info` lists the model's hook names)")
    return names


def depth_of(name: str, n_layers: int) -> int:
    """The probe depth of a hook name, -1 if it is not a probe depth."""
    return {depth_name(d): d for d in range(n_layers + 1)}.get(name, -1)


# ----------------------------------------------------------------------------- one forward, one backward
@dataclass
class Traced:
    """Activations and gradients of one batch. acts/grads: {(hook, pass): [N, T, ...]} (zeros where
    the hook did not fire), covered: {(hook, pass): bool [T]}; ld: [N] each row's own LD."""

    acts: dict
    grads: dict
    covered: dict
    ld: torch.Tensor
    logits: torch.Tensor  # [N, d_vocab] final position, detached


def _leaf_embed(x, hook=None):
    """Make the graph differentiable even when the parameters are frozen (a leaf at the embedding)."""
    return x if x.requires_grad else x.detach().requires_grad_(True)


def trace(model, batch: PairBatch, mode: Mode, names: Iterable[str], serial: bool) -> Traced:
    """One forward of the batch (hooks record every chunk, with the graph) and one backward of Σ LD."""
    names = list(dict.fromkeys(names))
    bad = [n for n in names if n.endswith("hook_pattern")]
    if bad:
        raise FbtError(
            f"attribution: hook {bad[0]} is not [batch, pos, ...]; use residual, fusion, attn_out or mlp_out hooks"
        )
    chunks: list[tuple[str, int, int, torch.Tensor]] = []

    def recorder(name):
        def hook(x, hook=None):
            ctx = model.hook_context
            chunks.append((name, ctx.pass_index if ctx is not None else 1, span(model, x).start, x))
            return x

        return hook

    hooks = [("hook_embed", _leaf_embed)] + [(n, recorder(n)) for n in names]
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.tokens, mode=mode, serial=serial, fwd_hooks=hooks)[:, -1]
        ld = logit_diff(logits, batch.target, batch.other)
        missing = sorted(set(names) - {c[0] for c in chunks})
        if missing:
            raise FbtError(f"attribution: hook {missing[0]} does not fire under mode '{mode}'")
        grads = torch.autograd.grad(ld.sum(), [c[3] for c in chunks], allow_unused=True)
    N, T = batch.tokens.shape
    acts, grs, covered = {}, {}, {}
    for (name, k, start, x), g in zip(chunks, grads):
        key = (name, k)
        if key not in acts:
            acts[key] = x.new_zeros((N, T) + tuple(x.shape[2:])).detach()
            grs[key] = torch.zeros_like(acts[key])
            covered[key] = torch.zeros(T, dtype=torch.bool)
        width = x.shape[1]
        acts[key][:, start : start + width] = x.detach()
        if g is not None:
            grs[key][:, start : start + width] = g.detach()
        covered[key][start : start + width] = True
    return Traced(acts, grs, covered, ld.detach(), logits.detach())


def estimates(tr: Traced, batch: PairBatch, direction: str) -> dict:
    """{(hook, pass): [N, T]} AtP estimate of the patched LD (row i's orientation) at every position."""
    p = batch.partner
    same = (batch.target == batch.target[p]).to(tr.ld.dtype)
    sign = 2 * same - 1  # +1 same labels, -1 different (see module doc)
    clean = tr.ld
    corrupt = sign * tr.ld[p]
    out = {}
    for key, a in tr.acts.items():
        g = tr.grads[key]
        dims = tuple(range(2, a.dim()))
        if direction == "noising":
            out[key] = clean[:, None] + ((a[p] - a) * g).sum(dims)
        elif direction == "denoising":
            s = sign.view((-1,) + (1,) * (a.dim() - 1))
            out[key] = corrupt[:, None] + ((a - a[p]) * s * g[p]).sum(dims)
        else:
            raise FbtError(f"attribution: direction '{direction}': expected denoising or noising")
    return out


def _rows(
    batch: PairBatch, ref: torch.Tensor, est: torch.Tensor, positions: list[int], min_gap: float, **axes
) -> pd.DataFrame:
    """Wide rows like `score` (one per row × position, position-major) with the estimated LD in place of
    a patched run (no kl / accuracy). est: [N, T] estimated LD at every position."""
    tgt, oth, partner = batch.target, batch.other, batch.partner
    clean = logit_diff(ref, tgt, oth)
    corrupt = logit_diff(ref[partner], tgt, oth)
    gap = clean - corrupt
    tiny = gap.abs() < min_gap
    safe = torch.where(tiny, torch.ones_like(gap), gap)
    e = est[:, positions].T  # [P, N]
    norm = torch.where(tiny, torch.full_like(gap, float("nan")), (e - corrupt) / safe)
    P, N = len(positions), batch.n
    data = {c: np.tile(batch.meta[c].to_numpy(), P) for c in batch.meta.columns}
    data.update({k: np.full(N * P, v) for k, v in {**AXES, **axes}.items()})
    data["position"] = np.repeat(np.asarray(positions, dtype=np.int64), N)
    col = lambda t: np.tile(t.double().cpu().numpy(), P)  # noqa: E731
    data.update(
        clean_logit_diff=col(clean),
        corrupt_logit_diff=col(corrupt),
        tiny_gap=np.tile(tiny.cpu().numpy(), P),
        logit_diff=e.reshape(-1).double().cpu().numpy(),
        normalized=norm.reshape(-1).double().cpu().numpy(),
    )
    return pd.DataFrame(data)


def _cell_axes(model, mode: Mode, serial: bool, direction: str, method: str, name: str, k: int) -> dict:
    """The columns that name an attribution cell (hook `name` in pass `k`), AtP's rows and the exact
    check's alike, so the parity table joins them."""
    return dict(
        experiment="attribution",
        condition=name,
        mode=mode,
        hook_rule=SERIAL if serial else ONE_PASS,
        direction=direction,
        method=method,
        depth=depth_of(name, model.cfg.n_layers),
        hook=name,
        pass_index=k,
    )


def traced_attribution(model, batches, mode, min_gap, hooks, last_k, directions, serial, keep: bool = True):
    """(AtP rows, [(batch, Traced, serial)] if `keep`): the traces let the parity check patch chosen
    cells exactly with the same source activations."""
    out, traces = [], []
    for batch in batches:
        batch = batch.to(device_of(model))
        T = batch.T
        use_serial = mode.first_fed_position(T) < T if serial is None else serial
        names = check_hooks(model, hooks) if hooks is not None else default_hooks(model, mode, T)
        tr = trace(model, batch, mode, names, use_serial)
        if keep:
            traces.append((batch, tr, use_serial))
        positions = set(range(T - last_k, T) if last_k else range(T))
        for direction in directions:
            for (name, k), est in estimates(tr, batch, direction).items():
                pos = sorted(positions & set(np.flatnonzero(tr.covered[(name, k)].numpy()).tolist()))
                axes = _cell_axes(model, mode, use_serial, direction, "atp", name, k)
                out.append(_rows(batch, tr.logits, est, pos, min_gap, **axes))
    return pd.concat(out, ignore_index=True), traces


# ----------------------------------------------------------------------------- exact patching of chosen cells
def _cell_hook(
    model, source: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, k: int, src_rows: torch.Tensor
):
    """Replica row rows[j] gets source[src_rows[j], positions[j]] at positions[j], in pass k only."""

    def hook(x, hook=None):
        ctx = model.hook_context
        if (ctx.pass_index if ctx is not None else 1) != k:
            return x
        s = span(model, x)
        sel = (positions >= s.start) & (positions < s.stop)
        if not bool(sel.any()):
            return x
        x = x.clone()
        pos = positions[sel]
        x[rows[sel], pos - s.start] = source[src_rows[sel], pos].to(x.dtype)
        return x

    return hook


@torch.no_grad()
def exact_cells(
    fw,
    batch: PairBatch,
    tr: Traced,
    mode: Mode,
    cells: list[tuple[str, int, int]],
    direction: str,
    serial: bool,
    min_gap: float,
    batch_size: int = 64,
) -> pd.DataFrame:
    """Exact patching (method `exact`) of the given (hook, pass, position) cells, scored by `score`
    exactly as `residual_patching` scores its cells; rows in the order of `cells`. Many cells share a
    forward (replicas): the cells taken by position, a forward reruns from its first cell's position
    on (`edit_from`; the positions before it are the unedited prefix, reused where `fw` reuses one),
    as `residual_patching` runs its chunks."""
    fw = forwards(fw)
    model, N = fw.model, batch.n
    own = torch.arange(N, device=batch.tokens.device)
    run_rows, src = (batch.partner, own) if direction == "denoising" else (None, batch.partner)
    per = max(1, batch_size // N)
    by_position = sorted(range(len(cells)), key=lambda i: cells[i][2])
    out: list = [None] * len(cells)
    for s in range(0, len(cells), per):
        at = by_position[s : s + per]
        chunk = [cells[i] for i in at]
        hooks = []
        for name, k in dict.fromkeys((c[0], c[1]) for c in chunk):
            js = [j for j, c in enumerate(chunk) if (c[0], c[1]) == (name, k)]
            rows = torch.cat([j * N + own for j in js])
            pos = torch.tensor([chunk[j][2] for j in js], device=own.device).repeat_interleave(N)
            hooks.append((name, _cell_hook(model, tr.acts[(name, k)], rows, pos, k, src.repeat(len(js)))))
        logits = fw.final_logits(
            batch.tokens, mode, hooks, edit_from=chunk[0][2], serial=serial, rows=run_rows, replicas=len(chunk)
        )
        for j, (name, k, p) in enumerate(chunk):
            axes = _cell_axes(model, mode, serial, direction, "exact", name, k)
            out[at[j]] = score(batch, tr.logits, logits[j * N : (j + 1) * N], min_gap, position=p, **axes)
    return pd.concat(out, ignore_index=True)
