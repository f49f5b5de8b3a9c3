"""How many thread blocks of a kernel an SM holds at once, how many waves a launch takes,
and from that which paged-attention kernel to launch.

A launch of G blocks on a device that holds B blocks per SM on S SMs runs in G / (B·S)
waves; the last wave is partly empty, so the device works at waves / ceil(waves) of its
capacity (a 1.3-wave launch idles 35 % of it in its second wave), and a launch of under
a few waves cannot hide its own tail. The plan below takes v1 (no reduce) when it already
fills ``MIN_WAVES`` waves, else v2 (split-K over 512-token partitions) when that gives more
waves; vLLM's rule (``kernels.cuda_backend.choose_variant``) stays selectable.

Plain arithmetic on the compiled kernel's attributes (registers, static shared memory)
and the device's limits, as CUDA's occupancy calculator does it; no GPU is needed to run
it, and the unit tests check it on the H200's and A100's published figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pagesim.kernels.geometry import CudaGeometry

MIN_WAVES = 4.0  # below this, v2 is taken if it gives more waves


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    sm_count: int
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    registers_per_sm: int = 65536
    shared_per_sm: int = 228 * 1024  # usable by blocks (the carve-out's maximum)
    reserved_shared_per_block: int = 1024  # sm_80 and later keep 1 KB per block for the system
    register_unit: int = 256  # registers are allocated per warp in units of this many
    shared_unit: int = 128
    warp_size: int = 32
    # For the bytes-in-flight estimate: peak DRAM bandwidth and a loaded DRAM latency (an
    # assumption, not a datasheet figure: ~600–700 ns is what microbenchmarks report).
    dram_bytes_per_s: float = 0.0
    dram_latency_s: float = 650e-9


# Published figures (CUDA occupancy calculator, compute capability 9.0 and 8.0; HBM3e and
# HBM2e peak bandwidth of the H200 SXM and the A100 80 GB SXM).
H200 = DeviceLimits("H200 (sm_90, 132 SMs)", sm_count=132, shared_per_sm=228 * 1024, dram_bytes_per_s=4.8e12)
A100 = DeviceLimits(
    "A100 (sm_80, 108 SMs)", sm_count=108, shared_per_sm=164 * 1024, dram_bytes_per_s=2.039e12, dram_latency_s=550e-9
)


def bytes_in_flight_per_warp(head_dim: int, itemsize: int) -> int:
    """What one warp of ``paged_attention.cu`` has in flight: each of its thread groups loads
    the head slices of K and of V (16 bytes a lane each) of a batch of TOKENS_PER_ITER tokens,
    all issued before the reduction uses any. So a warp holds 2 × batch × tokens_per_warp ×
    head_dim × itemsize bytes in flight."""
    geometry = CudaGeometry.of(np.dtype(f"f{itemsize}") if itemsize != 2 else np.float16, head_dim)
    return 2 * geometry.batch * geometry.tokens_per_warp * head_dim * itemsize


def dram_fraction(bytes_in_flight_per_sm: float, limits: DeviceLimits) -> float:
    """The share of peak DRAM bandwidth those bytes can sustain (Little's law: bandwidth ×
    latency bytes must be in flight to stream at the peak), at most 1."""
    needed = limits.dram_bytes_per_s * limits.dram_latency_s / limits.sm_count
    return min(1.0, bytes_in_flight_per_sm / needed) if needed else 0.0


@dataclass(frozen=True)
class KernelResources:
    threads: int  # per block
    registers: int  # per thread
    shared_bytes: int  # static shared memory per block


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limited_by: str  # "registers", "shared memory", "threads" or "blocks"

    def warps_per_sm(self, kernel: KernelResources, limits: DeviceLimits) -> int:
        return self.blocks_per_sm * math.ceil(kernel.threads / limits.warp_size)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(kernel: KernelResources, limits: DeviceLimits) -> Occupancy:
    """Resident blocks per SM and which limit binds (ties: the first of registers, shared
    memory, threads, blocks)."""
    warps = math.ceil(kernel.threads / limits.warp_size)
    registers_per_block = warps * _round_up(kernel.registers * limits.warp_size, limits.register_unit)
    shared_per_block = _round_up(kernel.shared_bytes, limits.shared_unit) + limits.reserved_shared_per_block
    by_registers = limits.registers_per_sm // registers_per_block if registers_per_block else limits.max_blocks_per_sm
    bounds = {
        "registers": by_registers,
        "shared memory": limits.shared_per_sm // shared_per_block,
        "threads": limits.max_threads_per_sm // (warps * limits.warp_size),
        "blocks": limits.max_blocks_per_sm,
    }
    limited_by = min(bounds, key=bounds.get)
    return Occupancy(bounds[limited_by], limited_by)


@dataclass(frozen=True)
class LaunchPlan:
    variant: str  # "v1" or "v2"
    grid_blocks: int
    partitions: int  # v2's per sequence (1 for v1)
    blocks_per_sm: int
    waves: float
    reason: str

    @property
    def efficiency(self) -> float:
        """Busy fraction of the device over the launch's waves (the tail wave partly idle)."""
        return self.waves / math.ceil(self.waves) if self.waves else 0.0


def plan_launch(
    num_seqs: int,
    num_heads: int,
    max_context_len: int,
    v1: KernelResources,
    v2: KernelResources,
    limits: DeviceLimits,
    partition_size: int,
    heads_per_block: int = 1,
) -> LaunchPlan:
    """v1 or v2 for a decode launch (grid: head groups × sequences, × partitions for v2; a
    thread block attends ``heads_per_block`` query heads of one KV group)."""
    partitions = max(1, math.ceil(max_context_len / partition_size))

    def plan(variant: str, kernel: KernelResources, parts: int, reason: str) -> LaunchPlan:
        grid = num_heads // heads_per_block * num_seqs * parts
        resident = occupancy(kernel, limits).blocks_per_sm
        return LaunchPlan(variant, grid, parts, resident, grid / (resident * limits.sm_count), reason)

    one = plan("v1", v1, 1, "")
    if partitions == 1:
        return LaunchPlan(**{**one.__dict__, "reason": "the longest context fits one partition"})
    if one.waves >= MIN_WAVES:
        return LaunchPlan(**{**one.__dict__, "reason": f"v1 fills {one.waves:.1f} waves (≥ {MIN_WAVES:g})"})
    split = plan("v2", v2, partitions, "")
    if split.waves > one.waves:
        reason = f"v1 would be {one.waves:.1f} waves; v2's {partitions} partitions give {split.waves:.1f}"
        return LaunchPlan(**{**split.__dict__, "reason": reason})
    return LaunchPlan(**{**one.__dict__, "reason": f"v2 gives no more waves than v1's {one.waves:.1f}"})
