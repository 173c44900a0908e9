"""`fbt-probe bench nnsight`: what reading a hook through nnsight costs beside `run_with_cache`.

On one model and one input (default `ref:tiny-feedback`, batch 8 × 256 random tokens) it times, in
one process under `torch.no_grad`, for each case:
- `forward`: the plain forward of the mode;
- `run_with_cache`: the same forward caching one hook (`names_filter`);
- `nnsight`: `NNsight(model).trace(...)` saving the same hook's output.
Cases: `recurrent:1` (the analysed pass; the carried states are computed silently), and `full` with
`serial=True` (every serial step's call reached through `tracer.iter`, the chunks concatenated).
Each time is the median of `repeats` calls after one warm-up; the ratio nnsight / run_with_cache
comes from the same run. Before timing, the nnsight value is checked against the cache's
(`max_abs_diff`, which a wrong position or chunk order would make large).
"""

from __future__ import annotations

import platform

import torch

from fbt_probe.bench.model import _median_of, _tokens
from fbt_probe.errors import FbtError
from fbt_probe.loading import load_model
from fbt_probe.provenance import provenance

CASES = (("recurrent:1", False), ("full", True))


def _nnsight():
    try:
        from nnsight import NNsight
    except ImportError:
        raise FbtError("bench nnsight: needs nnsight (pip install 'fbt-probe[dev]')") from None
    return NNsight


def _trace(nn_model, x, mode: str, serial: bool, layer: int, calls: int) -> torch.Tensor:
    block = nn_model.blocks[layer]
    if not serial:
        with nn_model.trace(x, mode=mode):
            value = block.hook_resid_post.output.save()
        return value
    with nn_model.trace(x, mode=mode, serial=True) as tracer:
        chunks = list().save()
        for _ in tracer.iter[:calls]:
            chunks.append(block.hook_resid_post.output)
    return torch.cat(list(chunks), 1)


@torch.no_grad()
def run_nnsight_bench(model: str = "ref:tiny-feedback", batch: int = 8, seq: int = 256, repeats: int = 15, layer=None):
    NNsight = _nnsight()
    m = load_model(model)
    m.eval()
    layer = m.cfg.n_layers // 2 if layer is None else int(layer)
    if not 0 <= layer < m.cfg.n_layers:
        raise FbtError(f"--layer {layer}: expected 0..{m.cfg.n_layers - 1}")
    hook = f"blocks.{layer}.hook_resid_post"
    x = _tokens(m.cfg.d_vocab, batch, seq, 0)
    nn_model = NNsight(m)
    rows = []
    for mode, serial in CASES:
        calls = seq if mode == "full" else 1
        _, cache = m.run_with_cache(x, mode=mode, serial=serial, names_filter=hook)
        diff = float((_trace(nn_model, x, mode, serial, layer, calls) - cache[hook]).abs().max())
        fwd = _median_of(lambda: m(x, mode=mode), repeats)
        rwc = _median_of(lambda: m.run_with_cache(x, mode=mode, serial=serial, names_filter=hook), repeats)
        nns = _median_of(lambda: _trace(nn_model, x, mode, serial, layer, calls), repeats)
        rows.append(
            {
                "mode": mode,
                "serial": serial,
                "forward_s": fwd,
                "run_with_cache_s": rwc,
                "nnsight_s": nns,
                "nnsight_over_run_with_cache": nns / rwc,
                "max_abs_diff": diff,
            }
        )
    return {
        "model": model,
        "hook": hook,
        "batch": batch,
        "seq": seq,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "cases": rows,
        "provenance": provenance(),
    }


def to_markdown(r: dict) -> str:
    lines = [
        f"### nnsight beside run_with_cache ({r['model']}, batch {r['batch']} × {r['seq']}, `{r['hook']}`, "
        f"{r['threads']} threads; medians of {r['repeats']} calls)",
        "",
        "| mode | forward | run_with_cache | nnsight trace | nnsight / run_with_cache | max abs diff |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in r["cases"]:
        mode = f"`{c['mode']}`" + (" serial=True (`tracer.iter` over every step)" if c["serial"] else "")
        lines.append(
            f"| {mode} | {c['forward_s'] * 1e3:,.1f} ms | {c['run_with_cache_s'] * 1e3:,.1f} ms | "
            f"{c['nnsight_s'] * 1e3:,.1f} ms | **{c['nnsight_over_run_with_cache']:.2f}×** | {c['max_abs_diff']:.1e} |"
        )
    return "\n".join(lines) + "\n"
