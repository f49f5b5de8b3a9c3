"""The launch-time check of block tables, compiled: a real model's runner launches a kernel
per layer, and NumPy's dozen small calls per check cost more than the check's work."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def tables_in_range(block_tables: np.ndarray, context_lens: np.ndarray, block_size: int, num_blocks: int) -> bool:
    """Every context ≥ 1 token, its blocks within the table's width and the pool, in one pass
    (False: the caller's NumPy checks find what is wrong and say so)."""
    for row in range(block_tables.shape[0]):
        if context_lens[row] < 1:
            return False
        needed = (context_lens[row] + block_size - 1) // block_size
        if needed > block_tables.shape[1]:
            return False
        for col in range(needed):
            if block_tables[row, col] < 0 or block_tables[row, col] >= num_blocks:
                return False
    return True
