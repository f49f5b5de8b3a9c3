"""The compiled CPU backend: a Numba paged-attention decode kernel (the prefill kernel, in
``cpu_prefill``, builds on this module's helpers).

Numba compiles the kernel below to native code with LLVM (threads over (sequence,
partition) work items via ``prange``), so the CPU path runs the algorithm of the CUDA
kernel (block-table lookups, online softmax, split-K partitions), written once in readable
Python, with no C toolchain needed at install time. Numba has no float16/bfloat16 on the
CPU, so half-precision caches are passed as their uint16 bit patterns and widened to fp32
inside the loop.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic
from pagesim.kernels.backend import Backend
from pagesim.kernels.dtypes import STORAGE_KINDS

KIND_FLOAT32 = STORAGE_KINDS["float32"]
KIND_FLOAT16 = STORAGE_KINDS["float16"]
KIND_BFLOAT16 = STORAGE_KINDS["bfloat16"]
_KINDS = STORAGE_KINDS

# Reassociation lets LLVM vectorise the dot products; no nnan/ninf, since the
# running max starts at -inf. No nsz either: with it beside reassoc, Numba (0.68) ran a
# parallel kernel it had just compiled with other code than the same kernel loaded from its
# on-disk cache, so a checkout's first run computed other last bits than every later run.
_FASTMATH = {"reassoc", "contract", "arcp"}


@intrinsic
def _bits_as_float32(typingctx, bits):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


@intrinsic
def _float32_as_bits(typingctx, value):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return sig, codegen


@numba.njit(inline="always")
def _half_to_float32(h):
    # Shift the half's exponent and mantissa into fp32 position, then fix up
    # inf/NaN and (via a float subtraction) zero and subnormals.
    bits = (h & np.uint32(0x7FFF)) << np.uint32(13)
    exponent = bits & np.uint32(0x0F800000)
    bits += np.uint32((127 - 15) << 23)
    if exponent == np.uint32(0x0F800000):
        bits += np.uint32((128 - 16) << 23)
    elif exponent == 0:
        bits += np.uint32(1 << 23)
        bits = _float32_as_bits(_bits_as_float32(bits) - _bits_as_float32(np.uint32(113 << 23)))
    return _bits_as_float32(bits | ((h & np.uint32(0x8000)) << np.uint32(16)))


@numba.njit(inline="always")
def _load(x, kind):
    if kind == KIND_FLOAT32:
        return np.float32(x)
    bits = np.uint32(x)
    if kind == KIND_BFLOAT16:
        return _bits_as_float32(bits << np.uint32(16))
    return _half_to_float32(bits)


# The work split. A work item is one (sequence, partition) with every query head: it walks
# the partition's blocks in table order, a tile at a time, and each token's K (then V) row
# holds every KV head side by side (the cache is block-major), so each block is read front to
# back in whole rows instead of one head's slice at a stride of num_kv_heads · head_dim — the
# access pattern whose speed depended on which CPU's prefetcher ran it. A GQA group's query
# heads share each row while it is in L1: K/V are read once per KV head, not once per query
# head. Scores are gathered for a tile of whole blocks (≥ TILE_TOKENS tokens, ≥ TILE_STREAMS
# blocks) before one online-softmax rescale per head, so block size 1 does not pay an exp and a
# rescale per token. Within a tile the blocks are read side by side, token t of each in turn:
# scattered blocks are that many streams at once, where one block after another was one stream
# restarting at every block (on Intel Xeon the large case read K/V at 0.7 of SDPA's rate that
# way; figures in docs/benchmarks.md). A few long sequences are split into partitions (split-K,
# as vLLM's v2) whose states a second loop merges.
TILE_TOKENS = 32
TILE_STREAMS = 4


def tile_blocks_for(block_size: int) -> int:
    """Blocks per tile: at least TILE_TOKENS tokens and TILE_STREAMS blocks."""
    return max(TILE_STREAMS, TILE_TOKENS // block_size)


_tile_blocks = numba.njit(inline="always")(tile_blocks_for)
MIN_PARTITION_TOKENS = 512
# Work items wanted per launch: a constant, not the thread count, so that the output (its
# summation order) is the same on every machine.
TARGET_WORK_ITEMS = 16


def work_split(num_seqs: int, max_blocks: int, block_size: int) -> tuple[int, int, int]:
    """(blocks per tile, blocks per partition, partitions) for a launch. (Splitting few short
    sequences by KV heads instead would bring the strided reads back.)"""
    tile_blocks = tile_blocks_for(block_size)
    parts = 1
    if 0 < num_seqs < TARGET_WORK_ITEMS:
        longest_parts = max(1, max_blocks * block_size // MIN_PARTITION_TOKENS)
        parts = min(-(-TARGET_WORK_ITEMS // num_seqs), longest_parts)
    part_blocks = -(-max(1, max_blocks) // parts)
    part_blocks = -(-part_blocks // tile_blocks) * tile_blocks  # whole tiles
    return tile_blocks, part_blocks, -(-max(1, max_blocks) // part_blocks)


def _build_kernel(head_size: int, fixed_kind: int = -1):
    """The kernel, for any head size (``head_size`` 0: read from the query's shape) or for one
    fixed at compile time, as vLLM instantiates its attention kernels per head size: with a
    known trip count LLVM's dot products and value updates need no loop set-up and remainder
    per 64-element row (figures in docs/benchmarks.md). ``fixed_kind``: the storage kind it
    is compiled for (its argument ``kind`` then ignored), or -1: the one passed."""

    @numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, boundscheck=False)
    def kernel(
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        scale,
        kind,
        part_blocks,
        part_m,
        part_l,
        part_acc,
    ):
        num_seqs, num_heads, query_dim = query.shape
        head_dim = query_dim if head_size == 0 else head_size  # (folded: head_size is a constant)
        if fixed_kind >= 0:
            kind = fixed_kind
        block_size = key_cache.shape[1]
        num_kv = key_cache.shape[2]
        group = num_heads // num_kv
        num_parts = part_m.shape[1]
        tile_blocks = _tile_blocks(block_size)
        # A GQA group's query heads share each fp16/bf16 row: widen it once into `row` for all of
        # them (widening per head repeats the work for every head of the group). fp32 rows are
        # read in place, and so is a row one head uses.
        widen_once = kind != KIND_FLOAT32 and group > 1
        for work in numba.prange(num_seqs * num_parts):
            seq = work // num_parts
            part = work % num_parts
            context_len = context_lens[seq]
            seq_blocks = (context_len + block_size - 1) // block_size
            first_block = part * part_blocks
            last_block = min(seq_blocks, first_block + part_blocks)
            q = np.empty((num_heads, head_dim), np.float32)
            for h in range(num_heads):
                for d in range(head_dim):
                    q[h, d] = _load(query[seq, h, d], kind) * scale
            acc = np.zeros((num_heads, head_dim), np.float32)
            running_max = np.full(num_heads, -np.inf, np.float32)
            running_sum = np.zeros(num_heads, np.float32)
            scores = np.empty((num_heads, tile_blocks * block_size), np.float32)
            row = np.empty(head_dim, np.float32)
            physicals = np.empty(tile_blocks, np.int64)
            for tile_first in range(first_block, last_block, tile_blocks):
                tile_last = min(last_block, tile_first + tile_blocks)
                # The tile's blocks side by side (see TILE_STREAMS); only the sequence's last
                # block may hold fewer tokens, and it is the tile's last.
                streams = tile_last - tile_first
                for j in range(streams):
                    physicals[j] = block_tables[seq, tile_first + j]
                last_tokens = min(block_size, context_len - (tile_last - 1) * block_size)
                n = (streams - 1) * block_size + last_tokens
                for t in range(block_size):
                    reading = streams if t < last_tokens else streams - 1
                    for kvh in range(num_kv):
                        for j in range(reading):
                            physical = physicals[j]
                            if widen_once:
                                for d in range(head_dim):
                                    row[d] = _load(key_cache[physical, t, kvh, d], kind)
                            for g in range(group):
                                h = kvh * group + g
                                s = np.float32(0.0)
                                if widen_once:
                                    for d in range(head_dim):
                                        s += q[h, d] * row[d]
                                else:
                                    for d in range(head_dim):
                                        s += q[h, d] * _load(key_cache[physical, t, kvh, d], kind)
                                scores[h, j * block_size + t] = s
                for h in range(num_heads):
                    tile_max = running_max[h]
                    for i in range(n):
                        tile_max = max(tile_max, scores[h, i])
                    correction = np.float32(math.exp(running_max[h] - tile_max))
                    running_sum[h] *= correction
                    for d in range(head_dim):
                        acc[h, d] *= correction
                    for i in range(n):
                        p = np.float32(math.exp(scores[h, i] - tile_max))
                        scores[h, i] = p
                        running_sum[h] += p
                    running_max[h] = tile_max
                for t in range(block_size):
                    reading = streams if t < last_tokens else streams - 1
                    for kvh in range(num_kv):
                        for j in range(reading):
                            physical = physicals[j]
                            if widen_once:
                                for d in range(head_dim):
                                    row[d] = _load(value_cache[physical, t, kvh, d], kind)
                            for g in range(group):
                                h = kvh * group + g
                                p = scores[h, j * block_size + t]
                                if widen_once:
                                    for d in range(head_dim):
                                        acc[h, d] += p * row[d]
                                else:
                                    for d in range(head_dim):
                                        acc[h, d] += p * _load(value_cache[physical, t, kvh, d], kind)
            if num_parts == 1:
                for h in range(num_heads):
                    inv = np.float32(1.0) / running_sum[h] if running_sum[h] > 0 else np.float32(0.0)
                    for d in range(head_dim):
                        out[seq, h, d] = acc[h, d] * inv
            else:
                for h in range(num_heads):
                    part_m[seq, part, h] = running_max[h]
                    part_l[seq, part, h] = running_sum[h]
                    for d in range(head_dim):
                        part_acc[seq, part, h, d] = acc[h, d]
        if num_parts > 1:
            for work in numba.prange(num_seqs * num_heads):
                seq = work // num_heads
                h = work % num_heads
                top = -np.inf
                for p in range(num_parts):
                    top = max(top, part_m[seq, p, h])
                total = np.float32(0.0)
                for d in range(head_dim):
                    out[seq, h, d] = 0.0
                for p in range(num_parts):
                    if part_l[seq, p, h] > 0:
                        w = np.float32(math.exp(part_m[seq, p, h] - top))
                        total += part_l[seq, p, h] * w
                        for d in range(head_dim):
                            out[seq, h, d] += part_acc[seq, p, h, d] * w
                inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
                for d in range(head_dim):
                    out[seq, h, d] *= inv

    return kernel


class KernelChoice:
    """A kernel builder's compiled instances and the rule that picks one for a launch: fp32
    launches run instances compiled for fp32 alone (no storage-kind branches in the loops), the
    head sizes in ``fp32_head_sizes`` each its own; fp16/bf16 launches run the any-kind one.
    ``build(head_size, fixed_kind=-1)``: head size 0 reads it at run time."""

    def __init__(self, build, fp32_head_sizes: tuple[int, ...]) -> None:
        self.any_kind = build(0)
        self._fp32 = {size: build(size, KIND_FLOAT32) for size in (0, *fp32_head_sizes)}

    def __call__(self, head_dim: int, kind: int):
        if kind == KIND_FLOAT32:
            return self._fp32.get(head_dim, self._fp32[0])
        return self.any_kind


# The head sizes with their own fp32 kernel: those it makes faster (64, the app's heavy case;
# 128, the benchmark's large cases, on Intel Xeon); 32 ran slower with its own and stays
# generic (docs/benchmarks.md).
kernel_for = KernelChoice(_build_kernel, (64, 128))
_paged_attention_kernel = kernel_for.any_kind


@numba.njit(cache=True, boundscheck=False)
def _write_slots(key_cache, value_cache, slot_mapping, keys, values):
    block_size = key_cache.shape[1]
    for i in range(slot_mapping.shape[0]):
        block = slot_mapping[i] // block_size
        offset = slot_mapping[i] % block_size
        key_cache[block, offset] = keys[i]
        value_cache[block, offset] = values[i]


def _kernel_view(array: np.ndarray) -> np.ndarray:
    """Half types reach Numba as their uint16 bit patterns."""
    if array.dtype.itemsize == 2:
        return array.view(np.uint16)
    return array


class CpuBackend(Backend):
    name = "cpu"
    xp = np

    @property
    def device(self) -> str:
        threads = numba.get_num_threads()
        return f"CPU kernel · numba {numba.__version__}, {threads} thread{'s' if threads != 1 else ''} · no CUDA device"

    def write_kv(self, key_cache, value_cache, slot_mapping, keys, values) -> None:
        slots = np.ascontiguousarray(slot_mapping, dtype=np.int64)
        keys, values = np.ascontiguousarray(keys, key_cache.dtype), np.ascontiguousarray(values, key_cache.dtype)
        # One call for both: a real model writes every layer's K/V every step, each call microseconds.
        _write_slots(
            _kernel_view(key_cache), _kernel_view(value_cache), slots, _kernel_view(keys), _kernel_view(values)
        )

    def copy_blocks(self, key_cache, value_cache, block_mapping) -> None:
        mapping = np.asarray(block_mapping, dtype=np.int64).reshape(-1, 2)
        key_cache[mapping[:, 1]] = key_cache[mapping[:, 0]]
        value_cache[mapping[:, 1]] = value_cache[mapping[:, 0]]

    def _paged_prefill(self, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale):
        from pagesim.kernels.cpu_prefill import paged_prefill  # its own module: it builds on this one's helpers

        kind_name = self.kv_dtype_name(key_cache.dtype)
        return paged_prefill(query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, kind_name)

    def _paged_attention(self, query, key_cache, value_cache, block_tables, context_lens, scale):
        kind = _KINDS[self.kv_dtype_name(key_cache.dtype)]
        num_seqs, num_heads, head_dim = query.shape
        _, part_blocks, parts = work_split(num_seqs, block_tables.shape[1], key_cache.shape[1])
        out = np.empty(query.shape, dtype=np.float32)
        part_m = np.empty((num_seqs, parts, num_heads), np.float32)
        part_l = np.empty((num_seqs, parts, num_heads), np.float32)
        part_acc = np.empty((num_seqs, parts, num_heads, head_dim) if parts > 1 else (1, 1, 1, 1), np.float32)
        kernel_for(head_dim, kind)(
            out,
            _kernel_view(np.ascontiguousarray(query)),
            _kernel_view(key_cache),
            _kernel_view(value_cache),
            block_tables,
            context_lens,
            np.float32(scale),
            kind,
            part_blocks,
            part_m,
            part_l,
            part_acc,
        )
        return out
