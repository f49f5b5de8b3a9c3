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

    def rebuild(self, blocks: dict[int, tuple[np.ndarray, np.ndarray]], block_size: int) -> None:
        """Put back the K/V of these CPU blocks (block -> (keys, values) of its tokens)."""
        if not blocks:
            return
        if self.keys is None:
            self.keys, self.values = np.zeros(self.shape, self.dtype), np.zeros(self.shape, self.dtype)
        for block, (keys, values) in blocks.items():
            self.keys[block, : len(keys)] = keys
            self.values[block, : len(values)] = values

    def restore(self, snap: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.keys, self.values = (None, None) if snap is None else (snap[0].copy(), snap[1].copy())


class _CapacityClass:
    """Rows of one capacity: (rows, num_kv_heads, capacity, head_dim), grown by doubling."""

    def __init__(self, num_kv_heads: int, capacity: int, head_dim: int, rows: int = 2) -> None:
        self.keys = np.zeros((rows, num_kv_heads, capacity, head_dim), np.float32)
        self.values = np.zeros_like(self.keys)
        self.lengths = np.zeros(rows, np.int64)
        self.free_rows = list(range(rows - 1, -1, -1))

    def take(self) -> int:
        if not self.free_rows:
            old = self.keys.shape[0]
            for name in ("keys", "values"):
                grown = np.zeros((2 * old, *self.keys.shape[1:]), np.float32)
                grown[:old] = getattr(self, name)
                setattr(self, name, grown)
            self.lengths = np.concatenate([self.lengths, np.zeros(old, np.int64)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        return self.free_rows.pop()

    def release(self, row: int) -> None:
        self.lengths[row] = 0
        self.free_rows.append(row)

    def copy(self) -> _CapacityClass:
        out = _CapacityClass.__new__(_CapacityClass)
        out.keys, out.values, out.lengths = self.keys.copy(), self.values.copy(), self.lengths.copy()
        out.free_rows = list(self.free_rows)
        return out


class ContiguousKVCache:
    """The dense reference: each sequence's K/V in one contiguous row, as a non-paged
    engine reserves them. Rows live in capacity classes (64, 128, 256, … tokens): a row
    sits in the smallest class that holds it and moves up when it outgrows it, so one long
    sequence does not make every short one as wide (memory stays within 2× the tokens).
    Rows are (num_kv_heads, capacity, head_dim), so dense attention runs over a class in one
    SDPA call with no copy. Values are the cache dtype's rounded values held as float32
    (exact), ready for an fp32 reference."""

    MIN_CAPACITY = 64

    def __init__(self, num_kv_heads: int, head_dim: int) -> None:
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.classes: dict[int, _CapacityClass] = {}
        self.row_of: dict[str, tuple[int, int]] = {}  # seq -> (capacity, row)

    def _class(self, capacity: int) -> _CapacityClass:
        if capacity not in self.classes:
            self.classes[capacity] = _CapacityClass(self.num_kv_heads, capacity, self.head_dim)
        return self.classes[capacity]

    @classmethod
    def capacity_for(cls, length: int) -> int:
        capacity = cls.MIN_CAPACITY
        while capacity < length:
            capacity *= 2
        return capacity

    def add(self, seq_id: str) -> None:
        capacity = self.MIN_CAPACITY
        self.row_of[seq_id] = (capacity, self._class(capacity).take())

    def length(self, seq_id: str) -> int:
        capacity, row = self.row_of[seq_id]
        return int(self.classes[capacity].lengths[row])

    def append(self, seq_id: str, keys: np.ndarray, values: np.ndarray) -> None:
        capacity, row = self.row_of[seq_id]
        group = self.classes[capacity]
        start, n = int(group.lengths[row]), keys.shape[0]
        if start + n > capacity:  # move up to the class that holds the new length
            bigger = self.capacity_for(start + n)
            target = self._class(bigger)
            new_row = target.take()
            target.keys[new_row, :, :start] = group.keys[row, :, :start]
            target.values[new_row, :, :start] = group.values[row, :, :start]
            target.lengths[new_row] = start
            group.release(row)
            capacity, row, group = bigger, new_row, target
            self.row_of[seq_id] = (capacity, row)
        group.keys[row, :, start : start + n] = keys.transpose(1, 0, 2)
        group.values[row, :, start : start + n] = values.transpose(1, 0, 2)
        group.lengths[row] = start + n

    def fork(self, parent: str, child: str) -> None:
        capacity, src = self.row_of[parent]
        group = self.classes[capacity]
        dst = group.take()
        n = int(group.lengths[src])
        group.keys[dst, :, :n] = group.keys[src, :, :n]
        group.values[dst, :, :n] = group.values[src, :, :n]
        group.lengths[dst] = n
        self.row_of[child] = (capacity, dst)

    def free(self, seq_id: str) -> None:
        capacity, row = self.row_of.pop(seq_id)
        self.classes[capacity].release(row)

    def view(self, seq_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(context_len, num_kv_heads, head_dim) views of one sequence's K/V."""
        capacity, row = self.row_of[seq_id]
        group = self.classes[capacity]
        n = int(group.lengths[row])
        return group.keys[row, :, :n].transpose(1, 0, 2), group.values[row, :, :n].transpose(1, 0, 2)

    @property
    def nbytes(self) -> int:
        return sum(g.keys.nbytes + g.values.nbytes for g in self.classes.values())

    def snapshot(self) -> ContiguousKVCache:
        snap = ContiguousKVCache(self.num_kv_heads, self.head_dim)
        snap.classes = {c: g.copy() for c, g in self.classes.items()}
        snap.row_of = dict(self.row_of)
        return snap

    def restore(self, snap: ContiguousKVCache) -> None:
        copy = snap.snapshot()
        self.classes, self.row_of = copy.classes, copy.row_of
