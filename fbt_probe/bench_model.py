"""`fbt-probe bench model`: plain forward vs `run_with_cache` on the residual hooks, and `full`
prefill (the exact serial recurrence through the KV cache) vs `standard`, for a preset on this machine."""
from __future__ import annotations

import platform
import time

import torch


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.no_grad()
def run_model_bench(preset: str = "tiny", batch: int = 8, seq: int = 256, lengths=(256, 1024), repeats: int = 3) -> dict:
    import fbt_probe as fp
    from fbt_probe.provenance import provenance

    model = fp.load_model(preset).eval()
    V = model.cfg.d_vocab
    toks = torch.randint(0, V, (batch, seq), generator=torch.Generator().manual_seed(0))
    resid = lambda name: "hook_resid" in name  # noqa: E731
    model(toks)  # warm-up
    plain = _best_of(lambda: model(toks), repeats)
    cached = _best_of(lambda: model.run_with_cache(toks, names_filter=resid), repeats)
    rows = []
    for T in lengths:
        one = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(1))
        std = _best_of(lambda: model(one), repeats)
        full = _best_of(lambda: model(one, mode="full"), 1)
        rows.append({"T": T, "standard_s": std, "full_s": full, "full_over_standard": full / std})
    n_tok = batch * seq
    return {
        "preset": preset, "device": "cpu", "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "forward": {"batch": batch, "seq": seq, "plain_tokens_per_s": n_tok / plain, "cache_tokens_per_s": n_tok / cached,
                    "cache_over_plain_time": cached / plain},
        "prefill": rows, "provenance": provenance(),
    }


def to_markdown(r: dict) -> str:
    f = r["forward"]
    lines = [
        f"### Model ({r['preset']}, {r['device']}, {r['threads']} threads)", "",
        f"| what | value |", "|---|---|",
        f"| plain forward, batch {f['batch']} × {f['seq']} | {f['plain_tokens_per_s']:,.0f} tokens/s |",
        f"| run_with_cache on the residual hooks | {f['cache_tokens_per_s']:,.0f} tokens/s |",
        f"| cache / plain time | {f['cache_over_plain_time']:.2f}× |", "",
        "| T (batch 1) | standard | full (KV-cache recurrence + final pass) | full / standard |", "|---|---|---|---|",
    ]
    for p in r["prefill"]:
        lines.append(f"| {p['T']} | {p['standard_s'] * 1e3:.1f} ms | {p['full_s'] * 1e3:.0f} ms | {p['full_over_standard']:.0f}× |")
    return "\n".join(lines) + "\n"
