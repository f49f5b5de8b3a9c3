#!/usr/bin/env bash
# The device check, in one call: the GPU tests (the kernels' matrix, the engine and the real
# model on the device), a compute-sanitizer memcheck of a few cases and the CUDA benchmark,
# written to OUT (default $OUT, else ./gpu-results).
#   bash scripts/gpu_check.sh [OUT]
# Installs nothing system-wide. Python packages the GPU machine lacks travel as wheels in
# .whl/ (msgspec, pyzmq, tomli-w, gguf); a model file too large to travel is cut to its
# first layers (scripts/cut_gguf.py) into .gpu/, which PAGESIM_GPU_MODEL names.
# Every step has its own time limit, and pytest's are shorter than the outer ones, so the
# junit files and logs are written even when a step hangs.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
py="${PYTHON:-python3}"
SECONDS=0

# pagesim without installing it: a namespace folder whose subpackages are the top-level folders.
pkg="$(mktemp -d)"
site=""
trap 'rm -rf "$pkg" ${site:+"$site"}' EXIT
mkdir -p "$pkg/pagesim"
for d in app core kernels assets; do ln -s "$PWD/$d" "$pkg/pagesim/$d"; done
if compgen -G ".whl/*.whl" > /dev/null; then
  site="$(mktemp -d)"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH="$pkg:$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export PAGESIM_CACHE_DIR="${PAGESIM_CACHE_DIR:-$(mktemp -d)}"  # compiled modules, the model's dequantised weights
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" NUMBA_NUM_THREADS="${NUMBA_NUM_THREADS:-2}"  # one test worker per two cores
model="$(ls .gpu/*.gguf 2>/dev/null | head -1)"
[ -n "$model" ] && export PAGESIM_GPU_MODEL="$PWD/$model"

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1
  # Import once here so that import-time warnings are seen (and not raised in every test).
  "$py" -W default -c "import cupy, torch, numpy, numba; print('cupy', cupy.__version__, '· torch', torch.__version__, '· numpy', numpy.__version__, '· numba', numba.__version__); print('CUDA runtime', cupy.cuda.runtime.runtimeGetVersion(), '· driver', cupy.cuda.runtime.driverGetVersion(), '· NVRTC', cupy.cuda.nvrtc.getVersion()); print('cpus', __import__('os').cpu_count())"
  echo "model for the model tests: ${PAGESIM_GPU_MODEL:-none}"
} > "$out/device.txt" 2>&1
cat "$out/device.txt"

# 0. Every module the tests use, compiled in parallel into the cache folder (one NVRTC
#    compile each; the test workers then load the cubins).
timeout -k 10 120 "$py" - <<'EOF' 2>&1 | tee "$out/build.log"
import concurrent.futures as cf, time
import cupy
from pagesim.kernels.cuda_backend import cached_module_file, device_target
from pagesim.kernels.cuda_build import instantiation_for
arch = device_target(cupy.cuda.Device().compute_capability)
insts = [instantiation_for(d, h, 16) for d in ("float32", "float16", "bfloat16") for h in (8, 24, 32, 64, 128, 256)]
started = time.perf_counter()
with cf.ProcessPoolExecutor(max_workers=16) as pool:
    for inst, _ in zip(insts, pool.map(cached_module_file, insts, [arch] * len(insts))):
        pass
print(f"{len(insts)} modules compiled for {arch} in {time.perf_counter() - started:.1f} s")
EOF
build_rc=${PIPESTATUS[0]}
echo "[$SECONDS s] modules built rc=$build_rc"

# 1. The GPU suite, a worker per two cores: --maxfail so a broken context cannot cascade
#    through every case; per-test timeout (signal method: the test fails, the suite goes on).
# The model's scenarios first: the longest tests, started while the kernels' matrix fills the other workers.
tests="${TEST_PATHS:-tests/gpu/test_model_on_device.py tests/gpu tests/kernels/test_cuda_compile.py tests/kernels/test_cuda_module_cache.py}"
timeout -s INT -k 30 "${TESTS_LIMIT:-360}" "$py" -m pytest -c scripts/gpu-pytest.ini --rootdir . $tests -n "${WORKERS:-8}" \
  -q -p no:cacheprovider -p no:benchmark --maxfail=25 -o timeout=150 --durations=15 --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt" | tail -60
tests_rc=${PIPESTATUS[0]}
echo "[$SECONDS s] tests rc=$tests_rc"

# 2. compute-sanitizer memcheck over a few cases (out-of-bounds and misaligned device accesses).
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -n "$sanitizer" ]; then
  timeout -s INT -k 20 "${SANITIZER_LIMIT:-90}" "$sanitizer" --tool memcheck --error-exitcode 3 --log-file "$out/sanitizer.log" \
    "$py" -m pytest -c scripts/gpu-pytest.ini --rootdir . tests/gpu/test_cuda_kernels.py tests/gpu/test_prefill_kernel.py \
    -q -p no:cacheprovider -p no:benchmark -o timeout=80 -k "v1_and_v2_agree or shared_blocks or one_query_token or copy_on_write" 2>&1 | tail -5
  sanitizer_rc=${PIPESTATUS[0]}
else
  echo "compute-sanitizer not found" | tee "$out/sanitizer.log"
  sanitizer_rc=0
fi
echo "[$SECONDS s] sanitizer rc=$sanitizer_rc"

# 3. The benchmark.
timeout -s INT -k 20 "${BENCH_LIMIT:-150}" "$py" -m pagesim.app.cli bench --backend cuda --json "$out/bench-cuda.json" 2>&1 | tee "$out/bench-cuda.txt"
bench_rc=${PIPESTATUS[0]}
echo "[$SECONDS s] bench rc=$bench_rc"

# 4. The model's decode and prefill steps on the device, paged against dense.
if [ -n "${PAGESIM_GPU_MODEL:-}" ] && [ "${MODEL_BENCH_LIMIT:-90}" -gt 1 ]; then
  OMP_NUM_THREADS=8 timeout -s INT -k 10 "${MODEL_BENCH_LIMIT:-90}" "$py" scripts/gpu_model_bench.py "$PAGESIM_GPU_MODEL" "$out/model-bench-cuda.json" 2>&1 | tail -8
  model_rc=${PIPESTATUS[0]}
  echo "[$SECONDS s] model bench rc=$model_rc"
fi

# 5. Nsight Compute on the decode kernels: where their time goes (throughput, occupancy, stalls).
ncu="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
if [ -n "$ncu" ] && [ "${PROFILE_LIMIT:-90}" -gt 1 ]; then
  timeout -s INT -k 10 "${PROFILE_LIMIT:-90}" "$ncu" --clock-control none -k regex:paged_attention_v -c 8 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    "$py" scripts/gpu_profile.py > "$out/ncu.txt" 2>&1
  profile_rc=$?
  echo "[$SECONDS s] profile rc=$profile_rc"
fi
echo "[$SECONDS s] build rc=$build_rc tests rc=$tests_rc sanitizer rc=$sanitizer_rc bench rc=$bench_rc" \
  "model bench rc=${model_rc:-skipped} profile rc=${profile_rc:-skipped}"
exit $(( build_rc || tests_rc || sanitizer_rc || bench_rc || ${model_rc:-0} || ${profile_rc:-0} ))
