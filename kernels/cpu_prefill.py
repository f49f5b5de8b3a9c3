"""The CPU paged prefill kernel: causal attention of every sequence's new tokens over its
cached prefix and themselves, read through the block table (Numba, as the decode kernel).

Prefill (a prompt, a chunk of one, the recompute after preemption) first writes the new
tokens' K/V into the cache, then attends here; a prefix-cache hit is simply a prefix that
is already in the cache, so its tokens cost no query rows. A sequence with one new token
is a decode, so a batch may mix decodes and prefill chunks.

The decode kernel's discipline, extended to a tile of query rows: a work item is one
(sequence, tile of up to QUERY_TILE consecutive query rows) with every query head. It walks
the sequence's blocks in table order up to the tile's last position; each token's K (then
V) row holds every KV head side by side, one contiguous run, read and widened once per work
item and used by every query row of the tile that may see it (causal: position ≤ the row's)
and every query head of the KV head's GQA group. Scores are gathered for a tile of whole
blocks (≥ TILE_TOKENS tokens) before one online-softmax rescale per (query row, head).
Rows see a prefix of each tile's tokens, so the mask is a loop bound, never a -inf score.
(Unlike the decode kernel it reads a tile's blocks one after another: it widens them into
buffers once per work item and then computes from those, so reading is not what bounds it.)

A prefill does head_dim multiply-adds per (row, token) pair, so unlike the decode kernel it
is bound by arithmetic, not by reading K/V. So a tile's K and V rows are widened once into
two small buffers, and the loops are blocked as a matrix multiply's: query rows go in pairs
and tokens in fours, so that each load of a K or V row serves two rows and each load of a
query row four tokens, with the eight sums in registers; each row's maximum is taken as its
scores are made; the softmax's exponentials are a polynomial LLVM vectorises (``math.exp``
is a library call per element: this Numba has no SVML). A 512-token prompt's attention took
2.5x SDPA's time before and 1.1x after (one thread, CPU time; docs/benchmarks.md).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from pagesim.kernels.backend import query_tiles
from pagesim.kernels.cpu_backend import (
    _FASTMATH,
    _KINDS,
    TILE_TOKENS,
    KernelChoice,
    _bits_as_float32,
    _kernel_view,
    _load,
)

QUERY_TILE = 32  # query rows a work item attends together (sharing each K/V row it reads)

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 in two parts: n · _LN2_HI is exact for |n| < 2**11
_LN2_LO = np.float32(-2.12194440e-4)


@numba.njit(inline="always", fastmath=_FASTMATH)
def _exp_nonpositive(x):
    """e**x for x ≤ 0 (a score less its row's maximum): x = n·ln 2 + r with |r| ≤ ln 2 / 2,
    e**r by its degree-6 Taylor polynomial (relative error < 2e-7), 2**n put into the
    exponent bits: a loop of these LLVM vectorises. Below -87 it gives e**-87 (about the
    smallest normal float) instead of a subnormal or 0: a weight beside the row's largest,
    which is 1."""
    x = max(x, np.float32(-87.0))
    n = math.floor(x * _LOG2E + np.float32(0.5))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _bits_as_float32(np.uint32(np.int32(n) + np.int32(127)) << np.uint32(23))


def _build_prefill_kernel(head_size: int, fixed_kind: int = -1):
    """The kernel for any head size (``head_size`` 0) or one fixed at compile time, and for any
    storage kind (``fixed_kind`` -1: the one passed) or one (as the decode kernel's: figures in
    docs/benchmarks.md)."""

    @numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, boundscheck=False)
    def kernel(
        out, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, kind, work_seqs, work_rows
    ):
        if fixed_kind >= 0:
            kind = fixed_kind
        num_heads = query.shape[1]
        head_dim = query.shape[2] if head_size == 0 else head_size  # (folded: head_size is a constant)
        block_size = key_cache.shape[1]
        num_kv = key_cache.shape[2]
        group = num_heads // num_kv
        tile_blocks = max(1, TILE_TOKENS // block_size)
        for work in numba.prange(work_seqs.shape[0]):
            seq = work_seqs[work]
            row0 = work_rows[work]
            q_begin = query_starts[seq]
            q_end = query_starts[seq + 1]
            rows = min(QUERY_TILE, q_end - row0)
            context_len = context_lens[seq]
            # Query row i of the tile sits at position first_pos + i and sees positions 0..first_pos + i.
            first_pos = context_len - (q_end - q_begin) + (row0 - q_begin)
            kv_len = first_pos + rows  # the tile's last row sees this many tokens
            q = np.empty((rows, num_heads, head_dim), np.float32)
            for i in range(rows):
                for h in range(num_heads):
                    for d in range(head_dim):
                        q[i, h, d] = _load(query[row0 + i, h, d], kind) * scale
            acc = np.zeros((rows, num_heads, head_dim), np.float32)
            running_max = np.full((rows, num_heads), -np.inf, np.float32)
            running_sum = np.zeros((rows, num_heads), np.float32)
            tile_tokens = tile_blocks * block_size
            keys = np.empty((tile_tokens, num_kv, head_dim), np.float32)  # the tile's K and V rows, widened
            values = np.empty((tile_tokens, num_kv, head_dim), np.float32)
            scores = np.empty((2, tile_tokens), np.float32)  # a row pair's for one head, then their weights
            kv_blocks = (kv_len + block_size - 1) // block_size
            for tile_first in range(0, kv_blocks, tile_blocks):
                tile_last = min(kv_blocks, tile_first + tile_blocks)
                tile_pos = tile_first * block_size  # position of the tile's first token
                n = 0
                for logical in range(tile_first, tile_last):
                    physical = block_tables[seq, logical]
                    tokens_here = min(block_size, kv_len - logical * block_size)
                    for t in range(tokens_here):
                        for kvh in range(num_kv):
                            for d in range(head_dim):
                                keys[n, kvh, d] = _load(key_cache[physical, t, kvh, d], kind)
                        for kvh in range(num_kv):
                            for d in range(head_dim):
                                values[n, kvh, d] = _load(value_cache[physical, t, kvh, d], kind)
                        n += 1
                # Rows before i_begin see none of this tile; row i sees its first n_i tokens. Rows go
                # in pairs (a, b): each load of a K or V row serves both. (An odd last row pairs
                # with itself: its copy's weights are zeroed, so it adds nothing.)
                i_begin = max(0, tile_pos - first_pos)
                for a in range(i_begin, rows, 2):
                    b = min(a + 1, rows - 1)
                    n_a = min(n, first_pos + a + 1 - tile_pos)
                    n_b = min(n, first_pos + b + 1 - tile_pos)
                    both = n_a - n_a % 4  # tokens both rows see, four at a time
                    for h in range(num_heads):
                        kvh = h // group
                        max_a, max_b = running_max[a, h], running_max[b, h]
                        for k in range(0, both, 4):
                            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
                            for d in range(head_dim):
                                qa, qb = q[a, h, d], q[b, h, d]
                                k0, k1 = keys[k, kvh, d], keys[k + 1, kvh, d]
                                k2, k3 = keys[k + 2, kvh, d], keys[k + 3, kvh, d]
                                a0 += qa * k0
                                a1 += qa * k1
                                a2 += qa * k2
                                a3 += qa * k3
                                b0 += qb * k0
                                b1 += qb * k1
                                b2 += qb * k2
                                b3 += qb * k3
                            scores[0, k], scores[0, k + 1], scores[0, k + 2], scores[0, k + 3] = a0, a1, a2, a3
                            scores[1, k], scores[1, k + 1], scores[1, k + 2], scores[1, k + 3] = b0, b1, b2, b3
                            max_a = max(max_a, max(max(a0, a1), max(a2, a3)))
                            max_b = max(max_b, max(max(b0, b1), max(b2, b3)))
                        for k in range(both, n_b):
                            sa = sb = np.float32(0.0)
                            for d in range(head_dim):
                                sa += q[a, h, d] * keys[k, kvh, d]
                                sb += q[b, h, d] * keys[k, kvh, d]
                            if k < n_a:
                                scores[0, k] = sa
                                max_a = max(max_a, sa)
                            scores[1, k] = sb
                            max_b = max(max_b, sb)
                        for r, i, n_i, tile_max in ((0, a, n_a, max_a), (1, b, n_b, max_b)):
                            if r == 1 and b == a:
                                scores[1, :n_i] = 0.0
                                break
                            correction = np.float32(math.exp(running_max[i, h] - tile_max))
                            total = np.float32(0.0)
                            for k in range(n_i):
                                p = _exp_nonpositive(scores[r, k] - tile_max)
                                scores[r, k] = p
                                total += p
                            running_sum[i, h] = running_sum[i, h] * correction + total
                            running_max[i, h] = tile_max
                            for d in range(head_dim):
                                acc[i, h, d] *= correction
                        for k in range(0, both, 4):
                            pa0, pa1, pa2, pa3 = scores[0, k], scores[0, k + 1], scores[0, k + 2], scores[0, k + 3]
                            pb0, pb1, pb2, pb3 = scores[1, k], scores[1, k + 1], scores[1, k + 2], scores[1, k + 3]
                            for d in range(head_dim):
                                v0, v1 = values[k, kvh, d], values[k + 1, kvh, d]
                                v2, v3 = values[k + 2, kvh, d], values[k + 3, kvh, d]
                                acc[a, h, d] += pa0 * v0 + pa1 * v1 + pa2 * v2 + pa3 * v3
                                acc[b, h, d] += pb0 * v0 + pb1 * v1 + pb2 * v2 + pb3 * v3
                        for k in range(both, n_b):
                            pa, pb = scores[0, k], scores[1, k]
                            for d in range(head_dim):
                                if k < n_a:
                                    acc[a, h, d] += pa * values[k, kvh, d]
                                acc[b, h, d] += pb * values[k, kvh, d]
            for i in range(rows):
                for h in range(num_heads):
                    inv = np.float32(1.0) / running_sum[i, h] if running_sum[i, h] > 0 else np.float32(0.0)
                    for d in range(head_dim):
                        out[row0 + i, h, d] = acc[i, h, d] * inv

    return kernel


# SmolLM2's head size 64 with its own fp32 kernel (0.95x the time of the any-kind kernel on
# Intel, alternated in one process).
prefill_kernel_for = KernelChoice(_build_prefill_kernel, (64,))
_prefill_any_kind = prefill_kernel_for.any_kind


def paged_prefill(query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, kind_name):
    """Run the kernel on validated host inputs; returns (total_query_tokens, num_heads, head_dim) float32."""
    out = np.empty(query.shape, dtype=np.float32)
    work_seqs, work_rows = query_tiles(query_starts, QUERY_TILE)
    if work_seqs.size == 0:
        return out
    # Tiles late in a long prompt see more tokens than early ones: hand the work items out one
    # at a time rather than in equal contiguous runs (the output does not depend on the order).
    kind = _KINDS[kind_name]
    with numba.parallel_chunksize(1):
        prefill_kernel_for(query.shape[2], kind)(
            out,
            _kernel_view(np.ascontiguousarray(query)),
            _kernel_view(key_cache),
            _kernel_view(value_cache),
            query_starts,
            block_tables,
            context_lens,
            np.float32(scale),
            kind,
            work_seqs,
            work_rows,
        )
    return out
