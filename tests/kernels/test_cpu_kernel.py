import os
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch
from pagesim.kernels.backend import KernelInputError, default_scale
from pagesim.kernels.cpu_backend import _half_to_float32
from pagesim.kernels.dtypes import storage_dtype, tolerance
from pagesim.kernels.reference import dense_attention, paged_attention_reference


def make_case(rng, *, num_seqs, context_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, spare=3):
    """A random pool with each sequence's blocks scattered over it (plus unused spare blocks)."""
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + spare
    dt = storage_dtype(dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    value_cache = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    # Poison every slot a kernel must not read: a masked slot leaking in shows as NaN.
    perm = rng.permutation(num_blocks)
    block_tables = np.zeros((num_seqs, max(blocks_per_seq)), dtype=np.int32)
    start = 0
    for s, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        block_tables[s, :nb] = perm[start : start + nb]
        last = perm[start + nb - 1]
        key_cache[last, n - (nb - 1) * block_size :] = np.nan
        value_cache[last, n - (nb - 1) * block_size :] = np.nan
        start += nb
    for b in perm[start:]:
        key_cache[b] = np.nan
        value_cache[b] = np.nan
    query = rng.standard_normal((num_seqs, num_heads, head_dim), dtype=np.float32).astype(dt)
    return query, key_cache, value_cache, block_tables, np.array(context_lens, dtype=np.int32)


def boundary_case(rng, block_size, head_dim, gqa, dtype, longest):
    """Lengths at, just under and just over block boundaries, a single token and ``longest``;
    GQA ratio ``gqa`` over 2 KV heads (1 for ratio 8, i.e. MQA-like)."""
    num_kv_heads = 2 if gqa < 8 else 1
    lens = sorted({1, block_size, block_size + 1, 2 * block_size - 1, 3 * block_size, 67, longest})
    return make_case(
        rng,
        num_seqs=len(lens),
        context_lens=lens,
        block_size=block_size,
        num_heads=num_kv_heads * gqa,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )


def dense_for(query, key_cache, value_cache, block_tables, context_lens, scale):
    block_size = key_cache.shape[1]
    out = []
    for s, n in enumerate(context_lens):
        slots = [(block_tables[s, p // block_size], p % block_size) for p in range(n)]
        k = np.stack([key_cache[b, o] for b, o in slots])
        v = np.stack([value_cache[b, o] for b, o in slots])
        out.append(dense_attention(query[s], k, v, scale).numpy())
    return np.stack(out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("gqa", [1, 2, 8])
@pytest.mark.parametrize("head_dim", [8, 64, 128, 256])
@pytest.mark.parametrize("block_size", [1, 3, 4, 16, 64])
def test_kernel_matches_dense_attention(cpu_backend, block_size, head_dim, gqa, dtype):
    rng = np.random.default_rng(block_size * 1000 + head_dim * 10 + gqa)
    case = boundary_case(rng, block_size, head_dim, gqa, dtype, longest=100)
    scale = default_scale(head_dim)
    out = cpu_backend.paged_attention(*case, scale)
    expected = dense_for(*case, scale)
    assert out.shape == expected.shape and out.dtype == np.float32
    assert np.isfinite(out).all(), "a masked or unused slot leaked into the output"
    np.testing.assert_allclose(out, expected, atol=tolerance(dtype) / 10, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_few_long_sequences_are_split_into_partitions_and_merged_exactly_enough(cpu_backend, block_size, dtype):
    from pagesim.kernels.cpu_backend import MIN_PARTITION_TOKENS, work_split

    rng = np.random.default_rng(block_size)
    lens = [3000, 1100, 5]  # a long one, a middling one, one shorter than a tile
    case = make_case(
        rng, num_seqs=3, context_lens=lens, block_size=block_size, num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype
    )
    tile_blocks, part_blocks, parts = work_split(3, case[3].shape[1], block_size)
    assert parts > 1 and part_blocks % tile_blocks == 0 and part_blocks * block_size >= MIN_PARTITION_TOKENS
    assert (parts - 1) * part_blocks < case[3].shape[1] <= parts * part_blocks  # every block in one partition
    scale = default_scale(32)
    out = cpu_backend.paged_attention(*case, scale)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, dense_for(*case, scale), atol=tolerance(dtype) / 10, rtol=0)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("lens", [[3000, 1100, 5], [200 + 37 * i for i in range(20)]], ids=["partitioned", "one-part"])
def test_an_fp32_kernel_computes_what_the_any_kind_kernel_does(cpu_backend, lens, head_dim):
    """fp32 launches run kernels compiled for fp32 alone, head sizes 64 and 128 each its own
    (trip counts fixed at compile time), 32 the fp32 generic one; split into partitions or
    not, with GQA, each must agree with the any-kind kernel and with dense."""
    from pagesim.kernels.cpu_backend import (
        KIND_BFLOAT16,
        KIND_FLOAT16,
        KIND_FLOAT32,
        _paged_attention_kernel,
        kernel_for,
        work_split,
    )

    fp32_kernels = {size: kernel_for(size, KIND_FLOAT32) for size in (32, 64, 96, 128)}
    assert len({id(k) for k in fp32_kernels.values()}) == 3  # 64 and 128 their own; 32 and 96 one generic
    assert fp32_kernels[32] is fp32_kernels[96] and _paged_attention_kernel not in fp32_kernels.values()
    assert all(kernel_for(head_dim, kind) is _paged_attention_kernel for kind in (KIND_FLOAT16, KIND_BFLOAT16))
    rng = np.random.default_rng(len(lens) + head_dim)
    case = make_case(
        rng, num_seqs=len(lens), context_lens=lens, block_size=16, num_heads=8, num_kv_heads=2, head_dim=head_dim,
        dtype="float32",
    )  # fmt: skip
    query, key_cache, value_cache, block_tables, context_lens = case
    _, part_blocks, parts = work_split(len(lens), block_tables.shape[1], 16)
    outputs = []
    for kernel in (kernel_for(head_dim, KIND_FLOAT32), _paged_attention_kernel):
        out = np.empty(query.shape, np.float32)
        part_m = np.empty((len(lens), parts, 8), np.float32)
        part_l = np.empty((len(lens), parts, 8), np.float32)
        part_acc = np.empty((len(lens), parts, 8, head_dim) if parts > 1 else (1, 1, 1, 1), np.float32)
        scale = np.float32(default_scale(head_dim))
        kernel(out, query, key_cache, value_cache, block_tables, context_lens, scale, KIND_FLOAT32, part_blocks,
               part_m, part_l, part_acc)  # fmt: skip
        outputs.append(out)
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-6, rtol=0)
    expected = dense_for(*case, default_scale(head_dim))
    np.testing.assert_allclose(outputs[0], expected, atol=tolerance("float32") / 10, rtol=0)
    assert (parts > 1) == (len(lens) == 3)


def test_the_work_split_fills_the_cpu_with_whole_tiles_and_never_depends_on_the_thread_count():
    from pagesim.kernels.cpu_backend import TARGET_WORK_ITEMS, TILE_STREAMS, TILE_TOKENS, work_split

    assert work_split(16, 128, 16) == (TILE_STREAMS, 128, 1)  # enough sequences: no split
    assert work_split(1, 8, 16) == (TILE_STREAMS, 8, 1)  # too short to split
    tile_blocks, part_blocks, parts = work_split(1, 2048, 16)  # one 32k sequence
    assert parts == TARGET_WORK_ITEMS and parts * part_blocks >= 2048
    assert work_split(3, 10, 1)[0] == TILE_TOKENS  # blocks of one token: a tile of TILE_TOKENS
    assert work_split(3, 10, 64)[0] == TILE_STREAMS  # large blocks: TILE_STREAMS of them side by side
    numba.set_num_threads(1)
    try:
        assert work_split(1, 2048, 16) == (tile_blocks, part_blocks, parts)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_every_slot_is_read_exactly_once_even_at_32k_tokens(cpu_backend, block_size, dtype):
    # Against dense attention a lost slot weighs 1/L and hides under rounding past a few
    # thousand tokens. Here it cannot: a zero query gives every score 0, every weight
    # exp(0) = 1 and every rescale 1, so with small whole values in V the kernel's sums are
    # exact and its output is the slots' sum / L to a rounding or two, while one slot lost
    # or read twice moves a value by ≥ 1/L (60 of its ulps at 32k).
    rng = np.random.default_rng(7)
    lens = [32768, 1001]
    query, key_cache, value_cache, tables, context_lens = make_case(
        rng, num_seqs=2, context_lens=lens, block_size=block_size, num_heads=2, num_kv_heads=1, head_dim=8, dtype=dtype
    )
    query[:] = 0
    codes = rng.integers(1, 14, size=value_cache.shape)  # whole values, exact in every dtype
    value_cache[:] = np.where(np.isnan(value_cache.astype(np.float32)), np.nan, codes).astype(value_cache.dtype)
    out = cpu_backend.paged_attention(query, key_cache, value_cache, tables, context_lens, 0.3)
    for s, n in enumerate(lens):
        positions = np.arange(n)
        blocks, offsets = tables[s, positions // block_size], positions % block_size
        expected = value_cache[blocks, offsets, 0].astype(np.float64).sum(axis=0) / n  # (head_dim,)
        gap = np.abs(out[s].astype(np.float64) - expected[None, :])
        assert (gap <= 4 * np.spacing(np.float32(expected.max()))).all(), (s, gap.max(), 1 / n)


def test_kernel_matches_seed_gather_reference_on_the_article_example(cpu_backend):
    # The seed article's demo: torch.manual_seed(42), 8 blocks of 4, 2 heads, head dim 8.
    torch.manual_seed(42)
    key_cache = torch.randn(8, 4, 2, 8)
    value_cache = torch.randn(8, 4, 2, 8)
    block_tables = np.array([[0, 3, 5, 0, 0, 0, 0, 0], [1, 7, 0, 0, 0, 0, 0, 0]], dtype=np.int32)
    context_lens = np.array([10, 7], dtype=np.int32)
    query = torch.randn(2, 2, 1, 8)[:, :, 0, :]
    scale = 1.0 / 8**0.5
    reference = paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale)
    out = cpu_backend.paged_attention(
        query.numpy(), key_cache.numpy(), value_cache.numpy(), block_tables, context_lens, scale
    )
    assert out[:, :, None, :].shape == (2, 2, 1, 8)
    np.testing.assert_allclose(out, reference.numpy(), atol=1e-6)


def test_kernel_reads_through_the_table_not_the_pool_order(cpu_backend):
    rng = np.random.default_rng(3)
    query, kc, vc, tables, lens = make_case(
        rng, num_seqs=2, context_lens=[9, 12], block_size=4, num_heads=2, num_kv_heads=2, head_dim=8, dtype="float32"
    )
    right = cpu_backend.paged_attention(query, kc, vc, tables, lens, 0.3)
    # Attention is order-free over full blocks, so point the entry at other data.
    swapped = tables.copy()
    swapped[1, 0] = tables[0, 0]
    wrong = cpu_backend.paged_attention(query, kc, vc, swapped, lens, 0.3)
    np.testing.assert_array_equal(right[0], wrong[0])
    assert np.abs(right[1] - wrong[1]).max() > 1e-3


def test_shared_blocks_give_identical_outputs(cpu_backend):
    rng = np.random.default_rng(4)
    kc = rng.standard_normal((6, 4, 1, 16), dtype=np.float32)
    vc = rng.standard_normal((6, 4, 1, 16), dtype=np.float32)
    query = np.repeat(rng.standard_normal((1, 2, 16), dtype=np.float32), 2, axis=0)
    tables = np.array([[4, 2, 0], [4, 2, 0]], dtype=np.int32)
    out = cpu_backend.paged_attention(query, kc, vc, tables, np.array([11, 11], np.int32), 0.25)
    np.testing.assert_array_equal(out[0], out[1])


@numba.njit
def _decode_all(bits):
    out = np.empty(bits.shape[0], np.float32)
    for i in range(bits.shape[0]):
        out[i] = _half_to_float32(np.uint32(bits[i]))
    return out


def test_half_decode_is_exact_for_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    expected = bits.view(np.float16).astype(np.float32)
    got = _decode_all(bits)
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[finite], expected[finite])
    assert np.isnan(got[np.isnan(expected)]).all()
    np.testing.assert_array_equal(got[np.isinf(expected)], expected[np.isinf(expected)])


def _valid_inputs():
    rng = np.random.default_rng(5)
    return list(
        make_case(
            rng, num_seqs=2, context_lens=[5, 8], block_size=4, num_heads=4, num_kv_heads=2, head_dim=8, dtype="float32"
        )
    )


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a[3].__setitem__((0, 1), 99), "out of range"),
        (lambda a: a[3].__setitem__((1, 0), -1), "out of range"),
        (lambda a: a[4].__setitem__(0, 0), "≥ 1 token"),
        (lambda a: a[4].__setitem__(1, 40), "needs 10 blocks"),
        (lambda a: a.__setitem__(0, a[0].astype(np.float16)), "share one dtype"),
        (lambda a: a.__setitem__(0, a[0][:, :, :4]), "query must be"),
        (lambda a: a.__setitem__(0, np.concatenate([a[0], a[0][:, :1]], axis=1)), "must divide"),
        # (cast to int32 before the checks, these read block 1 and a 5-token context)
        (lambda a: a.__setitem__(3, a[3].astype(np.int64) + (a[3] == a[3][0, 1]) * 2**32), "outside the kernels' 32"),
        (lambda a: a.__setitem__(4, a[4] + 0.9), "context_lens must hold integers; got dtype float64"),
    ],
)
def test_bad_kernel_inputs_are_refused_before_launch(cpu_backend, mutate, message):
    from pagesim.kernels.cuda_backend import CudaBackend

    args = _valid_inputs()
    mutate(args)
    with pytest.raises(KernelInputError, match=message):
        cpu_backend.paged_attention(*args, 0.3)
    with pytest.raises(KernelInputError, match=message):  # the CUDA backend's own checks, no device needed
        CudaBackend.__new__(CudaBackend)._checked_decode_inputs(*args)


def test_an_index_just_past_int32_in_a_float32_array_is_refused_by_its_own_value():
    # (compared in float32, 2**31 - 1 rounds up to 2**31: the value passed and wrapped)
    from pagesim.kernels.backend import int32_indices

    with pytest.raises(KernelInputError, match="holds 2147483648, outside"):
        int32_indices(np.array([2.0**31], np.float32), "block_tables")
    np.testing.assert_array_equal(int32_indices(np.array([3.0, 0.0], np.float16), "x"), [3, 0])


FIRST_RUN_PROBE = """
import hashlib
import numpy as np
from pagesim.kernels.cpu_backend import CpuBackend
rng = np.random.default_rng(7)
key, value = (rng.standard_normal((24, 16, 2, 64)).astype(np.float32) for _ in range(2))
query = rng.standard_normal((3, 4, 64)).astype(np.float32)
tables = rng.permutation(24).astype(np.int32).reshape(3, 8)
out = CpuBackend().paged_attention(query, key, value, tables, np.array([128, 77, 5], np.int32), 0.125)
print(hashlib.sha256(np.asarray(out).tobytes()).hexdigest())
"""


def test_the_kernel_computes_the_same_bits_when_compiled_and_when_loaded_from_its_cache(tmp_path):
    """The first run of a checkout compiles the kernel, later runs load it from Numba's on-disk
    cache: both must compute the same bits (the fp32 head-size-64 kernel, a real model's)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", FIRST_RUN_PROBE], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    compiled = run()
    assert any(tmp_path.rglob("*.nbc"))  # it was cached ...
    assert run() == compiled  # ... and the cached code computes what the compiled code did
