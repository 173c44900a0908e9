"""Benchmark of the fusion epilogue (docs/kernels.md).

For D = 1536 and 1..64k rows (batch × positions) it times `RMSNorm(value ⊙ gate) · w` as
  eager      the pure-PyTorch reference (what the model runs on CPU),
  compile    `torch.compile` of that same reference (CUDA only),
  fused      the Triton kernel (`fbt_probe.kernels.glu_fusion`, CUDA only),
  table      the kernel gathering the gate from the V×D gate table by token id (CUDA only),
and reports achieved memory bandwidth (the fewest bytes the epilogue must move: value, gate and out
once each) against the device's peak and a measured device-to-device copy, the speed-ups, the
kernel's error against a float64 reference, and the fusion's share of the real
`FeedbackTransformer.step` at `paper-1b`.

On CPU only the reference path is timed (the kernel is CUDA-only; interpreted timings mean
nothing) and the report says so. Every number is a median over repeated calls after warm-up:
CUDA timings use `triton.testing.do_bench` (device events, L2 flushed between calls).
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

import fbt_probe.kernels as kernels
from fbt_probe.config import PRESETS
from fbt_probe.engine import dispatch
from fbt_probe.engine.graph_scan import fusion_epilogue
from fbt_probe.errors import FbtError
from fbt_probe.kernels.glu_fusion import _launch as launch_kernel
from fbt_probe.kernels.glu_fusion import _num_warps as kernel_num_warps
from fbt_probe.kernels.glu_fusion import block_width
from fbt_probe.numerics import fusion_reference
from fbt_probe.provenance import provenance

DEFAULT_ROWS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class FusionBenchConfig:
    rows: tuple[int, ...] = DEFAULT_ROWS  # batch × positions fused per call
    d_model: int = 1536
    device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    eps: float = 1e-6
    vocab: int = 100_352  # gate-table rows (paper-1b vocabulary)
    compile: bool = True  # time torch.compile of the reference (CUDA only)
    decode_preset: str = "paper-1b"
    decode_batches: tuple[int, ...] = (1, 8, 64)  # sequences decoded together (= fusion rows per step)
    decode_ctx: int = 2048  # tokens already in the KV cache
    model_step: bool | None = None  # also time the real FeedbackTransformer.step; None: on CUDA only
    warps_rows: tuple[int, ...] = (64, 4096, 65536)  # the kernel's num_warps sweep (wherever the kernel runs)
    warps: tuple[int, ...] = (1, 2, 4, 8, 16)
    budget_ms: float = 100.0  # timing budget per measurement
    seed: int = 0
    interpreted_kernel: bool = False  # tests only: run the kernel on CPU under TRITON_INTERPRET (timings meaningless)

    def __post_init__(self) -> None:
        if not self.rows or any(int(r) < 1 for r in self.rows):
            raise FbtError(f"bench fusion: rows must be positive integers, got {list(self.rows)}")
        if self.d_model < 1:
            raise FbtError(f"bench fusion: d_model must be >= 1, got {self.d_model}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise FbtError(f"bench fusion: dtype '{self.dtype}': expected auto or one of {sorted(DTYPES)}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise FbtError(f"bench fusion: device '{self.device}': expected auto, cpu or cuda[:N]")
        if any(int(b) < 1 for b in self.decode_batches) or self.decode_ctx < 1:
            raise FbtError("bench fusion: decode batches and decode context must be positive")

        if self.decode_preset not in PRESETS:
            raise FbtError(f"bench fusion: decode preset '{self.decode_preset}': expected one of {sorted(PRESETS)}")


# --------------------------------------------------------------------------------- timing


def make_timer(device: torch.device, budget_ms: float) -> Callable[[Callable[[], object]], float]:
    """A function timing `fn()` in seconds (median after warm-up)."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            return lambda fn: _time_events(fn, budget_ms)

        def cuda_time(fn):
            # one call first: do_bench sizes its warm-up and repetitions from its first calls' times,
            # so a first call that JIT-compiles (Triton, inductor) would leave it a single timed run
            fn()
            torch.cuda.synchronize()
            return do_bench(fn, warmup=max(5.0, budget_ms / 4), rep=budget_ms, return_mode="median") / 1e3

        return cuda_time

    def cpu_time(fn):
        fn()  # warm-up
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or (time.perf_counter() - start) * 1e3 < budget_ms and len(times) < 1000:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return cpu_time


def _time_events(fn, budget_ms: float) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start) * 1e3 < budget_ms and len(times) < 1000:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


# --------------------------------------------------------------------------------- device


def device_bandwidth(device: torch.device, timer) -> dict:
    """Datasheet-style peak (memory clock × bus width, CUDA only) and a measured copy."""
    out: dict = {"peak_gbps": None, "peak_source": None}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
        if clock_khz and bus_bits:
            out["peak_gbps"] = 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
            out["peak_source"] = "2 × memory clock × bus width (cudaDeviceProp)"
    n_bytes = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.randn(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    out["copy_gbps"] = 2 * n_bytes / timer(lambda: dst.copy_(src)) / 1e9  # bytes read + written
    del src, dst
    return out


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# --------------------------------------------------------------------------------- the rows sweep


def _rel_err(out: torch.Tensor, value, gate, weight, eps) -> float:
    ref = fusion_reference(value.double(), gate.double(), weight.double(), eps)
    err = (out.double() - ref).norm() / ref.norm()
    return float("nan") if not torch.isfinite(out).all() else float(err)


def bench_rows(cfg: FusionBenchConfig, device: torch.device, dtype: torch.dtype, timer, fused: bool) -> list[dict]:

    reference = fusion_reference
    compiled = None
    if cfg.compile and device.type == "cuda":
        compiled = torch.compile(reference, dynamic=True)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    d, eps = cfg.d_model, cfg.eps
    weight = (1 + 0.1 * torch.randn(d, device=device, generator=gen)).to(dtype)
    table = torch.sigmoid(torch.randn(cfg.vocab, d, device=device, generator=gen)).to(dtype)
    records = []
    for n in cfg.rows:
        value = torch.randn(n, d, device=device, generator=gen).to(dtype)
        gate = table[torch.randint(0, cfg.vocab, (n,), device=device, generator=gen)]
        ids = torch.randint(0, cfg.vocab, (n,), device=device, generator=gen)
        elt = value.element_size()
        rec: dict = {"rows": n, "bytes": n * d * 3 * elt + d * weight.element_size()}
        rec["eager_s"] = timer(lambda: reference(value, gate, weight, eps))
        rec["eager_table_s"] = timer(lambda: reference(value, table[ids], weight, eps))
        if compiled is not None:
            try:
                compiled(value, gate, weight, eps)
                rec["compile_s"] = timer(lambda: compiled(value, gate, weight, eps))
            except Exception as exc:  # a compile failure is a result to report, not a crash
                rec["compile_error"] = _one_line(exc)
        rec["dispatch_kernel"] = dispatch.fusion(value) is not None  # the engine's size rule at this row count
        rec["dispatch_s"] = timer(lambda: fusion_epilogue(value, gate, weight, eps))
        if fused:
            rec["rel_err"] = _rel_err(kernels.glu_fusion(value, gate, weight, eps), value, gate, weight, eps)
            rec["table_rel_err"] = _rel_err(
                kernels.glu_fusion_table(value, ids, table, weight, eps), value, table[ids], weight, eps
            )
            rec["fused_s"] = timer(lambda: kernels.glu_fusion(value, gate, weight, eps))
            rec["table_s"] = timer(lambda: kernels.glu_fusion_table(value, ids, table, weight, eps))
        records.append(rec)
        del value, gate, ids
    return records


# --------------------------------------------------------------------------------- the model's step


def bench_model_step(cfg: FusionBenchConfig, device, dtype_name: str, timer) -> list[dict]:
    """The real `FeedbackTransformer.step` (fed-back state, KV cache of decode_ctx tokens) at the
    preset, random weights: eager PyTorch, one kernel launch per op (no CUDA graph), so the step is
    slower than a tuned decoder's and the share smaller."""
    try:
        from fbt_probe.loading import load_model

        model = load_model(cfg.decode_preset, device=str(device), seed=cfg.seed, dtype=dtype_name).eval()
    except Exception as exc:  # e.g. transformer-lens missing on a bare GPU image
        return [{"batch": b, "ctx": cfg.decode_ctx, "error": _one_line(exc)} for b in cfg.decode_batches]
    records = []
    for batch in cfg.decode_batches:
        rec: dict = {"batch": batch, "ctx": cfg.decode_ctx}
        try:
            rec.update(_model_step_once(model, cfg, batch, device, timer))
        except Exception as exc:  # e.g. out of memory in the prefill at a large batch
            rec["error"] = _one_line(exc)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        records.append(rec)
    del model
    return records


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


@torch.no_grad()
def _model_step_once(model, cfg, batch, device, timer) -> dict:
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (batch, cfg.decode_ctx), device=device, generator=gen)
    cache, state, logits = model.prefill_cache(tokens, capacity=cfg.decode_ctx + 1)
    token, state = logits[:, -1].argmax(-1), state[:, -1]
    del logits

    def step():
        cache.rewind(cfg.decode_ctx)  # the same cache length at every call (the step writes in place)
        return model.step(token, cache, state)

    out = {"model_step_s": timer(step), "fast_fusion_used": _model_uses_fast_path(model, device)}
    fusion, d = model.fusion, model.cfg.d_model
    value = torch.randn(batch, 1, d, device=device, generator=gen).to(state.dtype)
    gate = torch.rand(batch, 1, d, device=device, generator=gen).to(state.dtype)
    if out["fast_fusion_used"]:
        epilogue = lambda: kernels.glu_fusion(value, gate, fusion.norm.weight, fusion.norm.eps)  # noqa: E731
    else:
        epilogue = lambda: fusion_reference(value, gate, fusion.norm.weight, fusion.norm.eps)  # noqa: E731
    out["model_epilogue_s"] = timer(epilogue)
    x = torch.randn(batch, 1, d, device=device, generator=gen).to(state.dtype)
    has_state = torch.ones(1, dtype=torch.bool, device=device)
    out["model_fusion_s"] = timer(lambda: fusion(x, x, has_state, lambda hook, t: t))  # both products + epilogue
    return out


def _model_uses_fast_path(model, device) -> bool:
    return bool(model.cfg.fast_fusion and device.type == "cuda" and kernels.fast_fusion_available(device))


# --------------------------------------------------------------------------------- driver


def resolve(cfg: FusionBenchConfig) -> tuple[torch.device, torch.dtype]:
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise FbtError(f"bench fusion: device '{cfg.device}' requested but CUDA is not available")
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = DTYPES[cfg.dtype]
    return device, dtype


def run_fusion_bench(cfg: FusionBenchConfig = FusionBenchConfig()) -> dict:
    """Run the benchmark; returns a JSON-able dict (see `to_markdown`)."""

    device, dtype = resolve(cfg)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # do_bench times the current device
    timer = make_timer(device, cfg.budget_ms)
    fused = kernels.fast_fusion_available(device) and (device.type == "cuda" or cfg.interpreted_kernel)
    torch.manual_seed(cfg.seed)
    result: dict = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "device": str(device),
        "device_name": describe_device(device),
        "dtype": str(dtype).removeprefix("torch."),
        "fused_available": fused,
        "path": _path_label(device, fused),
        "triton": _triton_version(),
    }
    result["bandwidth"] = device_bandwidth(device, timer)
    result["rows"] = bench_rows(cfg, device, dtype, timer, fused)
    on_gpu = device.type == "cuda"
    if cfg.model_step if cfg.model_step is not None else on_gpu:
        result["model_step"] = bench_model_step(cfg, device, result["dtype"], timer)
    if fused and cfg.warps_rows:
        result["warps_sweep"] = bench_warps(cfg, device, dtype, timer)
    result["provenance"] = provenance(bench="fusion", device_name=result["device_name"])
    return result


def bench_warps(cfg: FusionBenchConfig, device, dtype, timer) -> dict:
    """Median kernel time per num_warps at a few row counts, beside the launcher's own choice, so
    the heuristic in `kernels/glu_fusion.py:_num_warps` can be checked on the device at hand."""
    block_d = block_width(cfg.d_model)
    records = []
    for n in cfg.warps_rows:
        v = torch.randn(n, cfg.d_model, device=device, dtype=dtype)
        g = torch.rand(n, cfg.d_model, device=device, dtype=dtype)
        w = torch.randn(cfg.d_model, device=device, dtype=dtype)
        times = {nw: timer(lambda nw=nw: launch_kernel(v, g, None, w, cfg.eps, num_warps=nw)) for nw in cfg.warps}
        records.append({"rows": n, "times_s": times})
    return {"default_warps": kernel_num_warps(block_d), "records": records}


def _warps_markdown(result: dict) -> list[str]:
    sweep = result.get("warps_sweep")
    if not sweep:
        return []
    warps = list(sweep["records"][0]["times_s"]) if sweep["records"] else []
    lines = [
        "",
        f"#### Kernel num_warps sweep (D = {result['config']['d_model']}, {result['dtype']}; "
        f"the launcher picks {sweep['default_warps']})",
        "",
        "| rows | " + " | ".join(f"{w} warps µs" for w in warps) + " |",
        "|---:|" + "---:|" * len(warps),
    ]
    for r in sweep["records"]:
        lines.append(f"| {r['rows']} | " + " | ".join(_us(r["times_s"][w]) for w in warps) + " |")
    return lines


def _path_label(device: torch.device, fused: bool) -> str:
    if not fused:
        return "reference path only (eager PyTorch)"
    if device.type != "cuda":
        return "Triton kernel INTERPRETED on CPU (a code-path check: its timings mean nothing)"
    return "fused Triton kernel vs eager and torch.compile"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


# --------------------------------------------------------------------------------- report


def _us(s) -> str:
    return "–" if s is None else f"{s * 1e6:.1f}" if s < 1e-1 else f"{s * 1e6:.0f}"


def _best_other(r: dict) -> float:
    """The fastest path the size dispatch did not pick at this row count (eager, compile, kernel)."""
    others = (r.get("compile_s"), r["eager_s"] if r["dispatch_kernel"] else r.get("fused_s"))
    return min(x for x in others if x is not None)


def _ratio(a, b) -> str:
    return "–" if a is None or b is None else f"{a / b:.2f}×"


def _peak_text(peak, source) -> str:
    return f"{peak:.0f} GB/s ({source})" if peak else "n/a"


def _pct(a, b) -> str:
    return "–" if a is None or b is None else f"{100 * a / b:.2f} %"


def to_markdown(result: dict) -> str:
    bw = result["bandwidth"]
    peak, copy = bw.get("peak_gbps"), bw.get("copy_gbps")
    cfg = result["config"]
    lines = [
        f"### Fusion epilogue, D = {cfg['d_model']}, {result['dtype']}, {result['device_name']}",
        "",
        f"- path: **{result['path']}**"
        + ("" if result["fused_available"] else " — the Triton kernel and torch.compile are timed on CUDA only"),
        f"- peak memory bandwidth: {_peak_text(peak, bw.get('peak_source'))}; measured device copy "
        f"(read + write): {copy:.0f} GB/s",
        "- bytes counted: value, gate and out once each (+ the weight); GB/s = those bytes / median time",
        f"- torch {result['provenance']['versions'].get('torch')}, triton {result['triton'] or 'not installed'}, "
        f"git {result['provenance']['git_commit']}",
        "",
    ]
    fused = result["fused_available"]
    if fused:
        lines += [
            "| rows | eager µs | compile µs | fused µs | fused GB/s | % of peak | × eager | × compile | table µs | table × eager-gather | rel. err | dispatch µs (path) | dispatch × best other |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    else:
        lines += ["| rows | eager µs | eager GB/s | % of copy | eager + gather µs |", "|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        gbps = lambda s: None if s is None else r["bytes"] / s / 1e9  # noqa: E731
        if fused:
            g = gbps(r.get("fused_s"))
            compile_cell = _us(r.get("compile_s")) if "compile_error" not in r else "error"
            lines.append(
                f"| {r['rows']} | {_us(r['eager_s'])} | {compile_cell} | {_us(r['fused_s'])} | {g:.0f} | "
                f"{_pct(g, peak)} | {_ratio(r['eager_s'], r['fused_s'])} | {_ratio(r.get('compile_s'), r['fused_s'])} | "
                f"{_us(r['table_s'])} | {_ratio(r['eager_table_s'], r['table_s'])} | {r['rel_err']:.1e} | "
                f"{_us(r['dispatch_s'])} ({'kernel' if r['dispatch_kernel'] else 'eager'}) | "
                f"{_ratio(_best_other(r), r['dispatch_s'])} |"
            )
        else:
            g = gbps(r["eager_s"])
            lines.append(
                f"| {r['rows']} | {_us(r['eager_s'])} | {g:.1f} | {_pct(g, copy)} | {_us(r['eager_table_s'])} |"
            )
    errors = sorted({r["compile_error"] for r in result["rows"] if "compile_error" in r})
    lines += [f"\ntorch.compile failed: {e}" for e in errors]
    lines += _model_step_markdown(result)
    lines += _warps_markdown(result)
    return "\n".join(lines) + "\n"


def _model_step_markdown(result: dict) -> list[str]:
    lines: list[str] = []
    cfg = result["config"]
    if "model_step" in result:
        lines += [
            "",
            f"#### Share of the real `FeedbackTransformer.step` ({cfg['decode_preset']}, random weights, "
            f"{cfg['decode_ctx']}-token preallocated cache; eager launches, no CUDA graph)",
            "",
            "| batch | step µs | fast path | epilogue µs | epilogue share | fusion module µs | fusion share |",
            "|---:|---:|---|---:|---:|---:|---:|",
        ]
        for r in result["model_step"]:
            if "error" in r:
                lines.append(f"| {r['batch']} | error: {r['error']} | | | | | |")
                continue
            lines.append(
                f"| {r['batch']} | {_us(r['model_step_s'])} | {'yes' if r['fast_fusion_used'] else 'no'} | "
                f"{_us(r['model_epilogue_s'])} | {_pct(r['model_epilogue_s'], r['model_step_s'])} | "
                f"{_us(r['model_fusion_s'])} | {_pct(r['model_fusion_s'], r['model_step_s'])} |"
            )
    return lines


def parse_rows(text: str, option: str = "--rows") -> tuple[int, ...]:
    """'1,16,4k,64k' -> (1, 16, 4096, 65536)."""
    rows = []
    for part in text.split(","):
        part = part.strip().lower()
        try:
            rows.append(int(part[:-1]) * 1024 if part.endswith("k") else int(part))
        except ValueError:
            raise FbtError(f"{option}: '{part}' is not an integer (e.g. 1,16,4k,64k)") from None
    return tuple(rows)
