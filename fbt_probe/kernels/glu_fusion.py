"""The fused fusion epilogue: out = RMSNorm(value ⊙ gate) · weight in one pass over memory.

`value = W_U h` and (on the two-product path) `gate = σ(W_G e)` stay on cuBLAS; this kernel reads
one row of `value` and one row of `gate` (or gathers the gate row from the V×D gate table by token
id), computes the float32 RMS statistics, and writes the scaled row: three row transfers instead of
the ~8 an eager RMSNorm makes.

The rounding follows the reference (`fbt_probe.numerics.fusion_reference`, Qwen3 style) step by
step, so on CUDA the kernel differs from it only in reduction order and `rsqrt` ulps:
    x = value * gate                  rounded to the product dtype (promote(value, gate))
    n = x * rsqrt(mean(x²) + eps)     in float32
    out = weight * n.to(value.dtype)  rounded to promote(weight, value)

Registered as the custom ops `fbt_probe::glu_fusion` and `fbt_probe::glu_fusion_table` with fake
(meta) kernels, so `torch.compile` traces through them, and with autograd. The backward is plain
PyTorch (eager math on saved inputs, no Triton kernel): correct for training, not fused.

The ops run the Triton kernel when it can run on the tensors (CUDA with Triton, or any device
when Triton was imported with `TRITON_INTERPRET=1`) and the eager reference
otherwise, so calling them is always safe; `fast_fusion_available(device)` says which one runs.
"""

from __future__ import annotations

import contextlib
import os
from functools import lru_cache

import torch
from torch import Tensor

from fbt_probe.numerics import fusion_reference

# Triton is imported only where its kernel can run (`triton_may_run`): a CPU process never pays its
# import (~0.2 s and ~75 MB resident). Without Triton the ops still work: they run the reference.
triton = None
tl = None

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_SINGLE_PASS_D = 16384  # wider rows are read twice in LOOP_D chunks (register budget)
LOOP_D = 4096


# ---------------------------------------------------------------------------------------------
# the Triton kernel


def _glu_fusion_kernel(
    V,
    G,
    IDS,
    W,
    OUT,  # value [N, D], gate [N, D] or table [vocab, D], ids [N], weight [D], out [N, D]
    n_cols,
    stride_v,
    stride_g,
    stride_o,
    eps,
    HAS_IDS: tl.constexpr,
    PROD_DT: tl.constexpr,
    NORM_DT: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if HAS_IDS:
        g_row = tl.load(IDS + row).to(tl.int64)
    else:
        g_row = row
    v_ptr = V + row * stride_v
    g_ptr = G + g_row * stride_g
    o_ptr = OUT + row * stride_o
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_PASS:  # the whole row in registers: one read, one write
        mask = cols < n_cols
        v = tl.load(v_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (v * g).to(PROD_DT).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x * rstd).to(NORM_DT).to(tl.float32) * w
        tl.store(o_ptr + cols, y.to(OUT.dtype.element_ty), mask=mask)
    else:  # very wide rows: sum of squares first, then a second read (mostly from L2)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        rstd = 0.0
        for second in tl.static_range(2):  # unrolled: pass 0 sums the squares, pass 1 scales and stores
            if second:
                rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
            for start in range(0, n_cols, BLOCK_D):
                c = start + cols
                mask = c < n_cols
                v = tl.load(v_ptr + c, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_ptr + c, mask=mask, other=0.0).to(tl.float32)
                x = (v * g).to(PROD_DT).to(tl.float32)
                if second:
                    w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32)
                    y = (x * rstd).to(NORM_DT).to(tl.float32) * w
                    tl.store(o_ptr + c, y.to(OUT.dtype.element_ty), mask=mask)
                else:
                    acc += x * x


@lru_cache(maxsize=None)
def import_triton() -> bool:
    """Import Triton into this module (once); False when it is not installed."""
    global triton, tl
    try:
        import triton as triton_module
        import triton.language as language
    except ImportError:
        return False
    triton, tl = triton_module, language
    return True


@lru_cache(maxsize=None)
def triton_may_run() -> bool:
    """Whether the kernel can run in this process: with CUDA, or with Triton's CPU interpreter asked
    for (TRITON_INTERPRET set) - and Triton installed. Only then is Triton imported. Decided once,
    as Triton decides its interpreter mode once, at its import."""
    interpret = os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")
    return (interpret or torch.cuda.is_available()) and import_triton()


@lru_cache(maxsize=None)
def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter. Triton decides when it is first imported (it
    decorates its own library then), so TRITON_INTERPRET=1 must be set before that import."""
    if not triton_may_run():
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


@lru_cache(maxsize=None)
def _kernel(interpret: bool):
    """The kernel, decorated on first launch in the mode Triton itself was imported in."""
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(_glu_fusion_kernel)
    return triton.runtime.jit.JITFunction(_glu_fusion_kernel)


def _tl_dtype(dtype: torch.dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def block_width(d: int) -> int:
    """The block the launcher gives rows of width d: the whole row up to MAX_SINGLE_PASS_D, else LOOP_D chunks."""
    return (1 << (d - 1).bit_length() if d > 0 else 0) if d <= MAX_SINGLE_PASS_D else LOOP_D  # next power of 2


def _num_warps(block_d: int) -> int:
    return 4 if block_d < 2048 else 8 if block_d < 8192 else 16


def fast_fusion_available(device: torch.device | str | None = None) -> bool:
    """True when the Triton kernel (not the eager reference) runs for tensors on `device`: on CUDA
    with Triton importable, or on any device when Triton runs interpreted (TRITON_INTERPRET=1 set
    before `import triton`: tests on CPU)."""
    if not triton_may_run():
        return False
    if interpreting():
        return True
    device = torch.device(device) if device is not None else torch.device("cpu")
    return device.type == "cuda" and torch.cuda.is_available()


def _kernel_runs(*tensors: Tensor) -> bool:
    return (
        fast_fusion_available(tensors[0].device)
        and all(t.dtype in KERNEL_DTYPES for t in tensors)
        and tensors[0].shape[-1] > 0
    )


def _out_dtype(value: Tensor, weight: Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, value.dtype)


def _rows(t: Tensor, d: int) -> Tensor:
    t = t.reshape(-1, d)
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(
    value: Tensor,
    gate: Tensor,
    ids: Tensor | None,
    weight: Tensor,
    eps: float,
    block_d: int | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """value [..., D]; gate [..., D] (ids None) or a table [vocab, D] gathered by ids [...]."""
    d = value.shape[-1]
    v2 = _rows(value, d)
    g2 = _rows(gate, d)
    ids2 = ids.reshape(-1).contiguous() if ids is not None else v2  # v2: an unused placeholder
    w = weight.contiguous()
    out = torch.empty((v2.shape[0], d), dtype=_out_dtype(value, weight), device=value.device)
    if v2.shape[0] == 0:
        return out.reshape(value.shape)
    if block_d is None:
        block_d = block_width(d)
    interpret = interpreting()
    # the launch goes to the current CUDA device: switch only when the tensors live on another one
    switch = value.is_cuda and not interpret and value.device.index not in (None, torch.cuda.current_device())
    with torch.cuda.device(value.device) if switch else contextlib.nullcontext():
        _kernel(interpret)[(v2.shape[0],)](
            v2,
            g2,
            ids2,
            w,
            out,
            d,
            v2.stride(0),
            g2.stride(0),
            out.stride(0),
            float(eps),
            HAS_IDS=ids is not None,
            PROD_DT=_tl_dtype(torch.promote_types(value.dtype, gate.dtype)),
            NORM_DT=_tl_dtype(value.dtype),
            BLOCK_D=block_d,
            SINGLE_PASS=block_d >= d,
            num_warps=num_warps or _num_warps(block_d),
        )
    return out.reshape(value.shape)


# ---------------------------------------------------------------------------------------------
# checks shared by the real and the fake kernels


def _check(value: Tensor, gate: Tensor, weight: Tensor) -> None:
    d = value.shape[-1]
    if gate.shape != value.shape:
        raise ValueError(f"glu_fusion: gate shape {tuple(gate.shape)} != value shape {tuple(value.shape)}")
    if weight.shape != (d,):
        raise ValueError(f"glu_fusion: weight shape {tuple(weight.shape)}, expected ({d},)")
    if not (value.device == gate.device == weight.device):
        raise ValueError("glu_fusion: value, gate and weight must be on one device")


def _check_table(value: Tensor, token_ids: Tensor, gate_table: Tensor, weight: Tensor) -> None:
    d = value.shape[-1]
    if gate_table.dim() != 2 or gate_table.shape[1] != d:
        raise ValueError(f"glu_fusion_table: gate_table shape {tuple(gate_table.shape)}, expected (vocab, {d})")
    if token_ids.shape != value.shape[:-1]:
        raise ValueError(
            f"glu_fusion_table: token_ids shape {tuple(token_ids.shape)}, expected {tuple(value.shape[:-1])}"
        )
    if token_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"glu_fusion_table: token_ids dtype {token_ids.dtype}, expected int64 or int32")
    if weight.shape != (d,):
        raise ValueError(f"glu_fusion_table: weight shape {tuple(weight.shape)}, expected ({d},)")
    if not (value.device == token_ids.device == gate_table.device == weight.device):
        raise ValueError("glu_fusion_table: all inputs must be on one device")


# ---------------------------------------------------------------------------------------------
# the custom ops


@torch.library.custom_op("fbt_probe::glu_fusion", mutates_args=())
def _glu_fusion_op(value: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return glu_fusion_direct(value, gate, weight, eps)


@_glu_fusion_op.register_fake
def _(value, gate, weight, eps):
    _check(value, gate, weight)
    return value.new_empty(value.shape, dtype=_out_dtype(value, weight))


@torch.library.custom_op("fbt_probe::glu_fusion_table", mutates_args=())
def _glu_fusion_table_op(value: Tensor, token_ids: Tensor, gate_table: Tensor, weight: Tensor, eps: float) -> Tensor:
    _check_table(value, token_ids, gate_table, weight)
    if _kernel_runs(value, gate_table, weight):
        if not value.is_cuda:  # out-of-range ids fault on a GPU like any gather; caught here on CPU
            _check_ids(token_ids, gate_table.shape[0])
        return _launch(value, gate_table, token_ids, weight, eps)
    return fusion_reference(value, gate_table[token_ids], weight, eps)


@_glu_fusion_table_op.register_fake
def _(value, token_ids, gate_table, weight, eps):
    _check_table(value, token_ids, gate_table, weight)
    return value.new_empty(value.shape, dtype=_out_dtype(value, weight))


def _check_ids(token_ids: Tensor, vocab: int) -> None:
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise IndexError(f"glu_fusion_table: token ids outside [0, {vocab})")


# ---------------------------------------------------------------------------------------------
# autograd: eager PyTorch on the saved inputs (straight-through the dtype roundings)


def _grads(value: Tensor, gate: Tensor, weight: Tensor, eps: float, grad: Tensor, needs: tuple[bool, bool, bool]):
    """d out / d (value, gate, weight) for out = w · x·rsqrt(mean(x²)+eps), x = value·gate."""
    d = value.shape[-1]
    x = (value * gate).float()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    n = x * rstd
    gy = grad.float()
    d_value = d_gate = d_weight = None
    if needs[2]:
        d_weight = (gy * n.to(value.dtype).float()).reshape(-1, d).sum(0).to(weight.dtype)
    if needs[0] or needs[1]:
        dn = gy * weight.float()
        dx = rstd * (dn - n * (dn * n).mean(-1, keepdim=True))
        if needs[0]:
            d_value = (dx * gate.float()).to(value.dtype)
        if needs[1]:
            d_gate = (dx * value.float()).to(gate.dtype)
    return d_value, d_gate, d_weight


def _setup(ctx, inputs, output):
    value, gate, weight, eps = inputs
    ctx.save_for_backward(value, gate, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    value, gate, weight = ctx.saved_tensors
    d_value, d_gate, d_weight = _grads(value, gate, weight, ctx.eps, grad, ctx.needs_input_grad[:3])
    return d_value, d_gate, d_weight, None


def _setup_table(ctx, inputs, output):
    value, token_ids, gate_table, weight, eps = inputs
    ctx.save_for_backward(value, token_ids, gate_table, weight)
    ctx.eps = eps


def _backward_table(ctx, grad):
    value, token_ids, gate_table, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    gate = gate_table[token_ids]
    d_value, d_gate, d_weight = _grads(value, gate, weight, ctx.eps, grad, (needs[0], needs[2], needs[3]))
    d_table = None
    if needs[2]:  # scatter-add the gathered rows' gradients back into the table
        d = value.shape[-1]
        d_table = torch.zeros_like(gate_table).index_add_(0, token_ids.reshape(-1), d_gate.reshape(-1, d))
    return d_value, None, d_table, d_weight, None


_glu_fusion_op.register_autograd(_backward, setup_context=_setup)
_glu_fusion_table_op.register_autograd(_backward_table, setup_context=_setup_table)


# ---------------------------------------------------------------------------------------------
# public entry points


def glu_fusion(value: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm(value ⊙ gate) · weight. value, gate: [..., D]; weight: [D]. Same result (within
    dtype tolerance) as `fusion_reference`; the Triton kernel when `fast_fusion_available`."""
    return torch.ops.fbt_probe.glu_fusion(value, gate, weight, float(eps))


def glu_fusion_direct(value: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`glu_fusion` without the custom-op dispatch (tens of microseconds of Python per call, more
    than the kernel itself below ~16k rows): the kernel launched directly where it runs, else the
    reference. No autograd and not traceable by `torch.compile`: for inference calls (the model's
    no-grad epilogue and the captured decode step); `glu_fusion` everywhere else."""
    _check(value, gate, weight)
    if _kernel_runs(value, gate, weight):
        return _launch(value, gate, None, weight, float(eps))
    return fusion_reference(value, gate, weight, eps)


def glu_fusion_table(value: Tensor, token_ids: Tensor, gate_table: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm(value ⊙ gate_table[token_ids]) · weight, the gather fused into the kernel.
    value: [..., D]; token_ids: [...] int64/int32 in [0, vocab); gate_table: [vocab, D] (see
    `build_gate_table`); weight: [D]."""
    return torch.ops.fbt_probe.glu_fusion_table(value, token_ids, gate_table, weight, float(eps))
