#!/usr/bin/env bash
# The device check, in one call: GPU tests, a compute-sanitizer memcheck of a few cases,
# the CUDA benchmark and the kernels' resource usage, written to OUT (default $OUT, else
# ./gpu-results). Installs nothing (the GPU machine has CuPy, torch, numba, ml-dtypes,
# pytest, pytest-timeout, hypothesis and nvcc; no pytest-qt, no tomli-w, no network).
#   bash scripts/gpu_check.sh [OUT]
# Every step has its own time limit, and pytest's are shorter than the outer ones, so the
# junit file and logs are written even when a step hangs.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  # Import once here so that import-time warnings are seen (and not raised in every test).
  "$py" -W default -c "import cupy, torch, numpy, numba; print('cupy', cupy.__version__, '· torch', torch.__version__, '· numpy', numpy.__version__, '· numba', numba.__version__); print('CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '· NVRTC', cupy.cuda.nvrtc.getVersion())"
} > "$out/device.txt" 2>&1
cat "$out/device.txt"

# 1. The GPU suite: --maxfail so a broken context cannot cascade through every case;
#    per-test timeout (signal method: the test fails, the suite goes on) under the outer one.
timeout -s INT -k 30 330 "$py" -m pytest -c scripts/gpu-pytest.ini --rootdir . tests/gpu tests/kernels/test_cuda_compile.py \
  -q -p no:cacheprovider --maxfail=25 -o timeout=90 --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

# 2. compute-sanitizer memcheck over a few cases (out-of-bounds and misaligned device accesses).
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -n "$sanitizer" ]; then
  timeout -s INT -k 20 150 "$sanitizer" --tool memcheck --error-exitcode 3 --log-file "$out/sanitizer.log" \
    "$py" -m pytest -c scripts/gpu-pytest.ini --rootdir . tests/gpu/test_cuda_kernels.py -q -p no:cacheprovider \
    -o timeout=120 -k "v1_and_v2_agree or shared_blocks" 2>&1 | tail -5
  sanitizer_rc=${PIPESTATUS[0]}
else
  echo "compute-sanitizer not found" | tee "$out/sanitizer.log"
  sanitizer_rc=0
fi

# 3. The benchmark.
timeout -s INT -k 20 200 "$py" -m pagesim.app.cli bench --backend cuda --json "$out/bench-cuda.json" 2>&1 | tee "$out/bench-cuda.txt"
bench_rc=${PIPESTATUS[0]}

"$py" scripts/kernel_resources.py --out "$out/kernel-resources.md" > "$out/build.log" 2>&1 || true
echo "tests rc=$tests_rc sanitizer rc=$sanitizer_rc bench rc=$bench_rc"
exit $(( tests_rc || sanitizer_rc || bench_rc ))
