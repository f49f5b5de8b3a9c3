"""The occupancy model on the H200's and A100's published limits, with the register and
shared-memory figures ptxas reports for the kernels (docs/kernel-resources.md)."""

import pytest
from pagesim.kernels.cuda_build import NUM_THREADS, PARTITION_SIZE
from pagesim.kernels.occupancy import A100, H200, MIN_WAVES, KernelResources, Occupancy, occupancy, plan_launch

# paged_attention_v1/v2<fp16, 128, 16> as ptxas reports them (docs/kernel-resources.md):
# registers on sm_90 / sm_80, 2080 B of shared memory.
V1_SM90, V2_SM90 = KernelResources(NUM_THREADS, 48, 2080), KernelResources(NUM_THREADS, 56, 2080)
V1_SM80, V2_SM80 = KernelResources(NUM_THREADS, 56, 2080), KernelResources(NUM_THREADS, 56, 2080)


def test_registers_bind_and_are_allocated_per_warp_in_units_of_256():
    # 40 registers × 32 lanes = 1280 per warp, 4 warps: 5120 a block, 12 in 64 K registers.
    exact = KernelResources(NUM_THREADS, 40, 2080)
    assert occupancy(exact, H200).blocks_per_sm == 12 and occupancy(exact, H200).limited_by == "registers"
    # 45 × 32 = 1440, rounded up to 1536 a warp: 10 blocks, not the 11 a plain division gives.
    assert occupancy(KernelResources(NUM_THREADS, 45, 2080), H200).blocks_per_sm == 10
    assert occupancy(V1_SM90, H200).blocks_per_sm == 10  # 48 × 32 = 1536 exactly
    assert occupancy(V1_SM80, A100).blocks_per_sm == 9  # 56 × 32 = 1792 a warp


def test_other_limits_bind_when_they_are_tighter():
    big_shared = KernelResources(128, 16, 48 * 1024)  # (48 K + 1 K reserved) a block
    assert occupancy(big_shared, H200) == Occupancy(4, "shared memory")
    assert occupancy(big_shared, A100).blocks_per_sm == 3  # the A100 has 164 K a SM, not 228 K
    light = KernelResources(128, 16, 0)
    assert occupancy(light, H200).blocks_per_sm == 16 and occupancy(light, H200).limited_by == "threads"
    tiny = KernelResources(32, 16, 0)
    assert occupancy(tiny, H200).blocks_per_sm == 32 and occupancy(tiny, H200).limited_by == "blocks"


def test_the_headline_case_is_not_a_one_and_a_half_wave_launch():
    # 64 sequences × 4096 tokens × 32 heads, fp16, head dim 128: v1 is 2048 blocks, 10 a SM
    # on 132 SMs — 1.55 waves, the second one half empty (1.29 with the 40 registers of the
    # kernel's earlier loop, which loaded V only after reducing K).
    plan = plan_launch(64, 32, 4096, V1_SM90, V2_SM90, H200, PARTITION_SIZE)
    assert plan.variant == "v2" and plan.partitions == 8 and plan.grid_blocks == 16384
    assert plan.waves == pytest.approx(16384 / (9 * 132)) and plan.waves >= MIN_WAVES
    assert "v1 would be 1.6 waves" in plan.reason
    before = plan_launch(64, 32, 4096, KernelResources(NUM_THREADS, 40, 2080), V2_SM90, H200, PARTITION_SIZE)
    assert "v1 would be 1.3 waves" in before.reason and before.variant == "v2"
    a100 = plan_launch(64, 32, 4096, V1_SM80, V2_SM80, A100, PARTITION_SIZE)
    assert a100.variant == "v2" and a100.waves == pytest.approx(16384 / (9 * 108))


def test_v1_when_it_already_fills_the_device_or_the_context_is_one_partition():
    many = plan_launch(512, 32, 2048, V1_SM90, V2_SM90, H200, PARTITION_SIZE)  # 16384 blocks of v1
    assert many.variant == "v1" and many.waves >= MIN_WAVES and many.efficiency > 0.9
    short = plan_launch(2, 8, 300, V1_SM90, V2_SM90, H200, PARTITION_SIZE)
    assert short.variant == "v1" and short.partitions == 1 and "one partition" in short.reason
    # vLLM's rule would take v1 here too (a single partition); where they differ:
    from pagesim.kernels.cuda_backend import choose_variant

    assert choose_variant(4096, 64, 32) == "v1"  # 2048 (sequence, head) pairs > 512: vLLM says v1
    assert plan_launch(64, 32, 4096, V1_SM90, V2_SM90, H200, PARTITION_SIZE).variant == "v2"


def test_efficiency_counts_the_tail_wave():
    plan = plan_launch(64, 32, 4096, V1_SM90, V2_SM90, H200, PARTITION_SIZE)
    assert plan.efficiency == pytest.approx(plan.waves / 14)


def test_bytes_in_flight_follow_the_thread_group_layout_and_littles_law():
    from pagesim.kernels.occupancy import bytes_in_flight_per_warp, dram_fraction

    # fp16, head dim 128: groups of 16 lanes × 16 B, two groups a warp, a batch of two tokens
    # each, K and V: 2 KB; fp32 head dim 256: one group, two 16-byte loads a lane: 4 KB.
    assert bytes_in_flight_per_warp(128, 2) == 2048 and bytes_in_flight_per_warp(256, 4) == 4096
    assert bytes_in_flight_per_warp(24, 2) == 2 * 2 * 8 * 24 * 2  # groups of 4 lanes, 8 groups a warp
    # The H200 needs 4.8 TB/s × 650 ns / 132 SMs ≈ 23.6 KB in flight a SM to stream at the peak.
    assert dram_fraction(40 * 512, H200) == pytest.approx(40 * 512 / (4.8e12 * 650e-9 / 132))
    assert dram_fraction(48 * 512, H200) == 1.0 and dram_fraction(40 * 512, A100) == 1.0


def test_a_gqa_group_shares_thread_blocks_and_the_plan_counts_the_smaller_grid():
    # 32 query heads over 8 KV heads: 4 heads a thread block, 125 / 122 registers (ptxas,
    # sm_90, fp16 head dim 128): 4 blocks a SM. v1 would be 8 × 64 = 512 blocks, under one
    # wave of 528; v2's 8 partitions give 4096 blocks, 7.8 waves.
    v1, v2 = KernelResources(NUM_THREADS, 125, 8320), KernelResources(NUM_THREADS, 122, 8320)
    assert occupancy(v1, H200).blocks_per_sm == 4 and occupancy(v1, H200).limited_by == "registers"
    plan = plan_launch(64, 32, 4096, v1, v2, H200, PARTITION_SIZE, heads_per_block=4)
    assert plan.variant == "v2" and plan.grid_blocks == 4096
    assert plan.waves == pytest.approx(4096 / (4 * 132)) and "v1 would be 1.0 waves" in plan.reason
    # One head a block would launch four times the blocks for the same K/V bytes.
    assert plan_launch(64, 32, 4096, V1_SM90, V2_SM90, H200, PARTITION_SIZE).grid_blocks == 4 * plan.grid_blocks
