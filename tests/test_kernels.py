"""The fusion fast path (fbt_probe/kernels/) against a float64 reference.

On CPU the Triton kernel runs in Triton's interpreter, which must be switched on (TRITON_INTERPRET=1)
before `triton` is first imported. So the interpreted tests run in a child pytest on this file with
that variable set (`test_interpreted_suite_in_subprocess`); in a process where Triton is not
interpreting they skip. The `launches` fixture counts kernel launches, so a test cannot pass by
silently running the eager fallback. GPU tests are marked `gpu` and skipped without CUDA.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fbt_probe.kernels as K
import fbt_probe.numerics as numerics
from fbt_probe.engine import dispatch
from fbt_probe.engine.graph_scan import fusion_epilogue

kmod = importlib.import_module("fbt_probe.kernels.glu_fusion")
ROOT = Path(__file__).resolve().parent.parent
INTERPRETED = kmod.interpreting()  # fixed when triton was imported
EPS = 1e-6
# Interpreted bf16 casts truncate (CUDA rounds to nearest), and the reference rounds three times
# (product, normalised row, times weight): a few bf16 ulps relative. float32: reduction order only.
TOL = {torch.float32: dict(rtol=2e-5, atol=1e-6), torch.bfloat16: dict(rtol=3e-2, atol=1e-3)}
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU (not interpreted)"
)


def ref64(value, gate, weight, eps=EPS):
    x = value.double() * gate.double()
    return weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def make(shape, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    value = torch.randn(shape, generator=gen).to(device, dtype)
    gate = torch.rand(shape, generator=gen).to(device, dtype)
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(device, dtype)
    return value, gate, weight


@pytest.fixture
def interpret():
    if not HAS_TRITON:
        pytest.skip("triton not installed")
    if not INTERPRETED:
        pytest.skip("runs in the TRITON_INTERPRET=1 child (test_interpreted_suite_in_subprocess)")


@pytest.fixture
def launches(monkeypatch, interpret):
    calls = []
    real = kmod._launch

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(kmod, "_launch", spy)
    return calls


# --------------------------------------------------------------------------- packaging, reference


def test_every_package_folder_is_a_package():
    """pyproject finds packages (`packages.find`, include fbt_probe*): a folder of modules without
    `__init__.py` would be left out of wheels."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert cfg["include"] == ["fbt_probe*"]
    try:  # committed files (a work-in-progress folder of another change is not yet a package)
        files = subprocess.run(
            ["git", "ls-files", "fbt_probe"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in (ROOT / "fbt_probe").rglob("*.py")]
    folders = {Path(f).parent for f in files if f.endswith(".py")}
    missing = sorted(str(d) for d in folders if not (ROOT / d / "__init__.py").is_file())
    assert not missing, f"add __init__.py to {missing}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_models(dtype):
    """The one fusion formula (fbt_probe.numerics) is what the model's fusion computes: its RMSNorm of
    value ⊙ gate, bit for bit."""
    components = pytest.importorskip("fbt_probe.model.components")
    value, gate, weight = make((3, 4, 33), dtype)
    assert torch.equal(
        numerics.fusion_reference(value, gate, weight, EPS), components.rms_norm(value * gate, weight, EPS)
    )


@needs_triton
def test_interpreted_suite_in_subprocess():
    if INTERPRETED:
        pytest.skip("this process is the interpreted one")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    classes = ["TestKernel", "TestGateTable", "TestAutogradCompile", "TestBenchInterpreted"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *(f"{__file__}::{c}" for c in classes)]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@needs_triton
def test_a_cpu_process_does_not_import_triton():
    """Triton is imported only where its kernel can run (CUDA, or the interpreter asked for): loading
    and running a model on CPU leaves it out (it costs ~0.2 s and ~75 MB resident). Loading a
    checkpoint (its shapes checked on a meta-device shell) leaves out the compiler stack too
    (torch._dynamo and sympy: ~1.5 s a process, `fbt_probe.model.meta`)."""
    code = (
        "import sys, torch; from fbt_probe.loading import load_model; "
        "m = load_model('tiny'); m(torch.zeros(1, 4, dtype=torch.long), mode='recurrent:1'); "
        "r = load_model('ref:tiny-feedback'); r(torch.zeros(1, 4, dtype=torch.long), mode='jacobi:2'); "
        "assert not torch.cuda.is_available(); "
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('triton', 'sympy') or n == 'torch._dynamo'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.skipif(INTERPRETED, reason="needs a process where Triton is not interpreting")
def test_cpu_without_interpreter_runs_the_reference():
    assert not K.fast_fusion_available("cpu")
    value, gate, weight = make((2, 5, 24), torch.float32)
    assert torch.equal(K.glu_fusion(value, gate, weight, EPS), numerics.fusion_reference(value, gate, weight, EPS))


@needs_triton
@pytest.mark.skipif(INTERPRETED, reason="compiles with the real Triton front end")
@pytest.mark.parametrize("single_pass", [True, False], ids=["single_pass", "loop"])
def test_kernel_compiles_for_hopper_with_16_byte_accesses(single_pass):
    """The real compiler (not the interpreter) accepts the kernel for sm_90, no GPU needed: with the
    launcher's block and warp choice, bf16 rows (D=1536, or the wide-row loop) load and store 16 bytes
    per access and nothing spills to local memory."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    assert kmod.import_triton()
    tl = kmod.tl
    fn = kmod._kernel(False)
    names = fn.arg_names
    sig = {n: "*bf16" for n in ("V", "G", "W", "OUT")} | {"IDS": "*i64", "eps": "fp32"}
    sig |= {n: "i32" for n in ("n_cols", "stride_v", "stride_g", "stride_o")}
    consts = {
        "HAS_IDS": True,
        "PROD_DT": tl.bfloat16,
        "NORM_DT": tl.bfloat16,
        "BLOCK_D": 2048 if single_pass else kmod.LOOP_D,
        "SINGLE_PASS": single_pass,
    }
    sig |= {n: "constexpr" for n in consts}
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in sig if sig[n] in ("*bf16", "*i64", "i32")}
    src = ASTSource(fn, {n: sig[n] for n in names}, {(names.index(n),): v for n, v in consts.items()}, aligned)
    try:
        ptx = kmod.triton.compile(
            src, target=GPUTarget("cuda", 90, 32), options={"num_warps": kmod._num_warps(consts["BLOCK_D"])}
        ).asm["ptx"]
    except Exception as exc:  # e.g. a Triton build without the NVIDIA back end
        if "ptxas" in str(exc).lower() or "backend" in str(exc).lower():
            pytest.skip(f"no CUDA compiler back end here: {exc}")
        raise
    loads, stores = re.findall(r"ld\.global[.\w]*", ptx), re.findall(r"st\.global[.\w]*", ptx)
    assert set(loads) == {"ld.global.v4.b32", "ld.global.b64"}, loads  # b64: the token id
    assert set(stores) == {"st.global.v4.b32"}, stores
    assert ".local" not in ptx


# --------------------------------------------------------------------------- the kernel, interpreted

SHAPES = {
    "batch1": (1, 1536),  # one decode row at the paper's D
    "odd_D": (2, 3, 129),  # D not a power of two, 3-d input
    "rows": (64, 96),
    "D1": (3, 1),
    "long_row": (2, 20000),  # > MAX_SINGLE_PASS_D: the two-read loop
}


class TestKernel:
    __test__ = INTERPRETED  # collected only where Triton interprets (the child process)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    @pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
    def test_kernel_matches_reference(self, launches, shape, dtype):
        assert K.fast_fusion_available("cpu")
        value, gate, weight = make(shape, dtype)
        out = K.glu_fusion(value, gate, weight, EPS)
        assert launches, "the kernel did not run"
        assert out.dtype == dtype and out.shape == value.shape
        torch.testing.assert_close(out.double(), ref64(value, gate, weight), **TOL[dtype])
        torch.testing.assert_close(out, numerics.fusion_reference(value, gate, weight, EPS), **TOL[dtype])

    def test_kernel_loop_path_equals_single_pass(self, interpret):
        value, gate, weight = make((5, 300), torch.float32)
        looped = kmod._launch(value, gate, None, weight, EPS, block_d=64)  # 5 chunks, last one partial
        single = kmod._launch(value, gate, None, weight, EPS)
        torch.testing.assert_close(looped, single, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(looped.double(), ref64(value, gate, weight), **TOL[torch.float32])

    def test_kernel_strided_and_mixed_inputs(self, launches):
        wide, gate, weight = make((6, 2 * 40), torch.float32)
        value = wide[:, :40]  # row stride 80
        gate = gate[:, ::2]  # column stride 2: copied
        out = K.glu_fusion(value, gate, weight[:40], EPS)
        torch.testing.assert_close(out.double(), ref64(value, gate, weight[:40]), **TOL[torch.float32])
        # bf16 activations with a float32 norm weight: float32 out, like the reference
        value, gate, _ = make((4, 40), torch.bfloat16)
        out = K.glu_fusion(value, gate, weight[:40], EPS)
        expected = numerics.fusion_reference(value, gate, weight[:40], EPS)
        assert out.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(out, expected, **TOL[torch.bfloat16])
        assert len(launches) == 2

    def test_direct_entry_is_the_ops_kernel_without_the_dispatch(self, launches):
        value, gate, weight = make((3, 5, 129), torch.float32)
        direct = K.glu_fusion_direct(value, gate, weight, EPS)
        assert len(launches) == 1, "the kernel did not run"
        torch.testing.assert_close(
            direct, K.glu_fusion(value, gate, weight, EPS), rtol=0, atol=0
        )  # same kernel, same shape
        with pytest.raises(ValueError, match="gate shape"):
            K.glu_fusion_direct(value, gate[..., :4], weight, EPS)

    def test_kernel_empty_rows(self, launches):
        value, gate, weight = make((0, 16), torch.float32)
        assert K.glu_fusion(value, gate, weight, EPS).shape == (0, 16)

    def test_bad_inputs_raise(self, interpret):
        value, gate, weight = make((2, 8), torch.float32)
        with pytest.raises(ValueError, match="gate shape"):
            K.glu_fusion(value, gate[:, :4], weight, EPS)
        with pytest.raises(ValueError, match="weight shape"):
            K.glu_fusion(value, gate, weight[:4], EPS)
        table = torch.rand(5, 8)
        with pytest.raises(ValueError, match="token_ids shape"):
            K.glu_fusion_table(value, torch.zeros(3, dtype=torch.long), table, weight, EPS)
        with pytest.raises(IndexError, match="outside"):
            K.glu_fusion_table(value, torch.tensor([0, 5]), table, weight, EPS)


# --------------------------------------------------------------------------- the gate table


def _model_like(vocab, d, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    embed = (torch.randn(vocab, d, generator=gen)).to(dtype)
    w_gate = (torch.randn(d, d, generator=gen) / d**0.5).to(dtype)
    return embed, w_gate


def test_gate_table_chunking_is_exact():
    # chunked and whole tables are products of different shapes, which BLAS may block differently
    # (bitwise equality held on one CPU and not on another): float64 and 1e-12, where a wrong chunk
    # offset or a dropped row is off by > 1e-2
    embed, w_gate = _model_like(23, 16, torch.float64)
    chunked, whole = K.build_gate_table(embed, w_gate, chunk_rows=4), K.build_gate_table(embed, w_gate)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(whole, torch.sigmoid(embed @ w_gate.T), rtol=0, atol=1e-12)
    assert (whole[1:] - whole[:-1]).abs().amax(-1).min() > 1e-2
    with pytest.raises(ValueError, match="W_G shape"):
        K.build_gate_table(embed, w_gate[:, :8])


def test_gate_table_is_the_models_gate():
    """The gate is written once, in the reference (`Fusion.gate`, which the lean step calls too); the
    kernels' table is its own product over the vocabulary and must give every token's row of it
    (float64; a transposed W_G or a row for the wrong token is off by > 1e-2)."""
    from fbt_probe.engine.walk import decode_plan
    from tests.helpers import make_model

    model = make_model()
    with torch.no_grad():  # gates spread over (0, 1), not all near 1/2 as at initialisation
        model.embed.weight.normal_(generator=torch.Generator().manual_seed(0))
        model.fusion.W_G.weight.normal_(std=model.cfg.d_model**-0.5, generator=torch.Generator().manual_seed(1))
    table = K.build_gate_table(model.embed.weight, model.fusion.W_G.weight, chunk_rows=7)
    with torch.no_grad():
        gate = model.fusion.gate(model.embed.weight)
        torch.testing.assert_close(table, gate, rtol=0, atol=1e-12)
        wrong = K.build_gate_table(model.embed.weight, model.fusion.W_G.weight.T)
        assert (wrong - gate).abs().max() > 1e-2 and (table[1:] - gate[:-1]).abs().max() > 1e-2
        assert decode_plan(model).gate == model.fusion.gate  # the lean step's gate is the reference's


class TestGateTable:
    __test__ = INTERPRETED  # collected only where Triton interprets (the child process)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_gate_table_gives_the_two_product_fused_input(self, launches, dtype):
        vocab, d = 37, 72
        embed, w_gate = _model_like(vocab, d, dtype)
        table = K.build_gate_table(embed, w_gate, chunk_rows=10)
        assert table.shape == (vocab, d) and table.dtype == dtype and not table.requires_grad
        ids = torch.randint(0, vocab, (3, 5), generator=torch.Generator().manual_seed(2))
        gate = torch.sigmoid(F.linear(embed[ids], w_gate))  # the model's two-product path
        torch.testing.assert_close(table[ids], gate, **TOL[dtype])
        value, _, weight = make((3, 5, d), dtype)
        fused_table = K.glu_fusion_table(value, ids, table, weight, EPS)
        fused_gate = K.glu_fusion(value, gate, weight, EPS)
        assert len(launches) == 2
        torch.testing.assert_close(fused_table, fused_gate, **TOL[dtype])
        gate64 = torch.sigmoid(embed[ids].double() @ w_gate.double().T)
        torch.testing.assert_close(fused_table.double(), ref64(value, gate64, weight), **TOL[dtype])


# --------------------------------------------------------------------------- autograd, compile


class TestAutogradCompile:
    __test__ = INTERPRETED  # collected only where Triton interprets (the child process)

    def test_backward_matches_reference(self, launches):
        value, gate, weight = make((2, 3, 40), torch.float32)
        table = torch.rand(9, 40, dtype=torch.float32)
        ids = torch.randint(0, 9, (2, 3), generator=torch.Generator().manual_seed(3))
        grad_out = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(4))

        def grads(fn, *inputs):
            inputs = [t.detach().clone().requires_grad_() for t in inputs]
            fn(*inputs).backward(grad_out.to(inputs[0].dtype))
            return [t.grad for t in inputs]

        expected = grads(lambda v, g, w: ref64(v, g, w), value.double(), gate.double(), weight.double())
        got = grads(lambda v, g, w: K.glu_fusion(v, g, w, EPS), value, gate, weight)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)
        expected = grads(lambda v, t, w: ref64(v, t[ids], w), value.double(), table.double(), weight.double())
        got = grads(lambda v, t, w: K.glu_fusion_table(v, ids, t, w, EPS), value, table, weight)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)
        assert len(launches) == 2

    def test_opcheck(self, interpret):
        value, gate, weight = (t.requires_grad_() for t in make((2, 3, 24), torch.float32))
        torch.library.opcheck(torch.ops.fbt_probe.glu_fusion.default, (value, gate, weight, EPS))
        table = torch.rand(7, 24, requires_grad=True)
        ids = torch.randint(0, 7, (2, 3))
        torch.library.opcheck(torch.ops.fbt_probe.glu_fusion_table.default, (value, ids, table, weight, EPS))

    def test_torch_compile_traces_through(self, launches):
        value, gate, weight = (t.requires_grad_() for t in make((2, 3, 24), torch.float32))

        def f(v, g, w):
            return K.glu_fusion(2 * v, g, w, EPS).square().sum()

        torch._dynamo.reset()
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        out = compiled(value, gate, weight)
        out.backward()
        assert launches
        got = [t.grad.clone() for t in (value, gate, weight)]
        for t in (value, gate, weight):
            t.grad = None
        expected_out = f(value, gate, weight)
        expected_out.backward()
        torch.testing.assert_close(out, expected_out)
        for a, t in zip(got, (value, gate, weight)):
            torch.testing.assert_close(a, t.grad)


# --------------------------------------------------------------------------- the benchmark


def test_bench_cli_cpu_reports_the_reference_path(tmp_path):
    import json

    from typer.testing import CliRunner

    from fbt_probe.cli import app

    out = tmp_path / "fusion.md"
    args = [
        "bench",
        "fusion",
        "--rows",
        "1,3",
        "--d-model",
        "32",
        "--decode-preset",
        "tiny",
        "--decode-batches",
        "1,2",
        "--decode-ctx",
        "8",
        "--model-step",
        "--budget-ms",
        "1",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "reference path only" in text and "| 3 |" in text and "FeedbackTransformer.step" in text
    result = json.loads((tmp_path / "fusion.md.json").read_text())
    assert [r["rows"] for r in result["rows"]] == [1, 3] and not result["fused_available"]
    assert result["provenance"]["git_commit"] and result["bandwidth"]["copy_gbps"] > 0
    assert "decode" not in result and all("error" not in r for r in result["model_step"]), result
    res = CliRunner().invoke(app, args)  # no --force: refuses, one line, exit 2
    assert res.exit_code == 2 and "already exists" in res.output and res.output.strip().count("\n") == 0


@pytest.mark.parametrize("bad", [["--rows", "0"], ["--rows", "1,x"], ["--dtype", "int8"], ["--decode-preset", "nope"]])
def test_bench_cli_bad_input_is_one_line(bad):
    from typer.testing import CliRunner

    from fbt_probe.cli import app

    res = CliRunner().invoke(app, ["bench", "fusion", *bad])
    assert res.exit_code == 2 and res.output.startswith("error:") and res.output.strip().count("\n") == 0, res.output


class TestBenchInterpreted:
    __test__ = INTERPRETED  # collected only where Triton interprets (the child process)

    def test_bench_fused_path_runs(self, launches):
        from fbt_probe.bench.fusion import FusionBenchConfig, run_fusion_bench, to_markdown

        cfg = FusionBenchConfig(
            rows=(1, 5),
            d_model=40,
            vocab=50,
            device="cpu",
            model_step=False,
            budget_ms=1,
            interpreted_kernel=True,
            warps_rows=(3,),
            warps=(1, 2),
        )
        result = run_fusion_bench(cfg)
        assert result["fused_available"] and launches
        assert all(r["rel_err"] < 1e-5 and r["table_rel_err"] < 1e-5 for r in result["rows"])
        text = to_markdown(result)
        assert "INTERPRETED" in text and "× eager" in text
        sweep = result["warps_sweep"]
        assert [r["rows"] for r in sweep["records"]] == [3] and set(sweep["records"][0]["times_s"]) == {1, 2}
        assert "num_warps sweep" in text and "| 3 |" in text


# --------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1536), (4096, 1536), (3, 7, 129), (2, 20000)])
def test_gpu_kernel_matches_reference(shape, dtype):
    assert K.fast_fusion_available("cuda")
    value, gate, weight = make(shape, dtype, device="cuda")
    poison = value.new_full(value.shape, float("nan"))  # the output will likely reuse this block:
    del poison  # an element the kernel failed to write then stays NaN
    out = K.glu_fusion(value, gate, weight, EPS)
    torch.testing.assert_close(out, numerics.fusion_reference(value, gate, weight, EPS), **TOL[dtype])
    torch.testing.assert_close(out.double(), ref64(value, gate, weight), **TOL[dtype])
    ids = torch.randint(0, 100, shape[:-1], device="cuda")
    table = torch.rand(100, shape[-1], device="cuda").to(dtype)
    torch.testing.assert_close(
        K.glu_fusion_table(value, ids, table, weight, EPS),
        numerics.fusion_reference(value, table[ids], weight, EPS),
        **TOL[dtype],
    )


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_inductor_compile():
    value, gate, weight = make((8, 1536), torch.bfloat16, device="cuda")
    compiled = torch.compile(lambda v, g, w: K.glu_fusion(v * 1.5, g, w, EPS), fullgraph=True)
    torch.testing.assert_close(
        compiled(value, gate, weight), numerics.fusion_reference(value * 1.5, gate, weight, EPS), **TOL[torch.bfloat16]
    )


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("mode", ["recurrent:1", "full"])
def test_gpu_model_outputs_unchanged_with_fast_path(mode, monkeypatch):
    pytest.importorskip("transformer_lens")  # absent from the bare GPU image
    import fbt_probe as fp

    monkeypatch.setattr(dispatch, "FUSED_MIN_ROWS", 1)  # every call takes the kernel (the size dispatch aside)

    models = {fast: fp.load_model("tiny", device="cuda", seed=0, fast_fusion=fast).eval() for fast in (False, True)}
    tokens = torch.randint(0, models[True].cfg.d_vocab, (2, 24), device="cuda")
    with torch.no_grad():
        slow, fast = (models[f](tokens, mode=mode) for f in (False, True))
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- the size dispatch


def test_fusion_dispatch_by_size(monkeypatch):
    """Calls that need autograd take the kernel (through the custom op) only where it runs and from
    FUSED_MIN_ROWS rows on (the op's dispatch is launch-bound below: reports/bench/fusion-gpu.md);
    calls that need none take it at any size (launched directly). On CPU the model always takes
    the reference."""

    n = dispatch.FUSED_MIN_ROWS
    assert (
        not dispatch.use_kernel(n - 1, True) and dispatch.use_kernel(n, True) and not dispatch.use_kernel(10 * n, False)
    )
    assert dispatch.use_kernel(1, True, autograd=False) and not dispatch.use_kernel(1, False, autograd=False)
    assert dispatch.fusion(torch.zeros(n, 4)) is None  # CPU tensor: never the kernel
    value, gate, weight = make((3, 5, 16), torch.float32)
    torch.testing.assert_close(
        fusion_epilogue(value, gate, weight, EPS), numerics.fusion_reference(value, gate, weight, EPS), rtol=0, atol=0
    )
    monkeypatch.setattr(dispatch, "FUSED_MIN_ROWS", 15)
    assert dispatch.use_kernel(15, True) and not dispatch.use_kernel(14, True)


@pytest.mark.skipif(INTERPRETED, reason="needs a process where Triton is not interpreting")
def test_direct_entry_on_cpu_is_the_reference():
    value, gate, weight = make((4, 33), torch.float32)
    torch.testing.assert_close(
        K.glu_fusion_direct(value, gate, weight, EPS),
        numerics.fusion_reference(value, gate, weight, EPS),
        rtol=0,
        atol=0,
    )


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_dispatch_direct_without_autograd_op_for_large_autograd_calls():
    small, large = torch.zeros(8, 1536, device="cuda"), torch.zeros(dispatch.FUSED_MIN_ROWS, 1536, device="cuda")
    assert dispatch.fusion(small) is K.glu_fusion_direct and dispatch.fusion(large) is K.glu_fusion_direct
    small_g, large_g = small.clone().requires_grad_(), large.clone().requires_grad_()
    assert dispatch.fusion(small_g) is None and dispatch.fusion(large_g) is K.glu_fusion
    with torch.no_grad():
        assert dispatch.fusion(small_g) is K.glu_fusion_direct
