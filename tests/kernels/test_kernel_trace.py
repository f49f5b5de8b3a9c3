"""The kernel walk-through's replay (kernels/trace.py) ends where the kernel ends: its
output equals the kernel's for every shipped scenario, for the CPU kernel's block-by-block
fold and the CUDA kernel's warps and groups, v1 and v2 (the real 512-token partitions and
a small teaching size)."""

import numpy as np
import pytest
from pagesim.core.scenario import load_scenario
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import work_split
from pagesim.kernels.cuda_build import TOKENS_PER_ITER
from pagesim.kernels.trace import CudaGeometry, trace_cpu, trace_cuda

from tests.scenarios import on_the_token_model


@pytest.fixture(scope="module")
def last_steps(cpu_backend):
    """Each scenario at its last step with attention: (inputs, report). The synthetic token
    model's (the real model's K/V go through the same kernels: its scenarios replay in the
    golden test with every layer checked)."""
    out = {}
    for name, source in sorted(on_the_token_model().items()):
        timeline = Timeline(load_scenario(source), cpu_backend)
        report = None
        for result in timeline.run_to_end():
            if result.attention is not None:
                report = result.attention
        cache = timeline.sim.runner.cache
        inputs = (
            report.query,
            cache.key_cache.copy(),
            cache.value_cache.copy(),
            report.block_tables,
            report.context_lens,
        )
        out[name] = (inputs, report)
    return out


def rows_of(report, limit=4):
    heads = report.query.shape[1]
    return [(r, h) for r in range(min(limit, len(report.seq_ids))) for h in sorted({0, heads - 1})]


@pytest.mark.parametrize("name", sorted(on_the_token_model()))
def test_every_replay_ends_at_the_kernels_output(last_steps, name):
    inputs, report = last_steps[name]
    for row, head in rows_of(report):
        want, bound = report.output[row, head], report.tolerances[row, head]
        replays = {
            "cpu": trace_cpu(*inputs, row, head, report.scale),
            "cuda-v1": trace_cuda(*inputs, row, head, report.scale, "v1"),
            "cuda-v2": trace_cuda(*inputs, row, head, report.scale, "v2"),
            "cuda-v2 teaching": trace_cuda(*inputs, row, head, report.scale, "v2", partition_size=16),
        }
        for label, trace in replays.items():
            err = float(np.abs(trace.output - want).max())
            assert err <= bound, f"{name} row {row} head {head} {label}: {err:.2e} > {bound:.2e}"


def test_the_replay_records_each_stage(last_steps):
    inputs, report = last_steps["synthetic_long_context"]
    row = int(np.argmax(report.context_lens))
    n = int(report.context_lens[row])
    bs = inputs[1].shape[1]
    cpu = trace_cpu(*inputs, row, 0, report.scale)
    assert [p for _, p in cpu.lookups] == list(report.block_tables[row, : -(-n // bs)])
    assert len(cpu.steps) == n
    # One fold per tile of whole blocks, tiles never crossing a partition, partitions reduced.
    tile_blocks, part_blocks, parts = work_split(report.query.shape[0], report.block_tables.shape[1], bs)
    seq_blocks = -(-n // bs)
    tiles = [(t, min(t + tile_blocks, (p + 1) * part_blocks, seq_blocks)) for p in range(parts)
             for t in range(p * part_blocks, min((p + 1) * part_blocks, seq_blocks), tile_blocks)]  # fmt: skip
    assert [(f["logical"], f["logical_end"]) for f in cpu.block_folds] == tiles
    assert len(cpu.partitions) == -(-seq_blocks // part_blocks) > 1  # 8k tokens beside a few short ones: split
    assert {m.stage for m in cpu.merges} == {"reduce"}
    rescaled = [f for f in cpu.block_folds if 0 < f["correction"] < 1.0]
    assert rescaled, "a new maximum arrived in some tile and rescaled what came before"
    firsts = {step.token for step in cpu.steps if step.correction != 1.0}
    assert firsts <= {lo * bs for lo, _ in tiles}  # a rescale only ever before a tile's first token
    assert {p.begin for p in cpu.partitions} <= firsts  # and every partition starts from an empty state
    v2 = trace_cuda(*inputs, row, 0, report.scale, "v2")
    assert [(p.begin, p.end) for p in v2.partitions] == [(b, min(b + 512, n)) for b in range(0, n, 512)]
    assert {m.stage for m in v2.merges} == {"group", "warp", "reduce"}
    geometry = v2.geometry
    for step in v2.steps[:200]:
        assert step.lane == geometry.lane_of(step.token, 512 * step.partition)


@pytest.mark.parametrize(
    "dtype, head_dim, group, tokens_per_warp",
    [("float32", 128, 32, 1), ("float16", 128, 16, 2), ("float16", 64, 8, 4), ("bfloat16", 8, 1, 32)],
)
def test_geometry_follows_the_cuda_source(dtype, head_dim, group, tokens_per_warp):
    from pagesim.kernels.dtypes import storage_dtype

    g = CudaGeometry.of(storage_dtype(dtype), head_dim)
    assert (g.group, g.tokens_per_warp) == (group, tokens_per_warp)
    span = tokens_per_warp * g.batch  # a warp's tokens per iteration: its groups' batches
    assert g.batch == TOKENS_PER_ITER > 1
    assert g.lane_of(0) == (0, 0, 0) and g.lane_of(tokens_per_warp) == (0, 0, 0)  # the batch's second
    assert g.lane_of(span) == (1, 0, 0) and g.lane_of(4 * span) == (0, 0, 1)


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, heads", [(8, 8, 1), (8, 4, 2), (8, 2, 4), (8, 1, 4), (32, 1, 4), (12, 2, 2), (9, 3, 1)]
)
def test_a_thread_block_takes_the_largest_power_of_two_of_its_group_up_to_four(num_heads, num_kv_heads, heads):
    from pagesim.kernels.cuda_build import heads_per_block

    assert heads_per_block(num_heads, num_kv_heads) == heads
    g = CudaGeometry.of(np.float16, 64, num_heads, num_kv_heads)
    assert g.heads_per_block == heads and g.thread_block_of(num_heads - 1) == (num_heads - 1) // heads


def test_a_gqa_walk_names_the_thread_block_its_heads_share():
    from pagesim.core.walkthrough import WalkThrough
    from pagesim.kernels.dtypes import storage_dtype

    rng = np.random.default_rng(4)
    dt = storage_dtype("float16")
    query = rng.standard_normal((1, 8, 64)).astype(dt)
    cache = rng.standard_normal((4, 16, 2, 64)).astype(dt)
    inputs = (query, cache, cache, np.array([[2, 0, 3]], np.int32), np.array([40], np.int32))
    trace = trace_cuda(*inputs, 0, 6, 0.125, "v1")
    assert trace.geometry.heads_per_block == 4 and trace.kv_head == 1
    walk = WalkThrough("A", 6, "cuda-v1", 512, trace, trace.output, trace.output, 1e-6, 0.0, (0,))
    assert "thread block 1 attends heads 4–7 (KV head 1)" in walk.stage_text(0)
    mha = trace_cuda(query, cache[:, :, :1].repeat(8, axis=2), cache[:, :, :1].repeat(8, axis=2), *inputs[3:], 0, 6,
                     0.125, "v1")  # fmt: skip
    assert "thread block" not in WalkThrough("A", 6, "cuda-v1", 512, mha, mha.output, mha.output, 1e-6, 0.0,
                                             (0,)).stage_text(0)  # fmt: skip


def test_a_stage_whose_max_came_from_a_later_token_says_so():
    """The CPU kernel takes a tile's max before its exps: at a tile's first token m can be a
    later token's score, and the stage's sentence says where it came from."""
    from pagesim.core.walkthrough import WalkThrough

    query = np.ones((1, 1, 4), np.float32)
    keys = np.zeros((2, 4, 1, 4), np.float32)
    keys[0, 2, 0] = 1.0  # token 2's score is the tile's highest
    inputs = (query, keys, keys, np.array([[0, 1]], np.int32), np.array([6], np.int32))
    trace = trace_cpu(*inputs, 0, 0, 0.5)
    walk = WalkThrough("A", 0, "cpu", 512, trace, trace.output, trace.output, 1e-6, 0.0, (0,))
    first, peak = walk.stage_text(0), walk.stage_text(2)
    assert "m starts at +2.000 (the highest score in this token's tile: the kernel finds it before" in first, first
    assert "score q·k·scale = +0.000" in first and "highest" not in peak
    # One tile holds the whole context: nothing is rescaled, and the first stage says why.
    assert walk.rescales == 0 and "no later max: nothing rescaled (a longer context shows it)" in first
    assert "nothing rescaled" not in peak


def test_a_cuda_replay_whose_merges_rescale_says_nothing_of_one_tile():
    # (its thread groups' maxima are rescaled at the merges: "nothing rescaled" was wrong there)
    from pagesim.core.walkthrough import WalkThrough

    query = np.ones((1, 1, 8), np.float32)
    keys = np.random.default_rng(1).standard_normal((4, 16, 1, 8)).astype(np.float32)
    inputs = (query, keys, keys, np.arange(4, dtype=np.int32)[None], np.array([60], np.int32))
    trace = trace_cuda(*inputs, 0, 0, 0.35, "v1", 512)
    walk = WalkThrough("A", 0, "cuda-v1", 512, trace, trace.output, trace.output, 1e-6, 0.0, (0,))
    assert trace.merges and "nothing rescaled" not in walk.stage_text(0)


def test_a_context_of_several_tiles_rescales_and_says_nothing_of_one_tile():
    from pagesim.core.walkthrough import WalkThrough

    rng = np.random.default_rng(3)
    blocks = 40  # more than one tile of the CPU kernel
    keys = rng.standard_normal((blocks, 4, 1, 4)).astype(np.float32)
    keys[-1] *= 8  # a late, larger score: a new maximum after the first tile
    query = np.ones((1, 1, 4), np.float32)
    inputs = (query, keys, keys, np.arange(blocks, dtype=np.int32)[None], np.array([blocks * 4], np.int32))
    trace = trace_cpu(*inputs, 0, 0, 0.5)
    walk = WalkThrough("A", 0, "cpu", 512, trace, trace.output, trace.output, 1e-6, 0.0, (0,))
    assert walk.rescales >= 1 and "nothing rescaled" not in walk.stage_text(0)
