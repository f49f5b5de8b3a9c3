"""The walk-through's assignment of tokens to warps, thread groups and partitions is the
one the CUDA source uses: every 16-byte K load of the real kernel, recorded under the
emulation, comes from the lane the replay says, in the order it says, once for all the
query heads of a KV group; and the replay's output equals the emulated kernel's."""

import numpy as np
import pytest
from pagesim.kernels.cuda_build import PARTITION_SIZE
from pagesim.kernels.trace import WARP, CudaGeometry, trace_cuda

from tests.cuda_emulation.cases import make_case


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize(
    "dtype, head_dim, num_heads, num_kv_heads",
    [("float32", 128, 4, 2), ("float16", 64, 8, 1), ("bfloat16", 24, 4, 2), ("float16", 64, 4, 4)],
)
def test_the_kernels_loads_come_from_the_lanes_the_replay_names(
    emulated_backend, emulated_module, variant, dtype, head_dim, num_heads, num_kv_heads
):
    rng = np.random.default_rng(head_dim)
    case = make_case(rng, context_lens=[37, 600], block_size=16, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, dtype=dtype)  # fmt: skip
    be = emulated_backend
    q, kc, vc = (be.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
    emulated_module.record_loads(True)
    try:
        out = be.paged_attention_device(q, kc, vc, case.block_tables, case.context_lens, case.scale, variant)
        loads = emulated_module.take_loads()
    finally:
        emulated_module.record_loads(False)
    geometry = CudaGeometry.of(kc.dtype, head_dim, num_heads, num_kv_heads)
    group = num_heads // num_kv_heads
    assert geometry.heads_per_block == min(group, 4)
    bs, kvh = kc.shape[1], kc.shape[2]
    base, item = kc.ctypes.data, kc.dtype.itemsize
    in_keys = (loads[:, 4] >= base) & (loads[:, 4] < base + kc.nbytes)
    seen: dict[tuple[int, int, int], list[int]] = {}  # (seq, thread block, lane) -> tokens, in load order
    chunks: dict[tuple[int, int, int], int] = {}  # (seq, KV head, token) -> 16-byte K loads
    for head_block, seq, partition, thread, address in loads[in_keys].tolist():
        element = (address - base) // item
        slot, within = divmod(element, kvh * head_dim)
        kv_head = within // head_dim
        # The GQA mapping: thread block x holds query heads x·H … x·H + H − 1, all of one KV head.
        assert kv_head == head_block * geometry.heads_per_block // group
        block, offset = divmod(slot, bs)
        logical = list(case.block_tables[seq]).index(block)
        token = logical * bs + offset
        warp, lane = divmod(thread, WARP)
        lane_warp, lane_group, _ = geometry.lane_of(token, partition * PARTITION_SIZE if variant == "v2" else 0)
        assert (warp, lane // geometry.group) == (lane_warp, lane_group), (token, thread)
        seen.setdefault((seq, head_block, thread), []).append(token)
        chunks[(seq, kv_head, token)] = chunks.get((seq, kv_head, token), 0) + 1
    for tokens in seen.values():
        assert tokens == sorted(tokens), "each lane walks its tokens in increasing order"
    expected = {(s, kv, t) for s, n in enumerate(case.context_lens) for kv in range(kvh) for t in range(int(n))}
    assert set(chunks) == expected  # every token read, nothing past the context
    # Each K row is read once per thread block: once for the whole group when it fits a block.
    blocks_per_kv_head = group // geometry.heads_per_block
    assert set(chunks.values()) == {blocks_per_kv_head * head_dim // geometry.vec}
    for seq in range(2):
        for head in range(num_heads):
            trace = trace_cuda(*case.args, seq, head, case.scale, variant)
            np.testing.assert_allclose(trace.output, out[seq, head], atol=2e-6, rtol=0)


@pytest.fixture(scope="module")
def scenario_backend():
    """The emulated CUDA backend with every head dim the shipped scenarios use."""
    from pagesim.core.scenario import load_scenario

    from tests.cuda_emulation import emulator
    from tests.scenarios import on_the_token_model

    if emulator.find_compiler() is None:
        pytest.skip("needs a C++20 compiler (g++ ≥ 10 or clang++ ≥ 10) to build the CUDA emulation")
    dims = sorted({load_scenario(source).config.head_dim for source in on_the_token_model().values()})
    module = emulator.EmulatedModule(emulator.build(names=emulator.backend_module_names(head_dims=dims)))
    return emulator.EmulatedCudaBackend(module)


def test_the_replay_ends_at_the_emulated_cuda_kernels_output_in_every_shipped_scenario(scenario_backend, cpu_backend):
    from pagesim.core.scenario import load_scenario
    from pagesim.core.timeline import Timeline

    from tests.scenarios import on_the_token_model

    be = scenario_backend
    for name, source in sorted(on_the_token_model().items()):
        timeline = Timeline(load_scenario(source), cpu_backend)
        report = None
        for result in timeline.run_to_end():
            report = result.attention or report
        cache = timeline.sim.runner.cache
        host = (report.query, cache.key_cache, cache.value_cache, report.block_tables, report.context_lens)
        q, kc, vc = (be.to_device(a) for a in host[:3])
        for variant in ("v1", "v2"):
            out = be.paged_attention_device(q, kc, vc, report.block_tables, report.context_lens, report.scale, variant)
            for row in range(min(3, len(report.seq_ids))):
                for head in (0, report.query.shape[1] - 1):
                    trace = trace_cuda(*host, row, head, report.scale, variant)
                    err = float(np.abs(trace.output - out[row, head]).max())
                    assert err <= report.tolerances[row, head], f"{name} {variant} row {row} head {head}: {err:.2e}"
