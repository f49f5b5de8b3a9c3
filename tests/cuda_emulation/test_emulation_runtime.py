"""The emulation itself: shuffles and barriers are real rendezvous, and a barrier or
shuffle that some threads never reach is reported (naming where each thread waits)
instead of hanging. Also the sanitizer build of the real kernels."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_emulation import emulator, mutations, sanitized_run
from tests.cuda_emulation.sanitized_run import SUBSET

PROBES = r"""
namespace probe {
constexpr unsigned FULL = 0xffffffffu;

__global__ void xor_lanes(float* out, int lane_mask) {
  const int t = threadIdx.x;
  out[blockIdx.x * blockDim.x + t] = __shfl_xor_sync(FULL, static_cast<float>(t), lane_mask);
}

// Shared memory written by each warp, read by every thread after the barrier.
__global__ void barrier_orders_shared(int* out) {
  __shared__ int s[4];
  const int t = threadIdx.x;
  if (t % 32 == 0) s[t / 32] = 10 * (t / 32) + static_cast<int>(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = s[0] + s[1] + s[2] + s[3];
}

__global__ void barrier_in_a_branch(int* out) {
  if (threadIdx.x < 64) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void two_barriers(int* out) {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void half_warp_shuffles(float* out) {
  float v = 1.f;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(FULL, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

__global__ void skipped_shuffle(float* out, int n) {
  float s = static_cast<float>(threadIdx.x);
  for (int i = 0; i < n; ++i) {
    if (threadIdx.x == 3 && i == 1) continue;
    s += __shfl_xor_sync(FULL, s, 1);
  }
  out[threadIdx.x] = s;
}
}  // namespace probe
"""
NAMES = [
    f"probe::{n}"
    for n in ("xor_lanes", "barrier_orders_shared", "barrier_in_a_branch", "two_barriers", "half_warp_shuffles",
              "skipped_shuffle")
]  # fmt: skip


@pytest.fixture(scope="module")
def probes():
    if emulator.find_compiler() is None:
        pytest.skip("needs a C++20 compiler (g++ ≥ 10 or clang++ ≥ 10) to build the CUDA emulation")
    return emulator.EmulatedModule(emulator.build(source=PROBES, names=NAMES))


@pytest.mark.parametrize("lane_mask", [1, 2, 16, 31])
def test_shuffle_exchanges_between_xor_partners(probes, lane_mask):
    out = np.full(2 * 64, np.nan, np.float32)
    probes.get_function("probe::xor_lanes")((2,), (64,), (out, np.int32(lane_mask)))
    lanes = np.arange(64)
    expected = (lanes & ~31) + ((lanes % 32) ^ lane_mask)
    np.testing.assert_array_equal(out.reshape(2, 64), np.stack([expected, expected]))


def test_barrier_makes_every_warps_shared_write_visible(probes):
    out = np.zeros(3 * 128, np.int32)
    probes.get_function("probe::barrier_orders_shared")((3,), (128,), (out,))
    np.testing.assert_array_equal(out.reshape(3, 128), (60 + 4 * np.arange(3))[:, None] + np.zeros((1, 128)))


def test_a_barrier_in_a_branch_is_reported(probes):
    with pytest.raises(emulator.EmulationError) as info:
        probes.get_function("probe::barrier_in_a_branch")((1,), (128,), (np.zeros(128, np.int32),))
    message = str(info.value)
    assert "block (0,0,0)" in message and "only part of the block" in message
    assert "threads 0-63 wait at __syncthreads" in message and "threads 64-127 finished" in message


def test_barriers_at_different_sites_are_reported(probes):
    with pytest.raises(emulator.EmulationError, match=r"different barriers.*threads 0-63 wait at __syncthreads"):
        probes.get_function("probe::two_barriers")((1,), (128,), (np.zeros(128, np.int32),))


def test_a_deadlock_names_where_each_thread_waits(probes):
    with pytest.raises(emulator.EmulationError) as info:
        probes.get_function("probe::half_warp_shuffles")((1,), (64,), (np.zeros(64, np.float32),))
    message = str(info.value)
    assert "deadlock" in message
    assert "threads 0-15 wait at __shfl_xor_sync" in message
    assert "threads 16-31 wait at __syncthreads" in message


def test_a_lane_that_skips_a_shuffle_is_caught_even_at_the_same_site(probes):
    """Lane 3 skips one shuffle of a loop: it meets the others at the same line one sync
    behind, and is left alone (exited) at their last one."""
    with pytest.raises(emulator.EmulationError, match=r"divergent shuffle in warp 0.*thread 3 finished"):
        probes.get_function("probe::skipped_shuffle")((1,), (32,), (np.zeros(32, np.float32), np.int32(3)))


def test_zero_sized_grids_and_oversized_blocks_are_refused(probes):
    out = np.zeros(64, np.float32)
    with pytest.raises(emulator.EmulationError, match="zero"):
        probes.get_function("probe::xor_lanes")((0,), (64,), (out, np.int32(1)))
    with pytest.raises(emulator.EmulationError, match="1024"):
        probes.get_function("probe::xor_lanes")((1,), (2048,), (out, np.int32(1)))


def test_sanitizer_build_finds_no_out_of_bounds_or_misaligned_access():
    if mutations.asan_runtime() is None:
        pytest.skip("needs a C++20 compiler with AddressSanitizer's runtime (libasan)")
    names = sanitized_run.module_names()
    rc, output = mutations.run_subset(emulator.build(names=names, sanitize=True), sanitize=True)
    assert rc == 0, output[-8000:]
    assert f"{2 * len(SUBSET) + len(sanitized_run.PREFILL_SUBSET)} passed, 0 failed" in output


@pytest.mark.parametrize(
    "mutation, caught_by",
    [(m, "emulation: ") for m in mutations.MUTATIONS if "__syncthreads" in m.name]
    + [(m, "numerics: ") for m in mutations.MUTATIONS if m.name.startswith("wrong GQA head mapping")],
    ids=["barrier-in-a-branch", "gqa-mapping"],
)
def test_planted_kernel_bugs_are_caught(mutation, caught_by):
    """Two of the mutation check's planted bugs, in every run of the suite (the whole table:
    ``python -m tests.cuda_emulation.mutations``, recorded in docs/kernel-verification.md)."""
    if emulator.find_compiler() is None:
        pytest.skip("needs a C++20 compiler (g++ ≥ 10 or clang++ ≥ 10) to build the CUDA emulation")
    row = mutations.check(mutation, sanitize_too=False)
    assert row["optimised"].startswith(caught_by), row
