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
"""

from __future__ import annotations

import math

import numba
import numpy as np
from pagesim.kernels.backend import query_tiles
from pagesim.kernels.cpu_backend import _FASTMATH, _KINDS, TILE_TOKENS, _kernel_view, _load

QUERY_TILE = 16  # query rows a work item attends together (sharing each K/V row it reads)


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, boundscheck=False)
def _prefill_kernel(
    out, query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, kind, work_seqs, work_rows
):
    num_heads = query.shape[1]
    head_dim = query.shape[2]
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
        scores = np.empty((rows, num_heads, tile_blocks * block_size), np.float32)
        row = np.empty(head_dim, np.float32)  # one K or V row of one KV head, widened once
        kv_blocks = (kv_len + block_size - 1) // block_size
        for tile_first in range(0, kv_blocks, tile_blocks):
            tile_last = min(kv_blocks, tile_first + tile_blocks)
            tile_pos = tile_first * block_size  # position of the tile's first token
            n = 0
            for logical in range(tile_first, tile_last):
                physical = block_tables[seq, logical]
                tokens_here = min(block_size, kv_len - logical * block_size)
                for t in range(tokens_here):
                    i_first = max(0, tile_pos + n - first_pos)  # the first row that sees this token
                    for kvh in range(num_kv):
                        for d in range(head_dim):
                            row[d] = _load(key_cache[physical, t, kvh, d], kind)
                        for g in range(group):
                            h = kvh * group + g
                            for i in range(i_first, rows):
                                s = np.float32(0.0)
                                for d in range(head_dim):
                                    s += q[i, h, d] * row[d]
                                scores[i, h, n] = s
                    n += 1
            # Rows before i_begin see none of this tile; row i sees its first n_i tokens.
            i_begin = max(0, tile_pos - first_pos)
            for i in range(i_begin, rows):
                n_i = min(n, first_pos + i + 1 - tile_pos)
                for h in range(num_heads):
                    tile_max = running_max[i, h]
                    for k in range(n_i):
                        tile_max = max(tile_max, scores[i, h, k])
                    correction = np.float32(math.exp(running_max[i, h] - tile_max))
                    running_sum[i, h] *= correction
                    for d in range(head_dim):
                        acc[i, h, d] *= correction
                    for k in range(n_i):
                        p = np.float32(math.exp(scores[i, h, k] - tile_max))
                        scores[i, h, k] = p
                        running_sum[i, h] += p
                    running_max[i, h] = tile_max
            n = 0
            for logical in range(tile_first, tile_last):
                physical = block_tables[seq, logical]
                tokens_here = min(block_size, kv_len - logical * block_size)
                for t in range(tokens_here):
                    i_first = max(0, tile_pos + n - first_pos)
                    for kvh in range(num_kv):
                        for d in range(head_dim):
                            row[d] = _load(value_cache[physical, t, kvh, d], kind)
                        for g in range(group):
                            h = kvh * group + g
                            for i in range(i_first, rows):
                                p = scores[i, h, n]
                                for d in range(head_dim):
                                    acc[i, h, d] += p * row[d]
                    n += 1
        for i in range(rows):
            for h in range(num_heads):
                inv = np.float32(1.0) / running_sum[i, h] if running_sum[i, h] > 0 else np.float32(0.0)
                for d in range(head_dim):
                    out[row0 + i, h, d] = acc[i, h, d] * inv


def paged_prefill(query, key_cache, value_cache, query_starts, block_tables, context_lens, scale, kind_name):
    """Run the kernel on validated host inputs; returns (total_query_tokens, num_heads, head_dim) float32."""
    out = np.empty(query.shape, dtype=np.float32)
    work_seqs, work_rows = query_tiles(query_starts, QUERY_TILE)
    if work_seqs.size == 0:
        return out
    # Tiles late in a long prompt see more tokens than early ones: hand the work items out one
    # at a time rather than in equal contiguous runs (the output does not depend on the order).
    with numba.parallel_chunksize(1):
        _prefill_kernel(
            out,
            _kernel_view(np.ascontiguousarray(query)),
            _kernel_view(key_cache),
            _kernel_view(value_cache),
            query_starts,
            block_tables,
            context_lens,
            np.float32(scale),
            _KINDS[kind_name],
            work_seqs,
            work_rows,
        )
    return out
