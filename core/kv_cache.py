"""The physical KV cache, held by the backend, plus the dense reference copy.

``key_cache``/``value_cache`` have the seed article's layout ``(num_blocks,
block_size, num_kv_heads, head_dim)`` and live in the backend's array module (a
NumPy array on the CPU, a CuPy array on a GPU). The dense reference keeps each
sequence's K/V contiguous, as a non-paged engine would; it never reads the pool,
so the kernel-vs-dense check catches any paging bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.config import CacheConfig
from kernels.backend import Backend
from kernels.dtypes import storage_dtype


class PagedKVCache:
    def __init__(self, config: CacheConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.dtype = storage_dtype(config.dtype)
        self.key_cache, self.value_cache = backend.allocate_cache(
            config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim, self.dtype
        )

    def write(self, slot_mapping: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        self.backend.write_kv(self.key_cache, self.value_cache, slot_mapping, keys, values)

    def copy_block(self, src: int, dst: int) -> None:
        self.backend.copy_blocks(self.key_cache, self.value_cache, np.array([[src, dst]], dtype=np.int64))

    def read_sequence(self, block_table: list[int], num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Gather one sequence's K/V to the host (for tests and inspection, never the kernel)."""
        bs = self.config.block_size
        slots = np.array([block_table[p // bs] * bs + p % bs for p in range(num_tokens)], dtype=np.int64)
        flat_shape = (-1, self.config.num_kv_heads, self.config.head_dim)
        keys = self.backend.to_numpy(self.key_cache).reshape(flat_shape)[slots]
        values = self.backend.to_numpy(self.value_cache).reshape(flat_shape)[slots]
        return keys, values

    def snapshot(self) -> tuple[object, object]:
        return self.key_cache.copy(), self.value_cache.copy()

    def restore(self, snap: tuple[object, object]) -> None:
        self.key_cache[...] = snap[0]
        self.value_cache[...] = snap[1]


@dataclass
class DenseKV:
    """One sequence's contiguous K/V (rounded to the cache dtype, as the pool stores them)."""

    keys: np.ndarray  # (capacity, num_kv_heads, head_dim)
    values: np.ndarray
    length: int = 0

    def append(self, keys: np.ndarray, values: np.ndarray) -> None:
        needed = self.length + keys.shape[0]
        if needed > self.keys.shape[0]:
            capacity = max(needed, 2 * self.keys.shape[0])
            self.keys = _grown(self.keys, capacity)
            self.values = _grown(self.values, capacity)
        self.keys[self.length : needed] = keys
        self.values[self.length : needed] = values
        self.length = needed

    def copy(self) -> DenseKV:
        return DenseKV(self.keys[: self.length].copy(), self.values[: self.length].copy(), self.length)

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.keys[: self.length], self.values[: self.length]


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    out = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    out[: array.shape[0]] = array
    return out
