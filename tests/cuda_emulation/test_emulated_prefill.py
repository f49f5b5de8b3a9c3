"""The real paged prefill kernel of paged_attention.cu, run on the CPU under the emulation of
the CUDA execution model, through the CUDA backend's own launch code, against float64 dense
causal attention.

The matrix: fp32/fp16/bf16 × head dims 8…256 × block sizes 1, 3, 7 (not dividing the tiles)
and 16, 64, 256 (the kernel takes the block size at run time only); GQA groups 1, 2, 3 (over
three KV heads, SmolLM2's 9/3), 4 and 8 rotate so that every dtype, head dim and block size
meets each group. Every launch is one mixed batch: a one-token prompt, a decode just past a
block edge, a prompt shorter than a block, a whole prompt over several query and KV tiles, a
chunk starting mid-block after a cached prefix, a chunk crossing a query tile's edge, and a
600-token decode.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pagesim.kernels.backend import KernelInputError
from pagesim.kernels.cuda_build import PREFILL_MAX_QUERY_TILE, prefill_query_tile

from tests.cuda_emulation import emulator
from tests.cuda_emulation.cases import make_prefill_case, mismatches, prefill_mismatches
from tests.cuda_emulation.test_emulated_kernels import DTYPES, Case

BLOCK_SIZES = (1, 3, 7, 16, 64, 256)
GQA_GROUPS = (1, 2, 3, 4, 8)
WORKERS = max(1, min(4, os.cpu_count() or 1))


def heads_for(group: int) -> tuple[int, int]:
    """(num_heads, num_kv_heads): three KV heads for a group of 3, one for 8 (MQA), else two."""
    num_kv_heads = {3: 3, 8: 1}.get(group, 2)
    return num_kv_heads * group, num_kv_heads


def batch_for(block_size: int) -> list[tuple[int, int]]:
    """(context_len, q_len) of every sequence of a launch."""
    half = max(1, block_size // 2)
    return [
        (1, 1),  # a one-token prompt
        (block_size + 1, 1),  # a decode just past a block edge
        (max(1, block_size - 1), max(1, block_size - 1)),  # a prompt shorter than a block (or of one token)
        (40, 40),  # a whole prompt: several query tiles and KV tiles
        (block_size + half + 37, 37),  # a chunk starting mid-block after a cached prefix
        (130, PREFILL_MAX_QUERY_TILE + 1),  # a chunk one row past a query tile
        (600, 1),  # a long decode
    ]


def group_for(dtype: str, head_dim: int, block_size: int) -> int:
    index = emulator.HEAD_DIMS.index(head_dim) + BLOCK_SIZES.index(block_size) + DTYPES.index(dtype)
    return GQA_GROUPS[index % len(GQA_GROUPS)]


def run_case(backend, dtype, head_dim, block_size) -> list[str]:
    group = group_for(dtype, head_dim, block_size)
    rng = np.random.default_rng([DTYPES.index(dtype), head_dim, block_size, group])
    num_heads, num_kv_heads = heads_for(group)
    case = make_prefill_case(
        rng, seqs=batch_for(block_size), block_size=block_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, dtype=dtype,
    )  # fmt: skip
    q, kc, vc = (backend.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
    got = backend.to_numpy(
        backend.paged_prefill_device(q, kc, vc, case.query_starts, case.block_tables, case.context_lens, case.scale)
    )
    return prefill_mismatches(got, case, f"prefill {dtype} d={head_dim} bs={block_size} gqa={group}")


@pytest.mark.parametrize("head_dim", emulator.HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_matches_float64_causal_attention(emulated_backend, dtype, head_dim):
    jobs = [(dtype, head_dim, bs) for bs in BLOCK_SIZES]
    with ThreadPoolExecutor(WORKERS) as pool:
        problems = [p for found in pool.map(lambda job: run_case(emulated_backend, *job), jobs) for p in found]
    assert not problems, "\n".join(problems)


def test_every_gqa_group_meets_every_dtype_head_dim_and_block_size():
    seen_dim = {(t, d, group_for(t, d, bs)) for t in DTYPES for d in emulator.HEAD_DIMS for bs in BLOCK_SIZES}
    seen_bs = {(t, bs, group_for(t, d, bs)) for t in DTYPES for d in emulator.HEAD_DIMS for bs in BLOCK_SIZES}
    assert len(seen_dim) == len(DTYPES) * len(emulator.HEAD_DIMS) * len(GQA_GROUPS)
    assert len(seen_bs) == len(DTYPES) * len(BLOCK_SIZES) * len(GQA_GROUPS)


def test_the_batches_cross_the_query_tiles_of_every_instantiation():
    """Every thread block's query tile (1 to 16 rows) is crossed by a prompt in every launch."""
    for head_dim in emulator.HEAD_DIMS:
        for heads in (1, 2, 4):
            tile = prefill_query_tile(head_dim, heads)
            assert 1 <= tile <= PREFILL_MAX_QUERY_TILE
            assert any(q_len > tile and q_len % tile for _, q_len in batch_for(16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_token_is_the_decode_kernel(emulated_backend, dtype):
    rng = np.random.default_rng(21)
    lens = [1, 16, 17, 511, 600]
    case = make_prefill_case(
        rng, seqs=[(n, 1) for n in lens], block_size=16, num_heads=9, num_kv_heads=3, head_dim=64, dtype=dtype
    )
    be = emulated_backend
    q, kc, vc = (be.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
    prefill = be.to_numpy(be.paged_prefill_device(q, kc, vc, *case.args[3:], case.scale))
    decode = be.to_numpy(be.paged_attention_device(q, kc, vc, case.block_tables, case.context_lens, case.scale, "v1"))
    as_decode = Case(case.query, case.key_cache, case.value_cache, case.block_tables, case.context_lens, case.scale)
    assert not prefill_mismatches(prefill, case, "prefill") and not mismatches(decode, as_decode, "v1")
    np.testing.assert_allclose(prefill, decode, atol=2e-6, rtol=0)


def test_an_empty_batch_launches_nothing(emulated_backend):
    kc = np.zeros((2, 16, 1, 64), np.float16)
    q = np.zeros((0, 2, 64), np.float16)
    out = emulated_backend.paged_prefill_device(q, kc, kc.copy(), [0], np.zeros((0, 1), np.int32), [], 0.1)
    assert out.shape == (0, 2, 64)


def test_device_entry_validates_like_the_host_one(emulated_backend):
    rng = np.random.default_rng(22)
    case = make_prefill_case(
        rng, seqs=[(5, 2), (9, 9)], block_size=4, num_heads=4, num_kv_heads=2, head_dim=64, dtype="float16"
    )
    be = emulated_backend
    q, kc, vc = (be.to_device(a) for a in (case.query, case.key_cache, case.value_cache))
    with pytest.raises(KernelInputError, match="but a context of 5"):
        be.paged_prefill_device(q, kc, vc, [0, 6, 11], case.block_tables, case.context_lens, 0.1)
    with pytest.raises(KernelInputError, match="from 0 to the 11 query tokens"):
        be.paged_prefill_device(q, kc, vc, [0, 2, 10], case.block_tables, case.context_lens, 0.1)
    tables = case.block_tables.copy()
    tables[1, 2] = 999
    with pytest.raises(KernelInputError, match="out of range"):
        be.paged_prefill_device(q, kc, vc, case.query_starts, tables, case.context_lens, 0.1)
    raw = np.empty(kc.nbytes + 16, np.uint8)
    offset = (-raw.ctypes.data) % 16 + 2  # 2 bytes past a 16-byte boundary
    shifted = raw[offset : offset + kc.nbytes].view(kc.dtype).reshape(kc.shape)
    shifted[...] = kc
    with pytest.raises(KernelInputError, match="16-byte boundary"):
        be.paged_prefill_device(q, shifted, vc, case.query_starts, case.block_tables, case.context_lens, 0.1)
