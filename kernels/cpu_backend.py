"""The compiled CPU backend: a Numba paged-attention decode kernel.

Numba compiles the kernel below to native code with LLVM (threads over
(sequence, head) pairs via ``prange``), so the CPU path runs the same loop as the
CUDA kernel, written once in readable Python, with no C toolchain needed at install
time. Numba has no float16/bfloat16 on the CPU, so half-precision caches are passed
as their uint16 bit patterns and widened to fp32 inside the loop.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from kernels.backend import Backend
from kernels.dtypes import STORAGE_KINDS

KIND_FLOAT32 = STORAGE_KINDS["float32"]
KIND_FLOAT16 = STORAGE_KINDS["float16"]
KIND_BFLOAT16 = STORAGE_KINDS["bfloat16"]
_KINDS = STORAGE_KINDS

# Reassociation lets LLVM vectorise the dot products; no nnan/ninf, since the
# running max starts at -inf.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


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


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, boundscheck=False)
def _paged_attention_kernel(out, query, key_cache, value_cache, block_tables, context_lens, scale, kind):
    num_seqs, num_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    heads_per_kv = num_heads // key_cache.shape[2]
    for work in numba.prange(num_seqs * num_heads):
        seq = work // num_heads
        head = work % num_heads
        kv_head = head // heads_per_kv
        context_len = context_lens[seq]

        q = np.empty(head_dim, np.float32)
        for d in range(head_dim):
            q[d] = _load(query[seq, head, d], kind) * scale
        acc = np.zeros(head_dim, np.float32)
        scores = np.empty(block_size, np.float32)
        running_max = -np.inf
        running_sum = np.float32(0.0)

        num_logical_blocks = (context_len + block_size - 1) // block_size
        for logical_block in range(num_logical_blocks):
            # The block-table lookup: logical block -> physical block, read in place.
            physical_block = block_tables[seq, logical_block]
            tokens_here = min(block_size, context_len - logical_block * block_size)

            block_max = -np.inf
            for t in range(tokens_here):
                s = np.float32(0.0)
                for d in range(head_dim):
                    s += q[d] * _load(key_cache[physical_block, t, kv_head, d], kind)
                scores[t] = s
                block_max = max(block_max, s)

            # Online softmax: rescale what was accumulated under the old max.
            new_max = max(running_max, block_max)
            correction = np.float32(math.exp(running_max - new_max))
            running_sum *= correction
            for d in range(head_dim):
                acc[d] *= correction
            for t in range(tokens_here):
                p = np.float32(math.exp(scores[t] - new_max))
                running_sum += p
                for d in range(head_dim):
                    acc[d] += p * _load(value_cache[physical_block, t, kv_head, d], kind)
            running_max = new_max

        inv_sum = np.float32(1.0) / running_sum
        for d in range(head_dim):
            out[seq, head, d] = acc[d] * inv_sum


@numba.njit(cache=True, boundscheck=False)
def _write_slots(cache, slot_mapping, rows):
    block_size = cache.shape[1]
    for i in range(slot_mapping.shape[0]):
        block = slot_mapping[i] // block_size
        offset = slot_mapping[i] % block_size
        cache[block, offset] = rows[i]


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
        return f"CPU kernel · numba {numba.__version__}, {numba.get_num_threads()} threads · no CUDA device"

    def write_kv(self, key_cache, value_cache, slot_mapping, keys, values) -> None:
        slots = np.ascontiguousarray(slot_mapping, dtype=np.int64)
        _write_slots(_kernel_view(key_cache), slots, _kernel_view(np.ascontiguousarray(keys, key_cache.dtype)))
        _write_slots(_kernel_view(value_cache), slots, _kernel_view(np.ascontiguousarray(values, key_cache.dtype)))

    def copy_blocks(self, key_cache, value_cache, block_mapping) -> None:
        mapping = np.asarray(block_mapping, dtype=np.int64).reshape(-1, 2)
        key_cache[mapping[:, 1]] = key_cache[mapping[:, 0]]
        value_cache[mapping[:, 1]] = value_cache[mapping[:, 0]]

    def _paged_attention(self, query, key_cache, value_cache, block_tables, context_lens, scale):
        kind = _KINDS[self.kv_dtype_name(key_cache.dtype)]
        out = np.empty(query.shape, dtype=np.float32)
        _paged_attention_kernel(
            out,
            _kernel_view(np.ascontiguousarray(query)),
            _kernel_view(key_cache),
            _kernel_view(value_cache),
            block_tables,
            context_lens,
            np.float32(scale),
            kind,
        )
        return out
