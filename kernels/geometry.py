"""How ``paged_attention.cu`` lays its threads out: warps of 32 lanes, thread groups of a
warp sharing one token's head slice, the batch of tokens each group loads per iteration,
and the query heads of a KV group that share a thread block. The walk-through's replay
(``kernels.trace``) and the occupancy model (``kernels.occupancy``) both read it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pagesim.kernels.cuda_build import NUM_THREADS, TOKENS_PER_ITER, heads_per_block

WARP = 32
NUM_WARPS = NUM_THREADS // WARP


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 2 * _next_pow2((x + 1) // 2)


@dataclass(frozen=True)
class CudaGeometry:
    """The thread-group layout ``paged_attention.cu`` uses for a dtype and head dim, and how
    many query heads of a KV group one thread block attends (each lane's K and V loads serve
    all of them; the tokens a lane reads are the same for every head)."""

    vec: int  # elements per 16-byte load
    group: int  # lanes per thread group (one token's head slice)
    tokens_per_warp: int  # tokens a warp's groups read side by side
    batch: int = TOKENS_PER_ITER  # tokens each group loads per iteration, one rescale for them
    heads_per_block: int = 1  # query heads sharing a thread block (and its K/V loads)

    @classmethod
    def of(cls, dtype, head_dim: int, num_heads: int = 1, num_kv_heads: int = 1) -> CudaGeometry:
        vec = 16 // np.dtype(dtype).itemsize  # bf16 may come as its uint16 patterns
        group = min(WARP, _next_pow2(head_dim // vec))
        return cls(vec, group, WARP // group, heads_per_block=heads_per_block(num_heads, num_kv_heads))

    def thread_block_of(self, head: int) -> int:
        """The grid x index of the thread block attending query ``head``."""
        return head // self.heads_per_block

    @property
    def warp_span(self) -> int:
        """Tokens a warp takes per iteration."""
        return self.tokens_per_warp * self.batch

    def lane_of(self, token: int, begin: int = 0) -> tuple[int, int, int]:
        """(warp, group, iteration) that reads ``token`` in a partition starting at ``begin``:
        iteration i gives warp w the tokens begin + i·4·span + w·span + [0, span), group g
        the ones ≡ g modulo tokens_per_warp."""
        rel = token - begin
        per_round = NUM_WARPS * self.warp_span
        within = rel % per_round
        return within // self.warp_span, within % self.tokens_per_warp, rel // per_round
