#!/usr/bin/env bash
# Issue 7 on a CUDA machine, in one call: the GPU tests of the fusion kernel, then the benchmark.
#   bash benchmarks/bench_fusion_gpu.sh [OUT_DIR]     (default: $OUT if set, else reports/bench)
# Writes OUT_DIR/gpu.txt (device), OUT_DIR/gpu-tests.log, OUT_DIR/fusion-gpu.md (+ .json).
# Python: .venv/bin/python if present, else python3 (the device image's, with CUDA torch + triton).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-reports/bench}}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# the package from this checkout, installed or not (the kernels are fbt_probe/kernels/)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  "$PY" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT_DIR/gpu.txt"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels.py 2>&1 | tee "$OUT_DIR/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}
"$PY" benchmarks/bench_fusion_gpu.py "$OUT_DIR"
bench_rc=$?
echo "gpu tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
