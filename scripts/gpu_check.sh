#!/usr/bin/env bash
# The device check, in one call: GPU tests, the CUDA benchmark and the kernels' resource
# usage, written to OUT (default $OUT, else ./gpu-results). Installs nothing; on an H200
# it finishes in a few minutes.
#   bash scripts/gpu_check.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c "import cupy, torch, numpy; print('cupy', cupy.__version__, '· torch', torch.__version__, '· numpy', numpy.__version__)"
} > "$out/device.txt" 2>&1
cat "$out/device.txt"

timeout 300 "$py" -m pytest -c scripts/gpu-pytest.ini --rootdir . tests/gpu tests/kernels/test_cuda_compile.py \
  -q -p no:cacheprovider --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 200 "$py" -m core.cli bench --backend cuda --json "$out/bench-cuda.json" 2>&1 | tee "$out/bench-cuda.txt"
bench_rc=${PIPESTATUS[0]}

"$py" scripts/kernel_resources.py --out "$out/kernel-resources.md" > /dev/null 2>&1 || true
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
