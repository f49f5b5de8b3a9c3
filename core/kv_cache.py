"""The physical KV cache, held by the backend, plus the dense reference copy.

``key_cache``/``value_cache`` have the seed article's layout ``(num_blocks,
block_size, num_kv_heads, head_dim)`` and live in the backend's array module (a
NumPy array on the CPU, a CuPy array on a GPU). The dense reference keeps each
sequence's K/V contiguous, as a non-paged engine would; it never reads the pool,
so the kernel-vs-dense check catches any paging bug.
"""

from __future__ import annotations

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


class SwapSpace:
    """The host memory that swapped-out blocks' K/V wait in, indexed by CPU block id
    (the block manager's CPU pool hands the ids out). Allocated on the first swap."""

    def __init__(self, config: CacheConfig, dtype: np.dtype) -> None:
        self.shape = (config.num_cpu_blocks, config.block_size, config.num_kv_heads, config.head_dim)
        self.dtype = dtype
        self.keys: np.ndarray | None = None
        self.values: np.ndarray | None = None

    def swap_out(self, backend: Backend, cache: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
        """Copy (gpu, cpu) block pairs' K/V from the cache to here."""
        if self.keys is None:
            self.keys, self.values = np.zeros(self.shape, self.dtype), np.zeros(self.shape, self.dtype)
        gpu, cpu = [g for g, _ in pairs], [c for _, c in pairs]
        keys, values = backend.read_blocks(cache.key_cache, cache.value_cache, gpu)
        self.keys[cpu], self.values[cpu] = keys, values

    def swap_in(self, backend: Backend, cache: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
        """Copy (cpu, gpu) block pairs' K/V from here back into the cache."""
        cpu, gpu = [c for c, _ in pairs], [g for _, g in pairs]
        backend.write_blocks(cache.key_cache, cache.value_cache, gpu, self.keys[cpu], self.values[cpu])

    def snapshot(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.keys is None else (self.keys.copy(), self.values.copy())

    def restore(self, snap: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.keys, self.values = (None, None) if snap is None else (snap[0].copy(), snap[1].copy())


class ContiguousKVCache:
    """The dense reference: each sequence's K/V in one contiguous row, as a non-paged
    engine reserves them. Rows are (num_kv_heads, capacity, head_dim) so dense attention
    runs over the whole buffer in one SDPA call, with no copy. Values are the cache
    dtype's rounded values held as float32 (exact), ready for an fp32 reference."""

    def __init__(self, num_kv_heads: int, head_dim: int, rows: int = 4, capacity: int = 64) -> None:
        self.keys = np.zeros((rows, num_kv_heads, capacity, head_dim), np.float32)
        self.values = np.zeros_like(self.keys)
        self.lengths = np.zeros(rows, np.int64)
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(rows - 1, -1, -1))

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def add(self, seq_id: str) -> None:
        if not self._free_rows:
            self._resize(2 * self.keys.shape[0], self.capacity)
        row = self._free_rows.pop()
        self.row_of[seq_id] = row
        self.lengths[row] = 0

    def append(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        row = self.row_of[seq_id]
        start, n = int(self.lengths[row]), keys.shape[0]
        if start + n > self.capacity:
            self._resize(self.keys.shape[0], max(start + n, 2 * self.capacity))
        self.keys[row, :, start : start + n] = keys.transpose(1, 0, 2)
        self.values[row, :, start : start + n] = values.transpose(1, 0, 2)
        self.lengths[row] = start + n

    def fork(self, parent: str, child: str) -> None:
        self.add(child)
        src, dst = self.row_of[parent], self.row_of[child]
        n = int(self.lengths[src])
        self.keys[dst, :, :n] = self.keys[src, :, :n]
        self.values[dst, :, :n] = self.values[src, :, :n]
        self.lengths[dst] = n

    def free(self, seq_id: str) -> None:
        row = self.row_of.pop(seq_id)
        self.lengths[row] = 0
        self._free_rows.append(row)

    def view(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(context_len, num_kv_heads, head_dim) views of one sequence's K/V."""
        row = self.row_of[seq_id]
        n = int(self.lengths[row])
        return self.keys[row, :, :n].transpose(1, 0, 2), self.values[row, :, :n].transpose(1, 0, 2)

    def _resize(self, rows: int, capacity: int) -> None:
        old_rows, _, old_capacity, _ = self.keys.shape
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = np.zeros((rows, old.shape[1], capacity, old.shape[3]), np.float32)
            new[:old_rows, :, :old_capacity] = old
            setattr(self, name, new)
        lengths = np.zeros(rows, np.int64)
        lengths[:old_rows] = self.lengths
        self.lengths = lengths
        self._free_rows = list(range(rows - 1, old_rows - 1, -1)) + self._free_rows

    def snapshot(self) -> ContiguousKVCache:
        snap = ContiguousKVCache.__new__(ContiguousKVCache)
        snap.keys, snap.values, snap.lengths = self.keys.copy(), self.values.copy(), self.lengths.copy()
        snap.row_of, snap._free_rows = dict(self.row_of), list(self._free_rows)
        return snap

    def restore(self, snap: ContiguousKVCache) -> None:
        copy = snap.snapshot()
        self.keys, self.values, self.lengths = copy.keys, copy.values, copy.lengths
        self.row_of, self._free_rows = copy.row_of, copy._free_rows
