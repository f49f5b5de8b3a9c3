"""The real paged_attention.cu, run on the CPU under the emulation of the CUDA execution
model, through the CUDA backend's own launch code, against float64 dense attention.

The matrix: v1 and v2 + reduce × fp32/fp16/bf16 × head dims 8…256 × every block size the
kernel takes at run time (1, 3, 5, 7) or as a template constant (8 … 256); GQA groups 1,
2, 4 and 8 rotate so that every dtype, head dim and block size meets each group; every
launch holds sequences of 1, bs, bs+1, 511, 512, 513 and 1100 tokens.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pagesim.kernels.backend import KernelInputError
from pagesim.kernels.cuda_build import FAST_BLOCK_SIZES, PARTITION_SIZE, instantiation_for

from tests.cuda_emulation import emulator
from tests.cuda_emulation.cases import Case, dense_reference, lengths_for, make_case, mismatches

DTYPES = ("float32", "float16", "bfloat16")
RUNTIME_BLOCK_SIZES = (1, 3, 5, 7)
BLOCK_SIZES = RUNTIME_BLOCK_SIZES + FAST_BLOCK_SIZES
GQA_GROUPS = (1, 2, 4, 8)
WORKERS = max(1, min(4, os.cpu_count() or 1))


def heads_for(group: int) -> tuple[int, int]:
    """(num_heads, num_kv_heads): two KV heads, or one for a group of 8 (MQA-like)."""
    num_kv_heads = 2 if group < 8 else 1
    return num_kv_heads * group, num_kv_heads


def run_case(backend, variant, dtype, head_dim, block_size, group) -> list[str]:
    rng = np.random.default_rng([DTYPES.index(dtype), head_dim, block_size, group])
    num_heads, num_kv_heads = heads_for(group)
    case = make_case(
        rng,
        context_lens=lengths_for(block_size),
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    dev = [backend.to_device(a) for a in (case.query, case.key_cache, case.value_cache)]
    got = backend.to_numpy(
        backend.paged_attention_device(*dev, case.block_tables, case.context_lens, case.scale, variant)
    )
    label = f"{variant} {dtype} d={head_dim} bs={block_size} gqa={group}"
    return mismatches(got, case, label)


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("head_dim", emulator.HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_float64_dense_attention(emulated_backend, variant, dtype, head_dim):
    d_index = emulator.HEAD_DIMS.index(head_dim)
    jobs = [
        (variant, dtype, head_dim, bs, GQA_GROUPS[(d_index + b_index + DTYPES.index(dtype)) % len(GQA_GROUPS)])
        for b_index, bs in enumerate(BLOCK_SIZES)
    ]
    with ThreadPoolExecutor(WORKERS) as pool:
        problems = [p for found in pool.map(lambda job: run_case(emulated_backend, *job), jobs) for p in found]
    assert not problems, "\n".join(problems)


def test_every_gqa_group_meets_every_dtype_head_dim_and_block_size():
    seen_dim, seen_bs = set(), set()
    for dtype in DTYPES:
        for d_index, head_dim in enumerate(emulator.HEAD_DIMS):
            for b_index, bs in enumerate(BLOCK_SIZES):
                group = GQA_GROUPS[(d_index + b_index + DTYPES.index(dtype)) % len(GQA_GROUPS)]
                seen_dim.add((dtype, head_dim, group))
                seen_bs.add((dtype, bs, group))
    assert len(seen_dim) == len(DTYPES) * len(emulator.HEAD_DIMS) * len(GQA_GROUPS)
    assert len(seen_bs) == len(DTYPES) * len(BLOCK_SIZES) * len(GQA_GROUPS)


def test_the_matrix_reaches_every_compiled_variant_and_partition_edge():
    reached = {instantiation_for(dtype, d, bs) for dtype in DTYPES for d in emulator.HEAD_DIMS for bs in BLOCK_SIZES}
    assert {inst.block_size for inst in reached} == {0, *FAST_BLOCK_SIZES}
    assert {PARTITION_SIZE - 1, PARTITION_SIZE, PARTITION_SIZE + 1} <= set(lengths_for(16))
    assert max(lengths_for(16)) > 2 * PARTITION_SIZE  # three partitions, the last one partial


@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_contexts_straight_into_the_kernel_give_zeros(emulated_backend, emulated_module, variant, dtype):
    """Zero-length contexts bypass the host checks and go to the kernels as they are."""
    rng = np.random.default_rng(11)
    case = make_case(
        rng, context_lens=[0, 37, 0, 600], block_size=16, num_heads=4, num_kv_heads=2, head_dim=64, dtype=dtype
    )
    be = emulated_backend
    q, kc, vc = (be.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
    out = be.launch_paged_attention(q, kc, vc, case.block_tables, case.context_lens, 600, case.scale, variant)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[[0, 2]], 0.0)
    assert not mismatches(out, case, variant)

    # Every context empty: v1 still launches and writes zeros; v2 must not launch a zero-sized grid.
    empty = np.zeros(2, np.int32)
    inst = instantiation_for(dtype, 64, 16)
    out = np.full((2, 4, 64), np.nan, np.float32)
    emulated_module.get_function(inst.names["v1"])(
        (4, 2),
        (128,),
        (out, q[:2].copy(), kc, vc, case.block_tables[:2].copy(), empty, np.float32(0.125), np.int32(4),
         np.int32(2), np.int32(16), np.int32(case.block_tables.shape[1])),
    )  # fmt: skip
    np.testing.assert_array_equal(out, 0.0)
    out = be.launch_paged_attention(q[:2].copy(), kc, vc, case.block_tables[:2].copy(), empty, 0, 0.125, variant)
    np.testing.assert_array_equal(out, 0.0)


def test_v1_and_v2_agree_over_many_partitions(emulated_backend):
    rng = np.random.default_rng(5)
    case = make_case(
        rng, context_lens=[2600, 1025, 3], block_size=16, num_heads=4, num_kv_heads=2, head_dim=128, dtype="float16"
    )
    be = emulated_backend
    dev = [be.to_device(a) for a in (case.query, case.key_cache, case.value_cache)]
    v1 = be.paged_attention_device(*dev, case.block_tables, case.context_lens, case.scale, "v1")
    v2 = be.paged_attention_device(*dev, case.block_tables, case.context_lens, case.scale, "v2")
    assert not mismatches(v1, case, "v1") and not mismatches(v2, case, "v2")
    np.testing.assert_allclose(v1, v2, atol=2e-6, rtol=0)


def test_the_reference_bound_is_tight_enough_to_catch_one_zeroed_slot():
    """A single zeroed V slot in a 1100-token context moves the output by ~1/L: the bound
    must be below that, or the matrix could not see a lost token."""
    rng = np.random.default_rng(3)
    case = make_case(
        rng, context_lens=[1100], block_size=16, num_heads=2, num_kv_heads=2, head_dim=128, dtype="float16"
    )
    exact, tol = dense_reference(case)
    broken = Case(case.query, case.key_cache, case.value_cache.copy(), case.block_tables, case.context_lens, case.scale)
    broken.value_cache[case.block_tables[0, 30], 5] = 0
    moved, _ = dense_reference(broken)
    assert (np.abs(moved - exact).max(axis=2) > tol).all()


def _cache_on_device(be, seed, **shape):
    """A case's caches on the (emulated) device, and host copies of them as they start."""
    rng = np.random.default_rng(seed)
    case = make_case(rng, **shape)
    kc, vc = be.to_device(case.key_cache), be.to_device(case.value_cache)
    return rng, case, kc, vc, be.to_numpy(kc).copy(), be.to_numpy(vc).copy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_writes_slots_and_skips_minus_one(emulated_backend, dtype):
    be = emulated_backend
    shape = dict(context_lens=[5], block_size=4, num_heads=2, num_kv_heads=2, head_dim=24, dtype=dtype)
    rng, case, kc, vc, before_k, before_v = _cache_on_device(be, 7, **shape)
    slots = np.array([9, -1, 0, 7], np.int64)
    keys = rng.standard_normal((4, 2, 24), dtype=np.float32).astype(case.key_cache.dtype)
    values = rng.standard_normal((4, 2, 24), dtype=np.float32).astype(case.key_cache.dtype)
    be.write_kv(kc, vc, slots, keys, values)
    after_k, after_v = be.to_numpy(kc), be.to_numpy(vc)
    expect_k, expect_v = before_k.reshape(-1, 2, 24).copy(), before_v.reshape(-1, 2, 24).copy()
    for i, slot in enumerate(slots):
        if slot >= 0:
            expect_k[slot], expect_v[slot] = keys[i], values[i]
    np.testing.assert_array_equal(after_k.reshape(-1, 2, 24).view(np.uint8), expect_k.view(np.uint8))
    np.testing.assert_array_equal(after_v.reshape(-1, 2, 24).view(np.uint8), expect_v.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_copies_whole_blocks_bit_for_bit(emulated_backend, dtype):
    be = emulated_backend
    shape = dict(context_lens=[40], block_size=8, num_heads=2, num_kv_heads=1, head_dim=136, dtype=dtype)
    _, _, kc, vc, before_k, before_v = _cache_on_device(be, 8, **shape)
    mapping = np.array([[0, 3], [2, 1], [5, 6]], np.int64)
    be.copy_blocks(kc, vc, mapping)
    expect_k, expect_v = before_k.copy(), before_v.copy()
    for src, dst in mapping:
        expect_k[dst], expect_v[dst] = before_k[src], before_v[src]
    np.testing.assert_array_equal(be.to_numpy(kc).view(np.uint8), expect_k.view(np.uint8))
    np.testing.assert_array_equal(be.to_numpy(vc).view(np.uint8), expect_v.view(np.uint8))


# -- the launch path's host checks ---------------------------------------------------------
def _small(be, dtype="float16"):
    rng = np.random.default_rng(1)
    case = make_case(rng, context_lens=[5, 9], block_size=4, num_heads=4, num_kv_heads=2, head_dim=64, dtype=dtype)
    return case, [be.to_device(a) for a in (case.query, case.key_cache, case.value_cache)]


def test_device_entry_validates_like_the_host_one(emulated_backend):
    case, (q, kc, vc) = _small(emulated_backend)
    tables = case.block_tables.copy()
    tables[1, 0] = 999
    with pytest.raises(KernelInputError, match="out of range"):
        emulated_backend.paged_attention_device(q, kc, vc, tables, case.context_lens, 0.1)
    with pytest.raises(KernelInputError, match="value_cache"):
        emulated_backend.paged_attention_device(q, kc, vc[:, :, :1].copy(), case.block_tables, case.context_lens, 0.1)
    with pytest.raises(KernelInputError, match="share one dtype"):
        emulated_backend.paged_attention_device(q, kc, vc.astype(np.float32), case.block_tables, case.context_lens, 0.1)


def test_misaligned_device_pointers_are_refused(emulated_backend):
    case, (q, kc, vc) = _small(emulated_backend)
    raw = np.empty(kc.nbytes + 16, np.uint8)
    offset = (-raw.ctypes.data) % 16 + 2  # 2 bytes past a 16-byte boundary
    shifted = raw[offset : offset + kc.nbytes].view(kc.dtype).reshape(kc.shape)
    shifted[...] = kc
    with pytest.raises(KernelInputError, match="16-byte boundary"):
        emulated_backend.paged_attention_device(q, shifted, vc, case.block_tables, case.context_lens, 0.1)


def test_headless_query_and_oversized_grids_are_refused(emulated_backend):
    case, (q, kc, vc) = _small(emulated_backend)
    with pytest.raises(KernelInputError, match="head"):
        emulated_backend.paged_attention_device(q[:, :0], kc, vc, case.block_tables, case.context_lens, 0.1)
    many = 65536
    tables = np.zeros((many, 1), np.int32)
    lens = np.ones(many, np.int32)
    big_q = np.zeros((many, 4, 64), q.dtype)
    with pytest.raises(KernelInputError, match="65535"):
        emulated_backend.paged_attention_device(big_q, kc, vc, tables, lens, 0.1)


def test_bad_cache_writes_are_refused(emulated_backend):
    _, (_, kc, vc) = _small(emulated_backend)
    keys = np.zeros((1, 2, 64), kc.dtype)
    with pytest.raises(KernelInputError, match="values must be"):
        emulated_backend.write_kv(kc, vc, np.array([3]), keys, np.zeros((1, 2, 64), np.float32))
    with pytest.raises(KernelInputError, match="out of range"):
        emulated_backend.write_kv(kc, vc, np.array([-2]), keys, keys)
    with pytest.raises(KernelInputError, match="value_cache"):
        emulated_backend.copy_blocks(kc, vc[:1].copy(), np.array([[0, 1]]))


def test_arguments_are_marshalled_with_the_kernels_own_types(emulated_module):
    """A launch whose scalar types differ from the kernel's parameters is refused, as a
    wrong-sized argument would be garbage on a GPU."""
    inst = instantiation_for("float32", 8, 0)
    out = np.zeros((1, 1, 8), np.float32)
    q = np.zeros((1, 1, 8), np.float32)
    kc = np.zeros((1, 4, 1, 8), np.float32)
    args = [out, q, kc, kc, np.zeros((1, 1), np.int32), np.ones(1, np.int32), np.float32(1.0)]
    tail = [np.int32(1), np.int32(1), np.int32(4), np.int32(1)]
    with pytest.raises(emulator.EmulationError, match="argument kinds"):
        emulated_module.get_function(inst.names["v1"])((1, 1), (128,), (*args[:-1], np.int32(1), *tail))
    with pytest.raises(emulator.EmulationError, match="NumPy"):
        emulated_module.get_function(inst.names["v1"])((1, 1), (128,), (*args[:-1], 1.0, *tail))
    emulated_module.get_function(inst.names["v1"])((1, 1), (128,), (*args, *tail))
    assert np.isfinite(out).all()
