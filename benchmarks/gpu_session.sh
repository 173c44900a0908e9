#!/usr/bin/env bash
# Every GPU check of this project in one device call (about 6 minutes on an H200):
#   bash benchmarks/gpu_session.sh [OUT_DIR] [--no-probes] [--paper-1b]
# 1. the `gpu`-marked tests of the captured serial scan, the model bench and the fusion dispatch;
# 2. `fbt-probe bench model --device cuda`: standard / full at T = 1,024, full with the serial step
#    captured as a CUDA graph and with the eager lean step (OUT_DIR/model-gpu.md);
# 3. the `gpu`-marked tests of the fusion kernel + the fusion benchmark (bench_fusion_gpu.sh), whose
#    `dispatch` column is the path the model takes at each row count against the best other path;
# 4. unless --no-probes: the `gpu` tests of the batched torch probe path and the probe-sweep
#    benchmark with it on the GPU;
# 5. with --paper-1b: the model bench of step 2 on `paper-1b` (random weights, one timed run each).
# The device image has torch + triton but not transformer-lens and a few of our dependencies:
# wheels in .whl/ are installed to /tmp/site first. Fetch them here (versions = this venv's), with
#   mkdir -p .git/info && echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     transformer-lens==4.3.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fancy-einsum==0.0.3 \
#     beartype==0.23.1 typeguard==4.6.1 concept-erasure==0.2.4 transformers==5.24.0 tokenizers==0.23.3 \
#     huggingface-hub==2.4.0 safetensors==0.8.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
# and name .whl in the device call's carry.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-reports/bench}}
FLAGS=" ${*:2} "
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PY=${PY:-python3}
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c "import transformer_lens, sklearn, torch; print('transformer-lens', transformer_lens.__version__ if hasattr(transformer_lens,'__version__') else '?', '| torch', torch.__version__)" 2>&1 | tail -2
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_scan.py tests/test_bench.py 2>&1 | tee "$OUT_DIR/gpu-graph-tests.log"; rc0=${PIPESTATUS[0]}
timeout 150 "$PY" -m fbt_probe bench model --device cuda --out "$OUT_DIR/model-gpu.md" --force; rc1=$?
timeout 300 bash benchmarks/bench_fusion_gpu.sh "$OUT_DIR"; rc2=$?
rc3=skipped rc4=skipped rc5=skipped
if [[ "$FLAGS" != *" --no-probes "* ]]; then
  timeout 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_probes_fast.py 2>&1 | tee "$OUT_DIR/gpu-probe-tests.log"; rc3=${PIPESTATUS[0]}
  timeout 150 "$PY" -m fbt_probe bench probes --torch --out "$OUT_DIR/probes-gpu.md" --force; rc4=$?
fi
if [[ "$FLAGS" == *" --paper-1b "* ]]; then
  timeout 180 "$PY" -m fbt_probe bench model --device cuda --preset paper-1b --repeats 1 --cache-batch 2 \
    --out "$OUT_DIR/model-gpu-paper-1b.md" --force; rc5=$?
fi
echo "graph/bench gpu tests exit $rc0, model bench exit $rc1, fusion tests+bench exit $rc2, probe gpu tests exit $rc3, probe bench exit $rc4, paper-1b model bench exit $rc5"
