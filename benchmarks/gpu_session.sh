#!/usr/bin/env bash
# Every GPU check of this project in one device call (about 5 minutes on an H200):
#   bash benchmarks/gpu_session.sh [OUT_DIR]
# 1. the `gpu`-marked tests of the fusion kernel + the fusion benchmark (bench_fusion_gpu.sh);
# 2. the `gpu`-marked tests of the batched torch probe path;
# 3. the probe-sweep benchmark with the batched torch path on the GPU.
# The device image has torch + triton but not transformer-lens and a few of our dependencies:
# wheels in .whl/ are installed to /tmp/site first. Fetch them here (versions = this venv's), with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     transformer-lens==4.3.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fancy-einsum==0.0.3 \
#     beartype==0.23.1 typeguard==4.6.1 concept-erasure==0.2.4 transformers==5.24.0 tokenizers==0.23.3 \
#     huggingface-hub==2.4.0 safetensors==0.8.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
# and name .whl in the device call's carry.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-reports/bench}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PY=${PY:-python3}
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import transformer_lens, sklearn, torch; print('transformer-lens', transformer_lens.__version__ if hasattr(transformer_lens,'__version__') else '?', '| torch', torch.__version__)" 2>&1 | tail -2
timeout 300 bash benchmarks/bench_fusion_gpu.sh "$OUT_DIR"; rc1=$?
timeout 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_probes_fast.py 2>&1 | tee "$OUT_DIR/gpu-probe-tests.log"; rc2=${PIPESTATUS[0]}
timeout 150 "$PY" -m fbt_probe bench probes --torch --out "$OUT_DIR/probes-gpu.md" --force; rc3=$?
echo "fusion tests+bench exit $rc1, probe gpu tests exit $rc2, probe bench exit $rc3"
